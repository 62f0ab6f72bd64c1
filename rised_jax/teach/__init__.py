"""Teacher contexts and rollout guidance (docs/ALGORITHMS.md §2.5–2.6)."""
from __future__ import annotations

from typing import Any

from rised_jax import plugins
from rised_jax.checks import named
from rised_jax.teach.guidance import GuidanceMemory
from rised_jax.teach.positive import (PositiveMemory, Positives, PositiveTeacher,
                                      available_positives, positive_teacher_prefix)

__all__ = ["GuidanceMemory", "PositiveMemory", "PositiveTeacher", "Positives",
           "available_positives", "check_config", "positive_teacher_prefix"]


def check_config(config: Any, distills: bool) -> None:
  """config.teacher and config.guidance of the agentic pipeline; `distills` is whether the
  step has a distillation weight (`StepConfig.distills`)."""
  with named("config.teacher.options"):
    plugins.check_options("teacher", "positive", PositiveTeacher,
                          config.teacher.options.to_dict(), positional=1)
  with named("config.guidance.options"):
    plugins.check_options("guidance", "memory", GuidanceMemory,
                          config.guidance.options.to_dict(), positional=1)
  if config.teacher.enabled != distills:
    raise ValueError(
        f"config.teacher.enabled={config.teacher.enabled} but config.step.beta="
        f"{config.step.beta}: the teacher is trained on only through the distillation weight, "
        "so expected beta > 0 with the teacher and beta = 0 without it (a config file built for "
        "a preset without the teacher has beta 0: give --config.step.beta, or name the "
        "algorithm in the config file's argument, --config FILE.py:ALGORITHM)")
