"""Seconds per GB of `save_pretrained` (the SGLang weight sync's export), on one process and on
several processes of 2 CPU devices each, where every tensor is gathered to process 0 first.

  python3 benchmarks/export_speed.py --model smollm2-135m --processes 1
  python3 benchmarks/export_speed.py --model smollm2-135m --processes 2   # 2 x 2 CPU devices

Random weights (timing does not depend on them), parameters sharded over a (1, fsdp, tensor)
= (1, 2, 2) mesh when there are 4 devices; the export is timed --repeats times into the same
directory (a re-export, as every sync step after the first is) and the median taken. GB is
10^9 bytes of safetensors written. JSON out.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="smollm2-135m", help="a benchmarks/common.py preset")
  parser.add_argument("--processes", type=int, default=1)
  parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", default=None, help="JSON result (default benchmarks/results/)")
  parser.add_argument("--process-id", type=int, default=None, help=argparse.SUPPRESS)
  parser.add_argument("--coordinator", default="", help=argparse.SUPPRESS)
  parser.add_argument("--export-dir", default="", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.processes < 1 or args.repeats < 1:
    parser.error(f"--processes and --repeats must be >= 1, got {args.processes}, {args.repeats}")
  return args


def spawn(args: argparse.Namespace) -> None:
  """Starts the processes (this script again, one per process id) and waits for them."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  with tempfile.TemporaryDirectory() as export_dir:
    procs = [subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--process-id", str(i),
                               "--coordinator", f"127.0.0.1:{port}", "--export-dir", export_dir])
             for i in range(args.processes)]
    codes = [p.wait() for p in procs]
  if any(codes):
    sys.exit(f"export_speed: a process failed (exit codes {codes})")


def run(args: argparse.Namespace) -> None:
  """One process of the measurement (process 0 writes the JSON)."""
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
  os.environ["JAX_PLATFORMS"] = "cpu"
  import numpy as np  # noqa: PLC0415
  from benchmarks import common  # noqa: PLC0415
  from rised_jax import parallel  # noqa: PLC0415
  from rised_jax.model import from_config, save_pretrained  # noqa: PLC0415
  from rised_jax.learn import train_step  # noqa: PLC0415

  if args.processes > 1:
    parallel.init_distributed(args.coordinator, args.processes, args.process_id,
                              cpu_collectives="gloo")
  mesh = parallel.make_mesh(parallel.MeshShape(1, -1, 2))
  model = from_config(common.model_config(args.model), 0)
  trainable, state = train_step.create(model, train_step.make_optimizer(
      train_step.OptimizerConfig()), train_step.StepConfig(), mesh)
  sharded = trainable.model(state)
  out_dir = Path(args.export_dir) / "export"
  times = []
  for _ in range(args.repeats):
    parallel.barrier("export_speed start")
    start = time.perf_counter()
    save_pretrained(sharded, None, out_dir, dtype=args.dtype)
    parallel.barrier("export_speed end")
    times.append(time.perf_counter() - start)
  if not parallel.is_coordinator():
    return
  written = sum(p.stat().st_size for p in out_dir.glob("*.safetensors"))
  median = float(np.median(times))
  result = {"benchmark": "export_speed", "machine": common.machine_info(), "args": vars(args),
            "processes": args.processes, "devices": len(mesh.devices.flat),
            "safetensors_bytes": written, "times_s": times, "median_s": median,
            "seconds_per_gb": median / (written / 1e9)}
  path = common.write_json(args.out or common.RESULTS_DIR / (
      f"export_speed_{args.model}_{args.dtype}_{args.processes}p.json"), result)
  print(f"{args.model} {args.dtype}: {written / 1e9:.3f} GB in {median:.2f} s (median of "
        f"{args.repeats}) on {args.processes} process(es) x 2 devices: "
        f"{result['seconds_per_gb']:.2f} s/GB; load {result['machine']['load_average_1_5_15']}; "
        f"wrote {path}")


def main(argv: Sequence[str] | None = None) -> None:
  args = parse_args(argv)
  if args.process_id is None:
    if args.processes > 1:
      spawn(args)
      return
    args.process_id = 0
    with tempfile.TemporaryDirectory() as export_dir:
      args.export_dir = export_dir
      run(args)
    return
  run(args)


if __name__ == "__main__":
  main()
