"""Machine-checkable criterion specs: parsed from JSON with validation, evaluated on an Answer.

A spec is a JSON object with a "type" and that type's keys (unknown keys are errors):

  {"type": "keywords", "all_of": [["scatter*"], ["wavelength*", "colour*"]], "same_sentence": false}
      holds when every group has at least one phrase in the answer (any-of synonyms within a group,
      all groups required); with same_sentence, all groups must match inside one sentence.
  {"type": "claim", "any_of": ["reflect* ... ocean"], "negation_guard": true}
      holds when some phrase occurs in a sentence with no negation cue (not, no, never, nothing,
      n't, myth, misconception, false, wrong, incorrect, untrue, rather than, instead of, contrary
      to, ...) before it or inside the matched words (beyond cues the phrase itself contains).
      Meant for pitfalls (negative weight): "it is a myth that the sky reflects the ocean" and
      "antibiotics do not kill viruses" do not commit the pitfall. A cue anywhere earlier in the
      sentence suppresses the match, which can miss a pitfall stated after an unrelated negation.
  {"type": "number", "value": 37, "abs_tol": 0.5, "rel_tol": 0, "units": ["°c", "degrees celsius"]}
      holds when some number in the answer lies within max(abs_tol, rel_tol·|value|) of value and,
      if units are given, is followed by one of them (a range's trailing unit counts).
  {"type": "sentences", "min": 2, "max": 4}, {"type": "words", "min": 40, "max": 120},
  {"type": "bullets", "min": 3, "max": 6}
      count bounds (inclusive; either bound may be omitted, not both; bullets' min defaults to 1).
  {"type": "any", "checks": [spec, ...]}, {"type": "all", "checks": [spec, ...]}
      combinators (e.g. "37 °C or 98.6 °F").

Phrases, sentences, words, bullets and numbers follow the rules of `rubric_tasks.text`.
"""
from __future__ import annotations

import abc
import dataclasses
import math
import re
from typing import Any, ClassVar, Mapping

from rised_jax.rubric_tasks import text as text_lib
from rised_jax.checks import is_int, is_number


class RubricFormatError(ValueError):
  """A task file or spec is malformed; the message starts with where (file:line: key)."""


_NEGATION_CUE_RE = re.compile(
    r"(?<![a-z0-9])(?:not|no|never|nothing|none|nobody|cannot|neither|nor|myths?|misconceptions?|false|incorrect|wrong|"
    r"untrue|mistaken(?:ly)?|rather than|instead of|contrary to|\w+n't)(?![a-z0-9])")


def _fail(where: str, message: str) -> RubricFormatError:
  return RubricFormatError(f"{where}: {message}")


def _check_keys(obj: Mapping[str, Any], where: str, required: set[str], optional: set[str]) -> None:
  missing = sorted(required - obj.keys())
  if missing:
    raise _fail(where, f"missing key(s) {missing}")
  unknown = sorted(obj.keys() - required - optional - {"type"})
  if unknown:
    raise _fail(where, f"unknown key(s) {unknown}; expected {sorted(required | optional)}")


def _phrase_list(value: Any, where: str) -> tuple[str, ...]:
  if not isinstance(value, list) or not value:
    raise _fail(where, f"expected a non-empty list of phrase strings, got {value!r}")
  for i, phrase in enumerate(value):
    try:
      text_lib.phrase_regex(phrase)
    except (ValueError, TypeError) as e:
      raise _fail(f"{where}[{i}]", str(e)) from None
  return tuple(value)


def _bool(value: Any, where: str) -> bool:
  if not isinstance(value, bool):
    raise _fail(where, f"expected true or false, got {value!r}")
  return value


def _count(value: Any, where: str) -> int | None:
  if value is None:
    return None
  if not is_int(value) or value < 0:
    raise _fail(where, f"expected a non-negative integer, got {value!r}")
  return value


def _real(value: Any, where: str, non_negative: bool = False) -> float:
  if not is_number(value):
    raise _fail(where, f"expected a finite number, got {value!r}")
  if non_negative and value < 0:
    raise _fail(where, f"expected a number >= 0, got {value!r}")
  return float(value)


