"""One-step-async roll-outs on and off, side by side in one run: wall time, stage times and the
training curves (`rollout.async_rollouts`, trainer.py).

  JAX_PLATFORMS=cpu python3 benchmarks/async_rollouts.py --config experiments/configs/smollm2_cpu.py \
      --checkpoint-every 6                       # the main job: its wall time on and off
  JAX_PLATFORMS=cpu python3 benchmarks/async_rollouts.py \
      --config experiments/configs/tiny_cpu.py:grpo,signpost --seeds 0 1 --tiny-model
                                                 # the learning setting: curves on and off

Each (seed, async) pair is one whole `trainer.train` run in its own temporary workdir, the
pairs interleaved (off, on, off, on, …) so drift in the machine's load falls on both. Async
overlaps nothing across a checkpoint, so `--checkpoint-every` sets how many steps may overlap
(the main job checkpoints every step: with its default no step overlaps).

Reported per run: wall seconds of `train` (model load and evaluations included), the sum of
each time/* stage over the steps, the per-step rollout success curve (rollout/<env>/success)
and the held-out pass rate after training with its Wilson 95 % interval; then, per seed, the
off/on wall-time ratio and, over seeds, the mean difference of the curves with a paired
t-interval (steps within a run are not independent, so the interval is over per-run means).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # `tests.helpers.learning_envs` (Signpost)

from benchmarks import common  # noqa: E402
from rised_jax import envs, runlog, stats, trainer  # noqa: E402
from rised_jax.model import tiny  # noqa: E402


def load(spec: str, seed: int, async_rollouts: bool, args: argparse.Namespace, workdir: Path):
  config = common.load_config(spec)
  config.seed = seed
  config.rollout.async_rollouts = async_rollouts
  if args.checkpoint_every:
    config.train.checkpoint_every = args.checkpoint_every
  if args.steps:
    config.train.steps = args.steps
  if args.tiny_model:
    envs.register_aliases(config.envs.aliases)   # tiny.write reads the games by name
    config.model.source = str(tiny.write(workdir / "model", list(config.envs.names), seed=seed))
  return config


def one_run(config, workdir: Path) -> dict[str, Any]:
  start = time.perf_counter()
  summary = trainer.train(config, workdir / "run")
  wall = time.perf_counter() - start
  metrics = [m for m in runlog.read_jsonl(workdir / "run" / runlog.METRICS_FILE) if "loss" in m]
  stages = sorted({k for m in metrics for k in m if k.startswith("time/")})
  success_keys = sorted({k for m in metrics for k in m if k.startswith("rollout/")
                         and k.endswith("/success")})
  curve = [float(np.mean([m[k] for k in success_keys if k in m])) for m in metrics]
  after = {}
  for env, r in summary["after"].items():
    wins = round(r["pass_rate"] * r["episodes"])
    low, high = stats.wilson_interval(wins, r["episodes"])
    after[env] = {"pass_rate": r["pass_rate"], "episodes": r["episodes"], "ci": [low, high]}
  return {"wall_s": wall, "stage_s": {k: float(sum(m.get(k, 0.0) for m in metrics))
                                      for k in stages},
          "policy_lag_steps": int(sum(m.get("rollout/policy_lag", 0.0) for m in metrics)),
          "success_curve": curve, "after": after}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default="experiments/configs/smollm2_cpu.py")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0])
  parser.add_argument("--steps", type=int, default=0, help="0: the config's train.steps")
  parser.add_argument("--checkpoint-every", type=int, default=0, help="0: the config's")
  parser.add_argument("--tiny-model", action="store_true",
                      help="a random tiny model over the config's environments, per seed")
  parser.add_argument("--out", default=str(common.RESULTS_DIR / "async_rollouts.json"))
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  args = parse_args(argv)
  runs: dict[str, dict[str, Any]] = {}
  limits = common.probe_machine()
  for seed in args.seeds:
    for async_rollouts in (False, True):
      with tempfile.TemporaryDirectory() as tmp:
        config = load(args.config, seed, async_rollouts, args, Path(tmp))
        runs[f"seed{seed}/{'on' if async_rollouts else 'off'}"] = one_run(config, Path(tmp))
  off = [runs[f"seed{s}/off"] for s in args.seeds]
  on = [runs[f"seed{s}/on"] for s in args.seeds]
  diffs = [float(np.mean(b["success_curve"]) - np.mean(a["success_curve"]))
           for a, b in zip(off, on)]
  out = {"config": args.config, "seeds": args.seeds, "runs": runs,
         "wall_ratio_off_over_on": [a["wall_s"] / b["wall_s"] for a, b in zip(off, on)],
         "mean_success_difference_on_minus_off": float(np.mean(diffs)),
         "machine": common.machine_record(limits)}
  if len(diffs) > 1:
    out["difference_t_interval"] = list(stats.t_interval(diffs))
  common.write_json(args.out, out)
  for name, r in runs.items():
    print(f"{name}: wall {r['wall_s']:.1f} s, overlapped steps {r['policy_lag_steps']}, "
          f"stages {', '.join(f'{k[5:]} {v:.1f}' for k, v in r['stage_s'].items())}, "
          f"after {json.dumps({e: round(a['pass_rate'], 3) for e, a in r['after'].items()})}")
  print(f"wall off/on: {', '.join(f'{x:.2f}' for x in out['wall_ratio_off_over_on'])}; mean "
        f"success on − off {out['mean_success_difference_on_minus_off']:+.4f}"
        + (f", 95 % t-interval {out['difference_t_interval']}" if len(diffs) > 1 else ""))
  return out


if __name__ == "__main__":
  main()
