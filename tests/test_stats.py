"""rised_jax.stats against hand-worked values and independent numpy computations."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from rised_jax import stats


def test_wilson_hand_worked():
  # 5/10, z = 1.96: centre 0.5, half-width 1.96/1.38416 · sqrt(0.025 + 0.009604) = 0.263410.
  np.testing.assert_allclose(stats.wilson_interval(5, 10), (0.236590, 0.763410), atol=1e-6)
  # 0/n: (0, z²/(n + z²)).
  np.testing.assert_allclose(stats.wilson_interval(0, 10), (0.0, 3.8416 / 13.8416), atol=1e-12)
  # 3/4, z = 1: centre (0.75 + 0.125)/1.25 = 0.7, half (1/1.25)·sqrt(0.046875 + 0.015625) = 0.2.
  np.testing.assert_allclose(stats.wilson_interval(3, 4, z=1.0), (0.5, 0.9), atol=1e-12)


def test_wilson_matches_the_closed_form_in_numpy():
  z = 1.959963984540054
  for n in (1, 3, 16, 48, 200):
    for k in range(0, n + 1, max(1, n // 7)):
      p = k / n
      centre = (p + z * z / (2 * n)) / (1 + z * z / n)
      half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
      np.testing.assert_allclose(stats.wilson_interval(k, n, z),
                                 (max(0, centre - half), min(1, centre + half)), atol=1e-12)


@pytest.mark.parametrize("args", [(0, 0), (3, 2), (-1, 5), (1.0, 4), (True, 4), (1, 4, 0.0)])
def test_wilson_rejects_bad_input(args):
  with pytest.raises(ValueError, match="wilson_interval"):
    stats.wilson_interval(*args)


def test_t_interval_hand_worked():
  # [1, 2, 3]: mean 2, s = 1, t_{0.975, 2} = 4.302653 → 2 ± 4.302653/√3 = 2 ± 2.484138.
  np.testing.assert_allclose(stats.t_interval([1, 2, 3]), (2 - 2.484138, 2 + 2.484138),
                             atol=1e-6)
  # [0.25, 0.75]: mean 0.5, s = 0.353553, t_{0.975, 1} = 12.706205 → 0.5 ± 3.176551.
  np.testing.assert_allclose(stats.t_interval([0.25, 0.75]), (0.5 - 3.176551, 0.5 + 3.176551),
                             atol=1e-6)
  # 90 %: t_{0.95, 2} = 2.919986 → 2 ± 1.685855.
  np.testing.assert_allclose(stats.t_interval([1, 2, 3], 0.90), (2 - 1.685855, 2 + 1.685855),
                             atol=1e-6)
  assert stats.t_interval([0.4, 0.4, 0.4]) == (pytest.approx(0.4), pytest.approx(0.4))
  assert all(math.isnan(x) for x in stats.t_interval([0.3]))


@pytest.mark.parametrize("values,confidence,match", [
    ([1.0, float("nan")], 0.95, "non-finite"), ([[1.0, 2.0]], 0.95, "1-D"),
    ([1.0, 2.0], 1.0, "confidence")])
def test_t_interval_rejects_bad_input(values, confidence, match):
  with pytest.raises(ValueError, match=match):
    stats.t_interval(values, confidence)


def _exact_bootstrap(diff: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Every resample of n indices (n^n equally likely tuples): the means and their weights."""
  n = diff.size
  means = np.asarray([diff[list(idx)].mean() for idx in itertools.product(range(n), repeat=n)])
  return means, np.full(means.size, 1.0 / means.size)


def test_paired_bootstrap_matches_exact_enumeration():
  a = np.asarray([0.50, 0.625, 0.75, 0.40])
  b = np.asarray([0.375, 0.625, 0.50, 0.45])
  result = stats.paired_bootstrap(a, b, seed=3, resamples=20000)
  means, weights = _exact_bootstrap(a - b)
  assert result.mean_diff == pytest.approx(np.mean(a - b))
  assert result.pairs == 4
  # The resampled share at or below 0 estimates the exact probability (binomial s.e. ≈ 0.003).
  assert result.p_not_better == pytest.approx(weights[means <= 1e-12].sum(), abs=0.015)
  order = np.argsort(means)
  cdf = np.cumsum(weights[order])
  exact_low = means[order][np.searchsorted(cdf, 0.025)]
  exact_high = means[order][np.searchsorted(cdf, 0.975)]
  # The percentile ends fall on (or between neighbouring) atoms of the exact distribution.
  atoms = np.unique(means)
  step = np.max(np.diff(atoms))
  assert abs(result.ci_low - exact_low) <= step
  assert abs(result.ci_high - exact_high) <= step
  assert result.ci_low < result.mean_diff < result.ci_high


