"""Name → class registries whose errors name the unknown name or option (used by configs)."""
from __future__ import annotations

import inspect
from typing import Any, Mapping, TypeVar

T = TypeVar("T")


def accepted_options(cls: type) -> list[str]:
  """The keyword arguments `cls(...)` accepts, following `**kwargs` forwarded up the MRO."""
  names: list[str] = []
  for klass in cls.__mro__:
    if "__init__" not in vars(klass):
      continue
    params = inspect.signature(vars(klass)["__init__"]).parameters.values()
    names += [p.name for p in params if p.name != "self" and p.name not in names
              and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not any(p.kind is p.VAR_KEYWORD for p in params):
      break
  return names


def build(kind: str, registry: Mapping[str, type[T]], name: str, *args: Any,
          **options: Any) -> T:
  """Instantiates `registry[name](*args, **options)`, checking the name and option keys first."""
  if name not in registry:
    raise ValueError(f"unknown {kind} {name!r}; expected one of {sorted(registry)}")
  cls = registry[name]
  accepted = accepted_options(cls)[len(args):]
  unknown = sorted(set(options) - set(accepted))
  if unknown:
    raise ValueError(f"{kind} {name!r} has no option(s) {unknown}; accepted options: {accepted}")
  return cls(*args, **options)
