"""Decoding JSON data files (rubric tasks, vocabularies) so that every error names file and line.

`json.loads` has three failures that carry no position: nesting deeper than the interpreter's
recursion limit (RecursionError), an integer of more than 4,300 digits (ValueError from `int`),
and, in the file reader, bytes that are not UTF-8 (UnicodeDecodeError at an offset into some
read buffer). `decode_utf8` and `check_shape` turn each into the caller's error class with the
line and column; a linear pre-scan (one regular-expression pass) finds the nesting depth and the
long numbers before `json.loads` runs, so a hostile file costs no more than reading it.
"""
from __future__ import annotations

import re

# Far above any real task or vocabulary file (3-5 levels), far below the recursion limit.
MAX_DEPTH = 64
# Characters of one JSON number: enough for any float64 written out in full, not for 5,000
# digits that `int()` refuses.
MAX_NUMBER_CHARS = 400

# A complete string (skipped), a lone quote (an unterminated string: json.loads reports it),
# a bracket, or a number.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|"|[\[\]{}]|-?[0-9][0-9.eE+\-]*', re.DOTALL)


def position(text: str, offset: int) -> tuple[int, int]:
  """(line, column), both 1-based, of character `offset` of `text`."""
  line = text.count("\n", 0, offset) + 1
  return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def decode_utf8(data: bytes, where: str, error: type[Exception]) -> str:
  """`data` as UTF-8 text; a bad byte is an `error` naming its line and column (in bytes)."""
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
    raise error(f"{where}: line {line} column {column} (byte {e.start}): byte "
                f"{data[e.start:e.start + 1]!r} is not valid UTF-8 ({e.reason}); expected a "
                "UTF-8 text file") from None


def check_shape(text: str, where: str, error: type[Exception], *, line: int | None = None) -> None:
  """Raises `error` for nesting deeper than MAX_DEPTH or a number longer than MAX_NUMBER_CHARS.

  `line` is the file line of a one-line `text` (a JSONL record); otherwise positions are
  counted in `text`.
  """
  depth = 0
  for match in _TOKENS.finditer(text):
    token = match.group()
    if token == '"':     # unterminated string: json.loads names it
      return
    if token[0] == '"':
      continue
    if token in "]}":
      depth -= 1
      continue
    if token in "[{":
      depth += 1
      if depth <= MAX_DEPTH:
        continue
      problem = f"nesting deeper than {MAX_DEPTH} levels"
    elif len(token) > MAX_NUMBER_CHARS:
      problem = f"a number of {len(token)} characters (at most {MAX_NUMBER_CHARS})"
    else:
      continue
    row, column = position(text, match.start())
    at = f"column {column}" if line is not None else f"line {row} column {column}"
    raise error(f"{where}: {at}: {problem}; expected a plain data file")
