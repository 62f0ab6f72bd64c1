"""The built-in multi-turn text environments and their registry.

    env = rised_jax.envs.make("sokoban", boxes=2)   # difficulty knobs are keyword arguments
    observation = env.reset(seed)
    observation, reward, done, info = env.step("<answer>up</answer>")
    env.instance_key()                              # which game this seed generated

`instance_key(name, seed, difficulty)` gives the same key without keeping an environment
(memoised: the task stream and the selector ask for the same seeds).

Names (`ENVIRONMENTS`, a `rised_jax.plugins.Registry`): a built-in name (`_REGISTRY`: a class,
or for the real suites an import-path string imported on first use), an alias a config's
`envs.aliases` defines (registered when the run's pipeline is built, never while the config is
checked), an entry point of group `rised_jax.envs`, or an import path "package.module:Class".
Every environment class is checked against `base.EnvironmentProtocol` when first looked up;
`check_name` also checks difficulty knobs (config validation, `settings.EnvsConfig.check`,
calls it before the model loads, then `check_knob_values`, which builds one instance with the
configured knobs: an environment's constructor checks their values and must not start sessions
or processes — that belongs in the first `reset`).

See `base` for the protocol and `parsing` for how the built-ins read replies.
"""
from __future__ import annotations

import functools
import inspect
import logging
import types
from typing import Any, Mapping

from rised_jax import plugins
from rised_jax.checks import named
from rised_jax.envs.base import (Environment, EnvironmentProtocol, Outcome,
                                 check_environment_class)
from rised_jax.envs.countdown import Countdown
from rised_jax.envs.frozenlake import FrozenLake
from rised_jax.envs.household import Household
from rised_jax.envs.maze import Maze
from rised_jax.envs.parsing import format_answer
from rised_jax.envs.sokoban import Sokoban
from rised_jax.envs.wordle import Wordle

log = logging.getLogger(__name__)

# The real suites behind optional extras (docs/environments.md): built-ins named by import path,
# imported on first use, so `import rised_jax` never needs them (a missing extra raises
# SuiteNotInstalled, naming it).
SUITES: dict[str, str] = {
    "babyai": "rised_jax.envs.babyai:BabyAI",
    "scienceworld": "rised_jax.envs.scienceworld_env:ScienceWorld",
    "twx_coin": "rised_jax.envs.twx:CoinCollector",
    "twx_cooking": "rised_jax.envs.twx:CookingWorld",
    "twx_twc": "rised_jax.envs.twx:Commonsense",
    "textcraft": "rised_jax.envs.textcraft_env:TextCraft",
}
# name -> environment class, or "module:Class" imported on first use.
_REGISTRY: dict[str, type | str] = {
    **{cls.name: cls for cls in (Sokoban, FrozenLake, Countdown, Wordle, Household, Maze)},
    **SUITES}
_BUILTIN_NAMES = frozenset(_REGISTRY)
ENVIRONMENTS = plugins.Registry("environment", "envs.names", _REGISTRY,
                                check=check_environment_class)


def names() -> list[str]:
  """The registered environment names (built-in and entry points; import paths and the real
  suites not listed)."""
  return [n for n in ENVIRONMENTS.names() if n not in SUITES]


def suite_names() -> list[str]:
  """The real suites' environment names, installed or not (`make` names a missing extra)."""
  return sorted(SUITES)


def register(name: str, target: type | str) -> None:
  """Adds `name` for an environment class or import path "package.module:Class" (a config's
  `envs.aliases`: one class under several names, each with its own difficulty knobs, and
  names without dots for `envs.difficulty`). Built-in names cannot be replaced. Called when a
  run's pipeline is built (`register_aliases`) or a module defines its games, never by a check."""
  check_alias(name, target)
  if _REGISTRY.get(name) != target:
    _REGISTRY[name] = target
    ENVIRONMENTS.resolved.pop(name, None)
    for cache_key in [k for k in _ENVS if k[0] == name]:
      del _ENVS[cache_key]
    _KEYS.clear()


def check_alias(name: Any, target: Any) -> None:
  """The errors of `register(name, target)`, registering nothing."""
  if not isinstance(name, str) or not name or ":" in name or "." in name:
    raise ValueError(f"environment alias {name!r}: expected a non-empty name without '.' or ':'")
  if name in _BUILTIN_NAMES:
    raise ValueError(f"environment alias {name!r}: a built-in environment has this name")
  if not (isinstance(target, type) or plugins.is_import_path(target)):
    raise ValueError(f"environment alias {name!r}: target {target!r}; expected a class or an "
                     "import path 'package.module:Class'")


