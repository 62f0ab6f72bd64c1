"""Maze: find the exit of a random perfect maze from an egocentric view.

The maze is a grid of cells carved by a randomised depth-first search (one path between any
two cells). The agent has a position and a heading and sees only its surroundings, in its own
frame: "Ahead: wall. Left: open. …" plus where the exit lies relative to it ("3 ahead, 1 to
your right", straight-line offsets, not the path). Actions: forward, turn left, turn right.
The oracle is a breadth-first search over (cell, heading) states; its distance is what
progress / regress events measure.
"""
from __future__ import annotations

import collections
import random
import re
from typing import Hashable

from rised_jax.envs import base
from rised_jax.types import Event

Cell = tuple[int, int]
State = tuple[Cell, int]                        # (cell, heading)
HEADINGS = ((-1, 0), (0, 1), (1, 0), (0, -1))   # north, east, south, west: clockwise
ACTIONS = ("forward", "turn left", "turn right")
_ACTION_WORDS = {
    "forward": "forward", "forwards": "forward", "ahead": "forward", "straight": "forward",
    "straight ahead": "forward", "f": "forward", "fwd": "forward",
    "left": "turn left", "l": "turn left",
    "right": "turn right", "r": "turn right",
}
_VERB_RE = re.compile(r"^(?:go|move|walk|step|turn|rotate|face|head)(?: to the| to)?\s+")
_MAX_GENERATION_TRIES = 500


def carve(width: int, height: int, rng: random.Random) -> dict[Cell, set[int]]:
  """A perfect maze: for each cell, the headings in which a passage leaves it."""
  passages: dict[Cell, set[int]] = {(r, c): set() for r in range(height) for c in range(width)}
  start = (rng.randrange(height), rng.randrange(width))
  visited, stack = {start}, [start]
  while stack:
    row, col = stack[-1]
    options = [(h, (row + dr, col + dc)) for h, (dr, dc) in enumerate(HEADINGS)
               if (row + dr, col + dc) in passages and (row + dr, col + dc) not in visited]
    if not options:
      stack.pop()
      continue
    heading, nxt = rng.choice(options)
    passages[(row, col)].add(heading)
    passages[nxt].add((heading + 2) % 4)
    visited.add(nxt)
    stack.append(nxt)
  return passages


def step_state(state: State, action: str, passages: dict[Cell, set[int]]) -> State:
  """The state after an action (unchanged when walking into a wall)."""
  (row, col), heading = state
  if action == "turn left":
    return (row, col), (heading + 3) % 4
  if action == "turn right":
    return (row, col), (heading + 1) % 4
  if heading not in passages[(row, col)]:
    return state
  dr, dc = HEADINGS[heading]
  return (row + dr, col + dc), heading


def shortest_actions(start: State, goal: Cell, passages: dict[Cell, set[int]]) -> list[str]:
  """A shortest action sequence from `start` to any state in the goal cell."""
  parent: dict[State, tuple[State, str] | None] = {start: None}
  queue = collections.deque([start])
  while queue:
    state = queue.popleft()
    if state[0] == goal:
      actions = []
      while parent[state] is not None:
        state, action = parent[state]
        actions.append(action)
      return actions[::-1]
    for action in ACTIONS:
      nxt = step_state(state, action, passages)
      if nxt not in parent:
        parent[nxt] = (state, action)
        queue.append(nxt)
  raise AssertionError("a perfect maze connects every cell")


