"""The learning core: advantages, losses and the fused train step.

Every choice that a config names by string (advantage estimator, loss aggregation, KL estimator,
distillation divergence) lives in a registry dict in its module; `lookup` turns a config string
plus options into a callable and rejects unknown names or options with a clear error before
anything is traced or compiled.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Mapping


def lookup(registry: Mapping[str, Callable[..., Any]], kind: str, name: str,
           **options: Any) -> Callable[..., Any]:
  """Returns `registry[name]` with `options` bound as keyword arguments.

  Args:
    registry: config string → function.
    kind: what the registry holds, for error messages (e.g. "advantage estimator").
    name: the config string.
    **options: hyperparameters to bind; each must be a keyword-only parameter of the function
      (array arguments are positional by convention, so they cannot be bound by mistake).

  Raises:
    ValueError: `name` is not registered, or an option is not a keyword-only parameter.
  """
  if name not in registry:
    raise ValueError(f"unknown {kind} {name!r}; expected one of {sorted(registry)}")
  fn = registry[name]
  if not options:
    return fn
  hyperparameters = {
      p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY
  }
  unknown = sorted(set(options) - hyperparameters)
  if unknown:
    raise ValueError(f"{kind} {name!r} takes no option(s) {unknown}; "
                     f"its options are {sorted(hyperparameters)}")
  return functools.partial(fn, **options)
