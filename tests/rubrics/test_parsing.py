"""The judge parser on any model output (issue 9): a verdict or unjudged, never an exception,
in time linear in the answer's length.

The fuzz set is seeded and generated: well-formed answers (whose tags are known, so the
verdict is checked exactly) inside prose, fences and odd key spellings; the same answers cut
short; deep nesting; numbers too long to convert; noise of JSON punctuation; huge answers; and
values that are not text at all.
"""
from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from rised_jax.rubrics import Vocabulary, criteria, parsing
from rised_jax.rubrics.parsing import MAX_ANSWER_CHARS, parse_verdict

SEED = 2026
# Measured on a busy 2-core machine: the slowest input of the fuzz set (1 MB of nested
# `{"tags": [`) parses in 58 ms, 200 kB ones in under 10 ms; 2 s leaves a 30x margin. The
# quadratic parser of before took 24 s for 200,000 `{`.
PROSE = "The agent moved around and then it stopped. Overall fair: see below.\n"
NOISE_ALPHABET = ' {}[]":,\n`\\tagsNaNInfinity-0123456789.eE'


@pytest.fixture(scope="module")
def vocab():
  return Vocabulary.load("agentic_v1")


def spell(rng: random.Random, vocab: Vocabulary, tag: str) -> str:
  """One of the spellings the parser accepts for a tag: its id or description, varied."""
  entry = vocab.entry(tag)
  return rng.choice([tag, tag.upper(), tag.replace("_", " "), tag.replace("_", "-"),
                     f"- {tag}", entry.description, entry.description.upper()])


def well_formed(rng: random.Random, vocab: Vocabulary) -> tuple[str, set[str]]:
  tags = set(rng.sample(vocab.ids, rng.randint(1, 4)))
  key = rng.choice(["tags", "TAGS", "Rubrics", "labels", "applicable_tags"])
  items = ", ".join(f'"{spell(rng, vocab, t)}"' for t in sorted(tags))
  body = f'{{"{key}": [{items}]}}'
  style = rng.randrange(4)
  if style == 1:
    body = f"```json\n{body}\n```"
  elif style == 2:
    body = f"{PROSE * rng.randint(1, 5)}{body}\n{PROSE}"
  elif style == 3:
    body = f"{PROSE}```\n{body}\n```{PROSE}"
  return body, tags


def nested(rng: random.Random) -> str:
  depth = rng.choice([10, 500, 999, 1000, 1001, 5000, 100_000])
  opener = rng.choice(["[", "{", '{"tags": ', '{"a":', '[{"tags": ['])
  tail = rng.choice(["", "]" * depth, '"x"', '{"tags": ["gave_up"]}'])
  return opener * depth + tail


def long_number(rng: random.Random) -> str:
  digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(4000, 20_000)))
  return rng.choice([digits, f'{{"tags": [{digits}]}}', f'{{"tags": {{"a": {digits}}}}}',
                     f"[{digits}]", f"-{digits}.5e{digits[:5]}"])


def noise(rng: random.Random) -> str:
  return "".join(rng.choice(NOISE_ALPHABET) for _ in range(rng.randint(0, 400)))


