"""Deterministic analysis of an answer's text: sentences, words, bullets, numbers, phrases.

Every rule the rubric checker relies on is defined here, once, so that a check means the same
thing in every task:

- Normalisation: lower case; typographic quotes, dashes and the minus sign become ASCII. Matching
  is therefore case-insensitive. Normalisation maps one character to one character, so positions
  in the normalised text are positions in the raw text.
- Words: whitespace-separated tokens that contain at least one letter or digit, bullet markers
  ("-", "1.") excluded; an em dash is not a word.
- Bullet items: lines that start with "-", "*", "•" or "1." / "1)" followed by a space and text.
- Sentences: a sentence ends at ".", "!" or "?" (one or more, optionally followed by closing
  quotes or brackets) followed by whitespace or the end of the text, except after a known
  abbreviation (e.g., i.e., vs., approx., cf., fig., dr.) or after a single capital letter followed
  by a lower-case word (an initial, as in "E. coli"; but "vitamin C. It" does end a sentence).
  A blank line and the start of a bullet item also end a sentence, so an unpunctuated list item is
  a sentence of its own; a single line break inside a paragraph does not. Decimals ("3.5") never
  split. Segments without a letter or digit (stray markdown) are not sentences.
- Phrases: a pattern is a sequence of words separated by spaces or hyphens. A word ending in "*"
  matches any word with that prefix ("scatter*": scatter, scattered, scattering). The token "..."
  matches a gap of zero to four words. In the text, the words of a phrase may be separated by any
  run of spaces, hyphens or slashes ("red-blood cells" matches "red blood cells"). A phrase is
  never glued to further letters or digits at either end ("ion" does not match "radiation").
- Numbers: digits with optional thousands commas and decimals, optionally followed by a power
  ("10^8", "10⁸"), scientific notation ("3e8", "3 × 10^8", "3x10**8", "3·10⁸") and a scale word
  (thousand, million, billion, trillion); or the number words zero to ninety-nine ("four",
  "twenty-three"). A "-" is a sign only when it is not glued to a preceding letter or digit, so
  "60-100" is the range 60 to 100, never 60 and -100. A unit may follow a number; in a range
  ("60-100 bpm", "60 to 100 bpm") the unit after the second number also applies to the first.
"""
from __future__ import annotations

import dataclasses
import functools
import re

_TRANSLATION = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"',
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2212": "-",
    "\u00a0": " ", "\u202f": " ",
})

_ABBREVIATIONS = frozenset({"e.g", "i.e", "vs", "approx", "cf", "fig", "dr"})
_BULLET_START = r"[ \t]*(?:[-*\u2022]|\d{1,3}[.)])[ \t]+(?=\S)"
_BULLET_RE = re.compile(rf"^{_BULLET_START}", re.MULTILINE)
_BLOCK_BREAK_RE = re.compile(rf"\n[ \t]*\n|\n(?={_BULLET_START})")
_STOP_RE = re.compile(r"[.!?]+[\"')\]]*(?=\s|$)")
_WORD_RE = re.compile(r"\S+")
_ALNUM_RE = re.compile(r"[a-z0-9]")

# Separators allowed between the words of a phrase, and the "not glued to letters" boundaries.
_SEP = r"[\s\-/]+"
_GAP = rf"(?:[^\s\-/]+{_SEP}){{0,4}}"
_LEFT = r"(?<![a-z0-9])"
_RIGHT = r"(?![a-z0-9])"

_SUPERSCRIPTS = "⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺"
_FROM_SUPERSCRIPT = str.maketrans(_SUPERSCRIPTS, "0123456789-+")
_SCALE_WORDS = {"thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12}
_UNIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
               "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
               "eighteen", "nineteen"]
_TENS_WORDS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]

_DIGITS = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_POWER = rf"(?:\^|\*\*)\s*[-+]?\d+|[{_SUPERSCRIPTS}]+"
_SCIENTIFIC = rf"e[-+]?\d+|\s*[×x*·]\s*10\s*(?:{_POWER})"
_SCALE = rf"\s+(?:{'|'.join(_SCALE_WORDS)}){_RIGHT}"
_NUMBER_WORD = (rf"(?:{'|'.join(_TENS_WORDS)})(?:[\s-](?:{'|'.join(_UNIT_WORDS[1:10])}))?"
                rf"|{'|'.join(sorted(_UNIT_WORDS, key=len, reverse=True))}")
_NUMBER_RE = re.compile(
    rf"(?<![\w.])(?P<sign>-)?(?P<digits>{_DIGITS})(?P<power>{_POWER})?(?P<sci>{_SCIENTIFIC})?"
    rf"|{_LEFT}(?P<word>{_NUMBER_WORD}){_RIGHT}")
_SCALE_RE = re.compile(_SCALE)
_RANGE_CONTINUATION = rf"\s*(?:-|to|and)\s*{_DIGITS}(?:{_SCALE})?"


def normalize(text: str) -> str:
  """Lower case with ASCII quotes and dashes; one output character per input character."""
  text = text.translate(_TRANSLATION)
  lowered = text.lower()
  if len(lowered) == len(text):
    return lowered
  # A few characters ("İ") lower-case to two; keep those as they are to preserve positions.
  return "".join(c.lower() if len(c.lower()) == 1 else c for c in text)


@dataclasses.dataclass(frozen=True)
class Number:
  """A number found in the text: its value and the span it covers (a unit may follow `end`)."""

  value: float
  start: int
  end: int


