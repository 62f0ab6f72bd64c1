"""Both CriPO branches acting, on a scripted model whose teacher distributions are known by hand.

`ScriptedLM` predicts the next token from the current token and from two markers seen anywhere
earlier in the row: INJECT (the injection teacher's prefix holds it) and COUNTER (the
counterfactual teacher's). Without a marker every prediction is uniform over the 16 tokens, so
log p_S = −log 16 everywhere, and each marker's effect is a hand-set table:

- INJECT: after token 1 the teacher puts logit 8 on token 2, after token 3 logit 4, after token 4
  logit 1 (any other current token: no change, KL 0). The per-token KL is then one of three
  closed-form values, ranked KL(8) > KL(4) > KL(1) > 0.
- COUNTER: logit 5 on every token except 3 and 7 ("the parts that satisfy the suppressed
  criterion"): p_T(3) / max p_T = e^−5 < α = 0.1 and p_T(3) < 1/16 = p_S(3), so exactly the
  tokens 3 and 7 of a negative-advantage row with a counterfactual teacher flip.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rised_jax import parallel
from rised_jax.learn import batching, chunked, cripo, train_step

VOCAB = 16
INJECT, COUNTER = 14, 15
RESPONSE = 200                     # 1 % edges: floor(0.01 · 200) = 2 tokens at each end


def kl_of_boost(c: float) -> float:
  """KL(softmax(c·e_k) ‖ uniform) over VOCAB tokens, in closed form."""
  z = math.exp(c) + VOCAB - 1
  top, rest = math.exp(c) / z, 1 / z
  return top * math.log(top * VOCAB) + (VOCAB - 1) * rest * math.log(rest * VOCAB)


class ScriptedLM(nnx.Module):
  """hidden = [one_hot(u), inject_seen · one_hot(u), counter_seen · one_hot(u)]; logits = hidden @ W."""

  dtype = jnp.float32   # the compute dtype (train_step.create casts forward-only copies to it)

  def __init__(self):
    table = np.zeros((3 * VOCAB, VOCAB), np.float32)
    for current, boost in ((1, 8.0), (3, 4.0), (4, 1.0)):
      table[VOCAB + current, 2] = boost
    table[2 * VOCAB:, :] = 5.0
    table[2 * VOCAB:, [3, 7]] = 0.0
    self.head = nnx.Param(jnp.asarray(table))

  def hidden_states(self, ids, attention_mask):
    current = jax.nn.one_hot(ids, VOCAB) * attention_mask[..., None]
    def seen(marker):
      return jax.lax.cummax(((ids == marker) & (attention_mask > 0)).astype(jnp.float32), axis=1)
    return jnp.concatenate([current, seen(INJECT)[..., None] * current,
                            seen(COUNTER)[..., None] * current], axis=-1)

  def logits(self, hidden):
    return hidden @ self.head[...]


def injection_response():
  """200 tokens of filler 5 with the KL-raising predecessors placed by hand (see the test)."""
  response = [5] * RESPONSE
  for position in (0, 49, 99, 149, 197, 198):       # y_{k−1} = 1 → KL(8) at k = 1, 50, 100, 150, 198, 199
    response[position] = 1
  for position in (19, 79, 129, 169):               # y_{k−1} = 3 → KL(4) at k = 20, 80, 130, 170
    response[position] = 3
  for position in range(30, 40):                    # y_{k−1} = 4 → KL(1) at k = 31 … 40
    response[position] = 4
  return response


CF_RESPONSE = [5, 3, 6, 7, 7, 8, 9, 3, 10, 11, 6, 5]   # the tokens 3 and 7 sit at 1, 3, 4, 7


def scripted_rows():
  row = lambda prefix, response, advantage, teacher=None, cf=None: batching.Row(  # noqa: E731
      prefix_ids=prefix, response_ids=response, response_loss_mask=[1] * len(response),
      response_behaviour_logprobs=[-math.log(VOCAB)] * len(response), advantage=advantage,
      teacher_prefix_ids=teacher, cf_teacher_prefix_ids=cf)
  return [
      # y*: its injection prefix holds INJECT and ends, like the student's, with token 1, so
      # response token 0 also has KL(8): it and 1, 198, 199 are edges, never kept.
      row([6, 1], injection_response(), 1.0, teacher=[INJECT, 6, 1]),
      row([6, 1], CF_RESPONSE, -0.5, cf=[COUNTER, 6, 1]),     # flips on 3 and 7
      row([6, 1], CF_RESPONSE, 0.5, cf=[COUNTER, 6, 1]),      # A > 0: no flips
      row([6, 1], CF_RESPONSE, -0.5),                         # no counterfactual teacher
  ]


def config(**overrides):
  base = dict(beta=0.05, chunk=32, clamp=10.0, localize=True, localize_gamma=0.95,
              localize_edge_frac=0.01, distill_norm="kept-tokens", counterfactual=True,
              flip_alpha=0.1, flip_tau=0.1, micro_batches=2)
  base.update(overrides)
  return train_step.StepConfig.from_keys(base)


def batch():
  return batching.assemble(scripted_rows(), pad_id=0, prefix_multiple=4, response_multiple=8,
                           with_distill=True, with_counterfactual=True)


def test_hand_kl_values_order_the_localisation():
  kl8, kl4, kl1 = kl_of_boost(8.0), kl_of_boost(4.0), kl_of_boost(1.0)
  interior = 3 * kl8 + 4 * kl4 + 10 * kl1         # the edges (four KL(8) tokens) are masked
  # Greedy by KL: the three KL(8), then the four KL(4) in position order; the sum reaches
  # 0.95 · total only with the fourth KL(4), so every KL(1) token is dropped.
  assert 3 * kl8 + 3 * kl4 < 0.95 * interior <= 3 * kl8 + 4 * kl4


def test_localisation_keeps_exactly_the_expected_tokens_and_skips_the_edges():
  model, data = ScriptedLM(), batch()
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  kept = np.asarray(train_step.kept_token_mask(params, rest, None, graphdef, config(),
                                                {k: jnp.asarray(v) for k, v in data.items()}))
  start = int(np.flatnonzero(data["distill_mask"][0])[0])          # response token 0's column
  assert np.flatnonzero(kept[0]).tolist() == [start + k for k in (20, 50, 80, 100, 130, 150, 170)]
  assert not kept[1:].any()


def test_flips_exactly_on_the_suppressed_tokens_of_the_negative_row():
  model, data = ScriptedLM(), {k: jnp.asarray(v) for k, v in batch().items()}
  student = model.hidden_states(data["input_ids"], data["attention_mask"])
  stats = chunked.token_stats_chunked(student, None, model.logits, data["input_ids"], chunk=32)
  cf_logprob, cf_log_max = chunked.teacher_token_stats_chunked(
      model.hidden_states(data["cf_teacher_input_ids"], data["cf_teacher_attention_mask"]),
      model.logits, data["input_ids"], chunk=32)
  np.testing.assert_allclose(np.asarray(stats.logprob)[data["loss_mask"] > 0], -math.log(VOCAB),
                             rtol=1e-6)
  _, flipped = cripo.counterfactual_flips(stats.logprob, cf_logprob, cf_log_max,
                                          data["advantages"], data["cf_mask"] * data["loss_mask"])
  start = int(np.flatnonzero(np.asarray(data["cf_mask"][1]))[0])
  assert np.flatnonzero(np.asarray(flipped[1])).tolist() == [start + k for k in (1, 3, 4, 7)]
  assert not np.asarray(flipped)[[0, 2, 3]].any()


def test_the_fused_step_counts_what_both_branches_did():
  mesh = parallel.make_mesh(parallel.MeshShape(1, 1, 1), devices=jax.devices()[:1])
  trainable, state = train_step.create(ScriptedLM(), optax.sgd(0.1), config(), mesh)
  _, metrics = trainable.step(state, trainable.put_batch(batch()))
  metrics = {k: float(v) for k, v in metrics.items()}
  assert (metrics["kept_tokens"], metrics["distill_tokens"]) == (7, RESPONSE)
  assert (metrics["flipped_tokens"], metrics["cf_tokens"]) == (4, 2 * len(CF_RESPONSE))
  np.testing.assert_allclose([metrics["kept_frac"], metrics["flip_frac"]], [7 / RESPONSE, 4 / 24],
                             rtol=1e-6)
  # L_distill is the mean KL over the 7 kept tokens: (3 · KL(8) + 4 · KL(4)) / 7.
  np.testing.assert_allclose(metrics["distill_loss"], (3 * kl_of_boost(8.0) + 4 * kl_of_boost(4.0)) / 7,
                             rtol=1e-5)
