"""Wordle: find the secret five-letter word from per-letter feedback.

Feedback per letter: G (right letter, right place), Y (in the word, elsewhere), - (not in the
word, or no more copies of it). Guesses must come from the shipped word list
(`data/words.txt`, written for this project), like the secrets. The oracle is a
consistent-candidate solver: it always guesses a word that agrees with all feedback so far,
choosing the one whose worst-case feedback leaves the fewest candidates (ties: the earliest
word). On the shipped list it finds every secret within 6 guesses, the default `max_turns`;
the tests check all words.
"""
from __future__ import annotations

import collections
import functools
import importlib.resources
import pathlib
import random
import re
from typing import Hashable, Sequence

from rised_jax.envs import base
from rised_jax.types import Event

WORD_LENGTH = 5
_WORD_RE = re.compile(r"^[a-z]{5}$")
_SEPARATORS_RE = re.compile(r"[\s\-,.]")
_MAX_GENERATION_TRIES = 1000


def score(guess: str, secret: str) -> str:
  """Wordle feedback: per letter G (right place), Y (elsewhere in the word), - (absent).

  A repeated letter counts yellow only as many times as the secret has unmatched copies of it.
  """
  marks = ["-"] * WORD_LENGTH
  unmatched = []
  for i, (g, s) in enumerate(zip(guess, secret)):
    if g == s:
      marks[i] = "G"
    else:
      unmatched.append(s)
  for i, g in enumerate(guess):
    if marks[i] == "-" and g in unmatched:
      marks[i] = "Y"
      unmatched.remove(g)
  return "".join(marks)


def load_words(path: str | pathlib.Path | None = None) -> tuple[str, ...]:
  """Reads a word list (one lowercase five-letter word per line, '#' comments); validates it."""
  if path is None:
    text = importlib.resources.files(__package__).joinpath("data/words.txt").read_text("utf-8")
    source = "rised_jax/envs/data/words.txt"
  else:
    try:
      text = pathlib.Path(path).read_text("utf-8")
    except OSError as error:
      raise ValueError(f"wordle: cannot read word_file {str(path)!r}: {error}") from error
    source = str(path)
  words, seen = [], set()
  for number, line in enumerate(text.splitlines(), start=1):
    word = line.strip()
    if not word or word.startswith("#"):
      continue
    if not _WORD_RE.match(word):
      raise ValueError(f"wordle: {source} line {number}: expected a lowercase five-letter word "
                       f"(a-z), got {word!r}")
    if word in seen:
      raise ValueError(f"wordle: {source} line {number}: duplicate word {word!r}")
    seen.add(word)
    words.append(word)
  if len(words) < 2:
    raise ValueError(f"wordle: {source} holds {len(words)} words; at least 2 are needed")
  return tuple(words)


