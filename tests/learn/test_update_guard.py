"""The update-size guard: `update_is_acceptable` against numpy, and a step whose finite update
is absurd (learning rate 1e30) leaves the state bit-identical and is counted."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rised_jax import parallel
from rised_jax.learn import train_step
from tests.helpers import step_fixtures


def _tree(rng, scale=1.0):
  return {"a": (rng.normal(size=(3, 4)) * scale).astype(np.float32),
          "b": {"c": (rng.normal(size=(5,)) * scale).astype(np.float32)}}


def _numpy_ratio(old, new):
  old_flat = np.concatenate([x.ravel() for x in jax.tree.leaves(old)]).astype(np.float64)
  new_flat = np.concatenate([x.ravel() for x in jax.tree.leaves(new)]).astype(np.float64)
  return np.linalg.norm(new_flat - old_flat) / np.linalg.norm(old_flat)


@pytest.mark.parametrize("scale, max_ratio", [(1e-3, 1.0), (0.3, 0.2), (0.3, 0.9), (2.0, 1.0),
                                              (1e30, 1.0)])
def test_ratio_and_verdict_match_numpy(scale, max_ratio):
  rng = np.random.default_rng(int(scale * 7) % 1000)
  old = _tree(rng)
  new = jax.tree.map(lambda x, d: x + d, old, _tree(rng, scale))
  accepted, ratio = train_step.update_is_acceptable(
      jax.tree.map(jnp.asarray, old), jax.tree.map(jnp.asarray, new), max_ratio)
  expected = _numpy_ratio(old, new)
  if expected < 1e18:   # beyond, float32 squares overflow and the ratio reads inf
    np.testing.assert_allclose(float(ratio), expected, rtol=1e-5)
  assert bool(accepted) == bool(expected <= max_ratio), (float(ratio), expected)


def test_a_nan_update_and_an_unchanged_state():
  old = {"w": jnp.ones((4,), jnp.float32)}
  accepted, ratio = train_step.update_is_acceptable(old, {"w": old["w"]}, 1e-6)
  assert bool(accepted) and float(ratio) == 0.0
  accepted, _ = train_step.update_is_acceptable(old, {"w": old["w"].at[0].set(jnp.nan)}, 1e6)
  assert not bool(accepted)
  # Exactly at the bound: Δ = (0.5, 0, 0, 0), ‖θ‖ = 2 → ratio 0.25.
  accepted, ratio = train_step.update_is_acceptable(old, {"w": old["w"].at[0].add(0.5)}, 0.25)
  assert bool(accepted) and float(ratio) == 0.25
  accepted, _ = train_step.update_is_acceptable(old, {"w": old["w"].at[0].add(0.5)}, 0.2499)
  assert not bool(accepted)


def _host_copy(state):
  return [np.array(leaf) for leaf in jax.tree.leaves(state)]


@pytest.mark.slow
def test_an_absurd_finite_update_is_skipped_and_counted():
  """lr = 1e30: Adam's first update is ~1e30 per coordinate, finite in float32 (the non-finite
  guard passes it); the size guard must refuse it and leave the whole state as it was."""
  mesh = parallel.make_mesh(parallel.MeshShape(1, 1, 1), devices=jax.devices()[:1])
  results = {}
  for lr in (1e-3, 1e30):
    optimizer = train_step.make_optimizer(train_step.OptimizerConfig(learning_rate=lr))
    trainable, state = train_step.create(step_fixtures.tiny_model(), optimizer,
                                         step_fixtures.step_config(), mesh)
    before = _host_copy(state)
    state, metrics = trainable.step(state, trainable.put_batch(step_fixtures.batch(0)))
    results[lr] = (before, _host_copy(state), {k: float(v) for k, v in metrics.items()})
  before, after, metrics = results[1e30]
  assert metrics["skipped_nonfinite"] == 0.0 and metrics["skipped_large_update"] == 1.0
  assert np.isfinite(metrics["loss"]) and metrics["update_ratio"] > 1e20
  assert all(a.tobytes() == b.tobytes() for a, b in zip(before, after))
  before, after, metrics = results[1e-3]   # a healthy step is applied, far below the bound
  assert metrics["skipped_large_update"] == 0.0 and 0 < metrics["update_ratio"] < 0.1
  assert any(a.tobytes() != b.tobytes() for a, b in zip(before, after))


def test_the_bound_is_checked():
  with pytest.raises(ValueError, match=r"max_update_ratio=0\.0: expected a number > 0"):
    train_step.StepConfig(max_update_ratio=0.0)