class Check(abc.ABC):
  """One machine-checkable condition on an answer."""

  kind: ClassVar[str]

  @classmethod
  @abc.abstractmethod
  def from_json(cls, obj: Mapping[str, Any], where: str) -> Check:
    """Parses and validates the spec; raises RubricFormatError naming `where` and the key."""

  @abc.abstractmethod
  def holds(self, answer: text_lib.Answer) -> bool:
    """Whether the answer satisfies the condition."""


@dataclasses.dataclass(frozen=True)
class Keywords(Check):
  """Required facts: every synonym group has a phrase in the answer (or in one sentence)."""

  all_of: tuple[tuple[str, ...], ...]
  same_sentence: bool = False
  kind: ClassVar[str] = "keywords"

  @classmethod
  def from_json(cls, obj: Mapping[str, Any], where: str) -> Check:
    _check_keys(obj, where, {"all_of"}, {"same_sentence"})
    groups = obj["all_of"]
    if not isinstance(groups, list) or not groups:
      raise _fail(f"{where}.all_of", f"expected a non-empty list of synonym lists, got {groups!r}")
    return cls(tuple(_phrase_list(g, f"{where}.all_of[{i}]") for i, g in enumerate(groups)),
               _bool(obj.get("same_sentence", False), f"{where}.same_sentence"))

  def holds(self, answer: text_lib.Answer) -> bool:
    def all_groups_in(span: str) -> bool:
      return all(any(text_lib.phrase_regex(p).search(span) for p in group)
                 for group in self.all_of)

    if self.same_sentence:
      return any(all_groups_in(sentence) for sentence in answer.sentences)
    return all_groups_in(answer.text)


@dataclasses.dataclass(frozen=True)
class Claim(Check):
  """A stated claim, usually a pitfall: some phrase occurs in a sentence without negation."""

  any_of: tuple[str, ...]
  negation_guard: bool = True
  kind: ClassVar[str] = "claim"

  @classmethod
  def from_json(cls, obj: Mapping[str, Any], where: str) -> Check:
    _check_keys(obj, where, {"any_of"}, {"negation_guard"})
    return cls(_phrase_list(obj["any_of"], f"{where}.any_of"),
               _bool(obj.get("negation_guard", True), f"{where}.negation_guard"))

  def holds(self, answer: text_lib.Answer) -> bool:
    for sentence in answer.sentences:
      for phrase in self.any_of:
        cues_in_phrase = len(_NEGATION_CUE_RE.findall(text_lib.normalize(phrase)))
        for match in text_lib.phrase_regex(phrase).finditer(sentence):
          if not (self.negation_guard and _negated(sentence, match, cues_in_phrase)):
            return True
    return False


def _negated(sentence: str, match: re.Match[str], cues_in_phrase: int) -> bool:
  """A cue before the match, or inside it beyond the cues the phrase itself spells out."""
  if _NEGATION_CUE_RE.search(sentence, 0, match.start()):
    return True
  return len(_NEGATION_CUE_RE.findall(sentence, match.start(), match.end())) > cues_in_phrase


@dataclasses.dataclass(frozen=True)
class Number(Check):
  """A quantity: some number within tolerance of value, followed by one of the units if given."""

  value: float
  abs_tol: float = 0.0
  rel_tol: float = 0.0
  units: tuple[str, ...] = ()
  kind: ClassVar[str] = "number"

  @classmethod
  def from_json(cls, obj: Mapping[str, Any], where: str) -> Check:
    _check_keys(obj, where, {"value"}, {"abs_tol", "rel_tol", "units"})
    units = obj.get("units", [])
    if not isinstance(units, list):
      raise _fail(f"{where}.units", f"expected a list of unit strings, got {units!r}")
    try:
      if units:
        text_lib.unit_regex(tuple(units))
    except (ValueError, TypeError) as e:
      raise _fail(f"{where}.units", str(e)) from None
    return cls(_real(obj["value"], f"{where}.value"),
               _real(obj.get("abs_tol", 0.0), f"{where}.abs_tol", non_negative=True),
               _real(obj.get("rel_tol", 0.0), f"{where}.rel_tol", non_negative=True),
               tuple(units))

  def holds(self, answer: text_lib.Answer) -> bool:
    tolerance = max(self.abs_tol, self.rel_tol * abs(self.value))
    units = text_lib.unit_regex(self.units) if self.units else None
    return any(abs(n.value - self.value) <= tolerance
               and (units is None or units.match(answer.text, n.end) is not None)
               for n in answer.numbers)


