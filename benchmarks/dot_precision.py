"""The main job's matmuls on XLA:CPU at each operand/result precision, side by side in one
process: does this CPU's bfloat16 hardware (AMX, AVX512-BF16) speed them up, and in which form?

  JAX_PLATFORMS=cpu python3 benchmarks/dot_precision.py   # → benchmarks/results/dot_precision.json

Per shape ([rows, in] · [in, out]; defaults: SmolLM2-135M's q, MLP-up and MLP-down
projections over a 4 × 512 step batch, the up projection over a 32-row decode step, and one
64-column chunk of the vocabulary head) the same product is timed in five forms:

  f32          float32 operands and result (the main job's `compute_dtype = "float32"`)
  bf16         bfloat16 operands and result (what `compute_dtype = "bfloat16"` gives a dense layer)
  bf16_acc32   bfloat16 operands, float32 result (`preferred_element_type`)
  cast_acc32   float32 operands cast to bfloat16 inside the compiled function, float32 result
  wgrad_acc32  the weight-gradient form xᵀ · g of bf16_acc32 (the contracted axis is major)

and, per shape, an elementwise SiLU(a) · b over the [rows, out] result in float32 and in
bfloat16 (the activations a bfloat16 compute dtype carries). The forms run in alternating order,
`--rounds` times each, and each case's figure is the median over rounds of the fastest of
`--repeats` calls; ratios are float32's time over the form's. Every form's product is checked
against numpy's float64 product of the same (bfloat16-rounded, where the form rounds) operands
before anything is timed. The CPU's bfloat16 flags (/proc/cpuinfo) and the probe
(`common.probe_machine`) are recorded with the result.
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

# (name, rows, in, out) of SmolLM2-135M (d = 576, MLP 1,536, vocabulary 49,152).
DEFAULT_SHAPES = ("q:2048x576x576", "mlp_up:2048x576x1536", "mlp_down:2048x1536x576",
                  "decode_up:32x576x1536", "head_chunk:64x576x49152")
FORMS = ("f32", "bf16", "bf16_acc32", "cast_acc32", "wgrad_acc32")
BF16_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16")
# float64 products of bfloat16-rounded operands, summed in float32 or rounded to bfloat16:
# the relative error of the result against the largest |entry| stays below these.
TOLERANCE = {"f32": 1e-5, "bf16": 2e-2, "bf16_acc32": 1e-4, "cast_acc32": 1e-4,
             "wgrad_acc32": 1e-4}


def cpu_bf16_flags() -> list[str]:
  """The bfloat16-related flags of this CPU (empty where /proc/cpuinfo is missing)."""
  try:
    words = set(Path("/proc/cpuinfo").read_text().split())
  except OSError:
    return []
  return [flag for flag in BF16_FLAGS if flag in words]


def parse_shape(spec: str) -> tuple[str, int, int, int]:
  """"name:ROWSxINxOUT" -> (name, rows, in, out)."""
  name, sep, dims = spec.partition(":")
  parts = dims.split("x")
  if not sep or not name or len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise ValueError(f"--shapes: {spec!r} is not NAME:ROWSxINxOUT with positive integers")
  return name, int(parts[0]), int(parts[1]), int(parts[2])


def _bf16(a: np.ndarray) -> np.ndarray:
  return np.asarray(jnp.asarray(a, jnp.bfloat16).astype(jnp.float32), np.float64)


def form_calls(x: np.ndarray, w: np.ndarray, g: np.ndarray
               ) -> dict[str, tuple[Callable[[], jax.Array], np.ndarray]]:
  """Per form: (a call of its compiled product on device arrays, numpy's float64 reference).

  x [rows, in], w [in, out]; g [rows, out] is the output gradient of the weight-gradient form.
  """
  f32 = jnp.float32
  xd, wd, gd = (jnp.asarray(a, f32) for a in (x, w, g))
  xb, wb, gb = (a.astype(jnp.bfloat16) for a in (xd, wd, gd))
  dot = jax.jit(jnp.dot)
  acc32 = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=f32))
  cast = jax.jit(lambda a, b: jnp.dot(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                                      preferred_element_type=f32))
  wgrad = jax.jit(lambda a, b: jnp.dot(a.T, b, preferred_element_type=f32))
  rounded = _bf16(x) @ _bf16(w)
  return {
      "f32": (lambda: dot(xd, wd), x.astype(np.float64) @ w.astype(np.float64)),
      "bf16": (lambda: dot(xb, wb), rounded),
      "bf16_acc32": (lambda: acc32(xb, wb), rounded),
      "cast_acc32": (lambda: cast(xd, wd), rounded),
      "wgrad_acc32": (lambda: wgrad(xb, gb), _bf16(x).T @ _bf16(g)),
  }


def check_values(calls: dict[str, tuple[Callable[[], jax.Array], np.ndarray]]
                 ) -> dict[str, float]:
  """Each form's relative error against its float64 reference; raises past its tolerance."""
  errors = {}
  for form, (call, reference) in calls.items():
    got = np.asarray(jax.block_until_ready(call()), np.float64)
    error = float(np.max(np.abs(got - reference)) / np.max(np.abs(reference)))
    if not error <= TOLERANCE[form]:
      raise AssertionError(f"{form}: relative error {error:.3g} against numpy exceeds "
                           f"{TOLERANCE[form]:g}; the form computes another product")
    errors[form] = error
  return errors


def time_alternating(calls: dict[str, Callable[[], Any]], rounds: int, repeats: int
                     ) -> dict[str, dict[str, Any]]:
  """Per call: the fastest of `repeats` in each of `rounds` rounds (the calls alternate in
  each round, the order reversed every other round) and the median over rounds."""
  for call in calls.values():
    jax.block_until_ready(call())                    # compiled and warm before timing
  per_round: dict[str, list[float]] = {name: [] for name in calls}
  names = list(calls)
  for index in range(rounds):
    for name in (names if index % 2 == 0 else names[::-1]):
      per_round[name].append(common.best_time(calls[name], repeats))
  return {name: {"median_s": float(np.median(times)), "rounds_s": times}
          for name, times in per_round.items()}


def bench_shape(name: str, rows: int, d_in: int, d_out: int, rounds: int, repeats: int,
                seed: int) -> dict[str, Any]:
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((rows, d_in), np.float32)
  w = rng.standard_normal((d_in, d_out), np.float32) / np.sqrt(d_in)
  g = rng.standard_normal((rows, d_out), np.float32)
  calls = form_calls(x, w, g)
  errors = check_values(calls)
  silu_mul = jax.jit(lambda a, b: jax.nn.silu(a) * b)
  a32, b32 = jnp.asarray(g), jnp.asarray(rng.standard_normal((rows, d_out), np.float32))
  a16, b16 = a32.astype(jnp.bfloat16), b32.astype(jnp.bfloat16)
  timed = time_alternating({**{form: call for form, (call, _) in calls.items()},
                            "silu_mul_f32": lambda: silu_mul(a32, b32),
                            "silu_mul_bf16": lambda: silu_mul(a16, b16)}, rounds, repeats)
  flops = 2 * rows * d_in * d_out
  f32_s = timed["f32"]["median_s"]
  forms = {form: {**timed[form], "flops_per_s": flops / timed[form]["median_s"],
                  "f32_over_form": f32_s / timed[form]["median_s"],
                  "relative_error": errors[form]} for form in FORMS}
  elementwise = {key: timed[key] for key in ("silu_mul_f32", "silu_mul_bf16")}
  return {"name": name, "rows": rows, "in": d_in, "out": d_out, "flops": flops,
          "forms": forms, "elementwise": elementwise,
          "silu_mul_f32_over_bf16": elementwise["silu_mul_f32"]["median_s"]
                                    / elementwise["silu_mul_bf16"]["median_s"]}


def print_table(shapes: Sequence[dict[str, Any]]) -> None:
  print(f"{'shape':24s} " + " ".join(f"{form:>17s}" for form in FORMS) + f" {'silu f32/bf16':>14s}")
  for shape in shapes:
    label = f"{shape['name']} {shape['rows']}x{shape['in']}x{shape['out']}"
    cells = [f"{shape['forms'][form]['median_s'] * 1e3:8.3f}ms {shape['forms'][form]['f32_over_form']:5.2f}x"
             for form in FORMS]
    print(f"{label:24s} " + " ".join(f"{cell:>17s}" for cell in cells)
          + f" {shape['silu_mul_f32_over_bf16']:14.2f}")
  print("(each form: median time, and float32's time over it; > 1 is faster than float32)")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES),
                      help="NAME:ROWSxINxOUT per matmul")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=str(common.RESULTS_DIR / "dot_precision.json"))
  args = parser.parse_args(argv)
  for key in ("rounds", "repeats"):
    if getattr(args, key) < 1:
      parser.error(f"--{key} must be >= 1, got {getattr(args, key)}")
  try:
    shapes = [parse_shape(spec) for spec in args.shapes]
  except ValueError as err:
    parser.error(str(err))
  limits = common.probe_machine()
  start = time.perf_counter()
  results = [bench_shape(*shape, args.rounds, args.repeats, args.seed) for shape in shapes]
  print_table(results)
  payload = {"benchmark": "dot_precision", "cpu_bf16_flags": cpu_bf16_flags(),
             "rounds": args.rounds, "repeats": args.repeats, "shapes": results,
             "seconds": time.perf_counter() - start, "machine": common.machine_record(limits)}
  print(f"bfloat16 CPU flags: {', '.join(payload['cpu_bf16_flags']) or 'none'}; "
        f"wrote {common.write_json(args.out, payload)}")
  return payload


if __name__ == "__main__":
  main()
