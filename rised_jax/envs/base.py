"""The environment protocol, and the base class of the built-in text environments.

`EnvironmentProtocol` is the public contract: any class with these members is an environment
(it need not subclass anything here). Exactly these are called by rised_jax:

  system_prompt          str (class attribute or property): the rules, the action format,
                         an example; constant for a given configuration. The agent loop puts
                         it in every rollout prompt, the trainer in every training row.
  reset(seed) -> str     starts the episode of `seed` (an int) and returns the first
                         observation. Called again on the same instance for later episodes:
                         it must reinitialise every piece of state. Deterministic given the
                         seed (evaluation instances are chosen by seed).
  step(reply) -> (observation: str, reward: float, done: bool, info: dict)
                         plays one turn with the model's raw reply text (the environment
                         reads the action out of it). `info` must hold at least
                           success    bool       the goal is reached (counted when done)
                           invalid    bool       the action was not executed
                           events     list[str]  `rised_jax.types.Event` values of this step:
                                                 the rule-based judge tags rollouts from them
                                                 (an environment without signals gives [])
                           truncated  bool       the turn budget ran out: a failure
  instance_key() -> str  names the instance the last `reset` generated, as the agent sees it:
                         two seeds whose games the agent cannot tell apart (the same game, or
                         for a partial view the same first observation and winning plan) give
                         the same key. Training and evaluation sets are disjoint by this key,
                         and pass-rate intervals count its distinct values
                         (`rised_jax.evaluate`, `rised_jax.tasks`).
Optional members (used where present):
  instance_key_for(seed) -> str   the key `reset(seed)` would give, without resetting (an
                         environment whose reset is costly, e.g. a remote one; the task
                         stream and the evaluation set ask for many seeds).
  close()                releases what the instance holds (a server-side session); called when
                         the instance is discarded.
  action_space() -> list[str]     well-formed actions of the current state (random policies,
                         the tiny test model's vocabulary).
  oracle() -> list[str]  canonical actions that solve the episode from the current state
                         (tests, scripted baselines); never called during training.
Difficulty knobs are the constructor's keyword-only parameters: `envs.difficulty.NAME` in a
config passes them, and validation rejects any other key (and a missing required one), then
builds one instance with them before the model loads: the constructor checks the knobs' values
(raising ValueError naming the knob, the value and the range) and must stay cheap, leaving
sessions, servers and processes to the first `reset`.

An exception raised inside `reset` or `step` ends that episode as *errored* (the agent loop
leaves its group out of training and evaluation, counts it, and discards the instance); a
`step` result that breaks the shape above counts the same way.

The rest of this module is the shared base class of the built-in games, `Environment`:

    observation = env.reset(seed)
    observation, reward, done, info = env.step(reply_text)   # until done

`reply_text` is the model's raw reply: the action is read from `<answer>ACTION</answer>`
(see `parsing`). An unreadable or inadmissible action never raises: it costs a turn and the
observation says why. Besides the four required keys, the built-ins' `info` holds

    failed     bool       an irreversible failure ended the episode
    turn       int        turns used so far (this step included)
    action     str | None the canonical text of the executed action, None when unreadable

An episode ends on success, on an irreversible failure, or after `max_turns` turns (a failure,
reported with `truncated=True`). The reward is 1.0 on success and 0.0 otherwise; with
`shaping > 0` every step also earns `shaping * (#progress - #regress)`.

`read_action(reply)` tells which action a reply would play, without playing it.
Instance keys: `instance_key()` names the situation the last `reset` generated, what the
agent can tell apart. Where the first observation shows the whole game (FrozenLake's map,
Sokoban's room, Countdown's numbers and target) it is a digest of the game: two seeds that
generate the same layout / numbers and target give the same key. Where it shows only part
(`partial_view`: Maze's egocentric view, Household's closed containers and other rooms,
Wordle's secret, the suites) it is a digest of the first observation and the oracle's plan
from there, so that two layouts that look alike at the start and are won by the same actions
are one instance: an agent trained on one has been shown how to win the other. Training and
evaluation sets are disjoint by this key, not by seed, and pass-rate intervals count its
distinct values (`rised_jax.evaluate`, `rised_jax.tasks`). Chance that is
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
import inspect
import random
from typing import Any, ClassVar, Hashable, Protocol, runtime_checkable

from rised_jax.envs import parsing
from rised_jax.types import Event
from rised_jax.checks import is_int, is_number

StepResult = tuple[str, float, bool, dict[str, Any]]
_GIVE_UP = object()  # the parsed form of "give up": handled here for every environment

# What the agent loop reads from `step`'s info (the protocol's required keys).
REQUIRED_INFO_KEYS = ("success", "invalid", "events", "truncated")
REQUIRED_METHODS = ("reset", "step", "instance_key")
OPTIONAL_METHODS = ("instance_key_for", "close", "action_space", "oracle")


@runtime_checkable
class EnvironmentProtocol(Protocol):
  """The public environment contract (module docstring): what rised_jax calls on an
  environment. Optional members (`OPTIONAL_METHODS`) are not part of the static type."""

  @property
  def system_prompt(self) -> str: ...

  def reset(self, seed: int) -> str: ...

  def step(self, reply: str) -> StepResult: ...

  def instance_key(self) -> str: ...


def check_environment_class(cls: Any, name: str) -> None:
  """Raises ValueError naming `name` and the first protocol member `cls` lacks (checked on the
  class, before any instance exists: `system_prompt` must be a class attribute or property)."""
  where = name if not isinstance(cls, type) else f"{name} ({cls.__module__}.{cls.__qualname__})"
  if not isinstance(cls, type):
    raise ValueError(f"environment {where} is {type(cls).__name__} {cls!r:.80}; expected a class "
                     "implementing rised_jax.envs.base.EnvironmentProtocol")
  if inspect.isabstract(cls):
    raise ValueError(f"environment {where} does not implement the abstract method(s) "
                     f"{sorted(cls.__abstractmethods__)}")
  missing = [m for m in REQUIRED_METHODS if not callable(getattr(cls, m, None))]
  if not hasattr(cls, "system_prompt"):
    missing.append("system_prompt")
  if missing:
    raise ValueError(f"environment {where} lacks {missing} of rised_jax.envs.base."
                     "EnvironmentProtocol (required: system_prompt, reset(seed), step(reply), "
                     "instance_key())")
  for method in OPTIONAL_METHODS:
    if hasattr(cls, method) and not callable(getattr(cls, method)):
      raise ValueError(f"environment {where}: {method} must be a method, got "
                       f"{getattr(cls, method)!r:.80}")


def check_step_result(result: Any, env: str) -> StepResult:
  """`step`'s return value checked against the protocol; ValueError says what is wrong (the
  agent loop counts it as an environment error)."""
  if not isinstance(result, tuple) or len(result) != 4:
    raise ValueError(f"{env}: step returned {result!r:.120}; expected a tuple "
                     "(observation, reward, done, info)")
  observation, reward, done, info = result
  if not isinstance(observation, str):
    raise ValueError(f"{env}: step's observation is {type(observation).__name__}; expected str")
  if not is_number(reward):
    raise ValueError(f"{env}: step's reward is {reward!r}; expected a finite number")
  if not isinstance(info, dict):
    raise ValueError(f"{env}: step's info is {type(info).__name__}; expected a dict with keys "
                     f"{list(REQUIRED_INFO_KEYS)}")
  missing = [k for k in REQUIRED_INFO_KEYS if k not in info]
  if missing:
    raise ValueError(f"{env}: step's info lacks {missing}; the protocol requires "
                     f"{list(REQUIRED_INFO_KEYS)}")
  events = info["events"]
  if isinstance(events, str) or not isinstance(events, (list, tuple)) or not all(
      isinstance(e, str) for e in events):
    raise ValueError(f"{env}: step's info['events'] is {events!r:.120}; expected a list of "
                     "rised_jax.types.Event values (strings)")
  return observation, float(reward), bool(done), info


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


MAX_TURNS = 1000   # the largest turn budget an environment accepts


class Environment(abc.ABC):
  """A deterministic multi-turn text environment with an oracle solver."""

  name: ClassVar[str]
  default_max_turns: ClassVar[int]
  # The first observation hides part of the game (an egocentric view, closed containers, a
  # secret): two games the agent cannot tell apart from the start and that one plan solves
  # are one instance (module docstring, "Instance keys").
  partial_view: ClassVar[bool] = False
  # How the system prompt asks for an action; each game adds its own example.
  ANSWER_FORMAT = ("Think briefly if you like, then give exactly one action as "
                   "<answer>ACTION</answer>.")

  def __init__(self, *, max_turns: int | None = None, shaping: float = 0.0):
    self.max_turns = check_int(self.name, "max_turns", self.default_max_turns
                               if max_turns is None else max_turns, 1, MAX_TURNS)
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
    observation = self._first_observation()
    digest = hashlib.sha256(repr(self._situation(observation)).encode()).hexdigest()[:16]
    self._instance_key = f"{self.name}:{digest}"
    return observation

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
    """'<env>:<16 hex digits>', a digest of the situation `reset` generated (stable across
    runs and processes: a SHA-256 of `repr(_situation(first observation))`)."""
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

  def _first_observation(self) -> str:
    """What `reset` returns: the start state and the turn budget."""
    return f"{self._render()}\n{self._turns_left_text()}"

  def _situation(self, first_observation: str) -> Hashable:
    """What the instance key digests: the game itself (`_instance()`) where the first
    observation shows all of it; for a `partial_view` game, what the agent sees of it, the
    first observation and the oracle's plan from there (`_opening_plan`)."""
    if self.partial_view:
      return (first_observation, self._opening_plan())
    return self._instance()

  def _opening_plan(self) -> tuple[str, ...] | None:
    """The oracle's plan from the start state (right after `_generate`)."""
    return tuple(self._solve())

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
