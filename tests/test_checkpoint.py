"""Checkpointer: what a killed run leaves behind is cleaned on open; broken states are refused."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from rised_jax import checkpoint


def _state(value: float):
  return {"w": jnp.full((3,), value, jnp.float32), "step": jnp.asarray(1, jnp.int32)}


def test_opening_removes_steps_beyond_keep(tmp_path):
  """A kill between a commit and the deletion of the oldest step leaves keep + 1 steps."""
  ckpt = checkpoint.Checkpointer(tmp_path, keep=4, async_save=False)
  for step in range(1, 5):
    ckpt.save(step, _state(float(step)))
  ckpt.close()
  ckpt = checkpoint.Checkpointer(tmp_path, keep=2, async_save=False)
  assert ckpt.all_steps() == [3, 4]
  assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["3", "4"]
  restored = ckpt.restore(4, _state(0.0))
  np.testing.assert_array_equal(restored["w"], np.full(3, 4.0, np.float32))
  ckpt.close()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_state_is_never_saved(tmp_path, bad):
  ckpt = checkpoint.Checkpointer(tmp_path, keep=1, async_save=False)
  ckpt.save(1, _state(1.0))
  state = _state(1.0)
  state["w"] = state["w"].at[1].set(bad)
  with pytest.raises(ValueError, match=r"step 2 .*leaf \['w'\] is not finite"):
    ckpt.save(2, state)
  assert ckpt.all_steps() == [1]   # the good checkpoint stays
  ckpt.close()
