"""Group advantages against a float64 numpy reference written with loops, and hand-worked cases."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import pytest

from rised_jax.learn import advantages


def reference(name: str, rewards: np.ndarray, mask: np.ndarray, eps: float = 1e-6) -> np.ndarray:
  """One group at a time over its valid rollouts; flat groups (all equal) get zeros."""
  out = np.zeros(rewards.shape, np.float64)
  for g in range(rewards.shape[0]):
    idx = [i for i in range(rewards.shape[1]) if mask[g, i]]
    r = rewards[g, idx].astype(np.float64)
    if len(idx) == 0 or np.all(r == r[0]):
      continue
    mean = r.sum() / len(r)
    for pos, i in enumerate(idx):
      if name == "grpo":
        std = np.sqrt(((r - mean) ** 2).sum() / len(r))   # population std
        out[g, i] = (r[pos] - mean) / (std + eps)
      elif name == "drgrpo":
        out[g, i] = r[pos] - mean
      else:
        others = [r[j] for j in range(len(r)) if j != pos]
        out[g, i] = r[pos] - sum(others) / len(others)
  return out


@pytest.fixture(scope="module")
def rewards_and_mask() -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(0)
  rewards = rng.normal(size=(7, 6)).astype(np.float32)
  rewards[1] = 1.0                                           # all pass
  rewards[2] = 0.0                                           # all fail
  rewards[3] = rng.integers(0, 2, size=6)                    # binary
  rewards[3, :2] = [0.0, 1.0]                                # ... with both outcomes
  mask = np.ones_like(rewards, dtype=bool)
  mask[4, 3:] = False                                        # 3 valid rollouts
  mask[5, 1:] = False                                        # 1 valid rollout
  mask[6, :] = False                                         # none valid
  mask[0, 2] = False
  return rewards, mask


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_matches_numpy_reference_without_mask(name, rewards_and_mask):
  rewards, _ = rewards_and_mask
  full = np.ones_like(rewards, dtype=bool)
  got = np.asarray(advantages.ADVANTAGES[name](rewards))
  np.testing.assert_allclose(got, reference(name, rewards, full), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_matches_numpy_reference_with_mask(name, rewards_and_mask):
  rewards, mask = rewards_and_mask
  got = np.asarray(advantages.ADVANTAGES[name](rewards, mask))
  np.testing.assert_allclose(got, reference(name, rewards, mask), rtol=1e-5, atol=1e-6)
  assert np.all(got[~mask] == 0.0)


def test_hand_worked_group():
  # r = [1, 0, 0, 1]: mean 0.5, population std 0.5.
  # grpo = ±0.5 / 0.5 = ±1; drgrpo = ±0.5; rloo: 1 − (0+0+1)/3 = 2/3, 0 − (1+0+1)/3 = −2/3.
  r = np.array([[1.0, 0.0, 0.0, 1.0]], np.float32)
  np.testing.assert_allclose(advantages.grpo(r, eps=0.0), [[1, -1, -1, 1]], rtol=1e-6)
  np.testing.assert_allclose(advantages.drgrpo(r), [[0.5, -0.5, -0.5, 0.5]], rtol=1e-6)
  np.testing.assert_allclose(advantages.rloo(r), [[2 / 3, -2 / 3, -2 / 3, 2 / 3]], rtol=1e-6)
  # eps enters the denominator: 0.5 / (0.5 + 0.5) = 0.5.
  np.testing.assert_allclose(advantages.grpo(r, eps=0.5), [[0.5, -0.5, -0.5, 0.5]], rtol=1e-6)


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_all_equal_groups_are_exactly_zero(name):
  # 0.1 is not representable: a float mean of [0.1] * 3 can differ from 0.1 by an ulp, which
  # (r − mean) / (0 + eps) would amplify; the estimators must return exact zeros instead.
  rewards = np.array([[0.1, 0.1, 0.1], [0.7, 0.7, 0.7], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]],
                     np.float32)
  got = np.asarray(advantages.ADVANTAGES[name](rewards))
  assert np.all(got == 0.0), got


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_group_of_one_is_zero(name):
  got = np.asarray(advantages.ADVANTAGES[name](np.array([[3.0], [-1.0]], np.float32)))
  assert np.all(got == 0.0)


def test_bind_binds_options_and_rejects_bad_names():
  r = np.array([[1.0, 0.0]], np.float32)
  fn = advantages.ADVANTAGES.bind("grpo", eps=1.0)
  np.testing.assert_allclose(fn(r), [[1 / 3, -1 / 3]], rtol=1e-6)   # ±0.5 / (0.5 + 1)
  with pytest.raises(ValueError, match=r"^config\.advantage: unknown advantage estimator 'gpro'; "
                     r"known: \['drgrpo', 'grpo', 'rloo'\]"):
    advantages.ADVANTAGES.bind("gpro")
  with pytest.raises(ValueError, match=r"'drgrpo' has no option\(s\) \['eps'\]"):
    advantages.ADVANTAGES.bind("drgrpo", eps=1e-6)


def test_bad_inputs_are_named():
  with pytest.raises(ValueError, match=r"rewards must have shape \[num_groups, group_size\]"):
    advantages.grpo(np.zeros(4))
  with pytest.raises(ValueError, match=r"mask shape \(2, 3\) does not match rewards shape"):
    advantages.rloo(np.zeros((2, 4)), np.ones((2, 3)))
  with pytest.raises(ValueError, match="grpo eps must be >= 0"):
    advantages.grpo(np.zeros((2, 4)), eps=-1.0)
