"""The rollout stage's typed config (`config.rollout`, built at `pipelines.stages`): the engine
it builds, the sampling and the agent loop's token budgets, and their checks.

`check()` holds every check of a `config.rollout` key alone (run by `pipelines.validate`, so
`--dry_run` too); checks against other sections (the behaviour weight of `config.step`) are
the boundary's ("Checks across sections" in `pipelines.stages`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from rised_jax.checks import (Rule, as_given, check_rules, from_section, int_at_least, is_http_url,
                              is_number, number_at_least, positive_ints)
from rised_jax.rollout.base import MATMUL_OPERANDS, EngineLimits
from rised_jax.rollout.sglang_engine import WEIGHT_SYNCS

ENGINES = ("jax", "sglang")


@dataclasses.dataclass(frozen=True)
class SGLangConfig:
  """config.rollout.sglang: the SGLang client's deadlines, retries and weight sync."""

  timeout_s: float
  retries: int
  max_reply_bytes: int
  weight_dir: str
  weight_sync: str
  tensor_bucket_bytes: int

  @classmethod
  def from_config(cls, section: Any) -> SGLangConfig:
    return from_section(cls, section)

  def check(self) -> None:
    check_rules("config.rollout.sglang", self, SGLANG_RULES)
    if self.weight_sync not in WEIGHT_SYNCS:
      raise ValueError(f"config.rollout.sglang.weight_sync={self.weight_sync!r}: expected one "
                       f"of {WEIGHT_SYNCS}")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """config.rollout (docs/config.md): lists are tuples."""

  engine: str
  sglang_url: str
  sglang: SGLangConfig
  group_size: int
  temperature: float
  top_p: float
  top_k: int
  max_new_tokens_per_turn: int
  max_total_tokens: int
  max_batch: int
  reply_prefix: str
  stop_strings: tuple[str, ...]
  batch_buckets: tuple[int, ...]
  reuse_prefix: bool
  decode_chunk: int
  matmul_operands: str
  async_rollouts: bool
  prompt_buckets: tuple[int, ...]
  new_token_buckets: tuple[int, ...]

  @classmethod
  def from_config(cls, section: Any) -> RolloutConfig:
    return from_section(cls, section, sglang=SGLangConfig.from_config(section.sglang))

  def check(self) -> None:
    """Values, engine name, server URL, the sampler's matmul operands, reply prefix, stop
    strings and the async flag."""
    check_rules("config.rollout", self, ROLLOUT_RULES)
    self.sglang.check()
    if self.group_size < 2:
      raise ValueError(f"config.rollout.group_size={self.group_size}: group advantages need at "
                       "least 2 rollouts per task")
    if self.engine not in ENGINES:
      raise ValueError(f"config.rollout.engine={self.engine!r}: expected 'jax' or 'sglang'")
    if self.engine == "sglang" and not is_http_url(self.sglang_url):
      raise ValueError(f"config.rollout.sglang_url={self.sglang_url!r}: expected the SGLang "
                       "server's http(s) URL, e.g. 'http://127.0.0.1:30000'")
    if self.engine == "sglang" and self.matmul_operands != "compute":
      raise ValueError(f"config.rollout.matmul_operands={self.matmul_operands!r}: applies to "
                       "the in-process sampler (engine='jax'); with engine='sglang' the "
                       "server's own dtype and quantization flags set its matmuls")
    if not isinstance(self.reply_prefix, str):
      raise ValueError(f"config.rollout.reply_prefix={self.reply_prefix!r}: expected a string")
    stops = self.stop_strings
    if isinstance(stops, str) or not all(isinstance(x, str) and x for x in stops):
      raise ValueError(f"config.rollout.stop_strings={as_given(stops)!r}: expected a list of "
                       "non-empty strings")
    if not isinstance(self.async_rollouts, bool):
      raise ValueError(f"config.rollout.async_rollouts={self.async_rollouts!r}: expected True or "
                       "False")

  def limits(self) -> EngineLimits:
    """The `limits()` of the engine this config builds (JaxEngine: its largest buckets), known
    before any model is loaded."""
    if self.engine == "jax":
      return EngineLimits.of_buckets(self.prompt_buckets, self.new_token_buckets)
    return EngineLimits()

  def check_agent_turns_fit(self) -> None:
    """The engine's fixed buckets (JaxEngine) take the longest prompt (max_total_tokens − 1) and
    reply an agent loop may send (`AgentLoop` checks the same of the built engine)."""
    limits = self.limits()
    if not limits.prompt_fits(self.max_total_tokens - 1):
      raise ValueError(f"config.rollout.prompt_buckets={list(self.prompt_buckets)}: expected a "
                       f"bucket >= {self.max_total_tokens - 1}, the longest prompt "
                       f"config.rollout.max_total_tokens={self.max_total_tokens} allows (or a "
                       "smaller max_total_tokens)")
    if not limits.reply_fits(self.max_new_tokens_per_turn):
      raise ValueError(f"config.rollout.new_token_buckets={list(self.new_token_buckets)}: "
                       f"expected a bucket >= config.rollout.max_new_tokens_per_turn="
                       f"{self.max_new_tokens_per_turn}")


SGLANG_RULES: dict[str, Rule] = {
    "timeout_s": ((lambda v: is_number(v) and v > 0),
                  "a finite number of seconds > 0 (the deadline of one request)"),
    "retries": int_at_least(0),
    "max_reply_bytes": int_at_least(1, "an integer >= 1 (bytes)"),
    "tensor_bucket_bytes": int_at_least(1, "an integer >= 1 (bytes)"),
}
ROLLOUT_RULES: dict[str, Rule] = {
    "temperature": number_at_least(0, "a finite number >= 0 (0: greedy)"),
    "top_p": ((lambda v: is_number(v) and 0 < v <= 1), "a number in (0, 1]"),
    "top_k": int_at_least(0, "an integer >= 0 (0: no top-k)"),
    "max_new_tokens_per_turn": int_at_least(1),
    "max_total_tokens": int_at_least(1),
    "max_batch": int_at_least(1),
    "decode_chunk": int_at_least(0, "an integer >= 0 (0: one decode call per turn)"),
    "matmul_operands": ((lambda v: v in MATMUL_OPERANDS), f"one of {MATMUL_OPERANDS}"),
    "batch_buckets": positive_ints(0),
    "prompt_buckets": positive_ints(1),
    "new_token_buckets": positive_ints(1),
}