def _exponent(power: str) -> int:
  """The integer in "^8", "**8", "⁸" or "⁻³"."""
  return int(power.translate(_FROM_SUPERSCRIPT).lstrip("^*").strip())


def _number_word_value(word: str) -> int:
  parts = re.split(r"[\s-]", word)
  if parts[0] in _TENS_WORDS:
    tens = 20 + 10 * _TENS_WORDS.index(parts[0])
    return tens + (_UNIT_WORDS.index(parts[1]) if len(parts) > 1 else 0)
  return _UNIT_WORDS.index(parts[0])


def find_numbers(text: str) -> list[Number]:
  """All numbers in normalised text, in order of appearance (rules in the module docstring)."""
  numbers = []
  for match in _NUMBER_RE.finditer(text):
    if match.group("word"):
      value = float(_number_word_value(match.group("word")))
    else:
      value = float(match.group("digits").replace(",", ""))
      if match.group("power"):
        value **= _exponent(match.group("power"))
      sci = match.group("sci")
      if sci:
        value *= 10.0 ** (int(sci[1:]) if sci.startswith("e") else _exponent(sci.split("10", 1)[1]))
      if match.group("sign"):
        value = -value
    end = match.end()
    scale = _SCALE_RE.match(text, end)
    if scale:
      value *= _SCALE_WORDS[scale.group().strip()]
      end = scale.end()
    numbers.append(Number(value, match.start(), end))
  return numbers


def _word_regex(word: str, pattern: str) -> str:
  stem = word[:-1] if word.endswith("*") else word
  if not stem or "*" in stem:
    raise ValueError(f"phrase pattern {pattern!r}: '*' is allowed only at the end of a word")
  return re.escape(stem) + (r"\w*" if word.endswith("*") else "")


@functools.lru_cache(maxsize=8192)
def phrase_regex(pattern: str) -> re.Pattern[str]:
  """Compiles a phrase pattern (module docstring) into a regex over normalised text, once.

  Raises ValueError for a pattern that is empty, has a "*" that does not end a word, or starts,
  ends or doubles the "..." gap.
  """
  if not isinstance(pattern, str):
    raise ValueError(f"a phrase pattern must be a string, got {pattern!r}")
  words = [w for w in re.split(r"[\s\-]+", normalize(pattern).strip()) if w]
  if not words:
    raise ValueError(f"empty phrase pattern {pattern!r}")
  if "..." in (words[0], words[-1]) or any(a == b == "..." for a, b in zip(words, words[1:])):
    raise ValueError(f"phrase pattern {pattern!r}: '...' must stand between two words")
  body = _word_regex(words[0], pattern)
  gap = ""
  for word in words[1:]:
    if word == "...":
      gap = _GAP
      continue
    body += _SEP + gap + _word_regex(word, pattern)
    gap = ""
  return re.compile(_LEFT + body + _RIGHT)


@functools.lru_cache(maxsize=1024)
def unit_regex(units: tuple[str, ...]) -> re.Pattern[str]:
  """Matches, at the end of a number, an optional range continuation and then one of `units`.

  Raises ValueError for an empty tuple or a blank unit.
  """
  if not units or any(not isinstance(u, str) or not u.strip() for u in units):
    raise ValueError(f"units must be non-empty strings, got {list(units)!r}")
  alternatives = "|".join(
      r"\s+".join(re.escape(part) for part in normalize(unit).split())
      for unit in sorted(units, key=len, reverse=True))
  return re.compile(rf"(?:{_RANGE_CONTINUATION})?\s*(?:{alternatives}){_RIGHT}")


def _is_abbreviation(raw: str, text: str, segment_start: int, stop_start: int) -> bool:
  before = text[segment_start:stop_start].rsplit(None, 1)
  last_word = before[-1].lstrip("(\"'") if before else ""
  if last_word in _ABBREVIATIONS:
    return True
  if len(last_word) == 1 and raw[stop_start - 1].isupper():
    following = raw[stop_start + 1:].lstrip()
    return bool(following) and following[0].islower()
  return False


def split_sentences(raw: str, text: str) -> list[str]:
  """Sentences of normalised `text` (raw text alongside, for the case of initials)."""
  sentences = []
  block_start = 0
  for block_end, next_start in [(m.start(), m.end()) for m in _BLOCK_BREAK_RE.finditer(text)] + [
      (len(text), len(text))]:
    start = block_start
    for stop in _STOP_RE.finditer(text, block_start, block_end):
      if stop.group().startswith(".") and len(stop.group().rstrip("\"')]")) == 1 and _is_abbreviation(
          raw, text, start, stop.start()):
        continue
      sentences.append(text[start:stop.end()])
      start = stop.end()
    sentences.append(text[start:block_end])
    block_start = next_start
  return [s.strip() for s in sentences if _ALNUM_RE.search(s)]


class Answer:
  """One answer, normalised and analysed once; every check reads it."""

  def __init__(self, raw: str):
    if not isinstance(raw, str):
      raise TypeError(f"an answer must be a str, got {type(raw).__name__}")
    self.raw = raw
    self.text = normalize(raw)
    self.sentences = split_sentences(raw, self.text)
    self.num_words = sum(1 for w in _WORD_RE.findall(_BULLET_RE.sub("", self.text)) if _ALNUM_RE.search(w))
    self.num_bullets = len(_BULLET_RE.findall(self.text))
    self.numbers = find_numbers(self.text)
