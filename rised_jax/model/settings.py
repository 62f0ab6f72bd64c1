"""The policy model's typed config (`config.model`, built at `pipelines.stages`): which checkpoint
the run loads and at which precision. The architecture itself is `ModelConfig`, read from the
checkpoint."""
from __future__ import annotations

import dataclasses
from typing import Any

from rised_jax.checks import Rule, check_rules, from_section
from rised_jax.model import DTYPES

# Master weights and compute (rised_jax/learn/precision.py).
MODEL_DTYPES = tuple(DTYPES)


def _one_of(names: tuple[str, ...]) -> Rule:
  return (lambda v: v in names), f"one of {list(names)}"


RULES: dict[str, Rule] = {
    "source": ((lambda v: isinstance(v, str) and bool(v.strip())),
               "a non-empty string: an HF directory, a .gguf file, a packaged name or a hub id"),
    "param_dtype": _one_of(MODEL_DTYPES),
    "compute_dtype": _one_of(MODEL_DTYPES),
    "remat": ((lambda v: isinstance(v, bool)), "True or False"),
    "scan_layers": ((lambda v: isinstance(v, bool)), "True or False"),
}


@dataclasses.dataclass(frozen=True)
class ModelLoadConfig:
  """config.model (docs/config.md): the checkpoint and the dtypes it is loaded with."""

  source: str
  param_dtype: str
  compute_dtype: str
  remat: bool
  scan_layers: bool

  @classmethod
  def from_config(cls, section: Any) -> ModelLoadConfig:
    return from_section(cls, section)

  def check(self) -> None:
    check_rules("config.model", self, RULES)
