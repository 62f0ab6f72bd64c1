"""Type predicates and argument checks shared by every module that validates its input.

`bool` is an `int` subclass in Python, so `isinstance(True, int)` holds; a flag given where a
count is expected must still be an error. These predicates reject bools and accept every
integer / real type (Python and NumPy scalars alike):

  is_int(v)                          an integer, not a bool
  is_number(v, finite=True)          a real number, not a bool (finite unless told otherwise)
  is_http_url(v)                     a string http(s)://HOST[...] URL
  with named("config.judge"): ...    a ValueError inside gets the key it is about in front
  check_field_types(cfg)             a dataclass's float fields finite, int fields integers

Each caller keeps its own error message (what the value is for, and the range it needs).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
import urllib.parse
from typing import Any, Iterator


def is_int(value: Any) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any, finite: bool = True) -> bool:
  return (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and (not finite or math.isfinite(value)))


def is_http_url(value: Any) -> bool:
  """An http:// or https:// URL with a host (what the HTTP clients can reach; file:// and bare
  words are refused)."""
  if not isinstance(value, str):
    return False
  parsed = urllib.parse.urlparse(value)
  return parsed.scheme in ("http", "https") and bool(parsed.hostname)


def prefixed(where: str, message: str) -> str:
  """`message` prefixed with the config key `where`, unless it starts with a key inside it
  already (a registry's errors name their full key: `config.rubric.judge.backend: ...`)."""
  return message if message.startswith(f"{where}.") else f"{where}: {message}"


@contextlib.contextmanager
def named(where: str) -> Iterator[None]:
  """Prefixes a ValueError raised inside the block with `where` (the config key it is about)."""
  try:
    yield
  except ValueError as e:
    raise ValueError(prefixed(where, str(e))) from None


def check_field_types(cfg) -> None:
  """Float fields finite, int fields integers (None where the annotation allows it), of a
  dataclass instance whose annotations are strings (`from __future__ import annotations`).

  First in `__post_init__`: NaN passes every `x <= 0` check, and a string would fail later
  inside a comparison with a message that names no field.
  """
  for field in dataclasses.fields(cfg):
    value, kind = getattr(cfg, field.name), str(field.type)
    if value is None and "None" in kind:
      continue
    if isinstance(value, bool):
      number = integer = False
    else:
      number = isinstance(value, numbers.Real) and math.isfinite(value)
      integer = isinstance(value, numbers.Integral)
    if kind.startswith("float") and not number:
      raise ValueError(f"{field.name}={value!r}: expected a finite number")
    if kind.startswith("int") and not integer:
      raise ValueError(f"{field.name}={value!r}: expected an integer")