def register_aliases(aliases: Mapping[str, Any]) -> None:
  """Registers a config's `envs.aliases` (the pipeline's first step, after validation)."""
  for alias, target in aliases.items():
    with named(f"config.envs.aliases.{alias}"):
      register(alias, target)


def is_environment(name: Any) -> bool:
  """Whether `name` resolves to an environment (a failing import path raises)."""
  return isinstance(name, str) and name in ENVIRONMENTS


@functools.cache
def _knobs(cls: type) -> Mapping[str, bool]:
  """The constructor's keyword-only parameters, each mapped to whether it is required.
  Cached per class: every `make` checks its keys, and `inspect.signature` each time made a
  32-row doors warm-start batch 13.6–15.6 ms instead of 10.5–11.1 ms."""
  return types.MappingProxyType({
      p.name: p.default is p.empty for p in inspect.signature(cls.__init__).parameters.values()
      if p.kind is inspect.Parameter.KEYWORD_ONLY})


def difficulty_keys(name: str) -> list[str]:
  """The keyword arguments `make(name, ...)` accepts (including max_turns and shaping)."""
  return sorted(_knobs(_lookup(name)))


def check_name(name: str, difficulty: Mapping[str, Any] | None = None,
               cls: type | None = None) -> None:
  """Resolves `name` (importing a plug-in; `cls`: the class an unregistered alias names),
  checks its protocol and the difficulty keys: ValueError names the environment and the unknown
  or missing key."""
  knobs = _knobs(cls or _lookup(name))
  given = set(difficulty or {})
  unknown = sorted(given - set(knobs))
  if unknown:
    raise ValueError(f"{name}: unknown difficulty key(s) {unknown}; valid keys: {sorted(knobs)}")
  missing = sorted(k for k, required in knobs.items() if required and k not in given)
  if missing:
    raise ValueError(f"{name}: difficulty key(s) {missing} are required (give them in "
                     f"envs.difficulty[{name!r}])")


def make(name: str, **difficulty: Any) -> EnvironmentProtocol:
  """A new environment; ValueError names any unknown environment or difficulty key."""
  check_name(name, difficulty)
  return _lookup(name)(**difficulty)


def close(env: Any) -> None:
  """Calls the environment's optional `close()`; a failure is logged, never raised (the
  instance is being discarded, often because it already failed)."""
  closer = getattr(env, "close", None)
  if closer is None:
    return
  try:
    closer()
  except Exception as error:  # pylint: disable=broad-except
    log.warning("closing environment %r failed: %s: %s", env, type(error).__name__, error)


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
    try:
      if hasattr(env, "instance_key_for"):
        key = env.instance_key_for(int(seed))
      else:
        env.reset(int(seed))
        key = env.instance_key()
    except Exception:
      del _ENVS[(name, knobs)]   # rebuilt on the next call: the instance may be broken
      close(env)
      raise
    if not isinstance(key, str) or not key:
      raise ValueError(f"{name}: instance key of seed {seed} is {key!r}; expected a non-empty "
                       "string")
    if len(_KEYS) >= _MAX_CACHED_KEYS:
      _KEYS.clear()
    _KEYS[cache_key] = key
  return _KEYS[cache_key]


def _lookup(name: str) -> type:
  return ENVIRONMENTS.lookup(name)   # a PluginError (ValueError) names what is wrong


def check_knob_values(name: str, difficulty: Mapping[str, Any], cls: type | None = None) -> None:
  """Builds one `name` environment with `difficulty` and closes it: its constructor checks the
  knobs' values (a width of -3, a string where a number belongs, a remote env's file:// URL),
  so those errors, too, come before the model loads. ValueError names the config key; a
  constructor's other exceptions (a plug-in's TypeError) are reported the same way."""
  where = f"config.envs.difficulty.{name}"
  try:
    env = (cls or _lookup(name))(**difficulty)
  except Exception as error:  # a plug-in's constructor  # pylint: disable=broad-except
    detail = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
    raise ValueError(f"{where}={dict(difficulty)!r}: {detail}") from error
  close(env)


__all__ = ["ENVIRONMENTS", "Environment", "check_knob_values",
           "EnvironmentProtocol", "Outcome", "check_name",
           "close", "is_environment", "register", "register_aliases", "check_alias",
           "format_answer", "make", "names", "suite_names",
           "difficulty_keys",
           "instance_key",
           "Countdown", "FrozenLake", "Household", "Maze", "Sokoban", "Wordle"]
