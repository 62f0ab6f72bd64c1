"""rised_jax.stats against hand-worked values and independent numpy computations."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

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
