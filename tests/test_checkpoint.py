"""Checkpointer: what a killed run leaves behind is cleaned on open; broken states are refused."""
from __future__ import annotations

import re

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


class _Host:
  """A host-state provider holding one value."""

  def __init__(self, value=None):
    self.value = value

  def state_dict(self):
    return {"value": self.value}

  def load_state_dict(self, state):
    self.value = state["value"]


def _truncate_host_json(step_dir):
  path = step_dir / "host" / "metadata"
  text = path.read_text()
  path.write_text(text[:len(text) // 2])
  return path


def _delete_state_metadata(step_dir):
  path = step_dir / "state" / "_METADATA"
  path.unlink()
  return path


def _saved(tmp_path, steps):
  ckpt = checkpoint.Checkpointer(tmp_path, keep=len(steps), async_save=False)
  for step in steps:
    ckpt.save(step, _state(float(step)), {"h": _Host(f"host {step}")})
  return ckpt


@pytest.mark.parametrize("corrupt, problem", [
    (_truncate_host_json, r"is not valid JSON \(.*line 1 column"),
    (_delete_state_metadata, r"is missing"),
])
def test_a_corrupt_step_names_its_file_and_resumes_from_the_newest_intact_one(
    tmp_path, corrupt, problem):
  ckpt = _saved(tmp_path, [1, 2, 3])
  path = corrupt(tmp_path / "3")
  expected = rf"checkpoint step 3 in .* is corrupt: {re.escape(str(path))} {problem}"
  with pytest.raises(checkpoint.CorruptCheckpointError, match=expected):
    ckpt.restore(3, _state(0.0), {"h": _Host()})
  host = _Host()
  step, state, set_aside = ckpt.restore_latest(_state(0.0), {"h": host})
  assert step == 2 and host.value == "host 2"
  np.testing.assert_array_equal(state["w"], np.full(3, 2.0, np.float32))
  assert len(set_aside) == 1 and str(path) in set_aside[0]
  assert set_aside[0].endswith(f"moved it to {tmp_path / '3.corrupt'}")
  # The damaged step is kept aside for inspection and no longer listed; step 3 saves again.
  assert ckpt.all_steps() == [1, 2] and (tmp_path / "3.corrupt").is_dir()
  ckpt.save(3, _state(33.0), {"h": _Host("again")})
  np.testing.assert_array_equal(ckpt.restore(3, _state(0.0))["w"], np.full(3, 33.0, np.float32))
  ckpt.close()


def test_every_step_corrupt_is_an_error_not_a_fresh_start(tmp_path):
  ckpt = _saved(tmp_path, [1, 2])
  _truncate_host_json(tmp_path / "2")
  _delete_state_metadata(tmp_path / "1")
  with pytest.raises(checkpoint.CorruptCheckpointError,
                     match=r"no intact checkpoint in .*step 2 .*host/metadata is not valid JSON"
                           r".*step 1 .*state/_METADATA is missing"):
    ckpt.restore_latest(_state(0.0))
  ckpt.close()


def test_unreadable_array_data_is_a_corrupt_step(tmp_path):
  """Beyond the JSON files: the array store itself damaged (every data file emptied)."""
  ckpt = _saved(tmp_path, [1, 2])
  for data in (tmp_path / "2" / "state").rglob("*"):
    if data.is_file() and data.parent.name == "d":
      data.write_bytes(b"")
  step, state, set_aside = ckpt.restore_latest(_state(0.0), {"h": _Host()})
  assert step == 1 and "reading " + str(tmp_path / "2") + " failed" in set_aside[0]
  np.testing.assert_array_equal(state["w"], np.full(3, 1.0, np.float32))
  ckpt.close()


def test_no_checkpoint_is_a_fresh_start(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path, async_save=False)
  target = _state(5.0)
  assert ckpt.restore_latest(target) == (None, target, [])
  ckpt.close()