def test_paired_bootstrap_is_paired_and_seeded():
  # b = a − 0.1 exactly: every resample's mean difference is 0.1 however much a varies.
  a = np.asarray([0.1, 0.9, 0.3, 0.7])
  paired = stats.paired_bootstrap(a, a - 0.1, seed=0)
  assert (paired.ci_low, paired.ci_high) == (pytest.approx(0.1), pytest.approx(0.1))
  assert paired.p_not_better == 0.0
  again = stats.paired_bootstrap([0.5, 0.2, 0.4], [0.3, 0.3, 0.1], seed=7)
  assert again == stats.paired_bootstrap([0.5, 0.2, 0.4], [0.3, 0.3, 0.1], seed=7)
  other = stats.paired_bootstrap([0.5, 0.2, 0.4], [0.3, 0.3, 0.1], seed=8, resamples=50)
  assert other.resamples == 50


@pytest.mark.parametrize("a,b,match", [([0.5], [0.4], ">= 2"), ([0.5, 0.2], [0.4], ">= 2"),
                                       ([0.5, float("inf")], [0.1, 0.2], "non-finite")])
def test_paired_bootstrap_rejects_bad_input(a, b, match):
  with pytest.raises(ValueError, match=match):
    stats.paired_bootstrap(a, b)


# ----------------------------------------------------------------------------- sign-flip test


def _exact_sign_flip_p(integer_differences) -> float:
  """P(Σ ±|d_i| >= Σ d_i) over uniform signs, by convolving the distribution of the signed sum
  (integers only: an oracle that enumerates nothing and shares no code with stats)."""
  counts = {0: 1}
  for value in integer_differences:
    step = abs(int(value))
    nxt = {}
    for total, ways in counts.items():
      for signed in {step, -step}:   # a zero flips to itself: one pattern, counted twice
        nxt[total + signed] = nxt.get(total + signed, 0) + ways * (2 if step == 0 else 1)
    counts = nxt
  observed = sum(int(v) for v in integer_differences)
  return sum(w for t, w in counts.items() if t >= observed) / sum(counts.values())


@pytest.mark.parametrize("differences,expected", [
    ([0.1, 0.0, 0.2], 1 / 4),       # the case: patterns of (±0.1, ±0.2), only (+, +)
    ([0.3, 0.3], 1 / 4),            # two equal differences: 1/4, not 0
    ([0.5], 1 / 2),
    ([1.0, -2.0, 3.0], 3 / 8),      # sums 6, 4, 2 of the 8 reach the observed 2
    ([0.1, 0.2, -0.3], 5 / 8),      # observed 0 ties two patterns whatever the rounding
    ([0.0, 0.0], 1.0),
    ([0.2, 0.2, 0.2, 0.2, 0.2], 1 / 32),
])
def test_sign_flip_hand_worked(differences, expected):
  result = stats.sign_flip_test(differences)
  assert result.p_value == pytest.approx(expected, abs=1e-15)
  assert result.exact and result.mean_diff == pytest.approx(np.mean(differences))
  assert result.nonzero == sum(d != 0 for d in differences)
  assert result.min_p == 1 / 2 ** result.nonzero


def test_sign_flip_three_seeds_cannot_reach_005():
  rng = np.random.default_rng(1)
  for _ in range(200):
    assert stats.sign_flip_test(rng.normal(size=3)).p_value >= 0.125


def test_sign_flip_matches_scipy_permutation_test():
  rng = np.random.default_rng(5)
  for n in (2, 3, 4, 5, 7, 9):
    for _ in range(6):
      a = rng.integers(0, 5, n) / 8        # pass rates: ties and zero differences happen
      b = rng.integers(0, 5, n) / 8
      reference = scipy.stats.permutation_test(
          (a, b), lambda x, y, axis=-1: np.mean(x - y, axis=axis), vectorized=True,
          permutation_type="samples", alternative="greater", n_resamples=10 ** 6)
      assert stats.sign_flip_test(a - b).p_value == pytest.approx(reference.pvalue, abs=1e-12)


def test_sign_flip_matches_the_convolution_oracle_exact_and_monte_carlo():
  rng = np.random.default_rng(11)
  for n in (6, 12, 20):
    d = rng.integers(-6, 10, n)
    assert stats.sign_flip_test(d.astype(float)).p_value == pytest.approx(
        _exact_sign_flip_p(d), abs=1e-12)
  d = rng.integers(-3, 8, 26)                    # above the exact limit: seeded Monte Carlo
  d[d == 0] = 1
  result = stats.sign_flip_test(d.astype(float), seed=3, resamples=40_000)
  exact = _exact_sign_flip_p(d)
  assert not result.exact and result.patterns == 40_000
  assert abs(result.p_value - exact) < 4 * math.sqrt(exact * (1 - exact) / 40_000) + 1e-4
  assert result == stats.sign_flip_test(d.astype(float), seed=3, resamples=40_000)