def huge(rng: random.Random) -> str:
  pattern = rng.choice(["{", "[", '{"', "```", '{"a":', '{"tags": [', "{ ", "``` ```json\n",
                        '"valid_syntax", ', "\\u00e9"])
  return pattern * (200_000 // len(pattern))


class Odd:
  def __repr__(self):
    return "<an object whose repr is long>" * 1000


def not_text(rng: random.Random) -> Any:
  deep: Any = ["x"]
  for _ in range(5000):
    deep = [deep]
  return rng.choice([None, 0, 7, -1, 10**5000, math.nan, math.inf, 1.5, True, b"bytes",
                     {"tags": ["valid_syntax"]}, ["valid_syntax"], deep, Odd(), object()])


def fuzz_set(vocab: Vocabulary) -> list[tuple[Any, set[str] | None]]:
  """(answer, expected tag ids or None when only "no exception" is known)."""
  rng = random.Random(SEED)
  cases: list[tuple[Any, set[str] | None]] = [
      ("[" * 1000, None), ('{"tags": [' + "9" * 4301 + "]}", None), ("{" * 200_000, None),
      (5, None), (math.nan, None), ({"tags": ["gave_up"]}, None), (None, None)]
  for _ in range(1500):
    answer, tags = well_formed(rng, vocab)
    cases.append((answer, tags))
    cases.append((answer[:rng.randrange(len(answer))], None))   # truncated
  cases += [(nested(rng), None) for _ in range(300)]
  cases += [(long_number(rng), None) for _ in range(200)]
  cases += [(noise(rng), None) for _ in range(1400)]
  cases += [(huge(rng), None) for _ in range(60)]
  cases += [(not_text(rng), None) for _ in range(300)]
  return cases


MOST_DECODES = 2 * parsing.MAX_CANDIDATES + 1


@pytest.fixture
def decodes(monkeypatch):
  """The JSON decodes of each parse, appended as they run.

  The parse's bound is its count of decodes (parsing's docstring: at most MAX_CANDIDATES fenced
  blocks, the whole answer and MAX_CANDIDATES embedded objects, each decode linear), counted
  rather than timed: a wall-clock limit fails on a loaded machine and proves nothing."""
  calls: list[int] = []
  decode = parsing._decode  # noqa: SLF001 - the one place every candidate is decoded
  monkeypatch.setattr(parsing, "_decode",
                      lambda fn, text: (calls.append(len(text)), decode(fn, text))[1])
  return calls


def test_fuzzed_answers_give_a_verdict_or_unjudged_in_bounded_work(vocab, decodes):
  cases = fuzz_set(vocab)
  assert len(cases) >= 5000
  most = 0
  checked = 0
  for answer, expected in cases:
    decodes.clear()
    verdict = parse_verdict(answer, vocab)
    most = max(most, len(decodes))
    assert verdict.tags.shape == (len(vocab),) and verdict.tags.dtype == np.float32
    assert set(np.unique(verdict.tags)) <= {0.0, 1.0}
    assert isinstance(verdict.unjudged, bool) and isinstance(verdict.raw, str)
    assert all(isinstance(u, str) and len(u) <= 200 for u in verdict.unknown_tags)
    if verdict.unjudged:
      assert not verdict.tags.any()
    if not isinstance(answer, str):
      assert verdict.unjudged
    if expected is not None:
      assert not verdict.unjudged and set(vocab.ids_of(verdict.tags)) == expected, answer
      checked += 1
  assert checked == 1500
  assert 0 < most <= MOST_DECODES, most


@pytest.mark.parametrize("answer", [
    "[" * 1000,                                  # was RecursionError
    '{"tags": [' + "9" * 5000 + "]}",            # was ValueError (int digit limit)
    5, math.nan, {"tags": ["gave_up"]},          # was AttributeError
])
def test_the_reported_crashes_are_unjudged(vocab, answer):
  assert parse_verdict(answer, vocab).unjudged


def test_many_braces_parse_in_bounded_work(vocab, decodes):
  # Decoding from every "{" made this quadratic (24 s once): now at most MAX_CANDIDATES.
  assert parse_verdict("{" * 200_000, vocab).unjudged
  assert 1 <= len(decodes) <= MOST_DECODES


def test_a_verdict_after_junk_and_the_size_limit(vocab):
  junk = "{ [ ` {{ [[ " * 1000
  assert vocab.ids_of(parse_verdict(junk + '{"tags": ["gave_up"]}', vocab).tags) == ["gave_up"]
  answer = '{"tags": ["gave_up"]}'
  assert not parse_verdict(answer + " " * (MAX_ANSWER_CHARS - len(answer)), vocab).unjudged
  assert parse_verdict(answer + " " * (MAX_ANSWER_CHARS + 1 - len(answer)), vocab).unjudged
  assert parse_verdict(5, vocab).raw == "<not text: 5>"


def test_criteria_judge_counts_unreadable_answers_as_unusable():
  # The CriPO per-criterion judge parses through the same parser (VERDICTS vocabulary).
  from rised_jax.rubric_tasks import builtin_task_set   # noqa: PLC0415
  task = builtin_task_set().tasks[0]
  replies = ["[" * 1000, '{"tags": [' + "9" * 5000 + "]}", 5, math.nan, None,
             {"tags": ["met"]}, "{" * 200_000, '{"tags": ["met"]}']
  count = len(task.criteria)
  answers = [replies[k % len(replies)] for k in range(count * len(replies))]
  judge = criteria.make_criteria_judge("inprocess", generate_text=lambda prompts: answers[
      :len(prompts)])
  result = judge.judge([task] * len(replies), [f"answer {k}" for k in range(len(replies))])
  usable_questions = sum(a == '{"tags": ["met"]}' for a in answers)
  assert result.stats.questions == count * len(replies)
  assert result.stats.unjudged_questions == count * len(replies) - usable_questions
