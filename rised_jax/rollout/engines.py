"""The rollout engine a config names: its checks and the request limits it will have.

`check_config` is the engine stage's part of config validation (`pipelines.validate`);
`limits_of(config)` answers before any model is loaded what the built engine's `limits()` will,
so a stage can check its longest prompt and reply against the config alone.
"""
from __future__ import annotations

from typing import Any

from rised_jax.rollout.base import EngineLimits

ENGINES = ("jax", "sglang")


def check_config(config: Any) -> None:
  """config.rollout's engine name, reply prefix and stop strings."""
  if config.rollout.engine not in ENGINES:
    raise ValueError(f"config.rollout.engine={config.rollout.engine!r}: expected 'jax' or 'sglang'")
  if not isinstance(config.rollout.reply_prefix, str):
    raise ValueError(f"config.rollout.reply_prefix={config.rollout.reply_prefix!r}: expected a "
                     "string")
  stops = config.rollout.stop_strings
  if isinstance(stops, str) or not all(isinstance(x, str) and x for x in stops):
    raise ValueError(f"config.rollout.stop_strings={stops!r}: expected a list of non-empty "
                     "strings")


def limits_of(config: Any) -> EngineLimits:
  """The `limits()` of the engine `config.rollout` builds (JaxEngine: its largest buckets)."""
  if config.rollout.engine == "jax":
    return EngineLimits.of_buckets(config.rollout.prompt_buckets,
                                   config.rollout.new_token_buckets)
  return EngineLimits()
