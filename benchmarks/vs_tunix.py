"""Our GRPO train step side by side with google-tunix 0.1.7's, on the same work, in one run.

  JAX_PLATFORMS=cpu python3 benchmarks/vs_tunix.py          # → benchmarks/results/vs_tunix.json

tunix is not a dependency: it lives in `.venv-tunix` at the repository root, which this script
creates when missing (`python3 -m venv` + pip install google-tunix==0.1.7 with jax/jaxlib pinned
to the version running here) and checks (its jax must equal ours). The tunix side is the
driver `benchmarks/peers/tunix_grpo_bench.py loss` (or --driver), run in that environment (it
imports only tunix and its dependencies, never rised_jax); the driver's `train_step` is
jit(value_and_grad(tunix grpo loss)) + AdamW update on a random tiny Qwen3.

Same work on both sides: the tiny Qwen3 (2 layers d 128 MLP 512, 4 heads, 2 KV heads, vocab
512, tied, float32; then 4 layers d 256 MLP 1024), B = 8 rows of P = 64 prompt + C = 192
response columns drawn by the driver's recipe and seed (`train_step.grpo_batch`), loss
seq-mean-token-mean with ε = 0.2, β = 0, one iteration (ratio against given old log-probs, no
behaviour importance weight), AdamW(lr 1e-4, weight decay 1e-4, optax defaults otherwise),
no gradient clipping. Timing on both sides: median of --iters calls after --warmup, each
blocked until ready; compile reported apart (tunix: its first call, compile + one step).

With --rounds R the pair is measured R times, alternating which side goes first, and the
ratio uses the median over rounds of each side's median step time. Each round's own ratio
(its two sides ran back to back, so the machine's drift between rounds cancels) is kept too,
with their median and its order-statistic interval (`stats.median_interval`).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jaxlib  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from benchmarks import train_step as train_step_bench  # noqa: E402
from rised_jax.learn import loss_terms, train_step as step_lib  # noqa: E402

TUNIX_SPEC = "google-tunix==0.1.7"
DEFAULT_VENV = common.REPO_ROOT / ".venv-tunix"
DEFAULT_DRIVER = common.REPO_ROOT / "benchmarks" / "peers" / "tunix_grpo_bench.py"
# Our preset → the driver's flags for the same architecture (its other defaults: 4 heads,
# 2 KV heads, head_dim = d / heads, vocab 512, tied, rope 1e4, eps 1e-6).
CONFIGS = {
    "qwen3-2l-d128": ["--layers", "2", "--d", "128", "--mlp", "512"],
    "qwen3-4l-d256": ["--layers", "4", "--d", "256", "--mlp", "1024"],
}
SPEEDUP_TARGET = 1.5
# The driver's optimizer, optax.adamw(1e-4), with optax's defaults written out.
OPTIMIZER = step_lib.OptimizerConfig(learning_rate=1e-4, b1=0.9, b2=0.999, eps=1e-8,
                                     weight_decay=1e-4, max_grad_norm=None)


def grpo_step_config(chunk: int) -> step_lib.StepConfig:
  """The driver's loss: GRPO, clip 0.2 both sides, no behaviour weight cap, no teacher."""
  return step_lib.StepConfig(policy_gradient=loss_terms.PolicyGradientConfig(
      aggregation="seq-mean-token-mean", eps_low=0.2, eps_high=0.2, importance_cap=None),
      teacher_kl=loss_terms.TeacherKLConfig(beta=0.0), chunk=chunk)


def venv_python(venv: Path) -> Path:
  return venv / "bin" / "python"


