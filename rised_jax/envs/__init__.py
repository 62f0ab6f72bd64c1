"""The built-in multi-turn text environments and their registry.

    env = rised_jax.envs.make("sokoban", boxes=2)   # difficulty knobs are keyword arguments
    observation = env.reset(seed)
    observation, reward, done, info = env.step("<answer>up</answer>")
    env.instance_key()                              # which game this seed generated

`instance_key(name, seed, difficulty)` gives the same key without keeping an environment
(memoised: the task stream and the selector ask for the same seeds).

See `base.Environment` for the protocol and `parsing` for how replies are read.
"""
from __future__ import annotations

import inspect
from typing import Any, Mapping

from rised_jax.envs.base import Environment, Outcome
from rised_jax.envs.countdown import Countdown
from rised_jax.envs.frozenlake import FrozenLake
from rised_jax.envs.household import Household
from rised_jax.envs.maze import Maze
from rised_jax.envs.parsing import format_answer
from rised_jax.envs.sokoban import Sokoban
from rised_jax.envs.wordle import Wordle

_REGISTRY: dict[str, type[Environment]] = {
    cls.name: cls for cls in (Sokoban, FrozenLake, Countdown, Wordle, Household, Maze)}


def names() -> list[str]:
  """The registered environment names."""
  return sorted(_REGISTRY)


def difficulty_keys(name: str) -> list[str]:
  """The keyword arguments `make(name, ...)` accepts (including max_turns and shaping)."""
  cls = _lookup(name)
  return sorted(p.name for p in inspect.signature(cls.__init__).parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY)


def make(name: str, **difficulty: Any) -> Environment:
  """A new environment; ValueError names any unknown environment or difficulty key."""
  cls = _lookup(name)
  valid = difficulty_keys(name)
  unknown = sorted(set(difficulty) - set(valid))
  if unknown:
    raise ValueError(f"{name}: unknown difficulty key(s) {unknown}; valid keys: {valid}")
  return cls(**difficulty)


_ENVS: dict[tuple, Environment] = {}
_KEYS: dict[tuple, str] = {}
_MAX_CACHED_KEYS = 1 << 18


def instance_key(name: str, seed: int, difficulty: Mapping[str, Any] | None = None) -> str:
  """`make(name, **difficulty).reset(seed)`'s `instance_key()`, memoised per (name, knobs, seed)."""
  knobs = tuple(sorted((str(k), repr(v)) for k, v in (difficulty or {}).items()))
  cache_key = (name, knobs, int(seed))
  if cache_key not in _KEYS:
    env = _ENVS.get((name, knobs))
    if env is None:
      env = _ENVS[(name, knobs)] = make(name, **dict(difficulty or {}))
    env.reset(int(seed))
    if len(_KEYS) >= _MAX_CACHED_KEYS:
      _KEYS.clear()
    _KEYS[cache_key] = env.instance_key()
  return _KEYS[cache_key]


def _lookup(name: str) -> type[Environment]:
  if not isinstance(name, str) or name not in _REGISTRY:
    raise ValueError(f"unknown environment {name!r}; valid names: {names()}")
  return _REGISTRY[name]


__all__ = ["Environment", "Outcome", "format_answer", "make", "names", "difficulty_keys",
           "instance_key",
           "Countdown", "FrozenLake", "Household", "Maze", "Sokoban", "Wordle"]


def check_config(config: Any) -> None:
  """config.envs: known environment names and each one's difficulty knobs."""
  unknown = [n for n in config.envs.names if n not in names()]
  if unknown or not config.envs.names:
    raise ValueError(f"config.envs.names={list(config.envs.names)}: unknown {unknown}; "
                     f"available {names()}")
  for name, knobs in config.envs.difficulty.items():
    if name not in config.envs.names:
      raise ValueError(f"config.envs.difficulty.{name}: {name!r} is not in config.envs.names")
    bad = sorted(set(knobs.keys()) - set(difficulty_keys(name)))
    if bad:
      raise ValueError(f"config.envs.difficulty.{name} has unknown knobs {bad}; "
                       f"{name} takes {difficulty_keys(name)}")
