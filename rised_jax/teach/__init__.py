"""Teacher contexts and rollout guidance (docs/ALGORITHMS.md §2.5–2.6)."""
from __future__ import annotations

from rised_jax.teach.guidance import GuidanceMemory
from rised_jax.teach.positive import (PositiveMemory, Positives, PositiveTeacher,
                                      available_positives, positive_teacher_prefix)

__all__ = ["GuidanceMemory", "PositiveMemory", "PositiveTeacher", "Positives",
           "available_positives", "positive_teacher_prefix"]

