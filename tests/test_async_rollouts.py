"""One-step-async roll-outs (`rollout.async_rollouts`): which steps roll out in the background,
that a background roll-out samples with the weights from before the update it overlaps, and
that a run that crashes with a roll-out in flight resumes exactly like an uninterrupted one."""
from __future__ import annotations

import threading

import pytest

from rised_jax import envs, pipelines, runlog, trainer
from rised_jax.model import tiny
from rised_jax.pipelines import stages
from tests.helpers.run_fixtures import tiny_config

# grpo: no guidance memory, so a background roll-out's prompt does not depend on the step it
# overlaps (with guidance its hint lags one step; that is the only other difference). Signpost
# (one-token moves): a random tiny model wins some episodes, so the updates are not zero.
SETTING = "grpo,signpost"
STEPS = 5
# An AdamW step of ~1e-12 is far below float32's spacing at the tiny model's weights (~1e-9):
# the weights stay bit-identical (the optimizer refuses a learning rate of 0).
FROZEN = 1e-12
LEARNING = 0.03


def _config(model, *, async_rollouts, learning_rate, checkpoint_every=2):
  return tiny_config(SETTING, model, **{
      "train.steps": STEPS, "train.checkpoint_every": checkpoint_every,
      "rollout.async_rollouts": async_rollouts, "optim.learning_rate": learning_rate,
      "rollout.group_size": 8, "select.pool_groups": 4, "select.batch_groups": 4,
      "eval.episodes_per_env": 8})


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
  config = _config(None, async_rollouts=False, learning_rate=FROZEN)
  envs.register_aliases(config.envs.aliases)   # the game `signpost`, read by name below
  (env_name,) = config.envs.names
  # The environment's words only, as the learning test's Signpost model (grpo shows the model
  # no rubric text): with the rubric words its replies here win nothing, so no update moves it.
  return tiny.write(tmp_path_factory.mktemp("tiny") / "model", [env_name], rubric=False)


def _rollouts(workdir):
  """Per step, what was sampled: (task, rollout, actions, reward) of every rollout."""
  by_step: dict[int, list] = {}
  for r in runlog.read_jsonl(workdir / runlog.ROLLOUTS_FILE):
    by_step.setdefault(r["step"], []).append((r["task"], r["rollout"], r["actions"], r["reward"]))
  return by_step


def _metric(workdir, name):
  return [m[name] for m in runlog.read_jsonl(workdir / runlog.METRICS_FILE) if name in m]


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory):
  """Four runs of the same seed: {(async, learning rate): workdir}."""
  out = {}
  for async_rollouts in (False, True):
    for lr in (FROZEN, LEARNING):
      workdir = tmp_path_factory.mktemp("run") / "w"
      trainer.train(_config(tiny_model, async_rollouts=async_rollouts, learning_rate=lr), workdir)
      out[async_rollouts, lr] = workdir
  return out


def test_background_roll_outs_skip_checkpoint_boundaries():
  config = _config(None, async_rollouts=True, learning_rate=FROZEN)
  # done = step + 1; checkpoint_every = 2: no roll-out in flight across steps 2 and 4, none
  # past the last step.
  settings = stages.stage_configs(config)
  assert [trainer.may_prefetch(settings, s) for s in range(STEPS)] == [
      True, False, True, False, False]
  config.rollout.async_rollouts = False
  assert not any(trainer.may_prefetch(stages.stage_configs(config), s) for s in range(STEPS))


@pytest.mark.slow
def test_policy_lag_is_logged_per_step(runs):
  assert _metric(runs[True, LEARNING], "rollout/policy_lag") == [0.0, 1.0, 0.0, 1.0, 0.0]
  assert _metric(runs[False, LEARNING], "rollout/policy_lag") == [0.0] * STEPS
  assert len(_metric(runs[True, LEARNING], "time/rollout_wait")) == 2


