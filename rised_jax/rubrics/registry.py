"""Name → class registries whose errors name the unknown name or option (used by configs).

A registry is any name -> class mapping; `rised_jax.plugins.Registry` (judges, selectors,
environments) also resolves entry points and import paths on lookup, so a plug-in's options are
checked here like a built-in's.
"""
from __future__ import annotations

import inspect
from typing import Any, Mapping, TypeVar

T = TypeVar("T")


def _parameters(cls: type) -> dict[str, bool]:
  """Keyword-passable parameters of `cls(...)` in order, following `**kwargs` forwarded up the
  MRO, each mapped to whether it is required (no default where it first appears)."""
  found: dict[str, bool] = {}
  for klass in cls.__mro__:
    if "__init__" not in vars(klass):
      continue
    params = inspect.signature(vars(klass)["__init__"]).parameters.values()
    for p in params:
      if p.name != "self" and p.name not in found and p.kind in (p.KEYWORD_ONLY,
                                                                 p.POSITIONAL_OR_KEYWORD):
        found[p.name] = p.default is p.empty
    if not any(p.kind is p.VAR_KEYWORD for p in params):
      break
  return found


def accepted_options(cls: type) -> list[str]:
  """The keyword arguments `cls(...)` accepts, following `**kwargs` forwarded up the MRO."""
  return list(_parameters(cls))


def check(kind: str, registry: Mapping[str, type], name: str, options: Mapping[str, Any], *,
          positional: int = 0, supplied: tuple[str, ...] = ()) -> None:
  """The name and option-key errors of `build`, without building (config validation calls it).

  `positional` arguments are passed by the caller (a vocabulary); `supplied` names keyword
  options the caller adds itself (the pipeline's in-process `generate_text`).
  """
  if name not in registry:   # a plug-in that fails to import raises its PluginError here
    unknown = getattr(registry, "unknown_message", None)
    raise ValueError(unknown(name) if unknown else
                     f"unknown {kind} {name!r}; expected one of {sorted(registry)}")
  params = list(_parameters(registry[name]).items())[positional:]
  accepted = [n for n, _ in params]
  unknown = sorted(set(options) - set(accepted))
  if unknown:
    raise ValueError(f"{kind} {name!r} has no option(s) {unknown}; accepted options: {accepted}")
  missing = [n for n, required in params if required and n not in options and n not in supplied]
  if missing:
    raise ValueError(f"{kind} {name!r} needs option(s) {missing}")


def build(kind: str, registry: Mapping[str, type[T]], name: str, *args: Any,
          **options: Any) -> T:
  """Instantiates `registry[name](*args, **options)`, checking the name and option keys first."""
  check(kind, registry, name, options, positional=len(args))
  return registry[name](*args, **options)


def supplied_options(backend: str) -> tuple[str, ...]:
  """Options of a judge backend that the pipeline supplies itself: the in-process judge's
  `generate_text` (the policy, through the rollout engine; `rubrics.engine_text.judge_options`)."""
  return ("generate_text",) if backend == "inprocess" else ()
