"""The selector interface: choose B of a pool's K candidate groups (docs/ALGORITHMS.md §2.4, 2.7).

Every selector is deterministic given its `seed`: the randomness of step t comes from
`numpy.random.default_rng([seed, t])`, so a resumed run needs no saved RNG state, only the
selector's host-side memory (`state_dict()` / `load_state_dict()`).

`select` returns distinct indices into the pool, at most `batch_size` of them (exactly
min(batch_size, len(pool)) for every selector except DAPO with `shortfall="truncate"`).
"""
from __future__ import annotations

import abc
from typing import Any, Mapping, Sequence

import numpy as np

from rised_jax.types import Group, GroupTags


class Selector(abc.ABC):
  """Chooses which groups of a candidate pool are trained on."""

  name: str = ""

  def __init__(self, seed: int = 0):
    if not isinstance(seed, (int, np.integer)) or seed < 0:
      raise ValueError(f"selector {self.name!r}: seed={seed!r}; expected a non-negative int")
    self.seed = int(seed)

  def select(self, pool: Sequence[Group], batch_size: int, step: int,
             tags: Sequence[GroupTags] | None = None) -> list[int]:
    """Distinct indices of the chosen groups, in the order they were chosen.

    `tags[k]` is the judge's answer for `pool[k]` (selectors that read profiles need it;
    None: no rollout is judged)."""
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 0:
      raise ValueError(f"selector {self.name!r}: batch_size={batch_size!r}; expected an int >= 0")
    if not isinstance(step, (int, np.integer)) or step < 0:
      raise ValueError(f"selector {self.name!r}: step={step!r}; expected an int >= 0")
    for i, group in enumerate(pool):
      if not isinstance(group, Group):
        raise TypeError(f"selector {self.name!r}: pool[{i}] is {type(group).__name__}; "
                        "expected rised_jax.types.Group")
    if tags is not None and len(tags) != len(pool):
      raise ValueError(f"selector {self.name!r}: {len(tags)} GroupTags for a pool of "
                       f"{len(pool)} groups")
    chosen = [int(i) for i in self._select(pool, tags, int(batch_size), int(step),
                                           np.random.default_rng([self.seed, int(step)]))]
    if len(set(chosen)) != len(chosen) or len(chosen) > batch_size or not all(
        0 <= i < len(pool) for i in chosen):
      raise AssertionError(f"selector {self.name!r} returned invalid indices {chosen} for a "
                           f"pool of {len(pool)} and batch size {batch_size}")
    return chosen

  @abc.abstractmethod
  def _select(self, pool: Sequence[Group], tags: Sequence[GroupTags] | None, batch_size: int,
              step: int, rng: np.random.Generator) -> Sequence[int]:
    """The selection itself; arguments are validated."""

  def state_dict(self) -> dict[str, Any]:
    """Host-side memory needed to resume exactly (plain Python values: JSON-serialisable)."""
    return {}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    if state:
      raise ValueError(f"selector {self.name!r} keeps no state; got keys {sorted(state)}")


def argmax_with_ties(scores: np.ndarray, order: np.ndarray) -> int:
  """The index of the largest score; among equal scores, the one first in `order`."""
  return int(order[np.argmax(scores[order])])


def check_choice(selector: str, option: str, value: Any, choices: Sequence[Any]) -> None:
  if value not in choices:
    raise ValueError(f"selector {selector!r}: {option}={value!r}; expected one of {list(choices)}")