class Maze(base.Environment):
  """Reach the exit of a maze seeing only the walls around you."""

  name = "maze"
  default_max_turns = 14
  partial_view = True   # an egocentric view: many layouts start alike

  def __init__(self, *, width: int = 3, height: int = 3, min_distance: int = 3,
               max_turns: int | None = None, shaping: float = 0.0):
    super().__init__(max_turns=max_turns, shaping=shaping)
    self.width = base.check_int(self.name, "width", width, 2, 12)
    self.height = base.check_int(self.name, "height", height, 2, 12)
    self.min_distance = base.check_int(self.name, "min_distance", min_distance, 1,
                                       min(self.width * self.height - 1, self.max_turns))

  @property
  def system_prompt(self) -> str:
    return (
        "You are in a maze and see only the walls next to you, from your own point of view. "
        "Each turn choose: forward (one cell ahead, if there is no wall), turn left or turn "
        "right (turn on the spot). The observation tells you where the exit is relative to you. "
        f"Goal: reach the exit within {self.max_turns} actions. {self.ANSWER_FORMAT} "
        "Example: <answer>turn left</answer>")

  def action_space(self) -> list[str]:
    return list(ACTIONS)

  def _generate(self, rng: random.Random) -> None:
    cells = [(r, c) for r in range(self.height) for c in range(self.width)]
    for _ in range(_MAX_GENERATION_TRIES):
      passages = carve(self.width, self.height, rng)
      start, goal = rng.sample(cells, 2)
      state = (start, rng.randrange(4))
      if (_cell_distance(start, goal, passages) >= self.min_distance
          and len(shortest_actions(state, goal, passages)) <= self.max_turns):
        self.passages, self.goal, self.state = passages, goal, state
        self.start_state = state
        return
    raise RuntimeError(f"maze: no start/exit pair at least {self.min_distance} cells apart and "
                       f"at most {self.max_turns} actions apart in {_MAX_GENERATION_TRIES} tries; "
                       "lower min_distance or raise max_turns")

  def _parse(self, candidate: str) -> str | None:
    if candidate in ACTIONS:
      return candidate
    return _ACTION_WORDS.get(_VERB_RE.sub("", candidate).strip())

  def _apply(self, action: str) -> base.Outcome:
    nxt = step_state(self.state, action, self.passages)
    if nxt == self.state:
      return base.Outcome("A wall blocks the way: you stay where you are.", [Event.NO_EFFECT.value])
    before = len(shortest_actions(self.state, self.goal, self.passages))
    self.state = nxt
    after = len(shortest_actions(self.state, self.goal, self.passages))
    events = [Event.PROGRESS.value] if after < before else (
        [Event.REGRESS.value] if after > before else [])
    feedback = "You move forward." if action == "forward" else f"You {action}."
    return base.Outcome(feedback, events, success=nxt[0] == self.goal)

  def _render(self) -> str:
    (row, col), heading = self.state
    if (row, col) == self.goal:
      return "You are at the exit."
    sides = (("Ahead", 0), ("Left", 3), ("Right", 1), ("Behind", 2))
    exits = self.passages[(row, col)]
    view = ". ".join(f"{name}: {'open' if (heading + turn) % 4 in exits else 'wall'}"
                     for name, turn in sides)
    d_row, d_col = self.goal[0] - row, self.goal[1] - col
    f_row, f_col = HEADINGS[heading]
    r_row, r_col = HEADINGS[(heading + 1) % 4]
    ahead = d_row * f_row + d_col * f_col
    right = d_row * r_row + d_col * r_col
    parts = []
    if ahead:
      parts.append(f"{abs(ahead)} {'ahead' if ahead > 0 else 'behind'}")
    if right:
      parts.append(f"{abs(right)} to your {'right' if right > 0 else 'left'}")
    return f"{view}. The exit is {' and '.join(parts)} (as the crow flies)."

  def _state_key(self) -> Hashable:
    return self.state

  def _instance(self) -> tuple:
    passages = tuple(sorted((cell, tuple(sorted(exits))) for cell, exits in self.passages.items()))
    return (self.width, self.height, passages, self.goal, self.start_state)

  def _solve(self) -> list[str]:
    return shortest_actions(self.state, self.goal, self.passages)

  def _format_hint(self) -> str:
    return "Valid actions: forward, turn left, turn right, e.g. <answer>forward</answer>."


def _cell_distance(start: Cell, goal: Cell, passages: dict[Cell, set[int]]) -> int:
  """Cells walked from start to goal along the maze."""
  dist = {start: 0}
  queue = collections.deque([start])
  while queue:
    cell = queue.popleft()
    for heading in passages[cell]:
      dr, dc = HEADINGS[heading]
      nxt = (cell[0] + dr, cell[1] + dc)
      if nxt not in dist:
        dist[nxt] = dist[cell] + 1
        queue.append(nxt)
  return dist[goal]
