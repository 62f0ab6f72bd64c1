"""Accelerator check: is the model right on this device, and how fast is it? One run, JSON out.

  benchmarks/device_check.sh [--out FILE]     # one GPU (or TPU chip); < 8 min on an H100/H200
  benchmarks/device_check.sh --dry-run        # CPU, tiny shapes, seconds (what CI runs)

Three parts, in this order (each timed; `ok` is false, and the exit status 1, when a check
fails or a number is not finite):

  parity   a tiny random Qwen3 (fp32, highest matmul precision) on the device against an
           independent reference: transformers (torch, CPU) when it is installed (the test
           extra), otherwise the same weights on JAX's CPU backend; max |Δlogit| <= 1e-4.
  step     the fused train step (GRPO + forward-KL distillation, chunked loss) on the
           Qwen3-0.6B architecture, random weights, bf16 compute over fp32 master weights:
           median step time, model FLOPs (common.train_step_flops), MFU against the bf16
           matmul rate measured on the same device just before (common.measure_matmul_rate),
           compiled memory (common.memory_report) and the device's measured peak
           (`device.memory_stats()["peak_bytes_in_use"]`; null where the backend has none,
           e.g. CPU).
  decode   the in-process sampler (JaxEngine, greedy) on the same model: decode tokens/s and
           bytes read per decode step (weights + KV cache) against the device's read
           bandwidth, measured by a jitted reduction over a large array (benchmarks/common.py);
           greedy tokens must equal cache-free decoding's.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARITY_ATOL = 1e-4
# The full run (one accelerator: Qwen3-0.6B, 8 rows of 256 + 768 columns, a teacher row each)
# and the CPU dry run. rows/prompt/response: the step's batch; matmul: the side of the bf16
# matmul that measures the peak rate; decode_*: the sampler's batch, prompt and new tokens.
SHAPES = {
    "device": dict(model="qwen3-0.6b", rows=8, prompt=256, response=768, chunk=512, warmup=2,
                   iters=5, matmul=8192, decode_batch=32, decode_prompt=256, new_tokens=64,
                   bandwidth_mib=4096),
    "dry_run": dict(model="qwen3-2l-d128", rows=2, prompt=8, response=16, chunk=32, warmup=1,
                    iters=2, matmul=128, decode_batch=2, decode_prompt=8, new_tokens=4,
                    bandwidth_mib=8),
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--dry-run", action="store_true",
                      help="CPU, tiny shapes: every code path in seconds")
  parser.add_argument("--out", default=None,
                      help="JSON result (default benchmarks/results/device_check[_dry_run].json)")
  return parser.parse_args(argv)


def timed(seconds: dict[str, float], name: str, fn: Callable[[], Any]) -> Any:
  start = time.perf_counter()
  try:
    return fn()
  finally:
    seconds[name] = time.perf_counter() - start


def parity(device) -> dict[str, Any]:
  """A tiny random Qwen3's logits on `device` against transformers or the CPU backend."""
  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  from flax import nnx  # noqa: PLC0415
  from tests.helpers import model_utils  # noqa: PLC0415 - the parity tests' reference helpers

  config = model_utils.TINY_CONFIGS["qwen3_untied"]
  rows = np.asarray(model_utils.random_rows((12, 12), seed=4), np.int32)
  forward = nnx.jit(lambda model, ids: model(ids))
  try:
    import torch  # noqa: PLC0415,F401
    hf = model_utils.hf_model(config, seed=3)
    reference = np.stack([model_utils.hf_logits(hf, row) for row in rows])
    ours, source = model_utils.decoder_from_hf(hf), "transformers (torch, CPU, fp32)"
  except ImportError:
    ours = model_utils.random_decoder(
        model_utils.ModelConfig.from_hf(config, source="tiny qwen3"), seed=3)
    with jax.default_device(jax.devices("cpu")[0]), jax.default_matmul_precision("highest"):
      reference = np.asarray(forward(ours, rows))
    source = "the same weights on JAX's CPU backend"
  with jax.default_device(device), jax.default_matmul_precision("highest"):
    on_device = jax.device_put(nnx.state(ours), device)
    nnx.update(ours, on_device)
    logits = np.asarray(forward(ours, jax.device_put(rows, device)))
  diff = float(np.abs(logits - reference).max())
  return {"reference": source, "model": "tiny qwen3 (tests/helpers/model_utils.py qwen3_untied)",
          "rows": list(rows.shape), "max_abs_diff": diff, "atol": PARITY_ATOL,
          "ok": bool(np.isfinite(logits).all() and diff <= PARITY_ATOL)}


