"""Rubric tasks (CriPO prompts): the format, the JSONL loader, the built-in set and the checker.

One task per JSONL line:

  {"id": "sky-blue",                          unique in the file
   "prompt": "Explain why the sky is blue in 2-4 sentences.",
   "domain": "physics",                        optional free-form label
   "criteria": [                               at least one; ids unique within the task
     {"id": "scattering", "text": "Attributes the colour to scattering by air molecules.",
      "weight": 3, "check": {"type": "keywords", ...}},
     {"id": "ocean-myth", "text": "Claims the sky reflects the ocean.",
      "weight": -2, "check": {"type": "claim", ...}}],        negative weight: a pitfall
   "reference": "..."}                         optional reference answer

Weights are finite and non-zero; a task needs at least one positive weight. A weight is a JSON
number or a ratio string ("1/18"), and it is read exactly as written: the number's own text
(0.1 is 1/10, 0.05555555555555555 that decimal) or the ratio, as a `fractions.Fraction`. CriPO
decides SC, y*, its counterfactual rollouts and the sign of each advantage on these exact
values (`learn.cripo`), so rubrics normalised by their sum (an integer over the sum) decide as
their integers would. The check specs are described in `rubric_tasks.checks`. Errors name the
file, the line and the key.
"""
from __future__ import annotations

import dataclasses
import fractions
import json
import math
import os
import re
from typing import Any, Sequence

import numpy as np

from rised_jax import json_data
from rised_jax.rubric_tasks import checks as checks_lib
from rised_jax.rubric_tasks import text as text_lib
from rised_jax.rubric_tasks.checks import RubricFormatError
from rised_jax.checks import is_int, is_number

BUILTIN_PATH = os.path.join(os.path.dirname(__file__), "data", "science_medicine.jsonl")
BUILTIN_NAME = "rubric_science_medicine"


@dataclasses.dataclass(frozen=True)
class Criterion:
  """One rubric criterion c_j with weight ω_j (negative for a pitfall)."""

  id: str
  text: str
  weight: fractions.Fraction   # exactly as the task file wrote it
  check: checks_lib.Check

  @property
  def is_pitfall(self) -> bool:
    return self.weight < 0


@dataclasses.dataclass(frozen=True)
class RubricTask:
  """One open-ended question with its weighted, machine-checkable criteria."""

  id: str
  prompt: str
  criteria: tuple[Criterion, ...]
  reference: str | None = None
  domain: str | None = None

  @property
  def key(self) -> str:
    """The task's name in logs (rollouts.jsonl's "task"): its id, unique within its task set."""
    return self.id

  @property
  def weights(self) -> np.ndarray:
    """ω as written in the task file: `fractions.Fraction`, object [num_criteria] (compare
    and sum them exactly; np.asarray(weights, np.float64) for float arithmetic)."""
    weights = np.empty(len(self.criteria), object)
    weights[:] = [c.weight for c in self.criteria]
    return weights


@dataclasses.dataclass(frozen=True)
class RubricTaskSet:
  """A named list of rubric tasks (ids unique: the loader checks it)."""

  name: str
  tasks: tuple[RubricTask, ...]

  def __len__(self) -> int:
    return len(self.tasks)


def _string(obj: dict[str, Any], key: str, where: str) -> str:
  value = obj[key]
  if not isinstance(value, str) or not value.strip():
    raise RubricFormatError(f"{where}.{key}: expected a non-empty string, got {value!r}")
  return value


class _FileNumber(float):
  """A JSON number with the text the file wrote (json's parse_float hook): a float to every
  reader, and the exact decimal where a weight needs it."""

  def __new__(cls, text: str):
    number = super().__new__(cls, text)
    number.text = text
    return number


_RATIO = re.compile(r"\s*[+-]?\d+\s*/\s*\d+\s*")


def _exact_weight(value: Any, where: str) -> fractions.Fraction:
  """A weight as written: a JSON number's text, an int, a "p/q" string (a float given in
  code reads as its shortest round-tripping decimal, the text a JSON writer writes)."""
  expected = 'expected a finite non-zero number or a ratio string such as "1/18"'
  if isinstance(value, str):
    if not _RATIO.fullmatch(value):
      raise RubricFormatError(f"{where}.weight: {value!r} is not a ratio of integers; {expected}")
    numerator, denominator = value.split("/")
    if int(denominator) == 0:
      raise RubricFormatError(f"{where}.weight: {value!r} divides by zero; {expected}")
    weight = fractions.Fraction(int(numerator), int(denominator))
  elif is_number(value, finite=False) and not (isinstance(value, float)
                                              and not math.isfinite(value)):
    if isinstance(value, _FileNumber):
      weight = fractions.Fraction(value.text)
    elif is_int(value):
      weight = fractions.Fraction(int(value))
    else:
      weight = fractions.Fraction(np.format_float_positional(value, unique=True, trim="-"))
  else:
    raise RubricFormatError(f"{where}.weight: {expected}, got {value!r}")
  # The weight's float feeds the float rewards: it must be finite and non-zero too.
  try:
    as_float = float(weight)
  except OverflowError:
    as_float = math.inf
  if not math.isfinite(as_float) or as_float == 0:
    raise RubricFormatError(f"{where}.weight: {expected}, got {value!r}")
  return weight


