"""The "not set yet" convention of both pipelines' step records (`AgenticStep`, `RubricStep`).

A record field that a stage sets is None until that stage has run (never an empty value that
could pass for a result: an empty selection, a pipeline without a teacher), and a stage that
reads it first calls `require`, so a stage run out of order fails naming what it lacks.
"""
from __future__ import annotations

from typing import Any

STAGE_ORDER = "roll_out, judge, advantages, select, teach"   # the trainer's order


def require(record: Any, stage: str, *fields: str) -> None:
  """Raises when `stage` runs before the stages that set `fields` of `record` (None: not set)."""
  missing = [name for name in fields if getattr(record, name) is None]
  if missing:
    raise RuntimeError(f"{type(record).__name__} of step {record.step}: {stage} needs "
                       f"{missing}, which earlier stages set (order: {STAGE_ORDER})")
