"""Runs the fused train step on a tiny Qwen3 in a fresh process, for the sharding tests.

Device count, mesh and process layout must be fixed before JAX starts, hence a subprocess:

  python tests/helpers/step_harness.py --devices 4 --mesh 1,2,2 --steps 3 --out result.npz
  (multi-host) ... --num-processes 2 --process-id 0 --coordinator 127.0.0.1:PORT

Every process builds the same global batches from a seed and feeds only its own rows
(`parallel.process_rows`). The result file holds the per-step metrics and the final
parameters (gathered to every process) as flat arrays.

Multi-host export (`--export-dir`, `--weight-dir` with `--sglang-url`): the initial parameters
(fixed bit for bit by the seed) are exported with `save_pretrained`, synced through
`SGLangEngine.update_weights`, and exported into `--foreign-dir` (not an export: every process
must refuse), before any step.
"""
from __future__ import annotations

import argparse
import os
import sys


def parse() -> argparse.Namespace:
  p = argparse.ArgumentParser()
  p.add_argument("--devices", type=int, default=1)
  p.add_argument("--mesh", default="1,-1,1", help="data,fsdp,tensor")
  p.add_argument("--steps", type=int, default=3)
  p.add_argument("--first-step", type=int, default=0, help="batch index of the first step")
  p.add_argument("--micro-batches", type=int, default=1)
  p.add_argument("--shared-prefix", type=int, default=0,
                 help="rows per shared-prefix group (0: the row layout)")
  p.add_argument("--save-dir", default="")
  p.add_argument("--restore", action="store_true")
  p.add_argument("--out", required=True)
  p.add_argument("--num-processes", type=int, default=1)
  p.add_argument("--process-id", type=int, default=0)
  p.add_argument("--coordinator", default="")
  p.add_argument("--export-dir", default="")
  p.add_argument("--export-shard-bytes", type=int, default=50_000)
  p.add_argument("--sglang-url", default="")
  p.add_argument("--weight-dir", default="")
  p.add_argument("--foreign-dir", default="")
  return p.parse_args()


def export_checks(args: argparse.Namespace, model) -> None:
  """The exports named on the command line; exits non-zero when one misbehaves here."""
  # pylint: disable=import-outside-toplevel
  from rised_jax.model import save_pretrained
  from rised_jax.model.errors import ExportError
  from rised_jax.rollout.sglang_engine import SGLangEngine
  from tests.helpers.model_utils import tiny_tokenizer

  tokenizer = tiny_tokenizer()
  if args.export_dir:
    save_pretrained(model, tokenizer, args.export_dir, max_shard_bytes=args.export_shard_bytes)
  if args.sglang_url:
    with SGLangEngine(args.sglang_url, weight_dir=args.weight_dir, tokenizer=tokenizer,
                      export_dtype="bfloat16", timeout_s=30.0) as engine:
      engine.update_weights(model, version=1)
      exported = os.path.join(args.weight_dir, "v1", "model.safetensors")
      # Every process returns only once process 0 has written the files and the server
      # has loaded them.
      if engine.weight_version != 1 or not os.path.isfile(exported):
        sys.exit(f"process {args.process_id}: update_weights returned before {exported} "
                 f"was there (weight_version {engine.weight_version})")
  if args.foreign_dir:
    try:
      save_pretrained(model, tokenizer, args.foreign_dir)
    except ExportError as error:
      print(f"process {args.process_id} refused the foreign directory: {error}")
    else:
      sys.exit(f"process {args.process_id}: exported into a foreign directory")


def main() -> None:
  args = parse()
  os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  from rised_jax import checkpoint, parallel  # pylint: disable=import-outside-toplevel
  from rised_jax.learn import train_step  # pylint: disable=import-outside-toplevel
  from tests.helpers import step_fixtures  # pylint: disable=import-outside-toplevel

  if args.num_processes > 1:
    parallel.init_distributed(args.coordinator, args.num_processes, args.process_id,
                              cpu_collectives="gloo")
  data, fsdp, tensor = (int(x) for x in args.mesh.split(","))
  mesh = parallel.make_mesh(parallel.MeshShape(data, fsdp, tensor))
  config = step_fixtures.step_config(micro_batches=args.micro_batches)
  trainable, state = train_step.create(step_fixtures.tiny_model(), step_fixtures.optimizer(),
                                       config, mesh)
  export_checks(args, trainable.model(state))
  ckpt = checkpoint.Checkpointer(args.save_dir, async_save=True) if args.save_dir else None
  if args.restore:
    state = ckpt.restore(None, state)
  rows = parallel.process_rows(mesh, step_fixtures.ROWS)
  if args.shared_prefix:   # the prefix arrays have one row per group
    groups = parallel.process_rows(mesh, step_fixtures.ROWS // args.shared_prefix)
  history = []
  for i in range(args.first_step, args.first_step + args.steps):
    batch = (step_fixtures.grouped_batch(i, args.shared_prefix) if args.shared_prefix
             else step_fixtures.batch(i))
    state, metrics = trainable.step(state, trainable.put_batch(
        {k: v[groups if k in train_step.SHARED_PREFIX_KEYS else rows]
         for k, v in batch.items()}))
    history.append({k: float(v) for k, v in metrics.items()})
  if ckpt is not None and not args.restore:
    ckpt.save(int(state.step), state, force=True)
    ckpt.close()
  params = multihost_utils.process_allgather(state.params, tiled=True)
  flat = {jax.tree_util.keystr(path): np.asarray(leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
  if args.process_id == 0:
    names = sorted(history[0]) if history else []
    np.savez(args.out, metric_names=np.asarray(names),
             metrics=np.asarray([[h[n] for n in names] for h in history]),
             step=np.asarray(int(state.step)), **{"param" + k: v for k, v in flat.items()})


if __name__ == "__main__":
  main()