@dataclasses.dataclass(frozen=True)
class _Bounds(Check):
  """A count of something in the answer within [min, max]."""

  min: int | None
  max: int | None
  default_min: ClassVar[int | None] = None

  @classmethod
  def from_json(cls, obj: Mapping[str, Any], where: str) -> Check:
    _check_keys(obj, where, set(), {"min", "max"})
    low = _count(obj.get("min", cls.default_min), f"{where}.min")
    high = _count(obj.get("max"), f"{where}.max")
    if low is None and high is None:
      raise _fail(where, "give at least one of 'min' and 'max'")
    if low is not None and high is not None and low > high:
      raise _fail(where, f"min {low} is larger than max {high}")
    return cls(low, high)

  @abc.abstractmethod
  def count(self, answer: text_lib.Answer) -> int:
    """The counted quantity."""

  def holds(self, answer: text_lib.Answer) -> bool:
    n = self.count(answer)
    return (self.min is None or n >= self.min) and (self.max is None or n <= self.max)


class Sentences(_Bounds):
  """The number of sentences lies in [min, max]."""

  kind: ClassVar[str] = "sentences"

  def count(self, answer: text_lib.Answer) -> int:
    return len(answer.sentences)


class Words(_Bounds):
  """The number of words lies in [min, max]."""

  kind: ClassVar[str] = "words"

  def count(self, answer: text_lib.Answer) -> int:
    return answer.num_words


class Bullets(_Bounds):
  """The number of bullet items lies in [min, max]."""

  kind: ClassVar[str] = "bullets"
  default_min: ClassVar[int | None] = 1

  def count(self, answer: text_lib.Answer) -> int:
    return answer.num_bullets


@dataclasses.dataclass(frozen=True)
class _Combinator(Check):
  """A check made of other checks."""

  checks: tuple[Check, ...]

  @classmethod
  def from_json(cls, obj: Mapping[str, Any], where: str) -> Check:
    _check_keys(obj, where, {"checks"}, set())
    specs = obj["checks"]
    if not isinstance(specs, list) or not specs:
      raise _fail(f"{where}.checks", f"expected a non-empty list of check specs, got {specs!r}")
    return cls(tuple(parse_check(spec, f"{where}.checks[{i}]") for i, spec in enumerate(specs)))


class AnyOf(_Combinator):
  """At least one of the checks holds."""

  kind: ClassVar[str] = "any"

  def holds(self, answer: text_lib.Answer) -> bool:
    return any(c.holds(answer) for c in self.checks)


class AllOf(_Combinator):
  """Every check holds."""

  kind: ClassVar[str] = "all"

  def holds(self, answer: text_lib.Answer) -> bool:
    return all(c.holds(answer) for c in self.checks)


CHECK_TYPES: dict[str, type[Check]] = {
    c.kind: c for c in (Keywords, Claim, Number, Sentences, Words, Bullets, AnyOf, AllOf)}


def parse_check(obj: Any, where: str) -> Check:
  """Parses one spec (module docstring); errors name `where` and the offending key."""
  if not isinstance(obj, dict):
    raise _fail(where, f"expected a check object, got {obj!r}")
  kind = obj.get("type")
  if kind not in CHECK_TYPES:
    raise _fail(f"{where}.type", f"unknown check type {kind!r}; expected one of {sorted(CHECK_TYPES)}")
  return CHECK_TYPES[kind].from_json(obj, where)
