"""The agentic pipeline's tag judge: its typed config (`config.judge`, built at
`pipelines.stages`) and its check."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from rised_jax.checks import Rule, check_rules, from_section, int_at_least, named
from rised_jax.rubrics import JUDGES
from rised_jax.rubrics.engine_text import supplied_options
from rised_jax.rubrics.vocabulary import Vocabulary

RULES: dict[str, Rule] = {"max_new_tokens": int_at_least(1)}


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
  """config.judge (docs/config.md): backend, vocabulary file ("" = the built-in agentic_v1),
  backend options and the in-process judge's answer length."""

  backend: str
  vocabulary: str
  options: Mapping[str, Any]
  max_new_tokens: int

  @classmethod
  def from_config(cls, section: Any) -> JudgeConfig:
    return from_section(cls, section)

  @property
  def vocabulary_name(self) -> str:
    return self.vocabulary or "agentic_v1"

  def check(self) -> None:
    """The answer length, the backend and its options, and the vocabulary file."""
    check_rules("config.judge", self, RULES)
    with named("config.judge"):   # name errors name config.judge.backend themselves
      JUDGES.check_options(self.backend, dict(self.options), positional=1,
                           supplied=supplied_options(self.backend))
    Vocabulary.load(self.vocabulary_name)