def ensure_venv(venv: Path) -> dict[str, str]:
  """Creates the tunix environment if missing; returns its package versions.

  Raises if its jax differs from ours (the comparison would not be of the same compiler).
  """
  python = venv_python(venv)
  if not python.exists():
    print(f"creating {venv} with {TUNIX_SPEC} (about a minute, 1.6 GB) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    TUNIX_SPEC, f"jax=={jax.__version__}", f"jaxlib=={jaxlib.__version__}"],
                   check=True)
  probe = ("import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
           "('google-tunix', 'jax', 'jaxlib', 'flax', 'optax')}))")
  found = subprocess.run([str(python), "-c", probe], check=False, capture_output=True, text=True)
  if found.returncode:
    raise RuntimeError(f"{venv}: cannot read its package versions ({found.stderr.strip()}); "
                       f"delete it and rerun to recreate it with {TUNIX_SPEC}")
  versions = json.loads(found.stdout)
  if versions["google-tunix"] != TUNIX_SPEC.split("==")[1]:
    raise RuntimeError(f"{venv}: has google-tunix {versions['google-tunix']}, expected "
                       f"{TUNIX_SPEC}; delete it and rerun")
  if (versions["jax"], versions["jaxlib"]) != (jax.__version__, jaxlib.__version__):
    raise RuntimeError(f"{venv}: has jax {versions['jax']} / jaxlib {versions['jaxlib']}, ours "
                       f"is {jax.__version__} / {jaxlib.__version__}; a fair comparison needs the "
                       f"same: run {python} -m pip install jax=={jax.__version__} "
                       f"jaxlib=={jaxlib.__version__}")
  return versions


def run_tunix(python: Path, driver: Path, preset: str, args: argparse.Namespace
              ) -> dict[str, Any]:
  """One run of the driver's `loss` part; returns its `train_step` record."""
  with tempfile.TemporaryDirectory() as tmp:
    out = Path(tmp) / "tunix.json"
    command = [str(python), str(driver), "loss", *CONFIGS[preset], "--B", str(args.batch),
               "--P", str(args.prompt_len), "--C", str(args.response_len),
               "--warmup", str(args.warmup), "--iters", str(args.iters), "--json", str(out)]
    done = subprocess.run(command, check=False, capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    if done.returncode:
      raise RuntimeError(f"the tunix driver failed ({' '.join(command)}):\n{done.stderr[-4000:]}")
    record = json.loads(out.read_text())[0]
  step = record["train_step"]
  return {"first_call_s": step["first_call_s"], "median_s": step["median_s"],
          "min_s": step["min_s"], "n_params": record["n_params"], "command": command}


def run_ours(preset: str, args: argparse.Namespace, matmul: dict[str, float]) -> dict[str, Any]:
  cfg = common.model_config(preset)
  batch = train_step_bench.grpo_batch(cfg.vocab_size, args.batch, args.prompt_len,
                                      args.response_len, seed=0, behaviour=False)
  config = grpo_step_config(args.chunk)
  return train_step_bench.bench_step(cfg, config, OPTIMIZER, batch, warmup=args.warmup,
                                     iters=args.iters, matmul=matmul)


def compare(preset: str, args: argparse.Namespace, python: Path,
            matmul: dict[str, float]) -> dict[str, Any]:
  rounds = []
  for index in range(args.rounds):
    order = ("tunix", "ours") if index % 2 == 0 else ("ours", "tunix")
    measured = {}
    for side in order:
      print(f"[{preset}] round {index + 1}/{args.rounds}: {side} ...", flush=True)
      measured[side] = (run_tunix(python, args.driver, preset, args) if side == "tunix"
                        else run_ours(preset, args, matmul))
    rounds.append({"order": list(order), **measured})
  tunix_s = float(np.median([r["tunix"]["median_s"] for r in rounds]))
  ours_s = float(np.median([r["ours"]["step"]["median_s"] for r in rounds]))
  ours_cpu_s = float(np.median([r["ours"]["step"]["cpu_median_s"] for r in rounds]))
  tokens = args.batch * (args.prompt_len + args.response_len)
  cfg = common.model_config(preset)
  flops = common.train_step_flops(cfg, args.batch, args.prompt_len + args.response_len)["total"]
  per_round = [r["tunix"]["median_s"] / r["ours"]["step"]["median_s"] for r in rounds]
  median = common.per_round_median(per_round)
  paired = {"speedup_per_round_median": median} if median else {}
  return {
      "config": preset, "tokens_per_step": tokens, "model_flops": flops, "rounds": rounds,
      "tunix_step_s": tunix_s, "ours_step_s": ours_s, "ours_cpu_step_s": ours_cpu_s,
      "tunix_tokens_per_s": tokens / tunix_s, "ours_tokens_per_s": tokens / ours_s,
      "tunix_mfu": common.limit_fraction(flops, tunix_s, matmul["flops_per_s"]),
      "ours_mfu": common.limit_fraction(flops, ours_s, matmul["flops_per_s"]),
      "speedup_ours_over_tunix": tunix_s / ours_s, "speedup_per_round": per_round, **paired,
  }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--configs", default=",".join(CONFIGS),
                      help=f"comma-separated, from {sorted(CONFIGS)}")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--prompt-len", type=int, default=64)
  parser.add_argument("--response-len", type=int, default=192)
  parser.add_argument("--chunk", type=int, default=256, help="our StepConfig.chunk")
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--iters", type=int, default=10)
  parser.add_argument("--rounds", type=int, default=1)
  parser.add_argument("--matmul-size", type=int, default=2048)
  parser.add_argument("--matmul-seconds", type=float, default=1.0)
  parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
  parser.add_argument("--driver", type=Path, default=DEFAULT_DRIVER)
  parser.add_argument("--out", default=str(common.RESULTS_DIR / "vs_tunix.json"))
  args = parser.parse_args(argv)
  args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
  unknown = [c for c in args.configs if c not in CONFIGS]
  if not args.configs or unknown:
    parser.error(f"--configs: unknown or no configs {unknown}; expected some of {sorted(CONFIGS)}")
  for key in ("batch", "prompt_len", "chunk", "iters", "rounds", "matmul_size"):
    if getattr(args, key) < 1:
      parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
  if args.response_len < 2 or args.warmup < 0:
    parser.error(f"need --response-len >= 2 and --warmup >= 0; got {args.response_len}, "
                 f"{args.warmup}")
  check_driver(parser, args.driver)
  return args


