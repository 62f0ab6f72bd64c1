"""The shared adapter of text suites that run in a JVM (ScienceWorld, TextWorld Express).

A subclass names its instances (`_choose(seed)` → a hashable instance, e.g. (task, variation))
and talks to its simulator through four hooks: `_new_backend`, `_load(backend, instance)`,
`_gold(backend)` and `_send(backend, command)` → `Report`. Everything else is here:

* commands are free text (the normalised answer, see `parsing`), sent as they are; the suite's
  own parser decides what is admissible, and a refusal is an invalid action;
* the simulators are shared through a `suites.BackendPool`, so an episode's state lives as its
  instance plus its command history (replayed when another episode used the backend since);
* the first observation of each instance is cached, so `reset` (and `envs.instance_key`)
  starts no JVM work for an instance seen before;
* events come from the suite's score and flags via `rubrics.suite_events.step_events`, with the
  distance to the goal taken as (max score - score);
* the oracle is the suite's gold action sequence, valid while the episode follows it: after an
  executed command off that sequence the suite offers no plan and `oracle()` raises.
"""
from __future__ import annotations

import abc
import dataclasses
import os
import re
import threading
from typing import Any, ClassVar, Hashable

from rised_jax.envs import base, parsing, suite_events, suites

# Commands that look rather than act: never `no_effect` (they are how an agent gathers facts).
_INFORMATIONAL_RE = re.compile(r"^(?:look|look around|look at .+|look in .+|l|inventory|inv|i|"
                               r"examine .+|read .+|task|score)$")
_MAX_COMMAND_CHARS = 200
_HEAP_RE = re.compile(r"^[1-9][0-9]*[kmgKMG]$")
_ENVIRON_LOCK = threading.Lock()   # JAVA_TOOL_OPTIONS is set only while a JVM starts


@dataclasses.dataclass(frozen=True)
class Report:
  """What the suite answered to one command."""

  feedback: str
  score: float
  view: Hashable          # what the agent can see (location text, inventory): `no_effect` if equal
  rejected: bool = False  # the suite's parser did not understand the command
  success: bool = False
  failed: bool = False
  admissible: tuple[str, ...] = ()   # the suite's valid commands now, where it lists them


@dataclasses.dataclass(frozen=True)
class Start:
  """An instance's opening: the suite's task text and first observation, its view and score."""

  intro: str
  view: Hashable
  score: float
  gold: tuple[str, ...]
  admissible: tuple[str, ...] = ()


