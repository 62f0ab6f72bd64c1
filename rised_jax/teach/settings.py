"""The teacher's and the guidance memory's typed configs (`config.teacher`, `config.guidance`,
built at `pipelines.stages`) and their checks. That the teacher needs the step's distillation
weight is a check across sections, the boundary's ("Checks across sections" in
`pipelines.stages`)."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from rised_jax import plugins
from rised_jax.checks import from_section, named
from rised_jax.teach.guidance import GuidanceMemory
from rised_jax.teach.positive import PositiveTeacher


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
  """config.teacher: the positive-rubric teacher (§2.5) and its `PositiveTeacher` options."""

  enabled: bool
  options: Mapping[str, Any]

  @classmethod
  def from_config(cls, section: Any) -> TeacherConfig:
    return from_section(cls, section)

  def check(self) -> None:
    with named("config.teacher.options"):
      plugins.check_options("teacher", "positive", PositiveTeacher, dict(self.options),
                            positional=1)


@dataclasses.dataclass(frozen=True)
class GuidanceConfig:
  """config.guidance: the rollout hint memory (§2.6), its `GuidanceMemory` options, and whether
  the student trains on the hinted prompt."""

  enabled: bool
  train_with_hint: bool
  options: Mapping[str, Any]

  @classmethod
  def from_config(cls, section: Any) -> GuidanceConfig:
    return from_section(cls, section)

  def check(self) -> None:
    with named("config.guidance.options"):
      plugins.check_options("guidance", "memory", GuidanceMemory, dict(self.options),
                            positional=1)
