"""FrozenLake: walk from the start to the goal across a frozen lake without falling into a hole.

Maps are random and checked solvable by breadth-first search. With `slip > 0` a move goes to
one of the two perpendicular directions with that probability (drawn from the episode's
seeded generator). Falling into a hole ends the episode (irreversible failure). The oracle is
the shortest path from the current cell; under slip it is only right until the next slip, so
it is meant to be called again after every step.
"""
from __future__ import annotations

import collections
import random
from typing import Hashable

from rised_jax.envs import base, parsing
from rised_jax.types import Event

Cell = tuple[int, int]
MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
PERPENDICULAR = {"up": ("left", "right"), "down": ("left", "right"),
                 "left": ("up", "down"), "right": ("up", "down")}
_MAX_GENERATION_TRIES = 500


def distances_to(goal: Cell, size: int, holes: frozenset[Cell]) -> dict[Cell, int]:
  """Moves from every safe cell to the goal (cells that cannot reach it are absent)."""
  dist = {goal: 0}
  queue = collections.deque([goal])
  while queue:
    row, col = queue.popleft()
    for dr, dc in MOVES.values():
      nxt = (row + dr, col + dc)
      if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in holes and nxt not in dist:
        dist[nxt] = dist[(row, col)] + 1
        queue.append(nxt)
  return dist


class FrozenLake(base.Environment):
  """Cross a square frozen lake from S to G, avoiding the holes H."""

  name = "frozenlake"
  default_max_turns = 10

  def __init__(self, *, size: int = 5, holes: int = 6, slip: float = 0.0,
               min_distance: int = 5, max_turns: int | None = None, shaping: float = 0.0):
    super().__init__(max_turns=max_turns, shaping=shaping)
    self.size = base.check_int(self.name, "size", size, 2, 12)
    self.num_holes = base.check_int(self.name, "holes", holes, 0, self.size * self.size // 2)
    self.slip = base.check_float(self.name, "slip", slip, 0.0, 0.9)
    self.min_distance = base.check_int(self.name, "min_distance", min_distance, 1,
                                       min(2 * (self.size - 1), self.max_turns))

  @property
  def system_prompt(self) -> str:
    slip = (f" The ice is slippery: with probability {self.slip:g} you slide to a side instead."
            if self.slip else "")
    return (
        "You walk on a frozen lake shown as a grid. Symbols: S start, F frozen (safe), H hole, "
        "G goal, P you. Rows are numbered from the top starting at 1, columns from the left "
        "starting at 1. Each turn move up, down, left or right; moving off the grid does "
        f"nothing. Falling into a hole loses the game.{slip} Goal: reach G within "
        f"{self.max_turns} moves. {self.ANSWER_FORMAT} Example: <answer>down</answer>")

  def action_space(self) -> list[str]:
    return list(MOVES)

  def _generate(self, rng: random.Random) -> None:
    cells = [(r, c) for r in range(self.size) for c in range(self.size)]
    for _ in range(_MAX_GENERATION_TRIES):
      start, goal, *holes = rng.sample(cells, self.num_holes + 2)
      dist = distances_to(goal, self.size, frozenset(holes))
      if self.min_distance <= dist.get(start, -1) <= self.max_turns:
        self.start, self.goal, self.holes = start, goal, frozenset(holes)
        self.dist, self.player = dist, start
        return
    raise RuntimeError(f"frozenlake: no {self.size}x{self.size} map with {self.num_holes} holes "
                       f"and a start-goal distance in [{self.min_distance}, {self.max_turns}] "
                       f"in {_MAX_GENERATION_TRIES} tries; use fewer holes or a lower min_distance")

  def _parse(self, candidate: str) -> str | None:
    return parsing.parse_direction(candidate)

  def _apply(self, action: str) -> base.Outcome:
    moved = action
    if self.slip and self._rng.random() < self.slip:
      moved = self._rng.choice(PERPENDICULAR[action])
    dr, dc = MOVES[moved]
    nxt = (self.player[0] + dr, self.player[1] + dc)
    feedback = f"You move {action}." if moved == action else f"You slip and slide {moved}."
    if not (0 <= nxt[0] < self.size and 0 <= nxt[1] < self.size):
      return base.Outcome(feedback[:-1] + " into the edge of the lake: you stay put.",
                          [Event.NO_EFFECT.value])
    before = self.dist[self.player]
    self.player = nxt
    if nxt in self.holes:
      return base.Outcome(feedback + " You fall into a hole.",
                          [Event.IRREVERSIBLE_FAILURE.value], failed=True)
    events = []
    if self.dist[nxt] < before:
      events.append(Event.PROGRESS.value)
    elif self.dist[nxt] > before:
      events.append(Event.REGRESS.value)
    return base.Outcome(feedback, events, success=nxt == self.goal)

  def _render(self) -> str:
    rows = []
    for r in range(self.size):
      row = []
      for c in range(self.size):
        cell = (r, c)
        if cell == self.player:
          row.append("P")
        elif cell in self.holes:
          row.append("H")
        elif cell == self.goal:
          row.append("G")
        elif cell == self.start:
          row.append("S")
        else:
          row.append("F")
      rows.append(" ".join(row))
    (row, col), (goal_row, goal_col) = self.player, self.goal
    return ("\n".join(rows) + f"\nYou are at row {row + 1}, column {col + 1}; "
            f"the goal is at row {goal_row + 1}, column {goal_col + 1}.")

  def _state_key(self) -> Hashable:
    return self.player

  def _instance(self) -> tuple:
    return (self.size, self.start, self.goal, tuple(sorted(self.holes)))

  def _solve(self) -> list[str]:
    plan, cell = [], self.player
    while cell != self.goal:
      for move, (dr, dc) in MOVES.items():
        nxt = (cell[0] + dr, cell[1] + dc)
        if self.dist.get(nxt, -1) == self.dist[cell] - 1:
          plan.append(move)
          cell = nxt
          break
    return plan

  def _format_hint(self) -> str:
    return "Valid actions: up, down, left, right, e.g. <answer>up</answer>."
