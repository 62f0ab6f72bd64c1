"""Group selection: RISED's profile-guided selector and the baselines, behind one interface.

`SELECTORS` maps names to classes: the built-ins below, entry points of group
`rised_jax.selectors`, and import paths "package.module:Class" (`rised_jax.plugins`); a plug-in
is a concrete `Selector` subclass whose constructor takes `seed` and its options as keywords.
"""
from __future__ import annotations

from typing import Any

from rised_jax import plugins
from rised_jax.select.base import Selector
from rised_jax.select.baselines import (CurriculumSelector, DapoSelector, RandomSelector,
                                        SuccessRateSelector, UniformSelector, VarianceSelector)
from rised_jax.select.rised import RisedSelector, cosine_similarity, greedy_select

__all__ = [
    "CurriculumSelector", "DapoSelector", "RandomSelector", "RisedSelector", "SELECTORS",
    "Selector", "SuccessRateSelector", "UniformSelector", "VarianceSelector", "cosine_similarity",
    "greedy_select", "make_selector",
]

SELECTORS = plugins.Registry("selector", "select.name", {
    cls.name: cls for cls in (RisedSelector, UniformSelector, RandomSelector, DapoSelector,
                              VarianceSelector, CurriculumSelector, SuccessRateSelector)
}, check=plugins.check_subclass(Selector))


def make_selector(name: str, **options: Any) -> Selector:
  """A selector by name ("rised", "uniform", "random", "dapo", "variance", "env_curriculum",
  "success_rate", an entry point or an import path)."""
  return SELECTORS.build(name, **options)

