"""The non-finite guard: a step with a NaN/inf loss or gradient applies nothing, and a run that
keeps producing them stops with an error, its checkpoints finite."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rised_jax import parallel
from rised_jax.learn import train_step
from rised_jax.model import tiny
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
  """lr = 3e38: Adam's ~lr-sized updates overflow float32 within two steps; whatever the step
  skips (a NaN loss, a NaN gradient or an overflowed parameter), the state never holds one."""
  trainable, state = _trainable(learning_rate=3e38)
  skipped = []
  for i in range(4):
    state, metrics = trainable.step(state, trainable.put_batch(step_fixtures.batch(i)))
    skipped.append(float(metrics["skipped_nonfinite"]))
    for path, leaf in _host_copy(state):
      assert np.isfinite(leaf).all(), (i, path)
  assert skipped[0] == 0.0 and 1.0 in skipped
  assert int(state.step) == skipped.count(0.0)


def _saved_params(checkpoint_dir: Path) -> list[np.ndarray]:
  restored = ocp.StandardCheckpointer().restore((checkpoint_dir / "state").resolve())
  return [np.asarray(x) for x in jax.tree.leaves(restored["params"])]


def test_a_diverging_run_stops_with_an_error_and_finite_checkpoints(tmp_path):
  """learning_rate=1e30 on the tiny config (one-move FrozenLake, where the random model wins
  some rollouts, so the first step has a gradient): the run must fail (non-zero exit, a message
  naming the key), every kept checkpoint must be finite and hold the last applied update's
  state. Before the guard this run exited 0 with NaN checkpoints."""
  model_dir = tiny.write(tmp_path / "model", ["frozenlake"])
  workdir = tmp_path / "run"
  cmd = [sys.executable, "-m", "rised_jax.main", f"--config={CONFIG}:rised,easy",
         f"--workdir={workdir}", f"--config.model.source={model_dir}",
         "--config.envs.names=frozenlake",
         "--config.envs.difficulty={'frozenlake': {'size': 2, 'holes': 0, 'min_distance': 1, "
         "'max_turns': 1}}",
         "--config.select.pool_groups=8", "--config.select.batch_groups=8",
         "--config.optim.learning_rate=1e30", "--config.train.steps=8",
         "--config.eval.episodes_per_env=4",
         "--config.train.keep_checkpoints=10", "--config.train.max_nonfinite_steps=2"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
  assert proc.returncode != 0, proc.stdout[-2000:]
  assert "train.max_nonfinite_steps=2" in proc.stderr, proc.stderr[-3000:]
  from rised_jax import runlog  # noqa: PLC0415
  lines = [m for m in runlog.read_jsonl(workdir / "metrics.jsonl") if "loss" in m]
  skipped = [m["step"] for m in lines if m["train/skipped_nonfinite"] == 1.0]
  applied = [m["step"] for m in lines if m["train/skipped_nonfinite"] == 0.0]
  assert len(skipped) == 2 and skipped == [lines[-2]["step"], lines[-1]["step"]], lines
  assert applied and max(applied) < skipped[0]
  assert "results.md" not in os.listdir(workdir)   # no normal results table
  steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  # Checkpoints up to the last applied update, and none written for the failing step.
  assert steps and max(steps) < skipped[-1] and max(applied) in steps
  last_good = _saved_params(workdir / "checkpoints" / str(max(applied)))
  for step in steps:
    params = _saved_params(workdir / "checkpoints" / str(step))
    assert all(np.isfinite(p).all() for p in params), step
    if step >= max(applied):
      assert all(np.array_equal(a, b) for a, b in zip(params, last_good)), step
