"""The step's loss terms (learn/loss_terms.py) against hand-worked numbers, and the one boundary
between the flat `config.step` keys and the term configs (`train_step.StepConfig.from_keys`)."""
from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np
import pytest

from rised_jax.learn import loss_terms, train_step

LOSS_MASK = np.array([[1, 1, 1, 0], [0, 1, 1, 1]], np.float32)


def inputs(**overrides) -> loss_terms.TokenInputs:
  pg = loss_terms.PolicyGradientConfig(aggregation="token-mean")
  fields = dict(
      logprob=jnp.asarray(np.log([[0.5, 0.25, 0.5, 0.9], [0.9, 0.125, 0.5, 0.25]]), jnp.float32),
      old_logprobs=jnp.asarray(np.log([[0.5, 0.25, 0.5, 0.9], [0.9, 0.125, 0.5, 0.25]]),
                               jnp.float32),
      advantages=jnp.asarray([[1.0, 1.0, 1.0, 1.0], [-2.0, -2.0, -2.0, -2.0]]),
      loss_mask=jnp.asarray(LOSS_MASK), behaviour_logprobs=None, divergence=None,
      distill_mask=None, kept_mask=None, ref_logprobs=None, beta=jnp.float32(0.5),
      denominators={"pg": jnp.float32(6.0)},
      aggregate=functools.partial(loss_terms.aggregate, pg))
  fields.update(overrides)
  return loss_terms.TokenInputs(**fields)


def test_policy_gradient_at_ratio_one_is_minus_the_advantage_sum():
  """r = 1: each loss token contributes −A_t; token-mean sums them (3·(−1) + 3·(+2) = 3)."""
  part = loss_terms.policy_gradient(loss_terms.PolicyGradientConfig(aggregation="token-mean"),
                                    inputs())
  assert float(part.total) == pytest.approx(3.0)
  assert part.weight is None and float(part.denominator) == 6.0
  assert float(part.metric_sums["clip_frac_low"]) == 0.0


def test_teacher_kl_sums_the_divergence_on_the_distillation_tokens():
  divergence = jnp.asarray([[0.5, 2.0, 1.0, 9.0], [0.0, 0.25, 4.0, 1.0]])
  distill = jnp.asarray([[1, 1, 0, 0], [0, 1, 1, 0]], jnp.float32)
  x = inputs(divergence=divergence, distill_mask=distill,
             denominators={"pg": jnp.float32(6.0), "distill": jnp.float32(4.0)})
  part = loss_terms.teacher_kl(loss_terms.TeacherKLConfig(beta=0.5), x)
  assert float(part.total) == pytest.approx(0.5 + 2.0 + 0.25 + 4.0)
  assert float(part.denominator) == 4.0 and float(part.weight) == 0.5
  assert float(part.metric_sums["kept_tokens"]) == 4.0


def test_localised_teacher_kl_counts_its_kept_tokens_in_the_pass():
  """γ = 0.5, no edges: row 0 keeps its largest divergence 2.0 (≥ half of 2.5), row 1 its 4.0
  (≥ half of 4.25); with kept-token normalisation the denominator is those 2 tokens."""
  divergence = jnp.asarray([[0.5, 2.0, 1.0, 9.0], [0.0, 0.25, 4.0, 1.0]])
  distill = jnp.asarray([[1, 1, 0, 0], [0, 1, 1, 0]], jnp.float32)
  cfg = loss_terms.TeacherKLConfig(beta=0.5, localize=True, localize_gamma=0.5,
                                   localize_edge_frac=0.0, distill_norm="kept-tokens")
  part = loss_terms.teacher_kl(cfg, inputs(divergence=divergence, distill_mask=distill,
                                           denominators={"distill": jnp.float32(4.0)}))
  assert float(part.total) == pytest.approx(6.0)
  assert float(part.denominator) == 2.0


