"""Interval estimates used by evaluation, CriPO and the method comparison.

  wilson_interval(k, n)         Wilson score interval of a binomial proportion (scipy)
  t_interval(values)            Student-t interval of a mean (over seeds, over rubric scores)
  median_interval(values)       distribution-free interval of a median (order statistics)
  paired_bootstrap(a, b, seed)  seeded bootstrap of mean(a − b), resampling pairs together
  sign_flip_test(differences)   one-sided exact p of mean(d) > 0 over the 2^n sign patterns
  paired_t(a, b)                paired Student-t interval and p-values of mean(a − b)
  check_results(results, what)  {group: {pass_rate, ci_low, ci_high, episodes}} checked
  format_pass_rate_table(b, a)  the before/after pass-rate table (run summary, notebook)

Intervals are 95 % by default. The comparison pairs two methods' results by seed: the
seed-to-seed variation both methods share cancels in the difference. With the 2–5 seeds of a
comparison the bootstrap is anti-conservative (under a paired N(0, 1) null its one-sided "p" fell
below 0.05 in 20 % of replicates at 3 seeds), so the comparison's test is the exact sign-flip
test and its interval the paired Student-t one; the bootstrap stays as a named interval.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np
import scipy.stats

from rised_jax.checks import is_int, is_number


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
  """Wilson score interval of a binomial proportion (z = 1.96: 95 %).

  Unlike the normal (Wald) interval it stays inside [0, 1] and is not empty at 0/n or n/n.
  scipy takes a confidence level, so z becomes 2·Φ(z) − 1 (the level whose two-sided normal
  quantile is z).
  """
  if not is_int(n) or n < 1:
    raise ValueError(f"wilson_interval: n={n!r}; expected an int >= 1")
  if not is_int(successes) or not 0 <= successes <= n:
    raise ValueError(f"wilson_interval: successes={successes!r}; expected an int in [0, {n}]")
  if not z > 0:
    raise ValueError(f"wilson_interval: z={z!r}; expected a positive number")
  level = 2.0 * scipy.stats.norm.cdf(z) - 1.0
  ci = scipy.stats.binomtest(int(successes), int(n)).proportion_ci(confidence_level=level,
                                                                    method="wilson")
  # Rounding can push an end a hair past [0, 1] at 0/n and n/n.
  return max(0.0, float(ci.low)), min(1.0, float(ci.high))


def _check_confidence(confidence: float, what: str) -> None:
  if not 0 < confidence < 1:
    raise ValueError(f"{what}: confidence={confidence!r}; expected a number in (0, 1)")


def _finite_values(values: Sequence[float], what: str) -> np.ndarray:
  array = np.asarray(values, np.float64)
  if array.ndim != 1:
    raise ValueError(f"{what}: expected a 1-D sequence of numbers; got shape {array.shape}")
  if not np.all(np.isfinite(array)):
    raise ValueError(f"{what}: values {array.tolist()} include a non-finite number")
  return array


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
  """Student-t interval of the mean: x̄ ± t_{(1+c)/2, n−1} · s / √n (s with ddof = 1).

  NaN ends for fewer than two values (no spread to estimate); (x̄, x̄) when all are equal.
  """
  _check_confidence(confidence, "t_interval")
  values = _finite_values(values, "t_interval")
  if values.size < 2:
    return math.nan, math.nan
  quantile = scipy.stats.t.ppf(0.5 + confidence / 2, values.size - 1)
  half = quantile * values.std(ddof=1) / math.sqrt(values.size)
  return float(values.mean() - half), float(values.mean() + half)


@dataclasses.dataclass(frozen=True)
class PairedBootstrap:
  """mean(a − b) over pairs, its percentile bootstrap interval and the share of resamples
  with a mean difference <= 0 (a one-sided bootstrap p-value for "a beats b")."""

  mean_diff: float
  ci_low: float
  ci_high: float
  p_not_better: float
  pairs: int
  resamples: int


class MedianInterval(NamedTuple):
  """A median with its order-statistic interval and the interval's exact coverage."""

  median: float
  low: float
  high: float
  coverage: float   # P(low <= true median <= high) for any continuous distribution


