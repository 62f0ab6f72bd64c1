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

import importlib
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
# Real suites behind optional extras (README, "Real environment suites"): imported on first use,
# so `import rised_jax` never needs them. name -> (module, class).
_SUITES: dict[str, tuple[str, str]] = {
    "babyai": ("rised_jax.envs.babyai", "BabyAI"),
    "scienceworld": ("rised_jax.envs.scienceworld_env", "ScienceWorld"),
    "twx_coin": ("rised_jax.envs.twx", "CoinCollector"),
    "twx_cooking": ("rised_jax.envs.twx", "CookingWorld"),
    "twx_twc": ("rised_jax.envs.twx", "Commonsense"),
}


def names() -> list[str]:
  """The built-in environment names."""
  return sorted(n for n in _REGISTRY if n not in _SUITES)


def suite_names() -> list[str]:
  """The real suites' environment names, installed or not (`make` names a missing extra)."""
  return sorted(_SUITES)


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
  if isinstance(name, str) and name in _SUITES and name not in _REGISTRY:
    module, cls = _SUITES[name]   # SuiteNotInstalled (an ImportError) names the missing extra
    _REGISTRY[name] = getattr(importlib.import_module(module), cls)
  if not isinstance(name, str) or name not in _REGISTRY:
    raise ValueError(f"unknown environment {name!r}; valid names: {names() + suite_names()}")
  return _REGISTRY[name]


__all__ = ["Environment", "Outcome", "format_answer", "make", "names", "suite_names",
           "difficulty_keys",
           "instance_key",
           "Countdown", "FrozenLake", "Household", "Maze", "Sokoban", "Wordle"]
