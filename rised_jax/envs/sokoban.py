"""Sokoban: push every box onto a target.

Rooms are generated backwards: boxes start on their targets and a random walk of the player
pulls them away, so every puzzle is solvable by construction (each reverse pull is undone by
a forward push). The oracle is a breadth-first search over (player, boxes) states; the same
search decides, after a push, whether the puzzle can still be solved (a box in a dead corner
is the common case) and ends the episode as an irreversible failure when it cannot.
"""
from __future__ import annotations

import collections
import random
from typing import Hashable

from rised_jax.envs import base, parsing
from rised_jax.types import Event

Cell = tuple[int, int]
MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_MAX_GENERATION_TRIES = 200


def solve(walls: frozenset[Cell], targets: frozenset[Cell], player: Cell,
          boxes: frozenset[Cell], max_states: int = 200_000) -> list[str] | None:
  """A shortest move sequence that puts every box on a target, or None if there is none."""
  start = (player, boxes)
  parent: dict[tuple[Cell, frozenset[Cell]], tuple | None] = {start: None}
  queue = collections.deque([start])
  while queue:
    state = queue.popleft()
    if state[1] <= targets:
      plan = []
      while parent[state] is not None:
        state, move = parent[state]
        plan.append(move)
      return plan[::-1]
    (row, col), state_boxes = state
    for move, (dr, dc) in MOVES.items():
      nxt = (row + dr, col + dc)
      if nxt in walls:
        continue
      new_boxes = state_boxes
      if nxt in state_boxes:
        beyond = (nxt[0] + dr, nxt[1] + dc)
        if beyond in walls or beyond in state_boxes:
          continue
        new_boxes = (state_boxes - {nxt}) | {beyond}
      new_state = (nxt, new_boxes)
      if new_state not in parent:
        parent[new_state] = (state, move)
        queue.append(new_state)
    if len(parent) > max_states:
      raise RuntimeError(f"sokoban: search exceeded {max_states} states; use a smaller room")
  return None


def in_dead_corner(cell: Cell, walls: frozenset[Cell]) -> bool:
  """A box here can never move again: a wall above or below AND a wall left or right."""
  row, col = cell
  vertical = (row - 1, col) in walls or (row + 1, col) in walls
  horizontal = (row, col - 1) in walls or (row, col + 1) in walls
  return vertical and horizontal