@pytest.mark.slow
def test_without_updates_async_and_sync_sample_the_same(runs):
  # Same weights at every step (lr ≈ 0): the background roll-outs draw the same tasks with the
  # same seeds as the foreground ones, nothing skipped or repeated.
  assert _rollouts(runs[True, FROZEN]) == _rollouts(runs[False, FROZEN])
  assert sorted(_rollouts(runs[True, FROZEN])) == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_a_background_roll_out_samples_with_the_weights_before_the_update(runs):
  frozen, synced, stale = (_rollouts(runs[k]) for k in ((False, FROZEN),
                                                         (False, LEARNING), (True, LEARNING)))
  # Logged at done = 1 is step 0's roll-out: the initial weights in every run.
  assert stale[1] == synced[1] == frozen[1]
  # Step 1 (logged at 2): the synchronous run samples after one update, and that update is
  # visible in what it samples (so this test can tell the weights apart) ...
  assert synced[2] != frozen[2]
  # ... the async run sampled step 1 during step 0's update, with the initial weights.
  assert stale[2] == frozen[2]
  # Step 2 rolled out in the foreground after the checkpoint: updated weights again.
  assert stale[3] != frozen[3]


@pytest.mark.slow
def test_a_crash_with_a_roll_out_in_flight_resumes_exactly(runs, tiny_model, tmp_path,
                                                           monkeypatch):
  config = _config(tiny_model, async_rollouts=True, learning_rate=LEARNING)
  workdir = tmp_path / "crashed"
  update, calls = trainer.update, []

  def crash_at_step_2(run, batch, compiled_shapes=None):
    calls.append(1)
    if len(calls) == 3:   # step 2's update; step 3's roll-out is running in the background
      raise KeyboardInterrupt("simulated crash")
    return update(run, batch, compiled_shapes)

  monkeypatch.setattr(trainer, "update", crash_at_step_2)
  with pytest.raises(KeyboardInterrupt):
    trainer.train(config, workdir)
  monkeypatch.setattr(trainer, "update", update)
  assert (workdir / "checkpoints" / "2").exists() and not (workdir / "checkpoints" / "3").exists()
  trainer.train(_config(tiny_model, async_rollouts=True, learning_rate=LEARNING), workdir)
  straight = runs[True, LEARNING]
  assert _rollouts(workdir) == _rollouts(straight)
  for name in ("loss", "grad_norm", "rollout/policy_lag", "rollout/reward"):
    assert _metric(workdir, name) == _metric(straight, name), name
  assert runlog.read_jsonl(workdir / runlog.EVAL_FILE)[-1]["pass_rate"] == \
      runlog.read_jsonl(straight / runlog.EVAL_FILE)[-1]["pass_rate"]


@pytest.mark.slow
def test_a_background_roll_out_outlives_the_update_that_donates_the_state(tiny_model, tmp_path,
                                                                          monkeypatch):
  # The background roll-out starts only once the overlapping update has run (and donated the
  # train state's buffers): the sampler must hold weights of its own, from the first step on.
  updated, update, roll_out = threading.Event(), trainer.update, trainer._timed_roll_out

  def update_then_signal(*args, **kwargs):
    metrics = update(*args, **kwargs)
    updated.set()
    return metrics

  def roll_out_after_the_update(pipeline, step):
    assert updated.wait(timeout=600)
    updated.clear()
    return roll_out(pipeline, step)

  monkeypatch.setattr(trainer, "update", update_then_signal)
  monkeypatch.setattr(trainer, "_timed_roll_out", roll_out_after_the_update)
  config = _config(tiny_model, async_rollouts=True, learning_rate=LEARNING, checkpoint_every=3)
  config.train.steps = 3
  trainer.train(config, tmp_path / "run")
  assert _metric(tmp_path / "run", "rollout/policy_lag") == [0.0, 1.0, 1.0]


def test_async_needs_the_behaviour_importance_weight(tiny_model):
  config = _config(tiny_model, async_rollouts=True, learning_rate=FROZEN)
  config.step.behaviour_weight = False
  with pytest.raises(ValueError, match="async_rollouts=True with config.step.behaviour_weight"):
    pipelines.validate(config)
