"""Tokens/s, peak memory and MFU of the fused train step, GRPO-only and GRPO + forward-KL
self-distillation, on a tiny Qwen3 and on the SmolLM2-135M architecture (random weights).

  JAX_PLATFORMS=cpu python3 benchmarks/train_step.py   # → benchmarks/results/train_step.json

For each model, one batch of B rows of P prompt + C response columns (the tunix driver's
batch recipe, `grpo_batch`) and two step configs compiled by `rised_jax.learn.train_step`:

  grpo        clipped PG, seq-mean-token-mean, ε = 0.2, truncated importance weight (C = 2)
  fused       the same plus β · forward KL(p_T ‖ p_S) over the full vocabulary against the
              live teacher (same parameters, another prefix, stop-gradient) on every
              response token
  fused_idle  the fused config on the same batch without a distillation token (a RISED step
              whose trained groups have no positive-rubric teacher): the step skips the
              teacher's forward, so this should cost what grpo does
  grpo_shared the grpo config on the same batch with each group of --group-size rows given
              its first row's prompt, carried once (`batching.group_prefixes`): the step's
              layers run a group's prompt once (model/shared_prefix.py); its model FLOPs are
              those it ran

Reported per case: compile time (apart), median step time over --iters calls after --warmup,
tokens/s (all B·T columns, and response tokens), CPU seconds per step (all threads; steadier
than wall time on a shared machine), model FLOPs (common.train_step_flops: the
student's forward + backward, plus one teacher forward for `fused`), XLA's FLOP count beside
it, MFU = model FLOPs / step time / the float32 matmul rate measured just before the case
(and the same per CPU-second: `mfu_cpu_time`), and the
compiled memory (common.memory_report; `total_bytes` is the headline), plus the process's
peak RSS so far. Per model: the fused / GRPO step-time ratio (target ≤ 1.35), the
fused_idle / GRPO one and the grpo_shared / GRPO one.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from pathlib import Path
from typing import Any, Sequence

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from rised_jax import parallel  # noqa: E402
from rised_jax.learn import batching, loss_terms, train_step as step_lib  # noqa: E402
from rised_jax.learn.flops import batch_forwards, student_layout_of  # noqa: E402
from rised_jax.model import ModelConfig, from_config  # noqa: E402

PAD_ID = 0
DEFAULT_MODELS = ("qwen3-2l-d128", "smollm2-135m")
# Rows per batch when --batch is not given: SmolLM2 at B = 8 takes over half a minute a step
# on 2 CPU cores.
DEFAULT_ROWS = {"smollm2-135m": 4}
FUSED_OVER_GRPO_TARGET = 1.35
MFU_TARGET = 0.5


def grpo_batch(vocab: int, rows: int, prompt_len: int, response_len: int, *, seed: int = 0,
               behaviour: bool = True, teacher: bool = False) -> dict[str, np.ndarray]:
  """A Batch-contract dict (rised_jax/types.py) of random GRPO rows.

  The recipe of the tunix driver's batch, drawn in the same order from
  `np.random.default_rng(seed)` so that the two steps see the same numbers: prompt ids in
  [3, V) with the first P // 8 columns left padding, response ids in [3, V) right-padded to a
  random length in [C // 2, C], one N(0, 1) advantage per row, old log-probs −|N(0, 1)| − 5.
  `behaviour` adds behaviour log-probs (equal to the old ones: the importance-weight path
  runs with w = 1); `teacher` adds teacher rows (another random prompt, same response) with a
  distill mask equal to the loss mask.
  """
  if prompt_len < 1 or response_len < 2 or rows < 1:
    raise ValueError(f"need rows >= 1, prompt_len >= 1 and response_len >= 2; got rows={rows}, "
                     f"prompt_len={prompt_len}, response_len={response_len}")
  rng = np.random.default_rng(seed)
  prompt = rng.integers(3, vocab, (rows, prompt_len)).astype(np.int32)
  prompt[:, :prompt_len // 8] = PAD_ID
  response = rng.integers(3, vocab, (rows, response_len)).astype(np.int32)
  lengths = rng.integers(response_len // 2, response_len + 1, (rows,))
  response[np.arange(response_len)[None, :] >= lengths[:, None]] = PAD_ID
  advantages = rng.standard_normal(rows).astype(np.float32)
  old = (-np.abs(rng.standard_normal((rows, response_len))) - 5.0).astype(np.float32)

  input_ids = np.concatenate([prompt, response], axis=1)
  response_mask = (response != PAD_ID).astype(np.float32)
  loss_mask = np.concatenate([np.zeros_like(prompt, np.float32), response_mask], axis=1)
  old_logprobs = np.concatenate([np.zeros_like(prompt, np.float32), old], axis=1) * loss_mask
  batch = {
      "input_ids": input_ids,
      "attention_mask": (input_ids != PAD_ID).astype(np.int32),
      "loss_mask": loss_mask,
      "advantages": advantages[:, None] * loss_mask,
      "old_logprobs": old_logprobs,
  }
  if behaviour:
    batch["behaviour_logprobs"] = old_logprobs.copy()
  if teacher:
    teacher_prompt = rng.integers(3, vocab, (rows, prompt_len)).astype(np.int32)
    teacher_prompt[:, :prompt_len // 4] = PAD_ID
    teacher_ids = np.concatenate([teacher_prompt, response], axis=1)
    batch.update(teacher_input_ids=teacher_ids,
                 teacher_attention_mask=(teacher_ids != PAD_ID).astype(np.int32),
                 distill_mask=loss_mask.copy())
  return batch


def bench_step(cfg: ModelConfig, config: step_lib.StepConfig,
               optimizer: step_lib.OptimizerConfig, batch: dict[str, np.ndarray], *,
               warmup: int, iters: int, matmul: dict[str, float],
               seed: int = 0, dtype: str = "float32", param_dtype: str | None = None
               ) -> dict[str, Any]:
  """Compiles and times one step config on one batch; returns the JSON record of the case.

  `matmul` is a `common.measure_matmul_rate` result, the denominator of the MFUs; `dtype`
  and `param_dtype` are the model's compute and parameter dtypes.
  """
  model = from_config(cfg, seed, dtype=dtype, param_dtype=param_dtype)
  trainable, state = step_lib.create(model, step_lib.make_optimizer(optimizer), config,
                                     parallel.make_mesh())
  device_batch = trainable.put_batch(batch)
  compiled, compile_s = common.compile_jitted(trainable.step, state, device_batch)
  memory = common.memory_report(compiled)
  xla_flops = common.xla_flops(compiled)

  carry = {"state": state}

  def one_step():
    carry["state"], metrics = compiled(carry["state"], device_batch)
    return carry["state"], metrics

  timing = common.time_calls(one_step, warmup, iters)
  _, metrics = one_step()
  loss = float(metrics["loss"])
  if not math.isfinite(loss):
    raise FloatingPointError(f"the step's loss is {loss}; the benchmark measured a broken step")

  rows, seq_len = batch["input_ids"].shape
  tokens = rows * seq_len
  flops = common.train_step_flops(
      cfg, rows, seq_len,
      teacher_forwards=batch_forwards(batch, ref_kl=False) if config.distills else 0.0,
      student_layout=student_layout_of(batch))
  median = timing.median_s
  achieved = flops["total"] / median
  return {
      "step_config": {"beta": config.teacher_kl.beta, "chunk": config.chunk,
                      "aggregation": config.policy_gradient.aggregation,
                      "importance_cap": config.policy_gradient.importance_cap,
                      "behaviour_logprobs": "behaviour_logprobs" in batch},
      "compile_s": compile_s,
      "step": timing.as_dict(),
      "tokens": tokens,
      "response_tokens": int(batch["loss_mask"].sum()),
      "tokens_per_s": tokens / median,
      "response_tokens_per_s": float(batch["loss_mask"].sum()) / median,
      "model_flops": flops,
      "xla_flops": xla_flops,
      "achieved_flops_per_s": achieved,
      "matmul": matmul,
      "mfu": common.limit_fraction(flops["total"], median, matmul["flops_per_s"]),
      "mfu_cpu_time": flops["total"] / timing.cpu_median_s / matmul["flops_per_cpu_s"],
      "memory": memory,
      "process_peak_rss_bytes": common.peak_rss_bytes(),
      "final_loss": loss,
  }


def bench_model(preset: str, args: argparse.Namespace) -> dict[str, Any]:
  cfg = common.model_config(preset)
  rows = args.batch or DEFAULT_ROWS.get(preset, 8)
  optimizer = step_lib.OptimizerConfig(learning_rate=args.lr)
  grpo = step_lib.StepConfig(policy_gradient=loss_terms.PolicyGradientConfig(
      aggregation="seq-mean-token-mean", eps_low=0.2, eps_high=0.2, importance_cap=2.0),
      chunk=args.chunk)
  fused = dataclasses.replace(grpo, teacher="live", teacher_kl=loss_terms.TeacherKLConfig(
      beta=args.beta, divergence="forward-kl"))
  batch = grpo_batch(cfg.vocab_size, rows, args.prompt_len, args.response_len, seed=args.seed,
                     teacher=True)
  idle = dict(batch, distill_mask=np.zeros_like(batch["distill_mask"]))
  cases = {}
  for name, config, case_batch in (("grpo", grpo, batch), ("fused", fused, batch),
                                   ("fused_idle", fused, idle),
                                   ("grpo_shared", grpo, grouped(batch, args.group_size,
                                                                 args.prompt_len))):
    print(f"[{preset}] {name}: compiling and timing ...", flush=True)
    # Measured next to each case: the load of a shared machine changes within a run.
    matmul = common.measure_matmul_rate(args.matmul_size, args.matmul_seconds)
    cases[name] = bench_step(cfg, config, optimizer, case_batch, warmup=args.warmup,
                             iters=args.iters, matmul=matmul, seed=args.seed)
  return {
      "model": preset,
      "config": common.MODEL_PRESETS[preset],
      "nonembedding_params": common.nonembedding_params(cfg),
      "batch": {"rows": rows, "prompt_len": args.prompt_len, "response_len": args.response_len,
                "seq_len": args.prompt_len + args.response_len},
      "cases": cases,
      "fused_over_grpo_step_time": cases["fused"]["step"]["median_s"]
                                   / cases["grpo"]["step"]["median_s"],
      "fused_over_grpo_cpu_time": cases["fused"]["step"]["cpu_median_s"]
                                  / cases["grpo"]["step"]["cpu_median_s"],
      "fused_idle_over_grpo_step_time": cases["fused_idle"]["step"]["median_s"]
                                        / cases["grpo"]["step"]["median_s"],
      "grpo_shared_over_grpo_step_time": cases["grpo_shared"]["step"]["median_s"]
                                         / cases["grpo"]["step"]["median_s"],
  }


def grouped(batch: dict[str, np.ndarray], group_size: int, prompt_len: int
            ) -> dict[str, np.ndarray]:
  """The GRPO rows (no teacher rows) with each group of `group_size` rows given its first
  row's prompt columns, and each group's prompt once (`prefix_ids`, `prefix_mask`)."""
  out = {k: v.copy() for k, v in batch.items() if not k.startswith(("teacher_", "distill"))}
  rows = out["input_ids"].shape[0]
  if rows % group_size:
    raise ValueError(f"--group-size {group_size} does not divide the batch's {rows} rows")
  first = np.arange(rows) // group_size * group_size
  for key in ("input_ids", "attention_mask"):
    out[key][:, :prompt_len] = out[key][first, :prompt_len]
  out.update(batching.group_prefixes(out["input_ids"], out["attention_mask"], prompt_len,
                                     group_size))
  return out


def print_table(models: Sequence[dict[str, Any]]) -> None:
  print(f"{'model':15s} {'case':10s} {'compile s':>9s} {'ms/step':>9s} {'cpu ms':>9s} {'tok/s':>9s} "
        f"{'GFLOP':>8s} {'XLA GFLOP':>9s} {'GFLOP/s':>8s} {'MFU':>6s} {'MFU(cpu)':>8s} "
        f"{'mm GF/s':>8s} {'total mem':>11s} "
        f"{'temp mem':>11s}")
  for model in models:
    for name, case in model["cases"].items():
      xla = case["xla_flops"]
      print(f"{model['model']:15s} {name:10s} {case['compile_s']:9.1f} "
            f"{case['step']['median_s'] * 1e3:9.1f} {case['step']['cpu_median_s'] * 1e3:9.1f} "
            f"{case['tokens_per_s']:9.0f} "
            f"{case['model_flops']['total'] / 1e9:8.2f} "
            f"{'n/a' if xla is None else f'{xla / 1e9:.2f}':>9s} "
            f"{case['achieved_flops_per_s'] / 1e9:8.2f} {case['mfu']:6.1%} "
            f"{case['mfu_cpu_time']:8.1%} {case['matmul']['flops_per_s'] / 1e9:8.1f} "
            f"{common.gib(case['memory']['total_bytes']):>11s} "
            f"{common.gib(case['memory']['temp_bytes']):>11s}")
    print(f"{model['model']:15s} fused/GRPO step time {model['fused_over_grpo_step_time']:.3f} "
          f"(CPU time {model['fused_over_grpo_cpu_time']:.3f}; target <= "
          f"{FUSED_OVER_GRPO_TARGET}); without distillation tokens "
          f"{model['fused_idle_over_grpo_step_time']:.3f}; GRPO with shared prompts "
          f"{model['grpo_shared_over_grpo_step_time']:.3f}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                      help=f"comma-separated presets from {sorted(common.MODEL_PRESETS)}")
  parser.add_argument("--batch", type=int, default=None,
                      help=f"rows per batch (default 8; {DEFAULT_ROWS} otherwise)")
  parser.add_argument("--prompt-len", type=int, default=64)
  parser.add_argument("--response-len", type=int, default=192)
  parser.add_argument("--chunk", type=int, default=256, help="StepConfig.chunk")
  parser.add_argument("--group-size", type=int, default=4,
                      help="rows per shared prompt in the grpo_shared case (G)")
  parser.add_argument("--beta", type=float, default=0.05, help="distillation weight (fused)")
  parser.add_argument("--lr", type=float, default=1e-6)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--iters", type=int, default=5)
  parser.add_argument("--matmul-size", type=int, default=2048)
  parser.add_argument("--matmul-seconds", type=float, default=1.0)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=str(common.RESULTS_DIR / "train_step.json"))
  args = parser.parse_args(argv)
  args.models = [m.strip() for m in args.models.split(",") if m.strip()]
  unknown = [m for m in args.models if m not in common.MODEL_PRESETS]
  if not args.models or unknown:
    parser.error(f"--models: unknown or no presets {unknown}; expected some of "
                 f"{sorted(common.MODEL_PRESETS)}")
  for key in ("prompt_len", "chunk", "iters", "matmul_size", "group_size"):
    if getattr(args, key) < 1:
      parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
  if args.batch is not None and args.batch < 1:
    parser.error(f"--batch must be >= 1, got {args.batch}")
  if args.response_len < 2:
    parser.error(f"--response-len must be >= 2, got {args.response_len}")
  if args.warmup < 0 or args.beta <= 0 or args.matmul_seconds < 0:
    parser.error(f"need --warmup >= 0, --beta > 0 and --matmul-seconds >= 0; got "
                 f"{args.warmup}, {args.beta}, {args.matmul_seconds}")
  return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  args = parse_args(argv)
  limits = common.probe_machine(args.matmul_size, args.matmul_seconds)
  models = [bench_model(preset, args) for preset in args.models]
  print_table(models)
  machine = common.machine_record(limits)
  result = {"benchmark": "train_step", "machine": machine, "args": vars(args),
            "targets": {"fused_over_grpo_step_time_max": FUSED_OVER_GRPO_TARGET,
                        "smollm2_mfu_min": MFU_TARGET},
            "models": models}
  path = common.write_json(args.out, result)
  print(f"load average {limits['load_average_before']} before, "
        f"{machine['load_average_after']} after; wrote {path}")
  return result


if __name__ == "__main__":
  main()