class Sokoban(base.Environment):
  """Push boxes onto targets in a small walled room."""

  name = "sokoban"
  default_max_turns = 12

  def __init__(self, *, width: int = 6, height: int = 6, boxes: int = 1, walls: int = 1,
               min_moves: int = 4, max_moves: int = 8, max_turns: int | None = None,
               shaping: float = 0.0):
    super().__init__(max_turns=max_turns, shaping=shaping)
    self.width = base.check_int(self.name, "width", width, 4, 10)
    self.height = base.check_int(self.name, "height", height, 4, 10)
    interior = (self.width - 2) * (self.height - 2)
    self.num_boxes = base.check_int(self.name, "boxes", boxes, 1, 3)
    self.num_walls = base.check_int(self.name, "walls", walls, 0, interior // 3)
    self.min_moves = base.check_int(self.name, "min_moves", min_moves, 1, self.max_turns)
    self.max_moves = base.check_int(self.name, "max_moves", max_moves, self.min_moves,
                                    self.max_turns)
    if interior - self.num_walls < 2 * self.num_boxes + 2:
      raise ValueError(f"sokoban: a {self.width}x{self.height} room with {self.num_walls} inner "
                       f"walls has no space for {self.num_boxes} boxes; use fewer boxes or walls")

  @property
  def system_prompt(self) -> str:
    return (
        "You play Sokoban on a grid. Symbols: # wall, _ floor, . target, $ box, * box on a "
        "target, @ you, + you on a target. Rows are numbered from the top starting at 1, "
        "columns from the left starting at 1. Each turn move up, down, left or right. Walking "
        "into a box pushes it one cell if the cell behind it is free; boxes cannot be pulled. "
        "A box pushed into a corner that is not a target is stuck and the game is lost. Goal: "
        f"put every box on a target within {self.max_turns} moves. {self.ANSWER_FORMAT} "
        "Example: <answer>left</answer>")

  def action_space(self) -> list[str]:
    return list(MOVES)

  # ---- episode ---------------------------------------------------------------------------

  def _generate(self, rng: random.Random) -> None:
    for _ in range(_MAX_GENERATION_TRIES):
      if self._try_generate(rng):
        return
    raise RuntimeError(f"sokoban: no puzzle with {self.min_moves}..{self.max_moves} moves found in "
                       f"{_MAX_GENERATION_TRIES} tries; widen min_moves/max_moves")

  def _try_generate(self, rng: random.Random) -> bool:
    border = {(r, c) for r in range(self.height) for c in range(self.width)
              if r in (0, self.height - 1) or c in (0, self.width - 1)}
    interior = [(r, c) for r in range(1, self.height - 1) for c in range(1, self.width - 1)]
    inner_walls = set(rng.sample(interior, self.num_walls))
    floor = [cell for cell in interior if cell not in inner_walls]
    if not _connected(floor):
      return False
    walls = frozenset(border | inner_walls)
    placed = rng.sample(floor, self.num_boxes + 1)
    targets = frozenset(placed[:-1])
    boxes, player = set(targets), placed[-1]
    # Reverse play: walk randomly; stepping away from an adjacent box pulls it along.
    for _ in range(self.max_moves * 4):
      dr, dc = MOVES[rng.choice(list(MOVES))]
      nxt = (player[0] + dr, player[1] + dc)
      if nxt in walls or nxt in boxes:
        continue
      behind = (player[0] - dr, player[1] - dc)
      if behind in boxes and rng.random() < 0.7:
        boxes.remove(behind)
        boxes.add(player)
      player = nxt
    plan = solve(walls, targets, player, frozenset(boxes))
    if plan is None or not self.min_moves <= len(plan) <= self.max_moves:
      return False
    self.walls, self.targets = walls, targets
    self.player, self.boxes = player, frozenset(boxes)
    self.start = (player, tuple(sorted(boxes)))
    return True

  def _parse(self, candidate: str) -> str | None:
    return parsing.parse_direction(candidate)

  def _apply(self, action: str) -> base.Outcome:
    dr, dc = MOVES[action]
    nxt = (self.player[0] + dr, self.player[1] + dc)
    if nxt in self.walls:
      return base.Outcome(f"You bump into a wall ({action}): nothing moves.",
                          [Event.NO_EFFECT.value])
    if nxt not in self.boxes:
      self.player = nxt
      return base.Outcome(f"You move {action}.")
    beyond = (nxt[0] + dr, nxt[1] + dc)
    if beyond in self.walls or beyond in self.boxes:
      blocker = "wall" if beyond in self.walls else "box"
      return base.Outcome(f"The box cannot move {action}: a {blocker} is behind it.",
                          [Event.NO_EFFECT.value])
    self.boxes = (self.boxes - {nxt}) | {beyond}
    self.player = nxt
    events, feedback = [], f"You push the box {action}."
    if beyond in self.targets and nxt not in self.targets:
      events.append(Event.PROGRESS.value)
      feedback += " It is on a target."
    elif nxt in self.targets and beyond not in self.targets:
      events.append(Event.REGRESS.value)
      feedback += " It left its target."
    if self.boxes <= self.targets:
      return base.Outcome(feedback, events, success=True)
    if beyond not in self.targets:
      if in_dead_corner(beyond, self.walls):
        return base.Outcome(feedback + " It is stuck in a corner: the puzzle can no longer be "
                            "solved.", events + [Event.IRREVERSIBLE_FAILURE.value], failed=True)
      if solve(self.walls, self.targets, self.player, self.boxes) is None:
        return base.Outcome(feedback + " The boxes are stuck: the puzzle can no longer be "
                            "solved.", events + [Event.IRREVERSIBLE_FAILURE.value], failed=True)
    return base.Outcome(feedback, events)

  def _render(self) -> str:
    rows = []
    for r in range(self.height):
      row = []
      for c in range(self.width):
        cell = (r, c)
        if cell in self.walls:
          row.append("#")
        elif cell == self.player:
          row.append("+" if cell in self.targets else "@")
        elif cell in self.boxes:
          row.append("*" if cell in self.targets else "$")
        else:
          row.append("." if cell in self.targets else "_")
      rows.append("".join(row))
    placed = len(self.boxes & self.targets)
    return ("\n".join(rows) + f"\nYou are at row {self.player[0] + 1}, column "
            f"{self.player[1] + 1}. Boxes on targets: {placed}/{len(self.targets)}.")

  def _state_key(self) -> Hashable:
    return (self.player, self.boxes)

  def _instance(self) -> tuple:
    return (self.width, self.height, tuple(sorted(self.walls)), tuple(sorted(self.targets)),
            self.start)

  def _solve(self) -> list[str]:
    return solve(self.walls, self.targets, self.player, self.boxes) or []

  def _format_hint(self) -> str:
    return "Valid actions: up, down, left, right, e.g. <answer>up</answer>."


def _connected(cells: list[Cell]) -> bool:
  """Whether the cells form one 4-connected region."""
  cell_set = set(cells)
  seen = {cells[0]}
  stack = [cells[0]]
  while stack:
    row, col = stack.pop()
    for dr, dc in MOVES.values():
      nxt = (row + dr, col + dc)
      if nxt in cell_set and nxt not in seen:
        seen.add(nxt)
        stack.append(nxt)
  return len(seen) == len(cell_set)