def median_interval(values: Sequence[float], confidence: float = 0.95) -> MedianInterval:
  """The sample median and the narrowest symmetric order-statistic interval [x_(k), x_(n+1−k)]
  whose exact coverage, 1 − 2·P(Bin(n, ½) ≤ k − 1), is at least `confidence`; distribution-
  free (needs only independent draws of a continuous quantity). Few values cannot reach every
  level: then the interval is [min, max] and `coverage` says what it has (1 − 2⁻⁽ⁿ⁻¹⁾, e.g.
  0.9375 at n = 5).
  """
  _check_confidence(confidence, "median_interval")
  array = np.sort(_finite_values(values, "median_interval"))
  n = array.size
  if n < 2:
    raise ValueError(f"median_interval: {n} value(s); expected at least 2")

  def coverage(k: int) -> float:   # of [x_(k), x_(n+1-k)], k 1-based
    return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2.0 ** n

  k = 1
  while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= confidence:
    k += 1
  return MedianInterval(float(np.median(array)), float(array[k - 1]), float(array[n - k]),
                        coverage(k))


def paired_bootstrap(a: Sequence[float], b: Sequence[float], *, seed: int = 0,
                     resamples: int = 9999, confidence: float = 0.95) -> PairedBootstrap:
  """Seeded paired bootstrap of mean(a − b): pairs (a_i, b_i) are resampled together.

  Percentile interval: with the few seeds of a comparison (2–5) BCa's acceleration estimate
  is unstable or undefined, and the percentile interval is what can be read off the resampled
  differences directly. With n pairs there are only C(2n − 1, n) distinct resamples (10 for
  n = 3), so the interval is coarse: read it with the per-seed values beside it.
  """
  _check_confidence(confidence, "paired_bootstrap")
  a = _finite_values(a, "paired_bootstrap: a")
  b = _finite_values(b, "paired_bootstrap: b")
  if a.size != b.size or a.size < 2:
    raise ValueError(f"paired_bootstrap: a has {a.size} values and b {b.size}; expected the "
                     "same number >= 2 (one per seed; one pair has no spread to resample)")
  if not is_int(resamples) or resamples < 1:
    raise ValueError(f"paired_bootstrap: resamples={resamples!r}; expected an int >= 1")
  diff = a - b
  result = scipy.stats.bootstrap(
      (a, b), lambda x, y, axis=-1: np.mean(x - y, axis=axis), paired=True, vectorized=True,
      n_resamples=resamples, confidence_level=confidence, method="percentile",
      rng=np.random.default_rng(seed))
  resampled = result.bootstrap_distribution
  return PairedBootstrap(
      mean_diff=float(diff.mean()), ci_low=float(result.confidence_interval.low),
      ci_high=float(result.confidence_interval.high),
      p_not_better=float(np.mean(resampled <= 0)), pairs=int(a.size), resamples=resamples)


# Most sign patterns enumerated exactly (2^20 ≈ 1e6 patterns × 20 values); above, Monte Carlo.
SIGN_FLIP_EXACT_MAX = 20


@dataclasses.dataclass(frozen=True)
class SignFlipTest:
  """One-sided sign-flip (paired permutation) test of mean(d) > 0.

  p_value: the share of sign patterns whose mean is >= the observed mean (ties count);
  exact: every pattern was enumerated (else `patterns` seeded random ones, p = (1 + k)/(1 + m));
  min_p: the smallest p-value this test can give at these values (1/2^nonzero when exact)."""

  mean_diff: float
  p_value: float
  pairs: int
  nonzero: int
  exact: bool
  patterns: int
  min_p: float


