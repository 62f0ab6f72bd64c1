"""Type predicates and argument checks shared by every module that validates its input.

`bool` is an `int` subclass in Python, so `isinstance(True, int)` holds; a flag given where a
count is expected must still be an error. These predicates reject bools and accept every
integer / real type (Python and NumPy scalars alike):

  is_int(v)                          an integer, not a bool
  is_number(v, finite=True)          a real number, not a bool (finite unless told otherwise)
  is_http_url(v)                     a string http(s)://HOST[...] URL
  with named("config.judge"): ...    a ValueError inside gets the key it is about in front
  check_field_types(cfg)             a dataclass's float fields finite, int fields integers
  typed(cls, section, where)         a checked dataclass from a config section, errors named

Each caller keeps its own error message (what the value is for, and the range it needs).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
import urllib.parse
from typing import Any, Callable, Iterator, Mapping


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


# ----------------------------------------------------------------------------- value rules
# A rule is (predicate, what is expected); a stage's typed config keeps the rules of its keys
# and `check_rules` names each failing one as `config.<section>.<key>=<value>: expected …`.
Rule = tuple[Callable[[Any], bool], str]


def int_at_least(low: int, expected: str | None = None) -> Rule:
  return (lambda v: is_int(v) and v >= low), expected or f"an integer >= {low}"


def number_at_least(low: float, expected: str | None = None) -> Rule:
  return (lambda v: is_number(v) and v >= low), expected or f"a finite number >= {low}"


def positive_ints(min_len: int) -> Rule:
  """A list of integers >= 1, with at least `min_len` of them."""
  return ((lambda v: isinstance(v, (list, tuple)) and len(v) >= min_len
           and all(is_int(x) and x >= 1 for x in v)),
          "a list of integers >= 1" + (" (at least one)" if min_len else ""))


def as_given(value: Any) -> Any:
  """A value as the config file gave it: a typed config holds its lists as tuples."""
  return list(value) if isinstance(value, tuple) else value


def check_rules(where: str, values: Any, rules: Mapping[str, Rule]) -> None:
  """Each `rules` key (an attribute of `values`) against its rule; `where` is its config
  section ("config.rollout")."""
  for key, (ok, expected) in rules.items():
    value = getattr(values, key)
    if not ok(value):
      raise ValueError(f"{where}.{key}={as_given(value)!r}: expected {expected}")


def frozen(value: Any) -> Any:
  """A ConfigDict value as a typed config holds it: lists as tuples, sub-dicts as plain dicts
  (anything else as it is, for the check to name)."""
  if isinstance(value, list):
    return tuple(value)
  if hasattr(value, "to_dict"):
    return value.to_dict()
  return value


def typed(cls, section: Any, where: str):
  """The dataclass `cls` built from every key of the ConfigDict `section` (its `__post_init__`
  checks them), with errors that name `where` ("config.optim"); a key `cls` has no field for
  is refused by name."""
  known = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(section.keys()) - known)
  if unknown:
    raise ValueError(f"{where} has unknown keys {unknown}; known: {sorted(known)}")
  try:
    return cls(**section.to_dict())
  except (TypeError, ValueError) as e:
    raise ValueError(prefixed(where, str(e))) from e


def from_section(cls, section: Any, **built: Any):
  """The frozen dataclass `cls` with each field the ConfigDict `section`'s key of that name
  (`frozen`); `built`: fields given already built (a nested section's own typed config). A
  field with a default that the section lacks (a key added after a run saved its config)
  keeps the default."""
  def value(field: dataclasses.Field) -> Any:
    if field.name in built:
      return built[field.name]
    if field.name not in section and field.default is not dataclasses.MISSING:
      return field.default
    return frozen(section[field.name])
  return cls(**{f.name: value(f) for f in dataclasses.fields(cls)})