def _parse_criterion(obj: Any, where: str) -> Criterion:
  if not isinstance(obj, dict):
    raise RubricFormatError(f"{where}: expected a criterion object, got {obj!r}")
  missing = sorted({"id", "text", "weight", "check"} - obj.keys())
  if missing:
    raise RubricFormatError(f"{where}: missing key(s) {missing}")
  unknown = sorted(obj.keys() - {"id", "text", "weight", "check"})
  if unknown:
    raise RubricFormatError(f"{where}: unknown key(s) {unknown}; expected ['check', 'id', 'text', 'weight']")
  weight = _exact_weight(obj["weight"], where)
  return Criterion(id=_string(obj, "id", where), text=_string(obj, "text", where), weight=weight,
                   check=checks_lib.parse_check(obj["check"], f"{where}.check"))


def parse_task(obj: Any, where: str) -> RubricTask:
  """Validates one task object (module docstring); errors start with `where`."""
  if not isinstance(obj, dict):
    raise RubricFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
  required, optional = {"id", "prompt", "criteria"}, {"reference", "domain"}
  missing = sorted(required - obj.keys())
  if missing:
    raise RubricFormatError(f"{where}: missing key(s) {missing}")
  unknown = sorted(obj.keys() - required - optional)
  if unknown:
    raise RubricFormatError(f"{where}: unknown key(s) {unknown}; expected {sorted(required | optional)}")
  task_id = _string(obj, "id", where)
  criteria_json = obj["criteria"]
  if not isinstance(criteria_json, list) or not criteria_json:
    raise RubricFormatError(f"{where}.criteria: expected a non-empty list, got {criteria_json!r}")
  criteria = tuple(_parse_criterion(c, f"{where}.criteria[{i}]") for i, c in enumerate(criteria_json))
  seen = set()
  for i, criterion in enumerate(criteria):
    if criterion.id in seen:
      raise RubricFormatError(f"{where}.criteria[{i}].id: duplicate criterion id {criterion.id!r}")
    seen.add(criterion.id)
  if not any(c.weight > 0 for c in criteria):
    raise RubricFormatError(f"{where}.criteria: task {task_id!r} needs at least one positive weight")
  return RubricTask(
      id=task_id, prompt=_string(obj, "prompt", where), criteria=criteria,
      reference=_string(obj, "reference", where) if "reference" in obj else None,
      domain=_string(obj, "domain", where) if "domain" in obj else None)


def parse_task_json(line: str, where: str) -> RubricTask:
  """One task from its JSON text, each weight read from the number's own text."""
  try:
    obj = json.loads(line, parse_float=_FileNumber)
  except json.JSONDecodeError as e:
    raise RubricFormatError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
  return parse_task(obj, where)


def load_jsonl(path: str | os.PathLike[str], name: str | None = None) -> RubricTaskSet:
  """Loads and validates a task file; blank lines are skipped. Errors say file:line: key."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"rubric task file {path!r} does not exist")
  tasks, first_line = [], {}
  with open(path, "rb") as f:
    text = json_data.decode_utf8(f.read(), path, RubricFormatError)
  for line_number, line in enumerate(text.split("\n"), start=1):
    if not line.strip():
      continue
    where = f"{path}:{line_number}"
    json_data.check_shape(line, where, RubricFormatError, line=line_number)
    task = parse_task_json(line, where)
    if task.id in first_line:
      raise RubricFormatError(
          f"{where}.id: duplicate task id {task.id!r} (first defined on line {first_line[task.id]})")
    first_line[task.id] = line_number
    tasks.append(task)
  if not tasks:
    raise RubricFormatError(f"{path}: no tasks in the file")
  return RubricTaskSet(name or os.path.splitext(os.path.basename(path))[0], tuple(tasks))


def builtin_task_set() -> RubricTaskSet:
  """The shipped offline set of short science and medicine explanation tasks."""
  return load_jsonl(BUILTIN_PATH, name=BUILTIN_NAME)


def check(task: RubricTask, answer_text: str) -> np.ndarray:
  """The deterministic judge: r_j ∈ {0, 1} per criterion, float32 [num_criteria].

  For a pitfall (negative weight) 1 means the answer commits it.
  """
  answer = text_lib.Answer(answer_text)
  return np.asarray([c.check.holds(answer) for c in task.criteria], np.float32)


def check_group(task: RubricTask, answers: Sequence[str]) -> np.ndarray:
  """r_ij for the G answers of one group: float32 [G, num_criteria]."""
  return np.stack([check(task, a) for a in answers]) if answers else np.zeros(
      (0, len(task.criteria)), np.float32)


def passes(verdicts: np.ndarray, weights: np.ndarray) -> bool:
  """A task passed: every positive criterion met and no pitfall committed."""
  met = np.asarray(verdicts) > 0
  return bool(np.all(met[weights > 0]) and not np.any(met[weights < 0]))
