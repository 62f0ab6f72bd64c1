"""rollout/logprob_diff: mean |log π_sampler(y_t) − log π_old(y_t)| over the loss tokens of the
rows sampled on their trained prefix, the check that the sampler serves the trainer's weights
(a skipped or failed weight sync shows; a guidance hint, which changes the sampler's context,
is left out)."""
from __future__ import annotations

import jax
import numpy as np

from rised_jax import parallel
from rised_jax.learn import batching, train_step
from rised_jax.rollout.base import GenerationRequest, SamplingParams
from rised_jax.rollout.jax_engine import JaxEngine
from tests.helpers import step_fixtures


def _mesh():
  return parallel.make_mesh(parallel.MeshShape(1, 1, 1), devices=jax.devices()[:1])


def test_logprob_diff_is_the_mean_absolute_gap_on_the_loss_tokens():
  trainable, state = train_step.create(step_fixtures.tiny_model(), step_fixtures.optimizer(),
                                       step_fixtures.step_config(), _mesh())
  batch = step_fixtures.batch(0)
  # π_old is the policy before the update: the step's own forward, here from full logits.
  old, _ = step_fixtures.target_logprobs(trainable.compute_model(state), batch)
  mask = batch["loss_mask"] > 0
  expected = np.abs(batch["behaviour_logprobs"] - np.asarray(old))[mask].mean()
  _, metrics = trainable.step(state, trainable.put_batch(batch))
  np.testing.assert_allclose(float(metrics["rollout/logprob_diff"]), expected, rtol=1e-4)


def test_rows_sampled_under_a_hint_are_left_out_of_the_comparison():
  trainable, state = train_step.create(step_fixtures.tiny_model(), step_fixtures.optimizer(),
                                       step_fixtures.step_config(), _mesh())
  batch = dict(step_fixtures.batch(0))
  old, _ = step_fixtures.target_logprobs(trainable.compute_model(state), batch)
  hinted = np.arange(len(batch["loss_mask"])) % 2 == 1   # every other row saw a hint
  # The hinted rows' sampler log-probs are far off (a hint, not the weights): left out.
  batch["behaviour_logprobs"] = np.where(hinted[:, None], batch["behaviour_logprobs"] - 3.0,
                                         batch["behaviour_logprobs"]).astype(np.float32)
  compared = (batch["loss_mask"] > 0) & ~hinted[:, None]
  batch["same_context_mask"] = compared.astype(np.float32)
  expected = np.abs(batch["behaviour_logprobs"] - np.asarray(old))[compared].mean()
  _, metrics = trainable.step(state, trainable.put_batch(batch))
  np.testing.assert_allclose(float(metrics["rollout/logprob_diff"]), expected, rtol=1e-4)
  assert float(metrics["rollout/logprob_diff_tokens"]) == compared.sum()


def test_assemble_marks_only_rows_sampled_on_their_prefix():
  rows = [batching.Row(prefix_ids=[1, 2], response_ids=[3, 4, 5], response_loss_mask=[1, 0, 1],
                       response_behaviour_logprobs=[-1.0, 0.0, -2.0], advantage=1.0,
                       sampled_on_prefix=on_prefix) for on_prefix in (True, False)]
  batch = batching.assemble(rows, pad_id=0, prefix_multiple=2, response_multiple=4)
  # Prefix width 2, then the response: loss tokens at columns 2 and 4 of the first row only.
  np.testing.assert_array_equal(batch["same_context_mask"],
                                [[0, 0, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0]])


def _rows(engine, prompts):
  """One sampled reply per prompt, with the engine's log-probs as behaviour log-probs."""
  params = SamplingParams(max_new_tokens=8, temperature=1.0)
  results = engine.generate([GenerationRequest(p, params, seed=i)
                             for i, p in enumerate(prompts)])
  return [batching.Row(prefix_ids=p, response_ids=r.output_ids,
                       response_loss_mask=[1] * len(r.output_ids),
                       response_behaviour_logprobs=r.logprobs, advantage=1.0 - 2.0 * (i % 2))
          for i, (p, r) in enumerate(zip(prompts, results))]


def test_logprob_diff_rises_when_a_weight_sync_is_skipped():
  config = step_fixtures.step_config(beta=0.0)
  trainable, state = train_step.create(
      step_fixtures.tiny_model(), train_step.make_optimizer(
          train_step.OptimizerConfig(learning_rate=3e-2, max_grad_norm=1.0)), config, _mesh())
  rng = np.random.default_rng(0)
  prompts = [rng.integers(1, step_fixtures.VOCAB, 6).tolist() for _ in range(step_fixtures.ROWS)]
  # The stale sampler keeps its own copy of the initial weights; the synced one follows.
  stale = JaxEngine(trainable.compute_model(state, copy=True), max_batch=8,
                    prompt_buckets=(8,), max_new_tokens_buckets=(8,))
  synced = JaxEngine(trainable.compute_model(state, copy=True), max_batch=8,
                     prompt_buckets=(8,), max_new_tokens_buckets=(8,))

  def step(engine):
    batch = batching.assemble(_rows(engine, prompts), pad_id=0, prefix_multiple=4,
                              response_multiple=8, with_distill=True)
    return trainable.step(state, trainable.put_batch(batch))

  state, first = step(synced)
  for _ in range(2):   # the policy moves; only `synced` is told
    synced.update_weights(trainable.compute_model(state, copy=True), version=1)
    state, _ = step(synced)
  synced.update_weights(trainable.compute_model(state, copy=True), version=2)
  state, fresh = step(synced)   # the step donates `state`: the next one takes its result
  _, behind = step(stale)
  diffs = {name: float(m["rollout/logprob_diff"]) for name, m in
           (("first", first), ("fresh", fresh), ("behind", behind))}
  # A synced sampler agrees with the trainer to float32 rounding; a stale one by far more.
  assert diffs["first"] < 1e-4 and diffs["fresh"] < 1e-4, diffs
  assert diffs["behind"] > 1e-2, diffs
