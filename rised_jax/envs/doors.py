"""Doors: the one-move plug-in game of the mechanism suite (experiments/configs/mechanisms_rised.py).

The observation names the door that hides the key ("A note: the key is behind the old small
red door."); opening it wins, any other door loses. Each instance is (door, two painted
details), so held-out instances differ in what the agent sees and each door wins on about 1 /
`doors` of them: the best constant policy wins about that share (`best_constant_pass_rate`).

What each RISED mechanism gets to act on, by construction:

  teacher    opening the door the note names reports the event `opens_named_door`, whose
             rule-judge tag `event.opens_named_door` reads "Opens the door the note names"
             (VOCABULARY): a general positive rubric, true of every won rollout of every
             instance, so the teacher reads it from the group, the pool or the memory (the
             default chain) and informs all-failure groups too, where GRPO has no signal. The
             warm-start (rised_jax.warmstart --game doors) teaches the model to follow that
             line (copy the note's door) and, without it, to keep its prior: the example's
             door 9 times in 10 (`--prior-share`, `--example-rate 0.9`), else a random one.
             Reward is sparse: off the example's door a rollout wins about 1/40 of the time,
             so 0.975^4 = 0.90 of such groups of G = 4 are all-failure (the pre-check
             measures 0.75 over all held-out instances).
  guidance   with `trap=True` the black door is also a door, never the winner, and the
             system prompt's example opens it: a policy that copies the example opens it, a
             recurring failure (the warm-start's prior opens the example's door 9 times in
             10) whose negative tag `event.opens_with_black` reads "Opens with black" (hint:
             "Avoid: Opens with black.").
  selection  the two games (aliases in the suite config) are learned at different rates
             (the example's door wins a quarter of `doors` and none of `trapdoors`), so which
             groups a batch holds matters.

One word per door and per detail, all in the system prompt or the observation, so the tiny
model's word-level tokenizer has each as one token.
"""
from __future__ import annotations

import random
from typing import Sequence

from rised_jax.envs import parsing

DOORS = ("red", "blue", "green", "white", "brown", "grey", "pink", "gold")
TRAP = "black"
SIZES = ("old", "new", "small", "large")
SHAPES = ("round", "square", "tall", "wide")
EVENT = "opens_with_{door}"
NAMED = "opens_named_door"   # the event of the winning move (module docstring, "teacher")
RULE = "Opens the door the note names"
PATH = "rised_jax.envs.doors:Doors"
# The mechanism suite's two games (aliases of Doors in experiments/configs/mechanisms_rised.py,
# and the warm-start's `--game doors` prompts): 4 doors; the same 4 and the trap. Four, not
# eight: with 8 doors the 2-layer tiny model had not learned, after 550 warm-start steps, to
# copy the exact door a rubric line names (it told only which half of the doors it was in).
SUITE_GAMES = {"doors": dict(doors=4), "trapdoors": dict(doors=4, trap=True)}


# The rule judge's vocabulary for Doors (`judge.vocabulary="rised_jax.envs.doors:VOCABULARY"`):
# the two syntax tags of agentic_v1, the general positive of a won rollout (RULE) and the
# trap's negative. No tag per door: "Opens with red" is true of one instance only, so a
# teacher reading it from the pool or the memory would be told a false door.
VOCABULARY = [
    {"id": "valid_syntax", "polarity": "+",
     "description": "Uses valid action syntax on every turn"},
    {"id": "malformed_action", "polarity": "-",
     "description": "Issues invalid or malformed actions"},
    {"id": "event." + NAMED, "polarity": "+", "description": RULE},
    {"id": "event." + EVENT.format(door=TRAP), "polarity": "-",
     "description": f"Opens with {TRAP}"},
]


class Doors:
  """One move: open the door the note names (module docstring).

  doors: how many of DOORS are in play (2..8); trap: the black door is in play too (never
  the winner) and the system prompt's example opens it.
  """

  max_turns = 1

  def __init__(self, *, doors: int = len(DOORS), trap: bool = False):
    if not (isinstance(doors, int) and not isinstance(doors, bool) and 2 <= doors <= len(DOORS)):
      raise ValueError(f"doors: doors must be an integer in [2, {len(DOORS)}], got {doors!r}")
    if not isinstance(trap, bool):
      raise ValueError(f"doors: trap must be true or false, got {trap!r}")
    self.doors = DOORS[:doors]
    self.trap = trap
    self.instance: tuple[str, str, str] | None = None

  @property
  def system_prompt(self) -> str:
    example = TRAP if self.trap else self.doors[0]
    return (f"Doors: {' '.join(self.action_space())}. A note names the door that hides the "
            f"key: open it. Example: <answer>{example}</answer>")

  def reset(self, seed: int) -> str:
    rng = random.Random(seed)
    self.instance = (rng.choice(self.doors), rng.choice(SIZES), rng.choice(SHAPES))
    door, size, shape = self.instance
    return f"A note: the key is behind the {size} {shape} {door} door."

  def step(self, reply):
    if self.instance is None:
      raise RuntimeError("doors: call reset(seed) before step()")
    opened = next((c for c in parsing.candidates(reply) if c in self.action_space()), None)
    success = opened == self.instance[0]
    observation = "The key is yours." if success else "No key here: the game is lost."
    events = ([] if opened is None else [EVENT.format(door=opened)]) + ([NAMED] if success else [])
    info = {"success": success, "invalid": opened is None, "events": events, "truncated": False}
    return observation, float(success), True, info

  def instance_key(self) -> str:
    if self.instance is None:
      raise RuntimeError("doors: call reset(seed) before instance_key()")
    return f"doors:{len(self.doors)}:{int(self.trap)}:" + ":".join(self.instance)

  def action_space(self) -> list[str]:
    return [*self.doors, TRAP] if self.trap else list(self.doors)


def winning_door(env: Doors, seed: int) -> str:
  """The door that wins instance `seed` (what the note names)."""
  env.reset(seed)
  return env.instance[0]


def best_constant_pass_rate(env: Doors, seeds: Sequence[int]) -> tuple[float, str]:
  """(pass rate, door) of the best constant policy, one door for every instance, on `seeds`:
  the commonest winning door's share, which a learning claim must beat."""
  winners = [winning_door(env, s) for s in seeds]
  door = max(env.action_space(), key=winners.count)
  return winners.count(door) / len(winners), door
