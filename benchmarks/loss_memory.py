"""Peak memory of the chunked fused loss + gradient against a naive full-logits version.

  JAX_PLATFORMS=cpu python3 benchmarks/loss_memory.py   # → benchmarks/results/loss_memory.json

The loss is the fused step's head: from student and teacher final hidden states [B, T, D]
and an unembedding W [D, V], the student's log-prob of each target, its entropy and the
forward KL(p_T ‖ p_S) over the full vocabulary; then the clipped policy-gradient loss
(seq-mean-token-mean) plus β · the mean KL over the loss tokens. Gradients are taken with
respect to the student hidden states and W (what flows back into the model).

  chunked  `rised_jax.learn.chunked.token_stats_chunked` (what the train step uses): logits
           for `chunk` positions at a time inside a rematerialised `lax.scan`.
  naive    the same statistics from log_softmax over full [B, T − 1, V] logits.

Memory is each compiled executable's `temp_bytes` (XLA's scratch buffers: the peak working
set beyond inputs and outputs), the "peak loss memory" of the ratio; `total_bytes` adds
inputs and outputs (common.memory_report). Both are compile-time figures: nothing is run to
get them. The chunked version is then run once to show it fits (time and the process's RSS
high-water mark); the naive one is run only if its estimate is below --naive-run-limit-gib,
and otherwise reported as an estimate only. Before the large case both versions are run at
a small size (--check-*) and must agree in loss and gradients.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from rised_jax.learn import chunked, losses  # noqa: E402

Array = jax.Array
QWEN_VOCAB = 151_936
RATIO_TARGET = 5.0


def _objective(logprob: Array, divergence: Array, inputs: dict[str, Array],
               beta: float) -> Array:
  """Clipped PG (seq-mean-token-mean) + β · mean forward KL over the loss tokens."""
  mask = inputs["loss_mask"]
  pg = losses.clipped_policy_gradient(logprob, inputs["old_logprobs"], inputs["advantages"],
                                      mask, eps_low=0.2, eps_high=0.2)
  pg_sum, pg_den = losses.seq_mean_token_mean(pg.loss, mask)
  distill = (divergence * mask).sum() / jnp.maximum(mask.sum(), 1.0)
  return pg_sum / jnp.maximum(pg_den, 1.0) + beta * distill


def chunked_loss(unembed: Array, student_hidden: Array, inputs: dict[str, Array], *,
                 chunk: int, beta: float) -> tuple[Array, Array]:
  """(loss, entropy sum) with per-token statistics formed `chunk` positions at a time."""
  stats = chunked.token_stats_chunked(
      student_hidden, inputs["teacher_hidden"], lambda h: h @ unembed, inputs["targets"],
      chunk=chunk, divergence="forward-kl")
  return (_objective(stats.logprob, stats.divergence, inputs, beta),
          (stats.entropy * inputs["loss_mask"]).sum())


def naive_loss(unembed: Array, student_hidden: Array, inputs: dict[str, Array], *,
               beta: float) -> tuple[Array, Array]:
  """The same as `chunked_loss` from full [B, T − 1, V] logits (target-column aligned)."""
  student_logp = jax.nn.log_softmax(student_hidden[:, :-1] @ unembed, axis=-1)
  teacher_logp = jax.lax.stop_gradient(
      jax.nn.log_softmax(inputs["teacher_hidden"][:, :-1] @ unembed, axis=-1))
  targets = inputs["targets"][:, 1:]
  logprob = jnp.take_along_axis(student_logp, targets[..., None], axis=-1)[..., 0]
  entropy = -(jnp.exp(student_logp) * student_logp).sum(-1)
  divergence = losses.forward_kl(student_logp, teacher_logp)
  to_columns = lambda x: jnp.pad(x, [(0, 0), (1, 0)])  # noqa: E731 - column 0 is never predicted
  return (_objective(to_columns(logprob), to_columns(divergence), inputs, beta),
          (to_columns(entropy) * inputs["loss_mask"]).sum())


def loss_and_grad(loss_fn: Callable[..., tuple[Array, Array]]) -> Callable[..., Any]:
  """jit(value_and_grad) w.r.t. the unembedding and the student hidden states."""
  return jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True))


def make_inputs(rows: int, seq_len: int, hidden: int, vocab: int,
                seed: int = 0) -> tuple[Array, Array, dict[str, Array]]:
  """Random (unembedding, student hidden, other inputs); the last quarter of columns is
  prompt (no loss) so that the masks matter."""
  rng = np.random.default_rng(seed)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
  loss_mask = np.ones((rows, seq_len), np.float32)
  loss_mask[:, :seq_len // 4] = 0.0
  inputs = {
      "teacher_hidden": normal(rows, seq_len, hidden),
      "targets": jnp.asarray(rng.integers(0, vocab, (rows, seq_len)), jnp.int32),
      "loss_mask": jnp.asarray(loss_mask),
      "advantages": jnp.asarray(np.repeat(rng.standard_normal((rows, 1)), seq_len, 1)
                                * loss_mask, jnp.float32),
      "old_logprobs": jnp.asarray(-np.abs(rng.standard_normal((rows, seq_len))) * 3 * loss_mask,
                                  jnp.float32),
  }
  # Small weights keep the logits O(1), as a trained model's are, so the PG ratios are sane.
  return normal(hidden, vocab) * hidden**-0.5, normal(rows, seq_len, hidden), inputs


def abstract(tree: Any) -> Any:
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def abstract_inputs(rows: int, seq_len: int, hidden: int, vocab: int) -> tuple[Any, Any, Any]:
  """Shapes and dtypes of `make_inputs` without allocating anything."""
  f32, i32 = jnp.float32, jnp.int32
  shape = lambda *s, dtype=f32: jax.ShapeDtypeStruct(s, dtype)  # noqa: E731
  bt = (rows, seq_len)
  return (shape(hidden, vocab), shape(rows, seq_len, hidden),
          {"teacher_hidden": shape(rows, seq_len, hidden), "targets": shape(*bt, dtype=i32),
           "loss_mask": shape(*bt), "advantages": shape(*bt), "old_logprobs": shape(*bt)})


def check_agreement(rows: int, seq_len: int, hidden: int, vocab: int, chunk: int,
                    beta: float) -> dict[str, float]:
  """Runs both versions at a small size; returns the largest differences (raises if large)."""
  unembed, student_hidden, inputs = make_inputs(rows, seq_len, hidden, vocab, seed=1)
  (c_loss, c_entropy), c_grads = loss_and_grad(
      lambda w, h, i: chunked_loss(w, h, i, chunk=chunk, beta=beta))(unembed, student_hidden,
                                                                     inputs)
  (n_loss, n_entropy), n_grads = loss_and_grad(
      lambda w, h, i: naive_loss(w, h, i, beta=beta))(unembed, student_hidden, inputs)
  diffs = {
      "loss": abs(float(c_loss) - float(n_loss)),
      "entropy_sum_rel": abs(float(c_entropy) - float(n_entropy)) / abs(float(n_entropy)),
      "grad_unembed": float(jnp.abs(c_grads[0] - n_grads[0]).max()),
      "grad_hidden": float(jnp.abs(c_grads[1] - n_grads[1]).max()),
      "grad_scale": float(max(jnp.abs(n_grads[0]).max(), jnp.abs(n_grads[1]).max())),
      "loss_value": float(n_loss),
  }
  tolerance = 1e-4 * max(1.0, diffs["grad_scale"])
  if max(diffs["loss"], diffs["grad_unembed"], diffs["grad_hidden"]) > tolerance:
    raise AssertionError(f"chunked and naive losses disagree at the check size: {diffs}")
  return diffs


def compiled_memory(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, dict[str, Any]]:
  compiled, compile_s = common.compile_jitted(fn, *args)
  return compiled, {"compile_s": compile_s, **common.memory_report(compiled)}


def run_once(compiled: Any, args: tuple[Any, ...]) -> dict[str, Any]:
  """Runs a compiled loss once on real inputs; time and the process's RSS high-water mark."""
  rss_before = common.peak_rss_bytes()
  start = time.perf_counter()
  (loss, _), _ = jax.block_until_ready(compiled(*args))
  return {"ran": True, "run_s": time.perf_counter() - start, "loss": float(loss),
          "process_peak_rss_bytes_before": rss_before,
          "process_peak_rss_bytes_after": common.peak_rss_bytes()}