def train_step(shape: dict[str, Any], device) -> dict[str, Any]:
  """The bf16-compute fused step on the preset's architecture (random weights)."""
  import jax.numpy as jnp  # noqa: PLC0415
  from benchmarks import common  # noqa: PLC0415
  from benchmarks import train_step as bench  # noqa: PLC0415
  from rised_jax.learn import loss_terms, train_step as step_lib  # noqa: PLC0415

  cfg = common.model_config(shape["model"])
  matmul = common.measure_matmul_rate(shape["matmul"], min_seconds=1.0, dtype=jnp.bfloat16)
  batch = bench.grpo_batch(cfg.vocab_size, shape["rows"], shape["prompt"], shape["response"],
                           teacher=True)
  config = step_lib.StepConfig(teacher_kl=loss_terms.TeacherKLConfig(beta=0.05),
                               policy_gradient=loss_terms.PolicyGradientConfig(
                                   importance_cap=2.0), chunk=shape["chunk"])
  optimizer = step_lib.OptimizerConfig(learning_rate=1e-6)
  result = bench.bench_step(cfg, config, optimizer, batch, warmup=shape["warmup"],
                            iters=shape["iters"], matmul=matmul, dtype="bfloat16",
                            param_dtype="float32")
  stats = device.memory_stats() or {}
  result.update(model=shape["model"], compute_dtype="bfloat16", param_dtype="float32",
                matmul_dtype="bfloat16",
                device_peak_bytes_in_use=stats.get("peak_bytes_in_use"),
                device_bytes_limit=stats.get("bytes_limit"))
  result["ok"] = all(math.isfinite(result[k]) for k in ("mfu", "final_loss", "tokens_per_s"))
  return result


def decode(shape: dict[str, Any]) -> dict[str, Any]:
  """Sampler decode tokens/s on the preset's architecture against the read bandwidth."""
  from benchmarks import common  # noqa: PLC0415
  from benchmarks import sampler  # noqa: PLC0415
  from rised_jax.model import from_config  # noqa: PLC0415

  bandwidth = common.measure_bandwidth(shape["bandwidth_mib"], repeats=5)
  model = from_config(common.model_config(shape["model"]), 0, dtype="bfloat16")
  args = argparse.Namespace(batch=shape["decode_batch"], prompt_len=shape["decode_prompt"],
                            new_tokens=shape["new_tokens"], repeats=3, naive_repeats=1)
  result = sampler.bench_model(shape["model"], model, args, bandwidth)
  result.update(measured_read_bytes_per_s=bandwidth, bandwidth_array_mib=shape["bandwidth_mib"],
                dtype="bfloat16")
  result["ok"] = bool(result["greedy_tokens_agree"] and result["cached_decode_step_s"] > 0
                      and math.isfinite(result["cached_decode_tokens_per_s"]))
  return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  args = parse_args(argv)
  if args.dry_run:
    os.environ["JAX_PLATFORMS"] = "cpu"
  else:
    # The other benchmark modules default JAX to the CPU; here every backend is wanted.
    os.environ.setdefault("JAX_PLATFORMS", "")
  import jax  # noqa: PLC0415
  from benchmarks import common  # noqa: PLC0415

  device = jax.devices()[0]
  if not args.dry_run and device.platform == "cpu":
    sys.exit("device_check: JAX sees no accelerator (jax.devices() are CPU devices); run with "
             "--dry-run on a CPU machine")
  shape = SHAPES["dry_run" if args.dry_run else "device"]
  seconds: dict[str, float] = {}
  result: dict[str, Any] = {"benchmark": "device_check", "dry_run": args.dry_run,
                            "machine": common.machine_info(), "shapes": shape,
                            "seconds": seconds}
  result["parity"] = timed(seconds, "parity", lambda: parity(device))
  result["train_step"] = timed(seconds, "train_step", lambda: train_step(shape, device))
  result["decode"] = timed(seconds, "decode", lambda: decode(shape))
  seconds["total"] = sum(seconds.values())
  result["ok"] = all(result[part]["ok"] for part in ("parity", "train_step", "decode"))
  out = args.out or common.RESULTS_DIR / (
      "device_check_dry_run.json" if args.dry_run else "device_check.json")
  path = common.write_json(out, result)
  step, dec = result["train_step"], result["decode"]
  peak = step["device_peak_bytes_in_use"]
  print(f"{device.device_kind}: parity max |dlogit| {result['parity']['max_abs_diff']:.2e} "
        f"vs {result['parity']['reference']}; step {step['step']['median_s'] * 1e3:.1f} ms, "
        f"MFU {step['mfu']:.1%} of a measured {step['matmul']['flops_per_s'] / 1e12:.1f} "
        f"TFLOP/s bf16, peak {'n/a' if peak is None else common.gib(peak)}; decode "
        f"{dec['cached_decode_tokens_per_s']:.0f} tok/s, "
        f"{dec['fraction_of_measured_bandwidth']:.1%} of a measured "
        f"{dec['measured_read_bytes_per_s'] / 1e9:.0f} GB/s; {seconds['total']:.0f} s; "
        f"{'ok' if result['ok'] else 'FAILED'}; wrote {path}")
  if not result["ok"]:
    sys.exit(1)
  return result


if __name__ == "__main__":
  main()
