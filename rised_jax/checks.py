"""Type predicates and argument checks shared by every module that validates its input.

`bool` is an `int` subclass in Python, so `isinstance(True, int)` holds; a flag given where a
count is expected must still be an error. These predicates reject bools and accept every
integer / real type (Python and NumPy scalars alike):

  is_int(v)                          an integer, not a bool
  is_number(v, finite=True)          a real number, not a bool (finite unless told otherwise)
  require_int(v, name, min=, max=)   v as an int, or ValueError "name=v: expected an integer …"
  require_number(v, name, min=, max=, above=)   the same for a finite real number
  with named("config.judge"): ...    a ValueError inside gets the key it is about in front
"""
from __future__ import annotations

import contextlib
import math
import numbers
from typing import Any, Iterator


def is_int(value: Any) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any, finite: bool = True) -> bool:
  return (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and (not finite or math.isfinite(value)))


def _bounds(min: float | None, max: float | None, above: float | None = None) -> str:
  parts = []
  if above is not None:
    parts.append(f"> {above}")
  if min is not None:
    parts.append(f">= {min}")
  if max is not None:
    parts.append(f"<= {max}")
  return (" " + " and ".join(parts)) if parts else ""


def require_int(value: Any, name: str, *, min: int | None = None,   # noqa: A002 - as in the error
                max: int | None = None) -> int:                     # noqa: A002
  """`value` as an `int`; a ValueError naming `name`, the value and the range otherwise."""
  if not is_int(value) or (min is not None and value < min) or (max is not None and value > max):
    raise ValueError(f"{name}={value!r}: expected an integer{_bounds(min, max)}")
  return int(value)


def require_number(value: Any, name: str, *, min: float | None = None,   # noqa: A002
                   max: float | None = None, above: float | None = None) -> float:  # noqa: A002
  """`value` as a finite `float`, at least `min` / at most `max` / strictly above `above`."""
  if (not is_number(value) or (min is not None and value < min)
      or (max is not None and value > max) or (above is not None and value <= above)):
    raise ValueError(f"{name}={value!r}: expected a finite number{_bounds(min, max, above)}")
  return float(value)


@contextlib.contextmanager
def named(where: str) -> Iterator[None]:
  """Prefixes a ValueError raised inside the block with `where` (the config key it is about)."""
  try:
    yield
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None
