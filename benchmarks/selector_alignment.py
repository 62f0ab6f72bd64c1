"""How closely each RISED selection objective's chosen batch matches its pool, against random.

For every pool generator of tests/select/pools.py ("beta": the tests' original one;
"dirichlet": the issue's second one; both were used to choose direction_weight and
direction_target; "prototype": written after they were chosen, run on them unchanged) and every
(K, B), `--pools` seeded pools are drawn and each objective chooses B groups:

  gap_ratio   mean ‖chosen mean tag profile − pool mean‖² over the pools, divided by the mean
              of its exact expectation for a uniform random B-subset (pools.random_mean_gap):
              < 1 is closer than random, 0.5 is the issue-21 bar
  cosine      mean pairwise cosine of the chosen profiles (tags ⊕ untagged fraction): the
              batch's redundancy; `cosine_vs_random` is its mean difference from the random
              subset's exact expectation (the pool's mean pairwise cosine), with its standard
              error over the pools: ≤ 0 is no more redundant than random

Then, at B = 8 and 32 and K = B … 16B, the squared distance of the chosen batch's mean from
the population's (not the pool's) in units of σ²/B, what a batch of B drawn from the
population has in expectation: what K = 4B buys over 2B or 8B (K = B is plain GRPO).

  python3 benchmarks/selector_alignment.py                      # ≈ 5 min on one core
  python3 benchmarks/selector_alignment.py --pools 20 --out /tmp/a.json
  git show d2dee26:rised_jax/select/rised.py > /tmp/old_rised.py   # the old default, as shipped
  python3 benchmarks/selector_alignment.py --compare /tmp/old_rised.py

Writes JSON (default benchmarks/results/selector_alignment.json) and prints a table.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rised_jax.select import make_selector  # noqa: E402
from tests.select import pools  # noqa: E402

SIZES = ((4, 1), (8, 2), (32, 8), (64, 16), (128, 32), (128, 64))
SWEEP_RATIOS = (1, 2, 4, 8, 16)   # K / B at B = 8 and 32
POPULATION = 1024                 # groups standing for the population in the sweep
OBJECTIVES = {
    "default": {},                                        # composition matching, mean + direction
    "mmr_lam2": {"objective": "mmr"},                     # the old default's objective
    "mean_only": {"objective": "composition", "direction_weight": 0.0, "lam": 0.01},  # old option
}
COMPARED = "compared"   # the --compare file's default RisedSelector


def load_selector_class(path: str) -> type:
  """`RisedSelector` of another version of rised_jax/select/rised.py (e.g. the old default:
  `git show d2dee26:rised_jax/select/rised.py > /tmp/old_rised.py`)."""
  spec = importlib.util.spec_from_file_location("compared_rised", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.RisedSelector


def measure(generator: str, num_groups: int, batch_size: int, num_pools: int, seed: int,
            compared: type | None = None) -> dict:
  rng = np.random.default_rng([seed, num_groups, batch_size, sorted(pools.GENERATORS).index(
      generator)])
  selectors = {name: (lambda options=options: make_selector("rised", seed=seed, **options))
               for name, options in OBJECTIVES.items()}
  if compared is not None:
    selectors[COMPARED] = lambda: compared(seed=seed)
  gaps = {name: [] for name in selectors}
  cosines = {name: [] for name in selectors}
  random_gaps, random_cosines = [], []
  for step in range(num_pools):
    pool, tags = pools.GENERATORS[generator](rng, num_groups)
    profiled = pools.profiled(tags)
    phi = pools.tag_profiles(tags)[profiled]
    behaviour = np.concatenate([phi, pools.untagged_fractions(tags)[profiled, None]], axis=1)
    position = {k: j for j, k in enumerate(profiled)}
    random_gaps.append(pools.random_mean_gap(phi, batch_size))
    if batch_size > 1:
      random_cosines.append(pools.random_pairwise_cosine(behaviour))
    for name, build in selectors.items():
      chosen = build().select(pool, batch_size, step, tags)
      rows = [position[k] for k in chosen if k in position]
      gaps[name].append(pools.mean_gap(phi, rows))
      if batch_size > 1:
        cosines[name].append(pools.mean_pairwise_cosine(behaviour, rows))
  result = {"random": {"gap": float(np.mean(random_gaps)),
                       "cosine": float(np.mean(random_cosines)) if random_cosines else None}}
  for name in selectors:
    entry = {"gap": float(np.mean(gaps[name])),
             "gap_ratio": float(np.mean(gaps[name]) / np.mean(random_gaps))}
    if batch_size > 1:
      diff = np.asarray(cosines[name]) - np.asarray(random_cosines)
      entry.update(cosine=float(np.mean(cosines[name])), cosine_vs_random=float(diff.mean()),
                   cosine_vs_random_se=float(diff.std(ddof=1) / np.sqrt(len(diff))))
    result[name] = entry
  return result


def pool_size_sweep(generator: str, batch_size: int, num_pools: int, seed: int) -> dict:
  """At fixed B, for K = B … 16B: the squared distance of the chosen batch's mean tag profile
  from the population's (estimated from the POPULATION groups drawn after the pool's in the
  same call: a generator's first K groups do not depend on how many follow), in units of σ²/B
  (σ² over those groups), for the
  default and for a random B of the K (the mean of 20 draws). K = B is plain GRPO."""
  result = {}
  for ratio in SWEEP_RATIOS:
    num_groups = ratio * batch_size
    rng = np.random.default_rng([seed, num_groups, batch_size, 99])
    chosen_gaps, random_gaps = [], []
    for step in range(num_pools):
      everything, all_tags = pools.GENERATORS[generator](rng, num_groups + POPULATION)
      pool, tags = everything[:num_groups], all_tags[:num_groups]
      rest = all_tags[num_groups:]   # the population sample, disjoint from the pool
      phi_rest = pools.tag_profiles(rest)[pools.profiled(rest)]
      population = phi_rest.mean(0)
      unit = float(np.mean(np.sum((phi_rest - population) ** 2, axis=1))) / batch_size
      phi = pools.tag_profiles(tags)

      def distance(subset):
        return float(np.sum((phi[list(subset)].mean(0) - population) ** 2)) / unit

      chosen_gaps.append(distance(make_selector("rised", seed=seed).select(
          pool, batch_size, step, tags)))
      random_gaps.append(np.mean([distance(rng.permutation(num_groups)[:batch_size])
                                  for _ in range(20)]))
    result[f"K={ratio}B"] = {"default": float(np.mean(chosen_gaps)),
                             "random": float(np.mean(random_gaps))}
  return result


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--pools", type=int, default=100, help="pools per generator and size")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--generators", default=",".join(pools.GENERATORS),
                      help=f"comma-separated, of {sorted(pools.GENERATORS)}")
  parser.add_argument("--compare", default=None,
                      help="a rised.py file whose default RisedSelector is measured too")
  parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"
                                           / "selector_alignment.json"))
  args = parser.parse_args(argv)
  generators = args.generators.split(",")
  unknown = sorted(set(generators) - set(pools.GENERATORS))
  if unknown or args.pools < 2:
    parser.error(f"--generators has unknown {unknown} (expected of {sorted(pools.GENERATORS)}); "
                 f"--pools={args.pools} (expected >= 2)")
  compared = load_selector_class(args.compare) if args.compare else None
  names = list(OBJECTIVES) + ([COMPARED] if compared else [])
  results = {}
  print(f"{'generator':10} {'K':>4} {'B':>3}  " + "  ".join(
      f"{name + ' gap/rand':>18} {'cos-rand':>14}" for name in names) + f"  {'rand cos':>8}")
  for generator in generators:
    for num_groups, batch_size in SIZES:
      row = measure(generator, num_groups, batch_size, args.pools, args.seed, compared)
      results.setdefault(generator, {})[f"{num_groups},{batch_size}"] = row
      cells = []
      for name in names:
        entry = row[name]
        cos = (f"{entry['cosine_vs_random']:+.3f}±{entry['cosine_vs_random_se']:.3f}"
               if "cosine" in entry else "-")
        cells.append(f"{entry['gap_ratio']:18.3f} {cos:>14}")
      rand_cos = f"{row['random']['cosine']:.3f}" if row["random"]["cosine"] is not None else "-"
      print(f"{generator:10} {num_groups:4} {batch_size:3}  " + "  ".join(cells)
            + f"  {rand_cos:>8}", flush=True)
  sweep = {}
  print(f"\nbatch mean vs population mean, in units of sigma^2/B: K = B ... {SWEEP_RATIOS[-1]}B")
  for generator in generators:
    for batch_size in (8, 32):
      row = pool_size_sweep(generator, batch_size, max(2, args.pools // 4), args.seed)
      sweep.setdefault(generator, {})[f"B={batch_size}"] = row
      print(f"{generator:10} B={batch_size:3} " + "  ".join(
          f"{k}: {v['default']:.3f} (random {v['random']:.3f})" for k, v in row.items()),
            flush=True)
  out = Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps({
      "command": " ".join(["python3", "benchmarks/selector_alignment.py", *(argv or sys.argv[1:])]),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "machine": platform.platform(), "pools": args.pools, "seed": args.seed,
      "objectives": OBJECTIVES, "results": results,
      "pool_size_sweep": sweep}, indent=1))
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
