"""Compile time and compiled memory of the train step with the decoder's layers scanned
(`model.scan_layers`: one `lax.scan` over stacked layers) against unrolled, by depth.

  JAX_PLATFORMS=cpu python3 benchmarks/scan_compile.py    # → benchmarks/results/scan_compile.json
  python3 benchmarks/scan_compile.py --main-job           # one SmolLM2 step of the main job

Default: the tiny Qwen3 width (d 128, MLP 512, 4 heads, 2 KV heads, V 512, tied, fp32) at
--layers 4, 12 and 36, the GRPO step (clipped PG, truncated importance weight) with remat,
B rows of T columns (`train_step.grpo_batch`), on one device. Per depth and side: lower +
compile seconds (nothing run; `common.compile_jitted`), the compiled memory
(`common.memory_report`), and one step's loss, which must be finite and agree between the
sides (else the benchmark raises: a broken step is not measured). Printed and in the JSON:
scanned / unrolled compile time and temp memory per depth, and each side's compile time at
the deepest over the shallowest depth (target: ≤ 1.5 when scanned).

--main-job: the same comparison for one step of experiments/configs/smollm2_cpu.py (its
StepConfig and optimizer: the fused RISED step with a live teacher, 2 micro-batches, remat)
on the SmolLM2-135M architecture (random weights, 30 layers) at one of the shapes that job
compiles (4 rows × 320 columns). Compile only; nothing is run (a step takes ~10 s there).
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
from pathlib import Path
from typing import Any, Sequence

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402
from benchmarks.train_step import grpo_batch  # noqa: E402
from rised_jax import parallel  # noqa: E402
from rised_jax.learn import loss_terms, train_step as step_lib  # noqa: E402
from rised_jax.model import ModelConfig, from_config, hf_io  # noqa: E402

TINY_PRESET = "qwen3-2l-d128"
DEFAULT_LAYERS = (4, 12, 36)
DEEP_OVER_SHALLOW_TARGET = 1.5
LOSS_RTOL = 1e-4   # scanned vs unrolled loss: same math, another XLA program (fp32)
MAIN_JOB_CONFIG = common.REPO_ROOT / "experiments" / "configs" / "smollm2_cpu.py"
MAIN_JOB_PRESET = "smollm2-135m"
MAIN_JOB_ROWS, MAIN_JOB_PROMPT, MAIN_JOB_RESPONSE = 4, 256, 64   # 4 × 320 columns
SIDES = ("unrolled", "scanned")


def compile_case(cfg: ModelConfig, step_config: step_lib.StepConfig,
                 optimizer: step_lib.OptimizerConfig, batch: dict[str, Any], *, scan: bool,
                 run: bool) -> dict[str, Any]:
  """Lowers and compiles one train step (and runs it once when `run`); its JSON record.

  Both sides hold the same weights: the unrolled random init, stacked for the scanned side.
  """
  model = from_config(cfg, 0, remat=True)
  if scan:
    model = hf_io.build_from_state(cfg, hf_io.hf_state_dict(model), "the unrolled init",
                                   remat=True, scan_layers=True)
  trainable, state = step_lib.create(model, step_lib.make_optimizer(optimizer), step_config,
                                     parallel.make_mesh())
  device_batch = trainable.put_batch(batch)
  compiled, compile_s = common.compile_jitted(trainable.step, state, device_batch)
  record = {"compile_s": compile_s, "memory": common.memory_report(compiled),
            "process_peak_rss_bytes": common.peak_rss_bytes()}
  if run:
    _, metrics = compiled(state, device_batch)
    loss = float(metrics["loss"])
    if not math.isfinite(loss):
      raise FloatingPointError(f"{'scanned' if scan else 'unrolled'} step at "
                               f"{cfg.num_layers} layers: loss {loss}; not measuring a broken "
                               "step")
    record["loss"] = loss
  return record


def compare(cfg: ModelConfig, step_config: step_lib.StepConfig,
            optimizer: step_lib.OptimizerConfig, batch: dict[str, Any], *, run: bool,
            label: str) -> dict[str, Any]:
  """Both sides at one depth, with their ratios."""
  sides = {}
  for side in SIDES:
    print(f"[{label}] {side}: compiling ...", flush=True)
    sides[side] = compile_case(cfg, step_config, optimizer, batch, scan=side == "scanned",
                               run=run)
    print(f"[{label}] {side}: compiled in {sides[side]['compile_s']:.1f} s, temp "
          f"{common.gib(sides[side]['memory']['temp_bytes'])}", flush=True)
  unrolled, scanned = sides["unrolled"], sides["scanned"]
  if run and not math.isclose(scanned["loss"], unrolled["loss"], rel_tol=LOSS_RTOL,
                              abs_tol=LOSS_RTOL):
    raise AssertionError(f"[{label}] scanned loss {scanned['loss']} != unrolled "
                         f"{unrolled['loss']} (rel. tolerance {LOSS_RTOL})")
  return {
      "layers": cfg.num_layers, **sides,
      "scanned_over_unrolled_compile": scanned["compile_s"] / unrolled["compile_s"],
      "scanned_over_unrolled_temp": (scanned["memory"]["temp_bytes"]
                                     / unrolled["memory"]["temp_bytes"]),
      "scanned_over_unrolled_total": (scanned["memory"]["total_bytes"]
                                      / unrolled["memory"]["total_bytes"]),
  }


def depth_sweep(args: argparse.Namespace) -> dict[str, Any]:
  base = common.MODEL_PRESETS[TINY_PRESET]
  step_config = step_lib.StepConfig(policy_gradient=loss_terms.PolicyGradientConfig(
      aggregation="seq-mean-token-mean", eps_low=0.2, eps_high=0.2, importance_cap=2.0),
      chunk=args.chunk)
  optimizer = step_lib.OptimizerConfig(learning_rate=1e-6)
  batch = grpo_batch(base["vocab_size"], args.batch, args.prompt_len, args.response_len,
                     seed=0)
  depths = []
  for layers in args.layers:
    cfg = ModelConfig.from_hf({**base, "num_hidden_layers": layers},
                              source=f"benchmarks preset {TINY_PRESET!r}, {layers} layers")
    depths.append(compare(cfg, step_config, optimizer, batch, run=True,
                          label=f"{layers} layers"))
  shallow, deep = depths[0], depths[-1]
  deep_over_shallow = {side: deep[side]["compile_s"] / shallow[side]["compile_s"]
                       for side in SIDES}
  return {
      "model": TINY_PRESET, "config": base,
      "batch": {"rows": args.batch, "prompt_len": args.prompt_len,
                "response_len": args.response_len},
      "depths": depths,
      "deep_over_shallow_compile": deep_over_shallow,
      "target": {"scanned_deep_over_shallow_compile_max": DEEP_OVER_SHALLOW_TARGET,
                 "met": deep_over_shallow["scanned"] <= DEEP_OVER_SHALLOW_TARGET},
  }


def _main_job_config():
  spec = importlib.util.spec_from_file_location("smollm2_cpu", MAIN_JOB_CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def main_job(_: argparse.Namespace) -> dict[str, Any]:
  from rised_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  config = _main_job_config()
  cfg = common.model_config(MAIN_JOB_PRESET)
  batch = grpo_batch(cfg.vocab_size, MAIN_JOB_ROWS, MAIN_JOB_PROMPT, MAIN_JOB_RESPONSE, seed=0,
                     teacher=True)
  step_config = config_lib.step_config(config)
  result = compare(cfg, step_config, config_lib.optimizer_config(config), batch, run=False,
                   label="main job step")
  return {"model": MAIN_JOB_PRESET, "config_file": str(MAIN_JOB_CONFIG.relative_to(
              common.REPO_ROOT)),
          "step_config": {"beta": step_config.teacher_kl.beta, "teacher": step_config.teacher,
                          "micro_batches": step_config.micro_batches,
                          "chunk": step_config.chunk},
          "batch": {"rows": MAIN_JOB_ROWS, "columns": MAIN_JOB_PROMPT + MAIN_JOB_RESPONSE},
          **result}


def _row(label: str, case: dict[str, Any]) -> str:
  u, s = case["unrolled"], case["scanned"]
  return (f"{label:>14s} {u['compile_s']:10.1f} {s['compile_s']:10.1f} "
          f"{case['scanned_over_unrolled_compile']:7.2f} "
          f"{common.gib(u['memory']['temp_bytes']):>11s} "
          f"{common.gib(s['memory']['temp_bytes']):>11s} "
          f"{case['scanned_over_unrolled_temp']:7.2f}")


def print_table(result: dict[str, Any]) -> None:
  print(f"{'':>14s} {'unrolled s':>10s} {'scanned s':>10s} {'ratio':>7s} "
        f"{'unroll temp':>11s} {'scan temp':>11s} {'ratio':>7s}")
  if "depths" in result:
    for case in result["depths"]:
      print(_row(f"{case['layers']} layers", case))
    ratios = result["deep_over_shallow_compile"]
    deep, shallow = result["depths"][-1]["layers"], result["depths"][0]["layers"]
    print(f"compile at {deep} / {shallow} layers: unrolled {ratios['unrolled']:.2f}, scanned "
          f"{ratios['scanned']:.2f} (target <= {DEEP_OVER_SHALLOW_TARGET}: "
          f"{'met' if result['target']['met'] else 'not met'})")
  else:
    print(_row(f"{result['layers']} layers", result))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--layers", default=",".join(map(str, DEFAULT_LAYERS)),
                      help="comma-separated depths, shallowest first")
  parser.add_argument("--batch", type=int, default=4, help="rows per batch")
  parser.add_argument("--prompt-len", type=int, default=32)
  parser.add_argument("--response-len", type=int, default=96)
  parser.add_argument("--chunk", type=int, default=128, help="StepConfig.chunk")
  parser.add_argument("--main-job", action="store_true",
                      help="instead: one step of experiments/configs/smollm2_cpu.py "
                           "(SmolLM2-135M, 4 x 320 columns), compile only")
  parser.add_argument("--out", default=None,
                      help="JSON path (default benchmarks/results/scan_compile.json, "
                           "scan_compile_main_job.json with --main-job)")
  args = parser.parse_args(argv)
  try:
    args.layers = [int(x) for x in args.layers.split(",") if x.strip()]
  except ValueError:
    parser.error(f"--layers must be comma-separated integers, got {args.layers!r}")
  if len(args.layers) < 2 or min(args.layers) < 1 or args.layers != sorted(args.layers):
    parser.error(f"--layers needs at least two depths >= 1, shallowest first; got {args.layers}")
  for key in ("batch", "prompt_len", "chunk"):
    if getattr(args, key) < 1:
      parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
  if args.response_len < 2:
    parser.error(f"--response-len must be >= 2, got {args.response_len}")
  if args.out is None:
    name = "scan_compile_main_job.json" if args.main_job else "scan_compile.json"
    args.out = str(common.RESULTS_DIR / name)
  return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  args = parse_args(argv)
  limits = common.probe_machine()
  result = main_job(args) if args.main_job else depth_sweep(args)
  print_table(result)
  machine = common.machine_record(limits)
  payload = {"benchmark": "scan_compile_main_job" if args.main_job else "scan_compile",
             "machine": machine, "args": vars(args), **result}
  path = common.write_json(args.out, payload)
  print(f"load average {limits['load_average_before']} before, "
        f"{machine['load_average_after']} after; wrote {path}")
  return payload


if __name__ == "__main__":
  main()