def check_driver(parser: argparse.ArgumentParser, driver: Path) -> None:
  if not driver.is_file():
    parser.error(f"--driver {driver}: not found; expected the tunix driver, by default "
                 f"{DEFAULT_DRIVER}")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  args = parse_args(argv)
  versions = ensure_venv(args.venv)
  limits = common.probe_machine(args.matmul_size, args.matmul_seconds)
  matmul = limits["matmul"]
  results = [compare(preset, args, venv_python(args.venv), matmul) for preset in args.configs]

  print(f"{'config':14s} {'tunix ms':>9s} {'ours ms':>9s} {'ours cpu ms':>11s} "
        f"{'tunix tok/s':>11s} {'ours tok/s':>11s} {'tunix MFU':>9s} {'ours MFU':>9s} "
        f"{'ours/tunix':>10s}")
  for r in results:
    print(f"{r['config']:14s} {r['tunix_step_s'] * 1e3:9.1f} {r['ours_step_s'] * 1e3:9.1f} "
          f"{r['ours_cpu_step_s'] * 1e3:11.1f} "
          f"{r['tunix_tokens_per_s']:11.0f} {r['ours_tokens_per_s']:11.0f} "
          f"{r['tunix_mfu']:9.1%} {r['ours_mfu']:9.1%} {r['speedup_ours_over_tunix']:9.2f}x")
  for r in results:
    if "speedup_per_round_median" in r:
      print(f"{r['config']}: {common.per_round_text(r['speedup_per_round_median'])}")
  print(f"target: ours/tunix >= {SPEEDUP_TARGET}x; matmul rate "
        f"{matmul['flops_per_s'] / 1e9:.1f} GFLOP/s")
  args_json = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
  machine = common.machine_record(limits)
  result = {"benchmark": "vs_tunix", "machine": machine, "tunix_venv": versions,
            "args": args_json, "matmul": matmul, "target_speedup_min": SPEEDUP_TARGET,
            "configs": results}
  path = common.write_json(args.out, result)
  print(f"load average {limits['load_average_before']} before, "
        f"{machine['load_average_after']} after; wrote {path}")
  return result


if __name__ == "__main__":
  main()
