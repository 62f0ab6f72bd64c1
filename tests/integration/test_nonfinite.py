"""The step guards: a step with a NaN/inf loss or gradient, or an absurd update, applies nothing,
and a run that keeps producing them stops with an error, its checkpoints holding the pre-fault
state."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from rised_jax import parallel
from rised_jax.learn import train_step
from rised_jax import model as model_lib
from tests.helpers import model_utils
from tests.helpers import step_fixtures

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "experiments" / "configs" / "tiny_cpu.py"


def _host_copy(state) -> list[tuple[str, np.ndarray]]:
  """(path, numpy copy) of every leaf: the reference, taken before the state is donated."""
  return [(jax.tree_util.keystr(path), np.array(leaf))
          for path, leaf in jax.tree_util.tree_leaves_with_path(state)]


def _trainable(learning_rate=1e-3):
  optimizer = train_step.make_optimizer(train_step.OptimizerConfig(learning_rate=learning_rate))
  mesh = parallel.make_mesh(parallel.MeshShape(1, 1, 1), devices=jax.devices()[:1])
  return train_step.create(step_fixtures.tiny_model(), optimizer, step_fixtures.step_config(),
                           mesh)


@pytest.mark.parametrize("poison", ["advantages", "behaviour_logprobs"])
def test_a_non_finite_step_leaves_the_state_bit_identical(poison):
  trainable, state = _trainable()
  state, metrics = trainable.step(state, trainable.put_batch(step_fixtures.batch(0)))
  assert float(metrics["skipped_nonfinite"]) == 0.0
  before = _host_copy(state)
  batch = step_fixtures.batch(1)
  row, col = np.argwhere(batch["loss_mask"] > 0)[0]   # a token the loss reads
  batch[poison] = batch[poison].copy()
  batch[poison][row, col] = np.nan
  state, metrics = trainable.step(state, trainable.put_batch(batch))
  assert not np.isfinite(float(metrics["loss"])) or not np.isfinite(float(metrics["grad_norm"]))
  assert float(metrics["skipped_nonfinite"]) == 1.0
  after = _host_copy(state)
  assert [p for p, _ in after] == [p for p, _ in before]
  for (path, old), (_, new) in zip(before, after):
    assert old.dtype == new.dtype and old.tobytes() == new.tobytes(), path
  # The same state then takes a finite step as usual (the guard is not sticky).
  state, metrics = trainable.step(state, trainable.put_batch(step_fixtures.batch(2)))
  assert float(metrics["skipped_nonfinite"]) == 0.0
  assert int(state.step) == 2
  assert any(old.tobytes() != np.array(new).tobytes() for (_, old), new
             in zip(before, jax.tree.leaves(state)))


def test_the_state_stays_finite_however_large_the_updates():
  """lr = 3e38: Adam's ~lr-sized updates overflow float32; whatever the step skips (a NaN loss
  or gradient, an overflowed parameter, an update beyond step.max_update_ratio), the state never
  holds a non-finite value and its step counter counts the applied updates only."""
  trainable, state = _trainable(learning_rate=3e38)
  skipped = []
  for i in range(4):
    state, metrics = trainable.step(state, trainable.put_batch(step_fixtures.batch(i)))
    skipped.append(float(metrics["skipped_nonfinite"]) + float(metrics["skipped_large_update"]))
    for path, leaf in _host_copy(state):
      assert np.isfinite(leaf).all(), (i, path)
  assert 1.0 in skipped
  assert int(state.step) == skipped.count(0.0)


def _by_path(tree) -> dict[str, np.ndarray]:
  """Leaves by their path, spelt the same for an nnx state's pure dict (int keys) and orbax's
  restored dict (str keys, each variable's array under "value")."""
  out = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    key = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
    out[key.removesuffix("/value")] = np.asarray(leaf)
  return out


def test_an_absurd_learning_rate_keeps_the_pre_fault_weights_in_every_checkpoint(tmp_path):
  """learning_rate=1e30 on the tiny config (one-move FrozenLake, on the tiny model that mostly
  names a move, so the first step has wins and a gradient): Adam's first update is ~1e30, finite in
  float32. Before the update-size guard it was applied, the later steps were skipped as
  non-finite and every kept checkpoint held the 1e30 weights. Now every step is skipped as a
  large update, the run fails naming the key and the last good checkpoint, and each kept
  checkpoint holds the initial weights (compared with the model's own, loaded here)."""
  model_dir = model_utils.write_mover(tmp_path / "model")
  workdir = tmp_path / "run"
  cmd = [sys.executable, "-m", "rised_jax.main", f"--config={CONFIG}:rised,easy",
         f"--workdir={workdir}", f"--config.model.source={model_dir}",
         "--config.envs.names=frozenlake",
         "--config.envs.difficulty={'frozenlake': {'size': 2, 'holes': 0, 'min_distance': 1, "
         "'max_turns': 1}}",
         "--config.select.pool_groups=8", "--config.select.batch_groups=8",
         "--config.optim.learning_rate=1e30", "--config.train.steps=8",
         "--config.eval.episodes_per_env=4",
         "--config.train.keep_checkpoints=2", "--config.train.max_nonfinite_steps=3"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 1, proc.stdout[-2000:]
  assert "steps 1..3: 3 consecutive steps were skipped" in proc.stderr, proc.stderr[-3000:]
  assert "config.step.max_update_ratio=1.0" in proc.stderr
  assert "the last good state is checkpoint 2 in" in proc.stderr
  from rised_jax import runlog  # noqa: PLC0415
  lines = [m for m in runlog.read_jsonl(workdir / "metrics.jsonl") if "loss" in m]
  assert [(m["step"], m["train/skipped_nonfinite"], m["train/skipped_large_update"])
          for m in lines] == [(1, 0.0, 1.0), (2, 0.0, 1.0), (3, 0.0, 1.0)]
  assert all(m["update_ratio"] > 1e20 for m in lines)
  assert "results.md" not in os.listdir(workdir)   # no normal results table
  steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert steps == [1, 2]
  model, _ = model_lib.from_pretrained(str(model_dir))
  initial = _by_path(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  for step in steps:
    restored = ocp.StandardCheckpointer().restore(
        (workdir / "checkpoints" / str(step) / "state").resolve())
    saved = _by_path(restored["params"])
    assert saved.keys() == initial.keys(), step
    for key, value in initial.items():
      assert np.array_equal(saved[key], value), (step, key)
