"""The rollout engine a config names: its checks and the request limits it will have.

`check_config` is the engine stage's part of config validation (`pipelines.validate`);
`limits_of(config)` answers before any model is loaded what the built engine's `limits()` will,
so a stage can check its longest prompt and reply against the config alone.
"""
from __future__ import annotations

from typing import Any

from rised_jax.checks import is_http_url
from rised_jax.rollout.base import EngineLimits
from rised_jax.rollout.sglang_engine import WEIGHT_SYNCS

ENGINES = ("jax", "sglang")


def check_config(config: Any) -> None:
  """config.rollout's engine name, server URL, reply prefix, stop strings and async roll-outs."""
  if config.rollout.engine not in ENGINES:
    raise ValueError(f"config.rollout.engine={config.rollout.engine!r}: expected 'jax' or 'sglang'")
  if config.rollout.engine == "sglang" and not is_http_url(config.rollout.sglang_url):
    raise ValueError(f"config.rollout.sglang_url={config.rollout.sglang_url!r}: expected the "
                     "SGLang server's http(s) URL, e.g. 'http://127.0.0.1:30000'")
  if config.rollout.sglang.weight_sync not in WEIGHT_SYNCS:
    raise ValueError(f"config.rollout.sglang.weight_sync={config.rollout.sglang.weight_sync!r}: "
                     f"expected one of {WEIGHT_SYNCS}")
  if not isinstance(config.rollout.reply_prefix, str):
    raise ValueError(f"config.rollout.reply_prefix={config.rollout.reply_prefix!r}: expected a "
                     "string")
  stops = config.rollout.stop_strings
  if isinstance(stops, str) or not all(isinstance(x, str) and x for x in stops):
    raise ValueError(f"config.rollout.stop_strings={stops!r}: expected a list of non-empty "
                     "strings")
  if not isinstance(config.rollout.async_rollouts, bool):
    raise ValueError(f"config.rollout.async_rollouts={config.rollout.async_rollouts!r}: "
                     "expected True or False")
  if config.rollout.async_rollouts and not config.step.behaviour_weight:
    raise ValueError("config.rollout.async_rollouts=True with config.step.behaviour_weight="
                     "False: rollouts sampled by the previous step's policy need the truncated "
                     "importance weight against it; keep behaviour_weight=True")


def limits_of(config: Any) -> EngineLimits:
  """The `limits()` of the engine `config.rollout` builds (JaxEngine: its largest buckets)."""
  if config.rollout.engine == "jax":
    return EngineLimits.of_buckets(config.rollout.prompt_buckets,
                                   config.rollout.new_token_buckets)
  return EngineLimits()
