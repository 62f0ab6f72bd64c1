"""The environment protocol shared by the built-in text environments.

An `Environment` is one multi-turn text game. The agent loop drives it with

    observation = env.reset(seed)
    observation, reward, done, info = env.step(reply_text)   # until done

`reply_text` is the model's raw reply: the action is read from `<answer>ACTION</answer>`
(see `parsing`). An unreadable or inadmissible action never raises: it costs a turn and the
observation says why. `info` always holds

    success    bool       the goal is reached (the episode is over and won)
    invalid    bool       the action was not executed (unreadable, inadmissible, unknown object)
    events     list[str]  `rised_jax.types.Event` values describing this step
    truncated  bool       the turn budget ran out before the goal: the episode is lost
    failed     bool       an irreversible failure ended the episode
    turn       int        turns used so far (this step included)
    action     str | None the canonical text of the executed action, None when unreadable

An episode ends on success, on an irreversible failure, or after `max_turns` turns (a failure,
reported with `truncated=True`). The reward is 1.0 on success and 0.0 otherwise; with
`shaping > 0` every step also earns `shaping * (#progress - #regress)`.

`read_action(reply)` tells which action a reply would play, without playing it.
`instance_key()` names the game the last `reset` generated: two seeds that generate the same
layout / secret / numbers and target give the same key (training and evaluation sets are
disjoint by this key, not by seed; `rised_jax.evaluate`, `rised_jax.tasks`). Chance that is
drawn during play (FrozenLake's slip) is not part of the instance.
`oracle()` returns plain canonical action texts (not wrapped in `<answer>` tags; use
`parsing.format_answer`) that solve the episode from its CURRENT state; environments with
chance (FrozenLake's slip) plan as if the next steps go as intended, so call it again after
every step. Every environment is deterministic given the seed and the actions: all chance
comes from the `random.Random(seed)` that `reset` creates.

A subclass implements the hooks below the public methods: `_generate`, `_parse`, `_apply`,
`_render`, `_state_key`, `_instance`, `_solve`, `action_space` and `system_prompt`.
"""
from __future__ import annotations

import abc
import dataclasses
import hashlib
import random
from typing import Any, ClassVar, Hashable

from rised_jax.envs import parsing
from rised_jax.types import Event
from rised_jax.checks import is_int, is_number

StepResult = tuple[str, float, bool, dict[str, Any]]
_GIVE_UP = object()  # the parsed form of "give up": handled here for every environment


@dataclasses.dataclass
class Outcome:
  """What applying one parsed action did; returned by `Environment._apply`."""

  feedback: str
  events: list[str] = dataclasses.field(default_factory=list)
  executed: bool = True   # False: rejected without touching the state (inadmissible, unknown)
  success: bool = False
  failed: bool = False    # irreversible failure: the goal can no longer be reached


def check_int(env: str, key: str, value: Any, low: int, high: int) -> int:
  """Validates an integer difficulty knob, naming the environment, key and allowed range."""
  if not is_int(value) or not low <= value <= high:
    raise ValueError(f"{env}: {key} must be an integer in [{low}, {high}], got {value!r}")
  return int(value)


def check_float(env: str, key: str, value: Any, low: float, high: float) -> float:
  """Validates a real difficulty knob, naming the environment, key and allowed range."""
  if not is_number(value, finite=False) or not low <= value <= high:
    raise ValueError(f"{env}: {key} must be a number in [{low}, {high}], got {value!r}")
  return float(value)


