"""Environments for the learning test (tests/integration/test_learning.py), plugged in through
the public protocol (`rised_jax.envs.base`) under the alias `signpost` (tiny_cpu.py:signpost).

The task stream and the sampling seeds hash the environment's name; under the alias that name
is "signpost", not this module's path, so the module can move without redrawing the test's
seed streams (under its earlier name `tests.learning_envs:Signpost` the streams differed).

Signpost is the simplest game a policy can only win by reading its observation: one turn, the
observation names the winning move in words, and two painted details vary besides it, so
held-out instances are many and each move wins on about a quarter of them.
"""
from __future__ import annotations

import random

from rised_jax.envs import parsing

MOVES = ("up", "down", "left", "right")
COLOURS = ("red", "blue", "green", "black", "white", "brown", "grey", "pink")
SHAPES = ("round", "square", "long", "short", "flat", "tall", "thin", "wide")


class Signpost:
  """One move: the sign in the observation points the way out; any other move loses.

  An instance is (winning move, colour, shape): 4 * colours * shapes distinct games. Every
  word of the game is in the system prompt, so the tiny test model's word-level tokenizer
  (`rised_jax.model.tiny`, built from the prompt) has each as one known token.
  """

  # Short on purpose: the tiny model's attention must find the sign's word in the prompt.
  system_prompt = (f"Signs are {' '.join(COLOURS)}; {' '.join(SHAPES)}. Move the way the sign "
                   "points: up, down, left or right. Example: <answer>up</answer>")
  max_turns = 1

  def __init__(self, *, colours: int = len(COLOURS), shapes: int = len(SHAPES)):
    if not (isinstance(colours, int) and 1 <= colours <= len(COLOURS)):
      raise ValueError(f"signpost: colours must be an integer in [1, {len(COLOURS)}], "
                       f"got {colours!r}")
    if not (isinstance(shapes, int) and 1 <= shapes <= len(SHAPES)):
      raise ValueError(f"signpost: shapes must be an integer in [1, {len(SHAPES)}], "
                       f"got {shapes!r}")
    self.colours, self.shapes = COLOURS[:colours], SHAPES[:shapes]
    self.instance: tuple[str, str, str] | None = None

  def reset(self, seed: int) -> str:
    rng = random.Random(seed)
    self.instance = (rng.choice(MOVES), rng.choice(self.colours), rng.choice(self.shapes))
    move, colour, shape = self.instance
    return f"A {colour} {shape} sign points {move}."

  def step(self, reply: str):
    if self.instance is None:
      raise RuntimeError("signpost: call reset(seed) before step()")
    moves = [parsing.parse_direction(c) for c in parsing.candidates(reply)]
    move = next((m for m in moves if m is not None), None)
    success = move == self.instance[0]
    observation = "You found the way out." if success else "Wrong way: the game is lost."
    info = {"success": success, "invalid": move is None, "events": [], "truncated": False}
    return observation, float(success), True, info

  def instance_key(self) -> str:
    if self.instance is None:
      raise RuntimeError("signpost: call reset(seed) before instance_key()")
    return "signpost:" + ":".join(self.instance)

  def action_space(self) -> list[str]:
    return list(MOVES)