def test_sign_flip_size_under_the_null_at_five_seeds():
  # Given the magnitudes, a symmetric null makes each of the 32 sign patterns equally likely:
  # P(p < 0.05) is the share of patterns with p < 0.05, exactly 1/32 for distinct magnitudes.
  rng = np.random.default_rng(2)
  for _ in range(20):
    magnitudes = np.abs(rng.normal(size=5))
    rejections = 0
    for pattern in itertools.product((-1, 1), repeat=5):
      rejections += stats.sign_flip_test(magnitudes * pattern).p_value < 0.05
    assert rejections / 32 == 1 / 32
  # Simulated: paired N(0, 1) and Laplace differences.
  for draw in (rng.normal, rng.laplace):
    rate = np.mean([stats.sign_flip_test(draw(size=5)).p_value < 0.05 for _ in range(4000)])
    assert rate <= 0.05 and rate == pytest.approx(1 / 32, abs=4 * math.sqrt(1 / 32 / 4000))


@pytest.mark.parametrize("values,match", [([], "at least one"), ([0.1, float("nan")], "non-finite")])
def test_sign_flip_rejects_bad_input(values, match):
  with pytest.raises(ValueError, match=match):
    stats.sign_flip_test(values)


# ----------------------------------------------------------------------------- paired t


def test_paired_t_hand_worked():
  # d = [0.1, 0, 0.2]: mean 0.1, s = 0.1, t = 0.1 / (0.1/√3) = √3 on 2 df.
  result = stats.paired_t([0.5, 0.6, 0.7], [0.4, 0.6, 0.5])
  assert result.t == pytest.approx(math.sqrt(3)) and result.df == 2
  # P(T_2 > √3) = ½ (1 − √3/√(3 + 2)) for 2 df.
  assert result.p_greater == pytest.approx(0.5 * (1 - math.sqrt(3) / math.sqrt(5)))
  assert result.p_two_sided == pytest.approx(1 - math.sqrt(3) / math.sqrt(5))
  half = 4.302652729749464 * 0.1 / math.sqrt(3)
  np.testing.assert_allclose([result.ci_low, result.ci_high], [0.1 - half, 0.1 + half])
  flat = stats.paired_t([0.5, 0.7], [0.4, 0.6])
  assert math.isnan(flat.p_greater) and flat.ci_low == pytest.approx(0.1) == flat.ci_high


def test_paired_t_matches_scipy_ttest_rel():
  rng = np.random.default_rng(4)
  for n in (2, 3, 5, 10):
    a, b = rng.normal(size=n), rng.normal(size=n)
    result = stats.paired_t(a, b, confidence=0.9)
    two = scipy.stats.ttest_rel(a, b)
    greater = scipy.stats.ttest_rel(a, b, alternative="greater")
    ci = two.confidence_interval(confidence_level=0.9)
    assert (result.t, result.p_two_sided, result.p_greater) == pytest.approx(
        (two.statistic, two.pvalue, greater.pvalue), rel=1e-10)
    assert (result.ci_low, result.ci_high) == pytest.approx((ci.low, ci.high), rel=1e-10)


def test_paired_t_rejects_bad_input():
  with pytest.raises(ValueError, match=">= 2"):
    stats.paired_t([0.5], [0.4])


def test_median_interval_hand_worked():
  # n = 5: only [min, max] is possible, coverage 1 − 2/32.
  assert stats.median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (3.0, 1.0, 5.0, 0.9375)
  # n = 10: P(Bin(10, ½) ≤ 1) = 11/1024, so [x_(2), x_(9)] covers 1 − 22/1024; the next one
  # in, [x_(3), x_(8)], would cover 1 − 112/1024 < 0.95.
  assert stats.median_interval(list(range(10))) == (4.5, 1.0, 8.0, 1 - 22 / 1024)
  # n = 20 at 95 %: the textbook ranks 6 and 15.
  result = stats.median_interval(np.arange(20.0)[::-1])
  assert (result.low, result.high) == (5.0, 14.0)
  assert result.coverage == pytest.approx(1 - 2 * scipy.stats.binom.cdf(5, 20, 0.5))


def test_median_interval_covers_the_true_median_as_often_as_it_says():
  rng = np.random.default_rng(0)
  for n in (5, 9, 20):
    draws = rng.exponential(size=(20000, n))   # true median ln 2
    hits = []
    for row in draws:
      result = stats.median_interval(row)
      hits.append(result.low <= np.log(2) <= result.high)
    claimed = stats.median_interval(draws[0]).coverage
    assert abs(np.mean(hits) - claimed) < 4 * np.sqrt(claimed * (1 - claimed) / len(draws))


@pytest.mark.parametrize("values, confidence, message", [
    ([1.0], 0.95, "at least 2"),
    ([1.0, float("nan")], 0.95, "non-finite"),
    ([1.0, 2.0], 1.5, "confidence"),
])
def test_median_interval_refuses_bad_input(values, confidence, message):
  with pytest.raises(ValueError, match=message):
    stats.median_interval(values, confidence)