def sign_flip_test(differences: Sequence[float], *, seed: int = 0,
                   resamples: int = 99_999) -> SignFlipTest:
  """Exact one-sided sign-flip test of H0: the paired differences are symmetric about 0.

  Under H0 every one of the 2^n sign patterns of d is equally likely; p is the share of
  patterns whose mean is >= the observed mean, ties included (so p >= 1/2^n: three seeds can
  never reach 0.05). Zero differences: a zero flips to itself, so it keeps its place in the mean
  and every pattern of the other signs appears 2^zeros times; the share is the same as over
  the 2^nonzero patterns of the non-zero differences (scipy.stats.permutation_test with
  permutation_type='samples' counts the same way). All zeros give p = 1.

  Exact for up to SIGN_FLIP_EXACT_MAX non-zero differences; above, `resamples` seeded random
  patterns with p = (1 + #{mean >= observed}) / (1 + resamples).
  """
  d = _finite_values(differences, "sign_flip_test")
  if d.size < 1:
    raise ValueError("sign_flip_test: no differences; expected at least one")
  if not is_int(resamples) or resamples < 1:
    raise ValueError(f"sign_flip_test: resamples={resamples!r}; expected an int >= 1")
  magnitudes = np.abs(d[d != 0])
  m = magnitudes.size
  observed = float(d.sum())
  # Sums of patterns that equal the observed one up to rounding are ties.
  tolerance = 1e-12 * float(magnitudes.sum())
  if m <= SIGN_FLIP_EXACT_MAX:
    bits = (np.arange(2 ** m)[:, None] >> np.arange(m)) & 1
    sums = (1 - 2 * bits) @ magnitudes
    p, exact, patterns = float(np.mean(sums >= observed - tolerance)), True, 2 ** m
    min_p = 1.0 / patterns
  else:
    signs = np.random.default_rng(seed).choice((-1.0, 1.0), size=(resamples, m))
    hits = int(np.sum(signs @ magnitudes >= observed - tolerance))
    p, exact, patterns = (1 + hits) / (1 + resamples), False, resamples
    min_p = 1.0 / (1 + resamples)
  return SignFlipTest(mean_diff=float(d.mean()), p_value=p, pairs=int(d.size), nonzero=int(m),
                      exact=exact, patterns=int(patterns), min_p=min_p)


@dataclasses.dataclass(frozen=True)
class PairedT:
  """Paired Student-t statistics of mean(a − b): the interval, t, df, and p-values for
  "mean > 0" (one-sided) and "mean ≠ 0" (NaN where the differences have no spread)."""

  mean_diff: float
  ci_low: float
  ci_high: float
  t: float
  df: int
  p_greater: float
  p_two_sided: float


