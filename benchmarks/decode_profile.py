"""Where the in-process sampler's decode step spends its time, part by part, against the bytes
each part must read.

  JAX_PLATFORMS=cpu python3 benchmarks/decode_profile.py   # → benchmarks/results/decode_profile.json

The defaults are the main job's rollout shapes (experiments/configs/smollm2_cpu.py): SmolLM2-135M
(random weights: the values do not change the time), scanned layers, 32 rows, a 384-token
prompt bucket and 16 new tokens, so a 400-slot KV cache. Temperature 1, no truncation.

1. The decode step unprofiled: (t(N) − t(1)) / (N − 1), t(n) the wall time of a `generate`
   call making n tokens per row (t(1) is the prefill), medians of --repeats alternating pairs.
2. One `generate` call under `jax.profiler` (a Perfetto trace): every kernel of the compiled
   decode loop (`hlo_module` jit__decode_fn), summed per HLO op and divided by the N − 1
   decode steps traced. Each op is put in a part by its line in the decode function's optimized
   HLO (compiled again from the arguments the engine passed it):

     weight dots      dot_general of the dense layers (q, k, v, o, gate, up, down)
     head             the dot whose result is [rows, vocabulary]
     attention dots   the q·k and p·v einsums over the cache
     cache slices     a layer's keys or values copied out of the stacked [L, ...] cache
                      (scanned layers; unrolled layers keep one array each)
     weight slices    a layer's parameters copied out of the stacked parameters (scanned)
     cache writes     the new column written into the cache (the stack or a layer's array)
     rest             softmax, norms, RoPE, sampling, bookkeeping

3. Per part, the bytes it must read at least once per step (the dense layers' weights, the
   embedding for the head, the filled K/V cache for the attention, nothing for the copies)
   over the read bandwidth probed in this process (`common.probe_machine`): the part's bound,
   and the step's bound as their sum (the least traffic `flops.decode_read_bytes` counts).

Profiled kernels run slower than unprofiled ones and two of them can overlap, so the parts'
sum is not the unprofiled step; the table gives each part's share of the profiled sum.
Prints the table and writes JSON.
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks import common  # noqa: E402
from rised_jax.learn.flops import decode_read_bytes  # noqa: E402
from rised_jax.model import from_config  # noqa: E402
from rised_jax.model.config import ModelConfig  # noqa: E402
from rised_jax.rollout.base import GenerationRequest, SamplingParams  # noqa: E402
from rised_jax.rollout.jax_engine import JaxEngine  # noqa: E402

PARTS = ("weight dots", "head", "attention dots", "cache slices", "weight slices",
         "cache writes", "rest")
_ATTENTION_EINSUMS = ("bkgtd,bkds->bkgts", "bkgts,bksd->bkgtd")
# `%name = shape opcode(...)`; a multi-output op's shape is a tuple "(f32[..], s32[..])".
_HLO_LINE = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.*?) [a-z][\w-]*\(.*$", re.M)
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def op_parts(hlo_text: str, vocab_size: int, cache_shapes: Sequence[tuple[int, ...]]
             ) -> dict[str, str]:
  """The part (`PARTS`) of every op in an optimized HLO module, from its op_name metadata (the
  JAX primitive it came from) and its result shape: the head is the dot whose result's last
  axis is the vocabulary, a cache slice a dynamic slice of a layer's keys or values."""
  parts = {}
  for line in _HLO_LINE.finditer(hlo_text):
    name, shape = line.group(1), line.group(2)
    found = _OP_NAME.search(line.group(0))
    source = found.group(1) if found else ""
    dims = tuple(int(d) for d in re.findall(r"\d+", shape.split("{")[0].split("[", 1)[-1]))
    if source.endswith("dot_general"):
      if any(spec in source for spec in _ATTENTION_EINSUMS):
        parts[name] = "attention dots"
      elif dims and dims[-1] == vocab_size:
        parts[name] = "head"
      else:
        parts[name] = "weight dots"
    elif source.endswith("dynamic_slice"):
      parts[name] = "cache slices" if dims in cache_shapes else "weight slices"
    elif source.endswith("dynamic_update_slice") and (len(dims) == 5 or dims in cache_shapes):
      parts[name] = "cache writes"
    else:
      parts[name] = "rest"
  return parts


