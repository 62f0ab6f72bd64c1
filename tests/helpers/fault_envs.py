"""Plug-in environments with environment faults (issue 23), loaded by import path
("tests.helpers.fault_envs:Wordy") through the public protocol, as a user's would be.

Both are FrozenLake with one fault on the seeds `fault_every` divides (seed % fault_every == 0):
  Wordy       its first observation is `words` words long (a web page, a long room)
  HugeReward  its first step rewards `reward` (1e39: finite in Python, inf in float32)

Each spells out FrozenLake's knobs in its own signature: the environment protocol reads the
knobs a class accepts from its `__init__` signature (rised_jax.envs), so `**knobs` would hide them.
"""
from __future__ import annotations

from rised_jax.envs.frozenlake import FrozenLake


def faulty(seed: int, every: int) -> bool:
  """Whether the environment faults on this seed: the tests' oracle uses the same rule."""
  return seed % every == 0


class Wordy(FrozenLake):
  name = "wordy"

  def __init__(self, *, size: int = 3, holes: int = 0, min_distance: int = 1,
               max_turns: int | None = 2, fault_every: int = 3, words: int = 3000):
    super().__init__(size=size, holes=holes, min_distance=min_distance, max_turns=max_turns)
    self.fault_every, self.words = fault_every, words

  def reset(self, seed):
    observation = super().reset(seed)
    if faulty(seed, self.fault_every):
      observation = " ".join(["ice"] * self.words) + "\n" + observation
    return observation


class HugeReward(FrozenLake):
  name = "huge_reward"

  def __init__(self, *, size: int = 3, holes: int = 0, min_distance: int = 1,
               max_turns: int | None = 2, fault_every: int = 3, reward: float = 1e39):
    super().__init__(size=size, holes=holes, min_distance=min_distance, max_turns=max_turns)
    self.fault_every, self.reward = fault_every, reward
    self.seed = None

  def reset(self, seed):
    self.seed = seed
    return super().reset(seed)

  def step(self, reply):
    observation, reward, done, info = super().step(reply)
    if faulty(self.seed, self.fault_every) and info["turn"] == 1:
      reward = self.reward
    return observation, reward, done, info