def available_memory_bytes() -> int:
  """MemAvailable from /proc/meminfo (Linux); 0 if unknown."""
  try:
    for line in Path("/proc/meminfo").read_text().splitlines():
      if line.startswith("MemAvailable:"):
        return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--seq-len", type=int, default=4096)
  parser.add_argument("--hidden", type=int, default=64)
  parser.add_argument("--vocab", type=int, default=QWEN_VOCAB)
  parser.add_argument("--chunk", type=int, default=256)
  parser.add_argument("--beta", type=float, default=0.05)
  parser.add_argument("--check-batch", type=int, default=2)
  parser.add_argument("--check-seq-len", type=int, default=40)
  parser.add_argument("--check-vocab", type=int, default=1000)
  parser.add_argument("--check-chunk", type=int, default=16)
  parser.add_argument("--naive-run-limit-gib", type=float, default=None,
                      help="run the naive version only if its total_bytes estimate is below "
                           "this (default: a quarter of MemAvailable)")
  parser.add_argument("--skip-chunked-run", action="store_true",
                      help="compile only (memory estimates without running the large case)")
  parser.add_argument("--out", default=str(common.RESULTS_DIR / "loss_memory.json"))
  args = parser.parse_args(argv)
  for key in ("batch", "hidden", "vocab", "chunk", "check_batch", "check_vocab", "check_chunk"):
    if getattr(args, key) < 1:
      parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
  for key in ("seq_len", "check_seq_len"):
    if getattr(args, key) < 4:
      parser.error(f"--{key.replace('_', '-')} must be >= 4, got {getattr(args, key)}")
  if args.beta < 0:
    parser.error(f"--beta must be >= 0, got {args.beta}")
  return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  args = parse_args(argv)
  machine = common.machine_info()
  agreement = check_agreement(args.check_batch, args.check_seq_len, args.hidden,
                              args.check_vocab, args.check_chunk, args.beta)
  print(f"check (B={args.check_batch}, T={args.check_seq_len}, V={args.check_vocab}): chunked "
        f"= naive, max |Δ| loss {agreement['loss']:.2e}, grads {agreement['grad_unembed']:.2e} "
        f"/ {agreement['grad_hidden']:.2e}", flush=True)

  shapes = abstract_inputs(args.batch, args.seq_len, args.hidden, args.vocab)
  chunked_fn = loss_and_grad(lambda w, h, i: chunked_loss(w, h, i, chunk=args.chunk,
                                                          beta=args.beta))
  naive_fn = loss_and_grad(lambda w, h, i: naive_loss(w, h, i, beta=args.beta))
  chunked_compiled, chunked_report = compiled_memory(chunked_fn, shapes)
  naive_compiled, naive_report = compiled_memory(naive_fn, shapes)
  full_logits_bytes = args.batch * (args.seq_len - 1) * args.vocab * 4

  limit = (args.naive_run_limit_gib * 2**30 if args.naive_run_limit_gib is not None
           else available_memory_bytes() / 4)
  real_inputs = None
  if not args.skip_chunked_run:
    real_inputs = make_inputs(args.batch, args.seq_len, args.hidden, args.vocab)
    print("running the chunked version once ...", flush=True)
    chunked_report.update(run_once(chunked_compiled, real_inputs))
  else:
    chunked_report["ran"] = False
  if real_inputs is not None and naive_report["total_bytes"] < limit:
    print("running the naive version once ...", flush=True)
    naive_report.update(run_once(naive_compiled, real_inputs))
  else:
    naive_report["ran"] = False
    naive_report["not_run_because"] = (
        f"its estimate ({common.gib(naive_report['total_bytes'])}) is not below the run limit "
        f"({common.gib(limit)})" if real_inputs is not None else "--skip-chunked-run")

  ratio_temp = naive_report["temp_bytes"] / chunked_report["temp_bytes"]
  ratio_total = naive_report["total_bytes"] / chunked_report["total_bytes"]
  print(f"B={args.batch} T={args.seq_len} D={args.hidden} V={args.vocab} chunk={args.chunk}; "
        f"one [B, T-1, V] float32 array = {common.gib(full_logits_bytes)}")
  for name, report in (("chunked", chunked_report), ("naive", naive_report)):
    ran = (f"ran in {report['run_s']:.1f} s" if report["ran"]
           else f"not run ({report['not_run_because']})" if "not_run_because" in report
           else "not run")
    print(f"  {name:8s} temp {common.gib(report['temp_bytes']):>12s}  total "
          f"{common.gib(report['total_bytes']):>12s}  compile {report['compile_s']:.1f} s  {ran}")
  print(f"naive / chunked: temp {ratio_temp:.1f}x, total {ratio_total:.1f}x "
        f"(target >= {RATIO_TARGET}x)")
  result = {"benchmark": "loss_memory", "machine": machine, "args": vars(args),
            "reported_memory": "temp_bytes of memory_analysis() (compile-time estimate)",
            "full_logits_bytes": full_logits_bytes, "check": agreement,
            "chunked": chunked_report, "naive": naive_report,
            "naive_over_chunked_temp": ratio_temp, "naive_over_chunked_total": ratio_total,
            "target_ratio_min": RATIO_TARGET}
  path = common.write_json(args.out, result)
  print(f"load average {machine['load_average_1_5_15']} at start; wrote {path}")
  return result


if __name__ == "__main__":
  main()