class Solver:
  """The consistent-candidate minimax solver over one word list (its choices and plays are
  memoised: generating a paper-scale task stream asks for the same secrets' plays tens of
  thousands of times, each a pass of `score` over the word list)."""

  def __init__(self, words: Sequence[str]):
    self.words = tuple(words)
    self._choice: dict[tuple[str, ...], str] = {}
    self._plays: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, ...]] = {}

  def choose(self, candidates: tuple[str, ...]) -> str:
    """The candidate whose worst feedback leaves the fewest candidates (then fewest on average)."""
    if candidates not in self._choice:
      best_key, best = None, candidates[0]
      for guess in candidates:
        sizes = collections.Counter(score(guess, secret) for secret in candidates).values()
        key = (max(sizes), sum(size * size for size in sizes))
        if best_key is None or key < best_key:
          best_key, best = key, guess
      self._choice[candidates] = best
    return self._choice[candidates]

  def play(self, secret: str, history: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The guesses the solver makes after `history` [(guess, feedback)], ending with `secret`."""
    key = (secret, tuple(map(tuple, history)))
    if key not in self._plays:
      self._plays[key] = tuple(self._play(secret, key[1]))
    return list(self._plays[key])

  def _play(self, secret: str, history: tuple[tuple[str, str], ...]) -> list[str]:
    candidates = tuple(w for w in self.words
                       if all(score(guess, w) == feedback for guess, feedback in history))
    guesses = []
    while True:
      guess = self.choose(candidates)
      guesses.append(guess)
      if guess == secret:
        return guesses
      feedback = score(guess, secret)
      candidates = tuple(w for w in candidates if score(guess, w) == feedback)


@functools.lru_cache(maxsize=8)
def solver_for(words: tuple[str, ...]) -> Solver:
  """One shared solver (and memo) per word list."""
  return Solver(words)


class Wordle(base.Environment):
  """Guess the secret five-letter word."""

  name = "wordle"
  default_max_turns = 6
  # The secret is hidden; the oracle's last guess is the secret, so this key is the secret's.
  partial_view = True

  def __init__(self, *, word_file: str | None = None, max_turns: int | None = None,
               shaping: float = 0.0):
    super().__init__(max_turns=max_turns, shaping=shaping)
    if word_file is not None and not isinstance(word_file, (str, pathlib.Path)):
      raise ValueError(f"wordle: word_file must be a path, got {word_file!r}")
    self.words = load_words(word_file)
    self._word_set = frozenset(self.words)

  @property
  def system_prompt(self) -> str:
    return (
        "You play Wordle. Find the secret five-letter English word. Each turn guess a common "
        "five-letter word. Feedback gives one mark per letter: G = right letter in the right "
        "place, Y = the letter is in the word but elsewhere, - = the letter is not in the word. "
        "Use the feedback: later guesses should keep the G letters, move the Y letters and avoid "
        f"the - letters. You have {self.max_turns} guesses. {self.ANSWER_FORMAT} "
        "Example: <answer>crane</answer>")

  def action_space(self) -> list[str]:
    return list(self.words)

  def _generate(self, rng: random.Random) -> None:
    # Only secrets the oracle finds within the turn budget (all of them on the shipped list
    # with the default 6 turns), so that every episode is solvable by the oracle.
    solver = solver_for(self.words)
    for _ in range(_MAX_GENERATION_TRIES):
      secret = rng.choice(self.words)
      if len(solver.play(secret)) <= self.max_turns:
        self.secret = secret
        self.history: list[tuple[str, str]] = []
        return
    raise RuntimeError(f"wordle: the oracle needs more than max_turns={self.max_turns} guesses "
                       f"for the secrets drawn in {_MAX_GENERATION_TRIES} tries; raise max_turns")

  def _parse(self, candidate: str) -> str | None:
    word = _SEPARATORS_RE.sub("", candidate)  # "c r a n e", "c-r-a-n-e"
    return word if _WORD_RE.match(word) else None

  def _apply(self, action: str) -> base.Outcome:
    if action not in self._word_set:
      return base.Outcome(f'"{action}" is not in the word list: that guess is not allowed.',
                          [Event.INVALID_ACTION.value], executed=False)
    events = []
    if any(guess == action for guess, _ in self.history):
      events.append(Event.REPEATED_ACTION.value)
    if self.history:
      consistent = all(score(guess, action) == feedback for guess, feedback in self.history)
      events.append(Event.USED_FEEDBACK.value if consistent else Event.IGNORED_FEEDBACK.value)
    self.history.append((action, score(action, self.secret)))
    # The rendered history right after this message shows the new feedback line.
    found = action == self.secret
    return base.Outcome("You found the word." if found else "", events, success=found)

  def _render(self) -> str:
    if not self.history:
      return "No guesses yet. Guess a five-letter word."
    lines = [f"{guess}: {' '.join(feedback)}" for guess, feedback in self.history]
    placed = ["_"] * WORD_LENGTH
    present, absent = set(), set()
    for guess, feedback in self.history:
      for i, (letter, mark) in enumerate(zip(guess, feedback)):
        if mark == "G":
          placed[i] = letter
        if mark in "GY":
          present.add(letter)
        else:
          absent.add(letter)
    absent -= present  # a '-' on a repeated letter only says there is no extra copy
    lines.append(f"Known: {' '.join(placed)} | in the word: "
                 f"{', '.join(sorted(present - set(placed))) or 'none'} | not in the word: "
                 f"{', '.join(sorted(absent)) or 'none'}")
    return "\n".join(lines)

  def _state_key(self) -> Hashable:
    return tuple(self.history)

  def _instance(self) -> tuple:
    return (self.secret,)

  def _solve(self) -> list[str]:
    return solver_for(self.words).play(self.secret, self.history)

  def _format_hint(self) -> str:
    return "Answer with one five-letter word, e.g. <answer>crane</answer>."
