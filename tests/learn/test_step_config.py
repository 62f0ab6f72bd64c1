"""The typed step and optimizer configs built from `default_config()` at their one boundary
(`config.step_config`, `config.optimizer_config`), against hand-listed values; each check's
refusal of one hand-picked bad value, by its exact message; the flat StepConfig interface is
gone."""
from __future__ import annotations

import re

import pytest

from rised_jax import config as config_lib
from rised_jax.learn import loss_terms, train_step


def test_default_config_builds_the_expected_typed_step():
  step = config_lib.step_config(config_lib.default_config())
  # Hand-listed: the defaults of default_config() (beta 0.05 is RISED's), read from each owner.
  assert step.teacher_kl.beta == 0.05
  assert step.teacher_kl.divergence == "forward-kl"
  assert step.teacher_kl.localize is False
  assert step.policy_gradient.aggregation == "seq-mean-token-mean"
  assert (step.policy_gradient.eps_low, step.policy_gradient.eps_high) == (0.2, 0.2)
  assert step.policy_gradient.importance_cap == 2.0
  assert step.reference_kl.ref_kl_coef == 0.0
  assert step.flips.counterfactual is False
  assert (step.teacher, step.chunk, step.micro_batches) == ("live", 256, 1)
  assert (step.num_iterations, step.mini_batches) == (1, 1)   # from config.train


def test_default_config_builds_the_expected_optimizer():
  config = config_lib.default_config()
  optim = config_lib.optimizer_config(config)
  assert (optim.learning_rate, optim.schedule, optim.max_grad_norm) == (1e-6, "constant", 1.0)
  assert optim.total_steps == 10   # config.train.steps, when larger than optim.total_steps


def test_the_schedule_keys_under_train_reach_the_step():
  config = config_lib.default_config()
  config.train.num_iterations, config.train.mini_batches = 4, 2
  step = config_lib.step_config(config)
  assert (step.num_iterations, step.mini_batches, step.updates_per_step) == (4, 2, 8)


@pytest.mark.parametrize("dotted, value, message", [
    ("step.beta", -1.0, "config.step: beta (-1.0) must be >= 0"),
    ("step.ref_kl_coef", -0.5, "config.step: ref_kl_coef (-0.5) must be >= 0"),
    ("step.distill_norm", "all", "config.step: distill_norm 'all': expected one of "
                                 "('distill-tokens', 'kept-tokens')"),
    ("step.flip_tau", float("nan"), "config.step: flip_tau=nan: expected a finite number"),
    ("step.teacher", "old", "config.step: teacher 'old': expected one of "
                            "('live', 'ema', 'frozen')"),
    ("step.max_update_ratio", 0.0, "config.step: max_update_ratio=0.0: expected a number > 0 "
                                   "(the largest accepted ‖Δθ‖ / ‖θ‖ of one update)"),
    ("train.mini_batches", 0, "config.train ({'num_iterations': 1, 'mini_batches': 0}): "
                              "micro_batches (1), chunk (256), num_iterations (1) and "
                              "mini_batches (0) must be >= 1"),
])
def test_each_step_check_refuses_its_bad_value_by_name(dotted, value, message):
  config = config_lib.default_config()
  config_lib._set(config, dotted, value)
  with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
    config_lib.step_config(config)


@pytest.mark.parametrize("key, value, message", [
    ("learning_rate", -1.0, "config.optim: learning_rate (-1.0) must be > 0 and warmup_steps "
                            "(0) >= 0"),
    ("schedule", "step", "config.optim: schedule 'step': expected one of "
                         "('constant', 'cosine', 'linear')"),
    ("max_grad_norm", 0.0, "config.optim: max_grad_norm must be > 0 or None, got 0.0"),
])
def test_each_optimizer_check_refuses_its_bad_value_by_name(key, value, message):
  config = config_lib.default_config()
  config.optim[key] = value
  with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
    config_lib.optimizer_config(config)


def test_the_flat_interface_is_gone():
  with pytest.raises(TypeError):
    train_step.StepConfig(beta=0.1)
  with pytest.raises(AttributeError):
    train_step.StepConfig().beta  # noqa: B018
  step = train_step.StepConfig(teacher_kl=loss_terms.TeacherKLConfig(beta=0.1))
  assert step.teacher_kl.beta == 0.1 and step.distills


def test_a_term_config_of_the_wrong_type_is_refused():
  with pytest.raises(TypeError, match=r"StepConfig\.teacher_kl=.*expected a TeacherKLConfig"):
    train_step.StepConfig(teacher_kl=loss_terms.ReferenceKLConfig())
