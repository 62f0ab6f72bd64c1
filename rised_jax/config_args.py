"""One parser for the argument of an experiment file's `get_config(arg)` (`--config FILE:ARG`).

After big_vision's `configs/common.py parse_arg`: the file declares its keys with their defaults,

  args = config_args.parse_arg(arg, algorithm="rised", size=OneOf("4b", "1.7b"),
                               tpu=False, local=False)

and ARG is comma-separated items, read in order:
  - a bare word naming a bool key is that flag, set true (`local` means `local=true`);
  - any other bare word is the value of the first key that is not a bool and has no value yet,
    in declaration order (`rised,4b` sets algorithm, then size); rised-compare puts the preset
    first (`FILE:preset,ARGS`), so every experiment file declares the algorithm first;
  - `key=value` sets a key by name.
A value takes its key's type: a str default takes the text as written, an int or float default
a number, a bool default true/false/1/0 (any case), a OneOf one of its choices. An unknown key or
word, a value of the wrong type, a key set twice, or an empty item is a ValueError naming the
experiment file, its argument, the bad item and the accepted keys. The result is a
FrozenConfigDict with every declared key (defaults for those ARG leaves out).
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
from typing import Any

import ml_collections

_TRUE = ("true", "1")
_FALSE = ("false", "0")


@dataclasses.dataclass(frozen=True, init=False)
class OneOf:
  """A text key restricted to `choices`; the first choice is the default."""
  choices: tuple[str, ...]

  def __init__(self, default: str, *others: str):
    object.__setattr__(self, "choices", (default, *others))

  @property
  def default(self) -> str:
    return self.choices[0]


def parse_arg(arg: str | None, /, **spec: Any) -> ml_collections.FrozenConfigDict:
  """The keys of `spec` (name -> default: str, int, float, bool or OneOf) as set by `arg`.

  An error names the file that called parse_arg (the experiment file) and its argument.
  """
  for key, default in spec.items():
    if not isinstance(default, (str, int, float, OneOf)):   # bool is an int
      raise TypeError(f"parse_arg: key {key!r} has default {default!r}; expected a str, int, "
                      "float, bool or OneOf")
  caller = sys._getframe(1).f_globals.get("__file__")   # the experiment file, for the message
  where = f"{os.path.basename(caller)}: " if caller else ""

  def fail(problem: str) -> ValueError:
    return ValueError(f"{where}config argument {arg!r}: {problem}; accepted: {_usage(spec)}")

  values: dict[str, Any] = {}
  for item in arg.split(",") if arg else []:
    if not item:
      raise fail("an empty item")
    key, eq, text = item.partition("=")
    if eq and key not in spec:
      raise fail(f"unknown key {key!r} in {item!r}")
    if not eq and isinstance(spec.get(item), bool):
      key, text = item, "true"
    elif not eq:
      key, text = next((k for k, d in spec.items() if not isinstance(d, bool) and k not in values),
                       None), item
      if key is None:
        raise fail(f"unknown flag {item!r} (every positional key is given)")
    if key in values:
      raise fail(f"{key} given twice ({key}={values[key]!r}, then {item!r})")
    try:
      values[key] = _convert(spec[key], text)
    except ValueError as e:
      raise fail(f"{key}={text!r}: {e}") from None
  return ml_collections.FrozenConfigDict(
      {k: values.get(k, d.default if isinstance(d, OneOf) else d) for k, d in spec.items()})


def _convert(default: Any, text: str) -> Any:
  """`text` as a value of `default`'s type (ValueError saying what was expected)."""
  if isinstance(default, OneOf):
    if text not in default.choices:
      raise ValueError(f"expected one of {', '.join(default.choices)}")
    return text
  if isinstance(default, bool):
    if text.lower() not in _TRUE + _FALSE:
      raise ValueError("expected true, false, 1 or 0")
    return text.lower() in _TRUE
  if isinstance(default, int):
    try:
      return int(text)
    except ValueError:
      raise ValueError("expected an integer") from None
  if isinstance(default, float):
    try:
      value = float(text)
    except ValueError:
      value = math.nan
    if not math.isfinite(value):
      raise ValueError("expected a finite number")
    return value
  return text


def _usage(spec: dict[str, Any]) -> str:
  """The accepted keys: by position or name with their defaults, then the flags."""
  named = [f"{k}={'|'.join(d.choices)}" if isinstance(d, OneOf) else f"{k}={d!r}"
           for k, d in spec.items() if not isinstance(d, bool)]
  flags = [k for k, d in spec.items() if isinstance(d, bool)]
  parts = [f"{', '.join(named)} (by position or key=value)"] if named else []
  if flags:
    parts.append(f"flags {', '.join(flags)} (bare, or key=true|false)")
  return "; ".join(parts) if parts else "no argument"