def test_reference_kl_is_aggregated_like_the_policy_gradient():
  """k1 = log π − log π_ref on the loss tokens: row 0 log 2 three times, row 1 −log 2, 0,
  −log 2; token-mean sums them to log 2 over the policy gradient's denominator."""
  logprob = jnp.log(jnp.asarray([[0.5, 0.5, 0.5, 0.5], [0.25, 0.25, 0.5, 0.25]]))
  ref = jnp.log(jnp.asarray([[0.25, 0.25, 0.25, 0.1], [0.5, 0.5, 0.5, 0.5]]))
  x = inputs(logprob=logprob, ref_logprobs=ref)
  part = loss_terms.reference_kl(loss_terms.ReferenceKLConfig(0.1, "k1"), x)
  assert float(part.total) == pytest.approx(3 * np.log(2) - 2 * np.log(2) + 0.0, abs=1e-6)
  assert float(part.weight) == pytest.approx(0.1) and float(part.denominator) == 6.0


def test_the_loss_is_the_weighted_sum_of_the_parts():
  parts = {"a": loss_terms.LossPart(None, jnp.float32(3.0), jnp.float32(6.0), {}),
           "b": loss_terms.LossPart(jnp.float32(0.5), jnp.float32(8.0), jnp.float32(2.0), {}),
           "c": loss_terms.LossPart(0.1, jnp.float32(1.0), jnp.float32(0.0), {})}
  assert float(loss_terms.total_loss(parts)) == pytest.approx(0.5 + 2.0 + 0.1 / 1e-9, rel=1e-6)


# ----------------------------------------------------------------------------- the key boundary


def test_every_term_has_its_step_config_field_and_keys_are_owned_once():
  fields = {f.name for f in dataclasses.fields(train_step.StepConfig)}
  assert set(train_step.TERM_CONFIGS) <= fields
  owned = [f.name for cls in train_step.TERM_CONFIGS.values() for f in dataclasses.fields(cls)]
  assert len(owned) == len(set(owned)), "a config.step key owned by two term configs"
  assert not set(owned) & fields


def test_flat_keys_go_to_their_term_and_come_back():
  config = train_step.StepConfig.from_keys(dict(beta=0.05, eps_high=0.28, ref_kl_coef=0.1,
                                                counterfactual=True, chunk=64))
  assert config.teacher_kl.beta == 0.05 and config.policy_gradient.eps_high == 0.28
  assert config.reference_kl.ref_kl_coef == 0.1 and config.flips.counterfactual
  assert config.chunk == 64 and config.teacher_kl.divergence == "forward-kl"   # a default
  keys = config.as_keys()
  assert (keys["beta"], keys["eps_high"], keys["chunk"], keys["eps_low"]) == (0.05, 0.28, 64, 0.2)
  assert train_step.StepConfig.from_keys(keys) == config
  assert set(keys) == set(train_step.KEY_OWNERS)
  assert list(config.active_terms()) == ["policy_gradient", "teacher_kl", "reference_kl"]
  assert list(train_step.StepConfig().active_terms()) == ["policy_gradient"]


@pytest.mark.parametrize("keys, message", [
    ({"beta": float("nan")}, r"beta=nan: expected a finite number"),
    ({"ref_kl_coef": -1.0}, r"ref_kl_coef \(-1.0\) must be >= 0"),
    ({"aggregation": "mean"}, r"config.step.aggregation: unknown loss aggregation 'mean'"),
    ({"localize": True}, r"localize=True needs a distillation weight beta > 0"),
    ({"flip_alpha": "0.1"}, r"flip_alpha='0.1': expected a finite number"),
    ({"teacher": "old"}, r"teacher 'old': expected one of"),
])
def test_a_bad_key_is_named_by_its_term_config(keys, message):
  with pytest.raises(ValueError, match=message):
    train_step.StepConfig.from_keys(keys)


def test_an_unknown_key_is_refused():
  with pytest.raises(TypeError, match=r"unknown step keys \['bta'\]"):
    train_step.StepConfig.from_keys({"bta": 0.1})
