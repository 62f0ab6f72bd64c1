"""BabyAI (minigrid 3.2.0's levels) as a text game, in the BabyAI-Text convention.

The agent sees its 7x7 egocentric view (walls block sight) and the mission. Following
BabyAI-Text (Carta et al., 2023, "Grounding LLMs in interactive environments with online RL"),
each visible thing is described by its offset from the agent in steps forward and left/right:

    Mission: put the grey ball next to the blue key.
    You see a grey ball 2 steps forward and 1 step left.
    You see a wall 3 steps forward.
    You carry nothing.

Actions, as texts: turn left, turn right, go forward, pick up, drop, toggle (BabyAI's `done`
action is not offered: no level needs it). The oracle is minigrid's `BabyAIBot`, run on a copy
of the current state until the mission is verified; the length of its plan is the distance that
progress / regress events measure (`rised_jax.envs.suite_events`). The bot remembers what it
has seen and which subgoals it holds, so one bot follows the whole episode: before each step it
observes the state and is told the action the agent took (the bot's own DAgger protocol,
`replan(action_taken)`), and a plan is that bot, copied with the world, played to the end. A bot
made afresh in mid-episode knows only the current view and loses its subgoals (holding the ball
it was to put somewhere, it forgets why): re-planned that way at every step, PutNextLocal seeds
looped or raised. Where the following bot cannot finish, a fresh one on the current state tries.

Difficulty: `level`, one BabyAI level name or several joined by commas (the seed picks one:
`levels[seed % len(levels)]`; minigrid's own generator then draws the instance from the seed).
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import io
from typing import Any, Hashable

from rised_jax.envs import base, suite_events, suites

ACTIONS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")
_ACTION_WORDS = {
    "left": "turn left", "turn to the left": "turn left", "rotate left": "turn left",
    "right": "turn right", "turn to the right": "turn right", "rotate right": "turn right",
    "forward": "go forward", "move forward": "go forward", "go ahead": "go forward",
    "step forward": "go forward", "walk forward": "go forward", "ahead": "go forward",
    "pickup": "pick up", "pick it up": "pick up", "pick": "pick up", "take": "pick up",
    "grab": "pick up", "put down": "drop", "drop it": "drop",
    "open": "toggle", "toggle it": "toggle", "open door": "toggle", "open the door": "toggle",
    "unlock": "toggle",
}
DEFAULT_LEVEL = "GoToLocal,PickupLoc,PutNextLocal,OpenDoor,UnlockPickup"
_WALL, _UNSEEN, _EMPTY = "wall", "unseen", "empty"
_DOOR_STATES = {0: "open", 1: "closed", 2: "locked"}
# Imported with the module, so that naming "babyai" without the extra fails at config validation.
gym = suites.require("gymnasium", "babyai", "babyai")
suites.require("minigrid", "babyai", "babyai")   # registers the BabyAI-* ids


def _steps(n: int, direction: str) -> str:
  return f"{n} step{'s' if n != 1 else ''} {direction}"


def describe_view(image: Any, carrying: Any, mission: str) -> str:
  """The BabyAI-Text rendering of one egocentric observation.

  image: [V, V, 3] minigrid encoding (object, colour, state) indexed [x, y], the agent at
  (V // 2, V - 1) facing y = 0. Objects are listed nearest first; walls only straight ahead,
  left and right (the nearest wall in each of those lines), as BabyAI-Text does.
  """
  from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT  # pylint: disable=import-outside-toplevel
  size = image.shape[0]
  ax, ay = size // 2, size - 1
  things = []
  for x in range(size):
    for y in range(size):
      kind = IDX_TO_OBJECT[int(image[x, y, 0])]
      if (x, y) == (ax, ay) or kind in (_UNSEEN, _EMPTY, _WALL, "agent"):
        continue
      forward, lateral = ay - y, x - ax
      name = f"{IDX_TO_COLOR[int(image[x, y, 1])]} {kind}"
      if kind == "door":
        name = f"{_DOOR_STATES.get(int(image[x, y, 2]), 'closed')} {name}"
      things.append((forward + abs(lateral), forward, lateral, name))
  walls = []
  for label, cells in (("forward", [(ax, ay - d) for d in range(1, size)]),
                       ("left", [(ax - d, ay) for d in range(1, ax + 1)]),
                       ("right", [(ax + d, ay) for d in range(1, size - ax)])):
    for d, (x, y) in enumerate(cells, start=1):
      kind = IDX_TO_OBJECT[int(image[x, y, 0])]
      if kind == _WALL:
        walls.append(f"You see a wall {_steps(d, label)}.")
      if kind != _EMPTY:
        break
  lines = [f"Mission: {mission}."]
  for _, forward, lateral, name in sorted(things):
    parts = []
    if forward:
      parts.append(_steps(forward, "forward"))
    if lateral:
      parts.append(_steps(abs(lateral), "right" if lateral > 0 else "left"))
    lines.append(f"You see a {name} {' and '.join(parts)}.")
  lines += walls
  held = "nothing" if carrying is None else f"a {carrying.color} {carrying.type}"
  lines.append(f"You carry {held}.")
  return "\n".join(lines)


class BabyAI(suites.SuiteEnvironment):
  """A BabyAI level seen through the BabyAI-Text description."""

  name = "babyai"
  default_max_turns = 64

  def __init__(self, *, level: str = DEFAULT_LEVEL, max_turns: int | None = None,
               shaping: float = 0.0):
    super().__init__(max_turns=max_turns, shaping=shaping)
    if not isinstance(level, str) or not level.strip():
      raise ValueError(f"babyai: level must be a level name such as 'GoToLocal' (or "
                       f"several joined by commas), got {level!r}")
    self.levels = [_level_id(part.strip()) for part in level.split(",")]
    unknown = [lv for lv in self.levels if lv not in gym.registry]
    if unknown:
      known = sorted(k[len("BabyAI-"):-len("-v0")] for k in gym.registry
                     if k.startswith("BabyAI-") and k.endswith("-v0"))
      raise ValueError(f"babyai: unknown level(s) {unknown}; minigrid has {known}")
    self._envs: dict[str, Any] = {}

  @property
  def system_prompt(self) -> str:
    return (
        "You are an agent in a grid world (BabyAI). You see the cells in front of and beside "
        "you, described as steps forward and steps left or right of you; walls hide what is "
        "behind them. Complete the mission. Each turn choose one action: turn left, turn right, "
        "go forward, pick up (the object right in front of you), drop (what you carry, in "
        "front of you), toggle (open the door or box in front of you; a locked door needs the "
        f"key of its colour). {self.ANSWER_FORMAT} Example: <answer>go forward</answer>")

  def action_space(self) -> list[str]:
    return list(ACTIONS)

  def _generate(self, rng: Any) -> None:
    del rng   # minigrid draws the instance from the seed itself
    level = self.levels[self._seed % len(self.levels)]
    if level not in self._envs:
      self._envs[level] = gym.make(level)
    with contextlib.redirect_stdout(io.StringIO()):   # minigrid prints its rejected samples
      self._envs[level].reset(seed=self._seed)
    self.level = level
    self.world = self._envs[level].unwrapped
    self._bot, self._action_taken = _new_bot(self.world), None
    plan = self._bot_plan()
    self._start_plan = None if plan is None else tuple(plan)
    self._distance = None if plan is None else len(plan)

  def _parse(self, candidate: str) -> str | None:
    if candidate in ACTIONS:
      return candidate
    return _ACTION_WORDS.get(candidate)

  def _apply(self, action: str) -> base.Outcome:
    before = self._state_key()
    self._follow()
    _, reward, terminated, truncated, _ = self.world.step(ACTIONS.index(action))
    self._action_taken = ACTIONS.index(action)
    won = bool(terminated and reward > 0)
    lost = bool(terminated and not won)
    distance = None if terminated else self._plan_length()
    changed = self._state_key() != before
    events = suite_events.step_events(
        rejected=False, changed=changed, failed=lost,
        distance_before=self._distance, distance_after=0 if won else distance)
    self._distance = distance
    feedback = f"You {action}." if changed else f"You {action}: nothing happens."
    return base.Outcome(feedback, events, success=won, failed=lost or bool(truncated and not won))

  def _render(self) -> str:
    return describe_view(self.world.gen_obs()["image"], self.world.carrying, self.world.mission)

  def _state_key(self) -> Hashable:
    carrying = self.world.carrying
    held = None if carrying is None else (carrying.type, carrying.color)
    return (self.world.grid.encode().tobytes(), tuple(self.world.agent_pos),
            int(self.world.agent_dir), held)

  def _instance(self) -> tuple:
    grid = hashlib.sha256(self.world.grid.encode().tobytes()).hexdigest()
    return (self.level, self.world.mission, grid, tuple(int(v) for v in self.world.agent_pos),
            int(self.world.agent_dir))

  def _opening_plan(self) -> tuple[str, ...] | None:
    return self._start_plan   # None where the bot does not win: the key is the view alone

  def _solve(self) -> list[str]:
    plan = self._bot_plan()
    if plan is None:
      raise RuntimeError(f"babyai: the BabyAI bot does not solve {self.level} seed {self._seed} "
                         f"from turn {self.turn} within the level's "
                         f"{self.world.max_steps - self.world.step_count} steps left")
    return plan

  def _follow(self) -> None:
    """Shows the episode's bot the state before this step and the action taken before it;
    a bot that cannot follow (it asserts on states it cannot plan) is dropped."""
    if self._bot is None:
      return
    try:
      self._bot.replan(self._action_taken)
    except Exception:  # pylint: disable=broad-except  # its asserts: no plan from here on
      self._bot = None

  def _bot_plan(self) -> list[str] | None:
    """The bot's actions from the current state, played on a copy; None if it does not win.
    The episode's own bot first (its memory and subgoals), else a bot made on this state."""
    if self._bot is not None:
      world, bot = copy.deepcopy((self.world, self._bot))   # the copy's bot plays the copy
      plan = _play(world, bot, self._action_taken)
      if plan is not None:
        return plan
    world = copy.deepcopy(self.world)
    return _play(world, _new_bot(world), None)

  def _plan_length(self) -> int | None:
    plan = self._bot_plan()
    return None if plan is None else len(plan)

  def _format_hint(self) -> str:
    return ("Valid actions: turn left, turn right, go forward, pick up, drop, toggle, e.g. "
            "<answer>go forward</answer>.")


def _new_bot(world: Any) -> Any:
  from minigrid.utils.baby_ai_bot import BabyAIBot  # pylint: disable=import-outside-toplevel
  try:
    return BabyAIBot(world)
  except Exception:  # pylint: disable=broad-except  # an instruction it has no plan for
    return None


def _play(world: Any, bot: Any, action_taken: int | None) -> list[str] | None:
  """`bot`'s actions on `world` (which it plays) until the mission ends; None unless won."""
  if bot is None:
    return None
  plan = []
  try:
    for _ in range(world.max_steps - world.step_count):
      action = int(bot.replan(action_taken))
      action_taken = None   # from here on the bot's own suggestion is what is taken
      if action >= len(ACTIONS):   # `done`: the bot believes the mission complete
        return None
      plan.append(ACTIONS[action])
      _, reward, terminated, truncated, _ = world.step(action)
      if terminated or truncated:
        return plan if terminated and reward > 0 else None
  except Exception:  # pylint: disable=broad-except  # the bot asserts on states it cannot plan
    return None
  return None


def _level_id(level: str) -> str:
  """'GoToLocal' or 'BabyAI-GoToLocal-v0' → the gymnasium id."""
  if level.startswith("BabyAI-"):
    return level
  return f"BabyAI-{level}-v0"
