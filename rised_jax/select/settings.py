"""The selection stage's typed config (`config.select`, built at `pipelines.stages`) and its
check."""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Mapping

from rised_jax.checks import Rule, check_rules, from_section, int_at_least, named
from rised_jax.select import SELECTORS

RULES: dict[str, Rule] = {"pool_groups": int_at_least(1), "batch_groups": int_at_least(1)}


@dataclasses.dataclass(frozen=True)
class SelectConfig:
  """config.select (docs/config.md): the selector, K (`pool_groups`) groups rolled out and B
  (`batch_groups`) trained on per step."""

  name: str
  pool_groups: int
  batch_groups: int
  compute_matched: bool
  options: Mapping[str, Any]

  @classmethod
  def from_config(cls, section: Any) -> SelectConfig:
    return from_section(cls, section)

  def check(self) -> None:
    """The sizes, the selector's name and options, and a batch that fits the pool."""
    check_rules("config.select", self, RULES)
    with named("config.select"):   # name errors name config.select.name themselves
      SELECTORS.check_options(self.name, dict(self.options))
    if self.batch_groups > self.pool_groups:
      raise ValueError(f"config.select.batch_groups={self.batch_groups} exceeds "
                       f"config.select.pool_groups={self.pool_groups}")
    if self.name == "rised" and self.pool_groups == self.batch_groups:
      warnings.warn(f"config.select.name='rised' with pool_groups == batch_groups == "
                    f"{self.batch_groups}: every group is trained on, so profile selection does "
                    "nothing (the shipped configs roll out pool_groups = 4 * batch_groups; "
                    "docs/rised.md#selection)", stacklevel=3)