class Environment(abc.ABC):
  """A deterministic multi-turn text environment with an oracle solver."""

  name: ClassVar[str]
  default_max_turns: ClassVar[int]
  # How the system prompt asks for an action; each game adds its own example.
  ANSWER_FORMAT = ("Think briefly if you like, then give exactly one action as "
                   "<answer>ACTION</answer>.")

  def __init__(self, *, max_turns: int | None = None, shaping: float = 0.0):
    self.max_turns = check_int(self.name, "max_turns", self.default_max_turns
                               if max_turns is None else max_turns, 1, 1000)
    self.shaping = check_float(self.name, "shaping", shaping, 0.0, 1.0)
    self._rng: random.Random | None = None
    self._turn = 0
    self._done = False
    self._success = False
    self._tried: set[tuple[Hashable, str]] = set()
    self._last_action: str | None = None

  # ---- public protocol -----------------------------------------------------------------

  @property
  @abc.abstractmethod
  def system_prompt(self) -> str:
    """The rules, the action format and an example; constant for a given configuration."""

  @abc.abstractmethod
  def action_space(self) -> list[str]:
    """Canonical texts of the well-formed actions in the current state (random policies)."""

  @property
  def done(self) -> bool:
    return self._done

  @property
  def success(self) -> bool:
    return self._success

  @property
  def turn(self) -> int:
    return self._turn

  def reset(self, seed: int) -> str:
    """Starts the episode of this seed and returns the first observation."""
    if not is_int(seed):
      raise ValueError(f"{self.name}: seed must be an integer, got {seed!r}")
    self._rng = random.Random(int(seed))
    self._turn = 0
    self._done = False
    self._success = False
    self._tried = set()
    self._last_action = None
    self._generate(self._rng)
    digest = hashlib.sha256(repr(self._instance()).encode()).hexdigest()[:16]
    self._instance_key = f"{self.name}:{digest}"
    return f"{self._render()}\n{self._turns_left_text()}"

  def step(self, action_text: Any) -> StepResult:
    """Plays one turn with the model's raw reply; see the module docstring for `info`."""
    if self._rng is None:
      raise RuntimeError(f"{self.name}: call reset(seed) before step()")
    if self._done:
      raise RuntimeError(f"{self.name}: the episode is over; call reset(seed) to start another")
    self._turn += 1
    state_before = self._state_key()
    action = self._read(action_text)
    if action is _GIVE_UP:
      outcome = Outcome("You gave up.", [Event.GAVE_UP.value], failed=True)
      action_key = "give up"
    elif action is None:
      outcome = Outcome(f'Invalid action "{parsing.shown(action_text)}". {self._format_hint()}',
                        [Event.INVALID_ACTION.value], executed=False)
      action_key = "invalid:" + parsing.shown(action_text, limit=200)
    else:
      outcome = self._apply(action)
      action_key = self._format(action)
    events = list(outcome.events)
    # A repeat: the previous turn's action again, now to no effect ("open drawer" twice), or
    # an action already taken from this very state (a retry, or a loop back to a position).
    repeated = ((state_before, action_key) in self._tried
                or (action_key == self._last_action and self._state_key() == state_before))
    if repeated and Event.REPEATED_ACTION.value not in events:
      events.append(Event.REPEATED_ACTION.value)
    self._tried.add((state_before, action_key))
    self._last_action = action_key

    self._success = outcome.success
    truncated = not outcome.success and not outcome.failed and self._turn >= self.max_turns
    self._done = outcome.success or outcome.failed or truncated
    if outcome.success and Event.SUCCESS.value not in events:
      events.append(Event.SUCCESS.value)
    reward = 1.0 if outcome.success else 0.0
    if self.shaping:
      net_progress = events.count(Event.PROGRESS.value) - events.count(Event.REGRESS.value)
      reward += self.shaping * net_progress

    lines = [outcome.feedback, self._render()]
    if outcome.success:
      lines.append("Success: goal reached.")
    elif outcome.failed:
      lines.append("Episode over: failure.")
    elif truncated:
      lines.append("Out of turns: episode over (failure).")
    else:
      lines.append(self._turns_left_text())
    info = {"success": outcome.success, "invalid": not outcome.executed, "events": events,
            "truncated": truncated, "failed": outcome.failed, "turn": self._turn,
            "action": None if action is None else action_key}
    return "\n".join(line for line in lines if line), reward, self._done, info

  def read_action(self, reply: Any) -> str | None:
    """The canonical text of the action a reply would play ("give up" included), or None."""
    action = self._read(reply)
    if action is None:
      return None
    return "give up" if action is _GIVE_UP else self._format(action)

  def instance_key(self) -> str:
    """'<env>:<16 hex digits>', a digest of the instance `reset` generated (stable across
    runs and processes: a SHA-256 of `repr(_instance())`)."""
    if self._rng is None:
      raise RuntimeError(f"{self.name}: call reset(seed) before instance_key()")
    return self._instance_key

  def oracle(self) -> list[str]:
    """Canonical action texts that reach the goal from the current state ([] once over)."""
    if self._rng is None:
      raise RuntimeError(f"{self.name}: call reset(seed) before oracle()")
    if self._done:
      return []
    return self._solve()

  # ---- hooks -----------------------------------------------------------------------------

  @abc.abstractmethod
  def _generate(self, rng: random.Random) -> None:
    """Builds a fresh, solvable episode from `rng` (the only source of chance)."""

  @abc.abstractmethod
  def _parse(self, candidate: str) -> Any | None:
    """A normalised candidate (see `parsing.normalize`) → this game's action, or None."""

  @abc.abstractmethod
  def _apply(self, action: Any) -> Outcome:
    """Plays a parsed action."""

  @abc.abstractmethod
  def _render(self) -> str:
    """The current state as compact text."""

  @abc.abstractmethod
  def _state_key(self) -> Hashable:
    """A hashable snapshot of everything an action can change."""

  @abc.abstractmethod
  def _instance(self) -> tuple:
    """What `_generate` drew, canonically (sorted; plain ints, strings and tuples): equal for
    two seeds exactly when they start the same game. `reset` reads it right after `_generate`."""

  @abc.abstractmethod
  def _solve(self) -> list[str]:
    """The oracle's plan from the current state (the episode is not over)."""

  def _format(self, action: Any) -> str:
    """The canonical text of a parsed action (it parses back to the same action)."""
    return str(action)

  def _format_hint(self) -> str:
    """One line reminding the agent of the action format."""
    return "Answer with one action as <answer>ACTION</answer>."

  # ---- helpers ---------------------------------------------------------------------------

  def _read(self, action_text: Any) -> Any | None:
    for candidate in parsing.candidates(action_text):
      if candidate in parsing.GIVE_UP_PHRASES:
        return _GIVE_UP
      action = self._parse(candidate)
      if action is not None:
        return action
    return None

  def _turns_left_text(self) -> str:
    return f"Turns left: {self.max_turns - self._turn}."