def paired_t(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> PairedT:
  """The one-sample t-test and interval on d = a − b (needs >= 2 pairs).

  Equal differences have no spread: the interval is (d̄, d̄) and t and both p-values are NaN
  (the sign-flip test still gives a p-value there)."""
  a = _finite_values(a, "paired_t: a")
  b = _finite_values(b, "paired_t: b")
  if a.size != b.size or a.size < 2:
    raise ValueError(f"paired_t: a has {a.size} values and b {b.size}; expected the same "
                     "number >= 2 (one per seed)")
  d = a - b
  low, high = t_interval(d, confidence)
  spread = float(d.std(ddof=1))
  df = d.size - 1
  if spread == 0:
    t = p_greater = p_two_sided = math.nan
  else:
    t = float(d.mean() / (spread / math.sqrt(d.size)))
    p_greater = float(scipy.stats.t.sf(t, df))
    p_two_sided = float(2 * scipy.stats.t.sf(abs(t), df))
  return PairedT(mean_diff=float(d.mean()), ci_low=low, ci_high=high, t=t, df=df,
                 p_greater=p_greater, p_two_sided=p_two_sided)


# ----------------------------------------------------------------------------- results

RESULT_KEYS = ("pass_rate", "ci_low", "ci_high", "episodes")


def check_results(results: Any, what: str) -> dict[str, dict[str, float | int]]:
  """Validates {env: {pass_rate, ci_low, ci_high, episodes}} (mappings or dataclasses).

  Returns plain dicts holding RESULT_KEYS plus any other numeric entries (e.g. CriPO's mean
  rubric score), which are logged alongside; `what` names the argument in errors.
  """
  if not isinstance(results, Mapping) or not results:
    raise ValueError(f"{what}: got {type(results).__name__} {results!r:.200}; expected a non-empty "
                     f"dict {{env: {{{', '.join(RESULT_KEYS)}}}}}")
  checked = {}
  for env, result in results.items():
    if not isinstance(env, str) or not env:
      raise ValueError(f"{what}: environment name {env!r}; expected a non-empty string")
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
      result = dataclasses.asdict(result)
    if not isinstance(result, Mapping):
      raise ValueError(f"{what}[{env!r}] is {type(result).__name__}; expected a dict with keys "
                       f"{list(RESULT_KEYS)}")
    missing = [k for k in RESULT_KEYS if k not in result]
    if missing:
      raise ValueError(f"{what}[{env!r}] lacks key(s) {missing}; expected keys {list(RESULT_KEYS)}")
    episodes = result["episodes"]
    if not is_int(episodes) or episodes < 1:
      raise ValueError(f"{what}[{env!r}]['episodes'] = {episodes!r}; expected an int >= 1")
    values = {}
    for key in RESULT_KEYS[:3]:
      value = result[key]
      if not is_number(value, finite=False) or not 0 <= value <= 1:
        raise ValueError(f"{what}[{env!r}][{key!r}] = {value!r}; expected a number in [0, 1]")
      values[key] = float(value)
    if not values["ci_low"] - 1e-9 <= values["pass_rate"] <= values["ci_high"] + 1e-9:
      raise ValueError(f"{what}[{env!r}]: pass_rate {values['pass_rate']} is outside its interval "
                       f"[{values['ci_low']}, {values['ci_high']}]; expected ci_low <= pass_rate "
                       "<= ci_high")
    extras = {k: float(v) for k, v in result.items() if k not in RESULT_KEYS
              and is_number(v, finite=False)}
    checked[env] = {**values, "episodes": int(episodes), **extras}
  return checked


def mean_pass_rate(results: Mapping[str, Mapping[str, Any]]) -> float:
  """The unweighted mean of the per-environment pass rates (docs/ALGORITHMS.md §4)."""
  return sum(float(r["pass_rate"]) for r in results.values()) / len(results)


def format_pass_rate_table(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
  """The before/after table: env | before (95 % CI) | after (95 % CI) | Δ, then the mean row.

  A Markdown table with padded columns, so it reads in a terminal too. Both arguments must
  cover the same environments; the mean row is the unweighted mean (no interval).
  """
  before = check_results(before, "before")
  after = check_results(after, "after")
  if set(before) != set(after):
    raise ValueError(f"before/after cover different environments: only before "
                     f"{sorted(set(before) - set(after))}, only after "
                     f"{sorted(set(after) - set(before))}; expected the same set")

  def cell(result):
    return f"{result['pass_rate']:.3f} [{result['ci_low']:.3f}, {result['ci_high']:.3f}]"

  rows = [("env", "before (95 % CI)", "after (95 % CI)", "Δ")]
  for env in sorted(before):
    rows.append((env, cell(before[env]), cell(after[env]),
                 f"{after[env]['pass_rate'] - before[env]['pass_rate']:+.3f}"))
  mean_before, mean_after = mean_pass_rate(before), mean_pass_rate(after)
  rows.append(("mean", f"{mean_before:.3f}", f"{mean_after:.3f}",
               f"{mean_after - mean_before:+.3f}"))
  widths = [max(len(row[i]) for row in rows) for i in range(4)]

  def line(cells):
    return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

  separator = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
  return "\n".join([line(rows[0]), separator] + [line(row) for row in rows[1:]])
