"""Tempered or truncated sampling with the behaviour importance weight is refused by validation,
naming the keys, before anything loads (issue 21.8: the engines disagree on those log-probs)."""
from __future__ import annotations

import pytest

from rised_jax import config as config_lib
from rised_jax import pipelines
from tests.helpers.run_fixtures import TINY_CONFIG, load_config_file


def _config(arg="rised", **edits):
  config = load_config_file(TINY_CONFIG, arg)
  for dotted, value in edits.items():
    config_lib._set(config, dotted, value)
  return config


@pytest.mark.parametrize("edits,named", [
    ({"rollout.temperature": 0.7}, r"config\.rollout\.temperature=0\.7 with"),
    ({"rollout.temperature": 0.0}, r"config\.rollout\.temperature=0\.0 with"),
    ({"rollout.top_p": 0.9}, r"config\.rollout\.top_p=0\.9 with"),
    ({"rollout.top_k": 20}, r"config\.rollout\.top_k=20 with"),
    ({"rollout.temperature": 1.3, "rollout.top_k": 5},
     r"config\.rollout\.temperature=1\.3, config\.rollout\.top_k=5 with"),
])
@pytest.mark.parametrize("arg", ["rised", "grpo"])
def test_tempered_sampling_with_the_behaviour_weight_is_refused(arg, edits, named):
  with pytest.raises(ValueError, match=named + r" config\.step\.behaviour_weight=True.*"
                                     r"step\.behaviour_weight=False"):
    pipelines.validate(_config(arg, **edits))


def test_plain_sampling_or_no_behaviour_weight_is_accepted():
  pipelines.validate(_config())
  pipelines.validate(_config(**{"rollout.temperature": 0.7, "rollout.top_p": 0.9,
                                "step.behaviour_weight": False}))
  pipelines.validate(_config("rised_hint_no_iw", **{"rollout.top_k": 20}))
  pipelines.validate(_config(**{"eval.temperature": 0.5}))   # evaluation has no weight