class TextSuite(suites.SuiteEnvironment, abc.ABC):
  """A JVM text suite behind the `base.Environment` protocol (see the module docstring)."""

  max_score: ClassVar[float]
  pool_key: ClassVar[str]          # environments with one pool key share their simulators
  # Set: without an explicit max_turns the budget is derived per instance, max(
  # default_max_turns, gold_turns_factor x its gold length), so a long gold run always fits.
  gold_turns_factor: ClassVar[int | None] = None
  # Live JVMs per pool: RISED_SUITE_JVMS, default 2. With fewer JVMs than live episodes every
  # step may replay (see `suites.BackendPool`).
  pool_capacity: ClassVar[int] = int(os.environ.get("RISED_SUITE_JVMS", "2"))
  # Each JVM's heap bound (java -Xmx): RISED_SUITE_JVM_HEAP, default 1g. Unbounded, the JVM's
  # heap limit is a quarter of the machine's memory, and a ScienceWorld JVM playing boil's gold
  # runs grew to 2.9 GB RSS; bounded to 1g it peaked at 0.9 GB, to 512m at 0.6 GB, same results.
  jvm_heap: ClassVar[str] = os.environ.get("RISED_SUITE_JVM_HEAP", "1g")
  _pools: ClassVar[dict[str, suites.BackendPool]] = {}
  _starts: ClassVar[dict[Hashable, Start]] = {}

  def __init__(self, *, eval_split: str, held_out_from: int, max_turns: int | None,
               shaping: float):
    """eval_split: the suite's split evaluation plays ('dev' or 'test'); seeds from
    `held_out_from` on play it, lower seeds the train split."""
    super().__init__(max_turns=max_turns, shaping=shaping)
    self._derive_turns = max_turns is None and self.gold_turns_factor is not None
    if eval_split not in ("dev", "test"):
      raise ValueError(f"{self.name}: eval_split must be 'dev' or 'test', got {eval_split!r}")
    self.eval_split = eval_split
    self.held_out_from = base.check_int(self.name, "held_out_from", held_out_from, 1, 1 << 62)

  # ---- hooks of a suite ------------------------------------------------------------------

  @abc.abstractmethod
  def _choose(self, seed: int) -> Hashable:
    """The instance this seed plays (plain strings and ints)."""

  @abc.abstractmethod
  def _new_backend(self) -> Any:
    """A new simulator (starts a JVM)."""

  @abc.abstractmethod
  def _load(self, backend: Any, instance: Hashable
            ) -> tuple[str, Hashable, float, tuple[str, ...]]:
    """Starts `instance` on `backend`; returns (intro text, view, score, admissible commands)."""

  @abc.abstractmethod
  def _gold(self, backend: Any) -> list[str]:
    """The suite's gold command sequence of the instance just loaded."""

  @abc.abstractmethod
  def _send(self, backend: Any, command: str) -> Report:
    """Plays one command."""

  @staticmethod
  def _close(backend: Any) -> None:
    backend.close()

  # ---- base.Environment hooks --------------------------------------------------------------

  def _pool(self) -> suites.BackendPool:
    if self.pool_key not in TextSuite._pools:
      if not _HEAP_RE.match(self.jvm_heap):
        raise ValueError(f"{self.name}: RISED_SUITE_JVM_HEAP={self.jvm_heap!r}; expected a java "
                         "heap size such as 512m or 1g")
      TextSuite._pools[self.pool_key] = suites.BackendPool(self._start_backend, self._close,
                                                           self.pool_capacity)
    return TextSuite._pools[self.pool_key]

  def _start_backend(self) -> Any:
    """`_new_backend()` with the JVM's heap bounded: the suites' launchers pass no JVM options,
    but every JVM reads JAVA_TOOL_OPTIONS at start (a bound already there is kept)."""
    with _ENVIRON_LOCK:
      before = os.environ.get("JAVA_TOOL_OPTIONS")
      if before is not None and "-Xmx" in before:
        return self._new_backend()
      os.environ["JAVA_TOOL_OPTIONS"] = " ".join(filter(None, (before, f"-Xmx{self.jvm_heap}")))
      try:
        return self._new_backend()
      finally:
        if before is None:
          del os.environ["JAVA_TOOL_OPTIONS"]
        else:
          os.environ["JAVA_TOOL_OPTIONS"] = before

  def _start(self, instance: Hashable) -> Start:
    key = (self.name, instance)
    if key not in TextSuite._starts:
      def load(backend: Any) -> Start:
        intro, view, score, admissible = self._load(backend, instance)
        return Start(intro, view, score, tuple(self._gold(backend)), admissible)

      TextSuite._starts[key] = self._pool().use(load)
    return TextSuite._starts[key]

  def _generate(self, rng: Any) -> None:
    del rng   # the suite draws the instance from the seed (`_choose`)
    self._pool().release(self)   # a backend may still hold this object's previous episode
    self.instance = self._choose(self._seed)
    start = self._start(self.instance)
    self._opening = start.intro
    self.view, self.score, self.gold = start.view, start.score, start.gold
    if self._derive_turns:
      self.max_turns = min(base.MAX_TURNS,
                           max(self.default_max_turns, self.gold_turns_factor * len(self.gold)))
    self._spelling = _spellings(start.admissible + start.gold)
    self.history: list[str] = []       # every command sent to the suite, in order
    self._gold_done: int | None = 0    # gold commands played so far; None once off the gold path

  def _intro(self) -> str:
    return self._opening

  def _parse(self, candidate: str) -> str | None:
    # Candidates arrive lower-cased (`parsing.normalize`); suites with case-sensitive parsers
    # (TextWorld Express's "take TV remote") get their own spelling of an admissible command.
    if not 0 < len(candidate) <= _MAX_COMMAND_CHARS:
      return None
    return self._spelling.get(candidate, candidate)

  def _apply(self, command: str) -> base.Outcome:
    pool = self._pool()
    backend = pool.lease(self, self._restore)
    try:
      report = self._send(backend, command)
    except Exception:
      pool.discard(self)   # the simulator's state is unknown now: never reuse it
      raise
    self.history.append(command)
    if self._gold_done is not None:
      # The next gold command keeps the episode on the gold path even when the suite refuses
      # it (TWX's gold runs hold a few refused no-ops); any other command that executed leaves
      # it, a refused one changes nothing.
      if self._gold_done < len(self.gold) and command == self.gold[self._gold_done]:
        self._gold_done += 1
      elif not report.rejected:
        self._gold_done = None
    events = suite_events.step_events(
        rejected=report.rejected, changed=(report.view, report.score) != (self.view, self.score),
        informational=bool(_INFORMATIONAL_RE.match(command)), failed=report.failed,
        distance_before=self.max_score - self.score, distance_after=self.max_score - report.score)
    self.view, self.score = report.view, report.score
    if report.admissible:
      self._spelling = _spellings(report.admissible + self.gold)
    return base.Outcome(report.feedback.strip(), events, executed=not report.rejected,
                        success=report.success, failed=report.failed)

  def _restore(self, backend: Any) -> None:
    self._load(backend, self.instance)
    for command in self.history:
      self._send(backend, command)

  def _render(self) -> str:
    return f"Score: {self.score:g}/{self.max_score:g}."

  def _state_key(self) -> Hashable:
    return (self.view, self.score)

  def _instance(self) -> tuple:
    return (self.instance,)

  def _solve(self) -> list[str]:
    if self._gold_done is None:
      raise RuntimeError(f"{self.name}: the suite's gold sequence is known only along its own "
                         f"path, and this episode left it (commands so far: {self.history})")
    return list(self.gold[self._gold_done:])

  def _format_hint(self) -> str:
    return "Answer with one command as <answer>COMMAND</answer>, e.g. <answer>look around</answer>."


def _spellings(commands: tuple[str, ...]) -> dict[str, str]:
  """{normalised command: the suite's spelling}, for commands whose spelling differs."""
  return {parsing.normalize(c): c for c in commands if parsing.normalize(c) != c}
