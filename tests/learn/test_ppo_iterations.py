"""Several PPO updates per rollout batch (`num_iterations`, GRPO's μ) against references.

The references take SGD steps on a full-logits (unchunked) loss written from the clipped
surrogate's definition, with log π_old taken once, from the parameters before the first
update; the clip fractions are counted in numpy from the reference's ratios.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rised_jax import checkpoint, parallel, runlog, trainer
from rised_jax.learn import losses, train_step
from rised_jax.model import tiny
from tests.helpers import step_fixtures
from tests.helpers.run_fixtures import tiny_config

EPS_LOW, EPS_HIGH, DUAL, CAP = 0.2, 0.28, 1.5, 2.0


def _config(num_iterations: int, mini_batches: int = 1) -> train_step.StepConfig:
  return step_fixtures.step_config(beta=0.0, eps_low=EPS_LOW, eps_high=EPS_HIGH,
                                   dual_clip=DUAL, importance_cap=CAP,
                                   num_iterations=num_iterations, mini_batches=mini_batches,
                                   max_update_ratio=100.0)   # lr 20 moves far; not its test


def _mesh():
  return parallel.make_mesh(parallel.MeshShape(1, 1, 1), devices=jax.devices()[:1])


def _reference_surrogate(logp, old, batch):
  """The clipped, dual-clipped, importance-weighted surrogate, seq-mean-token-mean."""
  mask = jnp.asarray(batch["loss_mask"])
  adv = jnp.asarray(batch["advantages"])
  ratio = jnp.exp(logp - old)
  per_token = jnp.maximum(-ratio * adv, -jnp.clip(ratio, 1 - EPS_LOW, 1 + EPS_HIGH) * adv)
  per_token = jnp.where(adv < 0, jnp.minimum(per_token, -DUAL * adv), per_token)
  per_token *= jnp.minimum(jnp.exp(old - jnp.asarray(batch["behaviour_logprobs"])), CAP)
  tokens = mask.sum(-1)
  per_seq = (jnp.where(mask > 0, per_token, 0.0) * mask).sum(-1) / jnp.maximum(tokens, 1)
  return per_seq.sum() / (tokens > 0).sum()


def _reference_run(batch, num_iterations: int, lr: float, mini_batches: int = 1):
  """Parameters after `num_iterations` passes of SGD steps, one per mini-batch (rows m, m + M,
  …, each step's loss the mean over its rows), and each step's clip fractions (numpy)."""
  graphdef, params, rest = nnx.split(step_fixtures.tiny_model(), nnx.Param, ...)
  logprobs = jax.jit(lambda p: step_fixtures.target_logprobs(nnx.merge(graphdef, p, rest),
                                                             batch)[0])
  old = logprobs(params)
  minis = [{k: np.asarray(v)[m::mini_batches] for k, v in batch.items()}
           for m in range(mini_batches)]
  grads = [jax.jit(jax.grad(lambda p, m=m: _reference_surrogate(
      logprobs(p)[m::mini_batches], old[m::mini_batches], minis[m])))
           for m in range(mini_batches)]
  fractions = []
  for _ in range(num_iterations):
    for m, mini in enumerate(minis):
      ratio = np.exp(np.asarray(logprobs(params), np.float64)[m::mini_batches]
                     - np.asarray(old, np.float64)[m::mini_batches])
      mask, adv = mini["loss_mask"] > 0, mini["advantages"]
      fractions.append(((mask & (adv < 0) & (ratio < 1 - EPS_LOW)).sum() / mask.sum(),
                        (mask & (adv > 0) & (ratio > 1 + EPS_HIGH)).sum() / mask.sum()))
      params = jax.tree.map(lambda p, g: p - lr * g, params, grads[m](params))
  return params, np.asarray(fractions)


def _step_run(batch, num_iterations: int, lr: float, mini_batches: int = 1):
  trainable, state = train_step.create(step_fixtures.tiny_model(), optax.sgd(lr),
                                       _config(num_iterations, mini_batches), _mesh())
  state, metrics = trainable.step(state, trainable.put_batch(batch))
  return state, {k: float(v) for k, v in metrics.items()}


def _assert_params_close(params, reference):
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(reference), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-6)


LR = 20.0   # large: one update moves the ratio of many tokens outside [1 − ε_low, 1 + ε_high]


# Mini-batches (1, 2) compile two more step shapes: the full suite runs them.
@pytest.mark.parametrize("num_iterations, mini_batches",
                         [(1, 1), (2, 1), pytest.param(1, 2, marks=pytest.mark.slow)])
def test_iterations_equal_sgd_steps_on_the_clipped_surrogate_of_the_old_policy(num_iterations,
                                                                              mini_batches):
  batch = step_fixtures.batch(0)
  state, metrics = _step_run(batch, num_iterations, LR, mini_batches)
  reference, fractions = _reference_run(batch, num_iterations, LR, mini_batches)
  _assert_params_close(state.params, reference)
  assert int(state.step) == 1
  assert metrics["skipped_nonfinite"] == metrics["skipped_large_update"] == 0
  # The step's metrics are the means over its updates; the first update's ratio is 1; the
  # token count is the whole batch's.
  assert fractions[0].tolist() == [0.0, 0.0]
  low, high = fractions.mean(axis=0)
  assert metrics["clip_frac_low"] == pytest.approx(low, abs=1e-6)
  assert metrics["clip_frac_high"] == pytest.approx(high, abs=1e-6)
  assert metrics["loss_tokens"] == batch["loss_mask"].sum()
  if num_iterations * mini_batches > 1:
    assert low > 0 and high > 0   # the later updates' ratios are clipped on both sides


def test_clipped_surrogate_on_a_hand_built_case():
  """Ratios 0.5, 0.9, 1.1, 1.5, 2.0 with A = ±1: clipped where PPO says, in numpy by hand."""
  ratio = np.array([0.5, 0.9, 1.1, 1.5, 2.0] * 2)
  adv = np.array([1.0] * 5 + [-1.0] * 5)
  terms = losses.clipped_policy_gradient(np.log(ratio), np.zeros(10), adv, np.ones(10),
                                         eps_low=0.2, eps_high=0.28, dual_clip=1.8)
  # A > 0: −min(r, clip(r)) = −r below 1 + ε_high, −1.28 above; A < 0: max(r, clip(r)),
  # 0.8 below 1 − ε_low, r above, capped at c = 1.8 by the dual clip.
  expected = [-0.5, -0.9, -1.1, -1.28, -1.28, 0.8, 0.9, 1.1, 1.5, 1.8]
  np.testing.assert_allclose(terms.loss, expected, rtol=1e-6)
  np.testing.assert_array_equal(terms.clipped_high, [0, 0, 0, 1, 1, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(terms.clipped_low, [0, 0, 0, 0, 0, 1, 0, 0, 0, 0])
  np.testing.assert_array_equal(terms.clipped_dual, [0, 0, 0, 0, 0, 0, 0, 0, 0, 1])


def test_learning_rate_schedule_counts_training_steps_not_updates():
  """Adam on a constant gradient moves by the learning rate itself (m̂ / √v̂ = 1): every update
  of training step s moves by step s's rate (warm-up 0 → 1 over 2 steps, then linear decay)."""
  cfg = train_step.OptimizerConfig(learning_rate=1.0, warmup_steps=2, total_steps=10,
                                   schedule="linear", max_grad_norm=None)
  moves = []
  for updates_per_step in (1, 3):
    optimizer = train_step.make_optimizer(cfg, updates_per_step=updates_per_step)
    params = {"w": jnp.zeros(())}
    opt_state = optimizer.init(params)
    seen = []
    for _ in range(4 * updates_per_step):
      updates, opt_state = optimizer.update({"w": jnp.ones(())}, opt_state, params)
      seen.append(-float(updates["w"]))
    moves.append(seen)
  np.testing.assert_allclose(moves[0], [0.0, 0.5, 1.0, 0.875], rtol=1e-4)
  np.testing.assert_allclose(moves[1], np.repeat(moves[0], 3), rtol=1e-5)
  with pytest.raises(ValueError, match="updates_per_step"):
    train_step.make_optimizer(cfg, updates_per_step=0)
  with pytest.raises(ValueError, match="num_iterations"):
    train_step.StepConfig(num_iterations=0)


@pytest.mark.slow
def test_resume_with_two_iterations_is_bit_exact(tmp_path):
  """Adam's count advances twice per step, the schedule once: a restored state continues the
  uninterrupted run's numbers exactly."""
  optimizer = train_step.make_optimizer(
      train_step.OptimizerConfig(learning_rate=1e-2, eps=1e-6, warmup_steps=2,
                                 schedule="cosine", total_steps=4), updates_per_step=2)

  def fresh():
    return train_step.create(step_fixtures.tiny_model(), optimizer, _config(2), _mesh())

  def run(trainable, state, indices):
    out = []
    for i in indices:
      state, metrics = trainable.step(state, trainable.put_batch(step_fixtures.batch(i)))
      out.append({k: float(v) for k, v in metrics.items()})
    return state, out

  trainable, state = fresh()
  straight, straight_metrics = run(trainable, state, range(4))
  trainable, state = fresh()
  state, first = run(trainable, state, range(2))
  ckpt = checkpoint.Checkpointer(tmp_path / "ckpt")
  ckpt.save(2, state, force=True)
  ckpt.close()
  trainable, target = fresh()
  ckpt = checkpoint.Checkpointer(tmp_path / "ckpt")
  restored = ckpt.restore(2, target)
  ckpt.close()
  resumed, second = run(trainable, restored, range(2, 4))
  assert first + second == straight_metrics
  assert max(m["clip_frac"] for m in straight_metrics) > 0
  for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_the_tiny_dapo_preset_clips(tmp_path):
  """The dapo preset's μ = 4 on the tiny Signpost game (the smoke setting's rewards are all 0,
  so it has no advantage to clip): the logged clip fractions are > 0 on both sides. The model
  is the learning test's (environment words only: dapo shows it no rubric text); with the
  rubric words the first step's rollouts happen to win nothing, so there is nothing to clip."""
  config = tiny_config("dapo,signpost", tiny.write(tmp_path / "model",
                                                   ["tests.helpers.learning_envs:Signpost"],
                                                   rubric=False),
                       **{"train.steps": 1, "select.pool_groups": 8, "select.batch_groups": 4,
                          "eval.episodes_per_env": 8})
  assert config.train.num_iterations == 4
  trainer.train(config, tmp_path / "run")
  (logged,) = [row for row in runlog.read_jsonl(tmp_path / "run" / runlog.METRICS_FILE)
               if "clip_frac" in row]
  assert logged["clip_frac_low"] > 0 and logged["clip_frac_high"] > 0
  assert logged["clip_frac"] == pytest.approx(logged["clip_frac_low"] + logged["clip_frac_high"])
