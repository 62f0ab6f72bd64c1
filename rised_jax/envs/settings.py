"""The environments' typed config (`config.envs`, built at `pipelines.stages`) and its check."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from rised_jax import envs
from rised_jax.checks import Rule, check_rules, from_section, int_at_least, is_number, named

RULES: dict[str, Rule] = {
    "max_turns": int_at_least(0, "an integer >= 0 (0: each environment's own)"),
    "max_abs_reward": ((lambda v: is_number(v) and 0 < v <= 3.4e38),
                       "a number in (0, 3.4e38] (the largest |step reward| accepted)"),
}


@dataclasses.dataclass(frozen=True)
class EnvsConfig:
  """config.envs (docs/config.md): `difficulty` per environment name {knob: value};
  `aliases` name -> class or import path (registered when the pipeline is built)."""

  names: tuple[str, ...]
  difficulty: Mapping[str, Mapping[str, Any]]
  max_turns: int
  max_abs_reward: float
  aliases: Mapping[str, Any]

  @classmethod
  def from_config(cls, section: Any) -> EnvsConfig:
    return from_section(cls, section)

  def check(self) -> None:
    """Values, the aliases' names and targets, every name imported (plug-ins and suites: their
    errors come before the model loads) and each one's difficulty knobs. Registers nothing: an
    alias resolves to its target here, and is registered when the pipeline is built."""
    check_rules("config.envs", self, RULES)
    if not self.names:
      raise ValueError(f"config.envs.names=[]: expected at least one of "
                       f"{envs.names() + envs.suite_names()} or an import path "
                       "'package.module:Class'")
    aliased: dict[str, type] = {}
    for alias, target in self.aliases.items():
      with named(f"config.envs.aliases.{alias}"):
        envs.check_alias(alias, target)
        aliased[alias] = target if isinstance(target, type) else envs.ENVIRONMENTS[target]
    classes = {name: aliased[name] if name in aliased else envs.ENVIRONMENTS.lookup(name)
               for name in self.names}
    for name in self.difficulty:
      if name not in self.names:
        raise ValueError(f"config.envs.difficulty.{name}: {name!r} is not in config.envs.names")
    for name, cls in classes.items():
      knobs = dict(self.difficulty.get(name) or {})
      with named("config.envs.names"):
        envs.check_name(name, knobs, cls)
      envs.check_knob_values(name, knobs, cls)