def trace_kernels(trace_dir: str, module: str) -> tuple[dict[str, float], dict[str, int]]:
  """Seconds and launches per HLO op of `module`'s kernels in a Perfetto trace."""
  path = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)
  if len(path) != 1:
    raise RuntimeError(f"expected one Perfetto trace under {trace_dir}, found {path}")
  seconds: dict[str, float] = collections.Counter()
  launches: dict[str, int] = collections.Counter()
  for event in json.load(gzip.open(path[0]))["traceEvents"]:
    args = event.get("args", {})
    if event.get("ph") == "X" and args.get("hlo_module") == module and "hlo_op" in args:
      seconds[args["hlo_op"]] += event["dur"] * 1e-6
      launches[args["hlo_op"]] += 1
  return dict(seconds), dict(launches)


def read_bytes(cfg: ModelConfig, model: Any, rows: int, prompt_len: int, new_tokens: int
               ) -> dict[str, float]:
  """What each part must read per decode step, on average over the call's new_tokens − 1
  decode steps: the dense layers' parameters, the head's kernel (the embedding when tied; an
  untied model's embedding lookup reads only the rows' ids), and each row's filled keys and
  values (float32). Decode step j (1 .. new_tokens − 1; the prefill drew token 0) attends over
  prompt_len + j slots, so the cache part is `flops.decode_read_bytes` of those steps, weights
  left out, over their count; the bucket's unfilled slots the decode also reads are excess."""
  params = {jax.tree_util.keystr(path): leaf.nbytes
            for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model))}
  kernel = "embed" if cfg.tie_word_embeddings else "lm_head"
  head = sum(b for name, b in params.items() if kernel in name)
  layers = sum(b for name, b in params.items() if "layers" in name)
  steps = new_tokens - 1
  cache = decode_read_bytes(cfg, 0, rows, prompt_len + 1, steps, itemsize=4) / steps
  return {"weight dots": layers, "head": head, "attention dots": cache}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="smollm2-135m", help="a benchmarks/common.py preset")
  parser.add_argument("--rows", type=int, default=32)
  parser.add_argument("--prompt-len", type=int, default=384)
  parser.add_argument("--new-tokens", type=int, default=16)
  parser.add_argument("--layers", choices=["scanned", "unrolled"], default="scanned")
  parser.add_argument("--repeats", type=int, default=3, help="unprofiled pairs of calls")
  parser.add_argument("--matmul-size", type=int, default=1024, help="the probe's matmul side")
  parser.add_argument("--matmul-seconds", type=float, default=1.0, help="the probe's duration")
  parser.add_argument("--out", default=str(common.RESULTS_DIR / "decode_profile.json"))
  args = parser.parse_args(argv)
  if args.new_tokens < 2 or args.rows < 1 or args.prompt_len < 1 or args.repeats < 1:
    parser.error("--new-tokens must be >= 2 and --rows, --prompt-len, --repeats >= 1")
  start = time.perf_counter()
  cfg = common.model_config(args.model)
  widths = {cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim,
            cfg.num_kv_heads * cfg.head_dim}
  if cfg.vocab_size in widths:
    parser.error(f"--model {args.model}: a layer's output width equals the vocabulary "
                 f"({cfg.vocab_size}), so the head's dot cannot be told from the layers' by its "
                 "result shape")
  limits = common.probe_machine(args.matmul_size, args.matmul_seconds)
  model = from_config(cfg, 0, dtype="float32", param_dtype="float32",
                      scan_layers=args.layers == "scanned")
  engine = JaxEngine(model, max_batch=args.rows, prompt_buckets=(args.prompt_len,),
                     max_new_tokens_buckets=(args.new_tokens,))
  decode_hlo = common.record_decode_hlo(engine)
  prompts = np.random.default_rng(0).integers(3, cfg.vocab_size, (args.rows, args.prompt_len))

  def generate(new_tokens: int) -> float:
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
    begin = time.perf_counter()
    results = engine.generate([GenerationRequest(row.tolist(), params) for row in prompts])
    if any(len(r.output_ids) != new_tokens for r in results):
      raise RuntimeError(f"a row ended before its {new_tokens} tokens (no stop token was set)")
    return time.perf_counter() - begin

  generate(args.new_tokens)   # compiles the prefill and the decode loop
  generate(1)
  times: dict[int, list[float]] = {args.new_tokens: [], 1: []}
  for _ in range(args.repeats):
    for n in times:
      times[n].append(generate(n))
  steps = args.new_tokens - 1
  step_s = (np.median(times[args.new_tokens]) - np.median(times[1])) / steps

  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      generate(args.new_tokens)
    seconds, launches = trace_kernels(trace_dir, "jit__decode_fn")
  if not seconds:
    raise RuntimeError("the profiler's trace holds no kernel of jit__decode_fn")
  hlo = decode_hlo()
  slots = args.prompt_len + args.new_tokens
  # A layer's keys and values: a slice of the stack, or an unrolled layer's own arrays
  # (without the KV-head axis when there is one, `decoder.LayerCache`).
  heads = () if cfg.num_kv_heads == 1 and args.layers == "unrolled" else (cfg.num_kv_heads,)
  parts_of = op_parts(hlo, cfg.vocab_size, [(args.rows, *heads, cfg.head_dim, slots),
                                            (args.rows, *heads, slots, cfg.head_dim)])
  unknown = sorted(set(seconds) - set(parts_of))
  if unknown:
    raise RuntimeError(f"traced decode kernels not in the decode module's HLO: {unknown[:5]}")
  part_s = dict.fromkeys(PARTS, 0.0)
  part_launches = dict.fromkeys(PARTS, 0)
  for op, s in seconds.items():
    part_s[parts_of[op]] += s / steps
    part_launches[parts_of[op]] += launches[op]
  profiled_s = sum(part_s.values())
  must_read = read_bytes(cfg, model, args.rows, args.prompt_len, args.new_tokens)
  rate = limits["read_bytes_per_s"]
  table = {part: {"profiled_s": part_s[part], "share": part_s[part] / profiled_s,
                  "launches_per_step": part_launches[part] / steps,
                  "read_bytes": must_read.get(part, 0),
                  "bound_s": must_read.get(part, 0) / rate} for part in PARTS}
  bound_s = sum(row["bound_s"] for row in table.values())
  print(f"{args.model}, {args.layers} layers, {args.rows} rows x {slots} slots: decode step "
        f"{step_s * 1e3:.1f} ms unprofiled; bandwidth bound {bound_s * 1e3:.1f} ms "
        f"({bound_s / step_s:.1%} of it reached); {profiled_s * 1e3:.1f} ms profiled")
  print(f"{'part':16s} {'ms':>8s} {'share':>7s} {'kernels':>8s} {'MB read':>9s} {'bound ms':>9s}")
  for part, row in table.items():
    print(f"{part:16s} {row['profiled_s'] * 1e3:8.2f} {row['share']:7.1%} "
          f"{row['launches_per_step']:8.1f} {row['read_bytes'] / 1e6:9.1f} "
          f"{row['bound_s'] * 1e3:9.2f}")
  payload = {"args": vars(args), "model": args.model, "slots": slots,
             "decode_step_s": step_s, "generate_s": {str(n): t for n, t in times.items()},
             "bandwidth_bound_s": bound_s, "bound_over_step": bound_s / step_s,
             "profiled_step_s": profiled_s, "parts": table,
             "seconds": time.perf_counter() - start, "machine": common.machine_record(limits)}
  print(f"wrote {common.write_json(args.out, payload)}")
  return payload


if __name__ == "__main__":
  main()
