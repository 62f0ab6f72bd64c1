"""Shared helpers of the benchmarks: timing, compiled-program statistics, the machine's limits
(matmul rate and memory bandwidth, `probe_machine`), analytic model FLOPs, model presets and
JSON output.

Conventions (see benchmarks/README.md):
- Compile time is measured apart (`compile_jitted`: lower + compile, nothing run).
- A step time is the median of `iters` calls after `warmup` calls, each blocked until ready.
- Memory is the compiled executable's `memory_analysis()`; `memory_report` names its parts.
- Every benchmark probes the machine in its own process (`probe_machine`: fp32 matmul rate,
  read and copy bandwidth, the load average before) and records it with the load average after
  (`machine_record`), so a time can be read as a fraction of the machine's limits
  (`flops.limit_fraction`) on any machine, and a shared machine's load is on record.
- Model FLOPs are counted analytically (`decoder_flops`); XLA's `cost_analysis()` is printed
  beside them as a cross-check only, because XLA counts the body of a `while` loop (a
  `lax.scan`, e.g. the chunked loss) once, whatever its trip count.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import platform
import re
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np

import jax.numpy as jnp

from rised_jax.learn.flops import (decode_read_bytes, decoder_forward_flops,  # noqa: F401
                                   limit_fraction, measure_matmul_rate, nonembedding_params,
                                   train_step_flops)
from rised_jax import stats
from rised_jax.model import ModelConfig


def per_round_median(ratios: Sequence[float]) -> dict[str, float] | None:
  """The median of per-round ratios (each round's two sides ran back to back, so the
  machine's drift between rounds cancels within a round) with its order-statistic interval
  (`stats.median_interval`), as a JSON dict; None under two rounds."""
  return stats.median_interval(ratios)._asdict() if len(ratios) >= 2 else None


def per_round_text(median: dict[str, float]) -> str:
  """`per_round_median`'s dict as one line of a benchmark's printout."""
  return (f"per round median {median['median']:.2f}x, [{median['low']:.2f}, "
          f"{median['high']:.2f}] covers it with probability {median['coverage']:.3f} "
          "(order statistics)")


def load_config(spec: str):
  """`path[:arg]` as rised-train's --config reads it: the file's get_config(arg)."""
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location(Path(path).stem, path)
  if module_spec is None:
    raise ValueError(f"--config {spec}: {path} is not a Python file")
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"

# Random-weight architectures (timing does not depend on the weights). The tiny Qwen3s are
# the defaults of the tunix driver (benchmarks/peers/tunix_grpo_bench.py): tied, fp32.
_TINY_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 512,
    "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "rms_norm_eps": 1e-6, "rope_theta": 10_000.0, "tie_word_embeddings": True,
    "max_position_embeddings": 4096,
}
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-2l-d128": _TINY_QWEN3,
    "qwen3-4l-d256": {**_TINY_QWEN3, "hidden_size": 256, "intermediate_size": 1024,
                      "num_hidden_layers": 4, "head_dim": 64},
    # SmolLM2-135M(-Instruct)'s config.json.
    # Qwen3-0.6B's config.json (benchmarks/device_check.py).
    "qwen3-0.6b": {**_TINY_QWEN3, "vocab_size": 151936, "hidden_size": 1024,
                   "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                   "rope_theta": 1_000_000.0, "max_position_embeddings": 40960},
    "smollm2-135m": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 100_000.0, "tie_word_embeddings": True,
        "max_position_embeddings": 8192,
    },
}


def model_config(preset: str) -> ModelConfig:
  if preset not in MODEL_PRESETS:
    raise ValueError(f"unknown model preset {preset!r}; expected one of {sorted(MODEL_PRESETS)}")
  return ModelConfig.from_hf(MODEL_PRESETS[preset], source=f"benchmarks preset {preset!r}")


# ----------------------------------------------------------------------------- machine


def machine_info() -> dict[str, Any]:
  """What the numbers were measured on, including the load average (the machine is shared)."""
  load1, load5, load15 = os.getloadavg()
  return {
      "device": jax.devices()[0].device_kind, "num_devices": jax.device_count(),
      "cpus": os.cpu_count(), "load_average_1_5_15": [load1, load5, load15],
      "platform": platform.platform(), "python": sys.version.split()[0],
      "jax": jax.__version__, "allocator": process_allocator(),
  }


def process_allocator() -> str:
  """The malloc this process runs on: "tcmalloc" or "jemalloc" when one is mapped in (e.g.
  by LD_PRELOAD, as `make demo` does), else "glibc". On the CPU it moves step times by up to
  1.4x, on both sides of a comparison alike (docs/performance.md, "The allocator")."""
  try:
    maps = Path("/proc/self/maps").read_text()
  except OSError:
    return "unknown"
  return next((name for name in ("tcmalloc", "jemalloc") if f"lib{name}" in maps), "glibc")


def best_time(fn: Callable[[], Any], repeats: int) -> float:
  """The fastest of `repeats` timed calls (after the caller's warm-up)."""
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return min(times)


def measure_bandwidth(mib: int, repeats: int) -> float:
  """Bytes/s of a jitted sum over a `mib` MiB float32 array (read-bound): the rate a decode
  step's weight and KV-cache reads are bounded by."""
  x = jnp.ones((mib * 2**20 // 4,), jnp.float32)
  reduce = jax.jit(jnp.sum)
  reduce(x).block_until_ready()
  return x.nbytes / best_time(lambda: reduce(x), repeats)


def measure_copy_bandwidth(mib: int, repeats: int) -> float:
  """Bytes/s moved (read + write) by a jitted copy of a `mib` MiB float32 array."""
  x = jnp.ones((mib * 2**20 // 4,), jnp.float32)
  copy = jax.jit(lambda a: a + 1.0)   # one read and one write per element
  copy(x).block_until_ready()
  return 2 * x.nbytes / best_time(lambda: copy(x), repeats)


# Instructions of a compiled loop body that launch no kernel of their own.
_NOT_KERNELS = ("parameter", "get-tuple-element", "tuple", "bitcast", "constant")


def record_decode_hlo(engine: Any) -> Callable[[], str]:
  """Wraps a JaxEngine's jitted decode loop so that it keeps the shapes of its latest call
  (not the arrays: each call's arguments hold a whole KV cache); the returned function
  compiles that call again and gives its optimized HLO text."""
  decode, last_call = engine._decode, []   # noqa: SLF001 - the engine's jitted loop

  def recording_decode(*call_args):
    last_call[:] = [jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "shape") else a,
        call_args)]
    return decode(*call_args)

  engine._decode = recording_decode   # noqa: SLF001

  def decode_hlo() -> str:
    if not last_call:
      raise RuntimeError("the engine's decode loop has not run yet")
    return decode.lower(*last_call[0]).compile().as_text()
  return decode_hlo


def while_body_kernels(hlo_text: str) -> int:
  """Kernels launched per iteration of the largest `while` body of an optimized HLO module:
  its instructions other than parameters, tuples, bitcasts and constants (each fusion, dot,
  copy or custom call is one thunk of XLA:CPU's runtime)."""
  counts = []
  for body in re.findall(r"\n(%\S+ \([^\n]*\{\n.*?\n\})", hlo_text, flags=re.S):
    name = body.split(" ", 1)[0]
    if not re.search(rf"while\([^\n]*body={re.escape(name)}\b", hlo_text):
      continue
    ops = re.findall(r"^\s+(?:ROOT )?%\S+ = \S+(?: \S+)*? ([a-z][a-z\-]*)\(", body, flags=re.M)
    counts.append(sum(op not in _NOT_KERNELS for op in ops))
  if not counts:
    raise ValueError("while_body_kernels: the module has no while loop")
  return max(counts)


def measure_kernel_cost(steps: int = 200, repeats: int = 5) -> dict[str, float]:
  """Seconds per kernel launched inside a compiled loop: two `fori_loop`s whose bodies chain
  8 and 32 tiny dependent [8, 8] matmul + tanh pairs (no compute to speak of), timed; the
  cost is the time difference over the difference in kernels launched. A small model's
  decode step is bound by this, not by bandwidth, when kernels × cost ≈ its time."""
  def chain(pairs: int):
    def run(x, w):
      def body(_, x):
        for _ in range(pairs):
          x = jnp.tanh(x @ w)
        return x
      return jax.lax.fori_loop(0, steps, body, x)
    return jax.jit(run)

  x, w = jnp.full((8, 8), 0.1, jnp.float32), jnp.eye(8, dtype=jnp.float32)
  seconds, kernels = {}, {}
  for pairs in (8, 32):
    fn = chain(pairs)
    kernels[pairs] = while_body_kernels(fn.lower(x, w).compile().as_text())
    fn(x, w).block_until_ready()
    seconds[pairs] = best_time(lambda: fn(x, w), repeats)
  per_kernel = (seconds[32] - seconds[8]) / ((kernels[32] - kernels[8]) * steps)
  return {"seconds_per_kernel": per_kernel, "kernels_per_iteration": kernels,
          "loop_seconds": seconds, "steps": steps}


def probe_machine(matmul_size: int = 1024, matmul_seconds: float = 1.0,
                  bandwidth_mib: int = 256, repeats: int = 5) -> dict[str, Any]:
  """The machine's limits, measured in this process before the benchmark runs: the fp32
  [size²] matmul rate (`flops.measure_matmul_rate`), the read and copy bandwidth of a
  `bandwidth_mib` MiB array (larger than the caches), the cost of one kernel launched inside
  a compiled loop (`measure_kernel_cost`), and the load average before them."""
  load_before = list(os.getloadavg())
  matmul = measure_matmul_rate(matmul_size, matmul_seconds)
  kernel = measure_kernel_cost()
  return {"load_average_before": load_before, "matmul": matmul,
          "matmul_flops_per_s": matmul["flops_per_s"],
          "read_bytes_per_s": measure_bandwidth(bandwidth_mib, repeats),
          "copy_bytes_per_s": measure_copy_bandwidth(bandwidth_mib, repeats),
          "bandwidth_array_mib": bandwidth_mib, "kernel": kernel,
          "seconds_per_kernel": kernel["seconds_per_kernel"]}


def machine_record(limits: dict[str, Any]) -> dict[str, Any]:
  """`machine_info` with the probed `limits` and the load average now (after the run)."""
  return {**machine_info(), "limits": limits, "load_average_after": list(os.getloadavg())}


def peak_rss_bytes() -> int:
  """High-water mark of this process's resident memory so far (Linux reports KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ----------------------------------------------------------------------------- timing


@dataclasses.dataclass(frozen=True)
class Timing:
  """Per-call wall times after warm-up, and the CPU time (all threads) of each call."""

  times_s: tuple[float, ...]
  cpu_times_s: tuple[float, ...]

  @property
  def median_s(self) -> float:
    return float(np.median(self.times_s))

  @property
  def cpu_median_s(self) -> float:
    # CPU seconds are less sensitive than wall seconds to other jobs on a shared machine.
    return float(np.median(self.cpu_times_s))

  def as_dict(self) -> dict[str, Any]:
    return {"median_s": self.median_s, "min_s": min(self.times_s),
            "max_s": max(self.times_s), "iters": len(self.times_s),
            "cpu_median_s": self.cpu_median_s}


def time_calls(call: Callable[[], Any], warmup: int, iters: int) -> Timing:
  """Runs `call` warmup + iters times, blocking on its output; times the last `iters`."""
  if warmup < 0 or iters < 1:
    raise ValueError(f"need warmup >= 0 and iters >= 1, got warmup={warmup}, iters={iters}")
  for _ in range(warmup):
    jax.block_until_ready(call())
  times, cpu_times = [], []
  for _ in range(iters):
    start, cpu_start = time.perf_counter(), time.process_time()
    jax.block_until_ready(call())
    times.append(time.perf_counter() - start)
    cpu_times.append(time.process_time() - cpu_start)
  return Timing(tuple(times), tuple(cpu_times))


def compile_jitted(jitted: Any, *args: Any) -> tuple[Any, float]:
  """(compiled executable, seconds to lower and compile) of a `jax.jit` function."""
  start = time.perf_counter()
  compiled = jitted.lower(*args).compile()
  return compiled, time.perf_counter() - start


def xla_flops(compiled: Any) -> float | None:
  """XLA's FLOP count of a compiled executable (while-loop bodies counted once), if any."""
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):  # older jax: one dict per computation
    analysis = analysis[0] if analysis else None
  if not analysis or "flops" not in analysis:
    return None
  return float(analysis["flops"])


def memory_report(compiled: Any) -> dict[str, int]:
  """The compiled executable's memory_analysis(), in bytes.

  argument / output / temp: XLA's buffer sizes; alias: outputs that reuse donated arguments.
  `total_bytes` = argument + output − alias + temp, the device memory the call needs with
  its inputs resident; `xla_peak_bytes` is XLA's own peak of its buffer assignment.
  """
  stats = compiled.memory_analysis()
  if stats is None:
    raise RuntimeError("this backend's compiled executables report no memory_analysis()")
  report = {
      "argument_bytes": int(stats.argument_size_in_bytes),
      "output_bytes": int(stats.output_size_in_bytes),
      "alias_bytes": int(stats.alias_size_in_bytes),
      "temp_bytes": int(stats.temp_size_in_bytes),
  }
  report["total_bytes"] = (report["argument_bytes"] + report["output_bytes"]
                           - report["alias_bytes"] + report["temp_bytes"])
  report["xla_peak_bytes"] = int(getattr(stats, "peak_memory_in_bytes", 0))
  return report


# ----------------------------------------------------------------------------- output


def write_json(path: str | os.PathLike, payload: Any) -> Path:
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(payload, indent=2) + "\n")
  return path


def gib(num_bytes: float) -> str:
  return f"{num_bytes / 2**30:.3f} GiB"
