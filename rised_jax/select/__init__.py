"""Group selection: RISED's profile-guided selector and the baselines, behind one interface."""
from __future__ import annotations

from typing import Any

from rised_jax.rubrics import registry
from rised_jax.select.base import Selector
from rised_jax.select.baselines import (CurriculumSelector, DapoSelector, RandomSelector,
                                        SuccessRateSelector, UniformSelector, VarianceSelector)
from rised_jax.select.rised import RisedSelector, cosine_similarity, greedy_select

__all__ = [
    "CurriculumSelector", "DapoSelector", "RandomSelector", "RisedSelector", "SELECTORS",
    "Selector", "SuccessRateSelector", "UniformSelector", "VarianceSelector", "cosine_similarity",
    "greedy_select", "make_selector",
]

SELECTORS: dict[str, type[Selector]] = {
    cls.name: cls for cls in (RisedSelector, UniformSelector, RandomSelector, DapoSelector,
                              VarianceSelector, CurriculumSelector, SuccessRateSelector)
}


def make_selector(name: str, **options: Any) -> Selector:
  """A selector by name ("rised", "uniform", "random", "dapo", "variance", "env_curriculum",
  "success_rate")."""
  return registry.build("selector", SELECTORS, name, **options)
