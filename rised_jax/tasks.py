"""Training task stream: which (environment, seed) tasks each step rolls out.

Tasks cycle through the configured environments in order, each with the next unused seed of
that environment, so every step's candidate pool covers the environments evenly and no
training seed repeats. Held-out evaluation seeds live at and above `eval_seed_offset`, which the
training stream never reaches. The cursor is host state, saved with every checkpoint.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from rised_jax.types import Task


class TaskStream:

  def __init__(self, env_names: Sequence[str], difficulty: Mapping[str, Mapping[str, Any]],
               *, seed: int = 0, eval_seed_offset: int = 1_000_000):
    if not env_names:
      raise ValueError("TaskStream needs at least one environment")
    self.env_names = list(env_names)
    self.difficulty = {name: dict(difficulty.get(name, {})) for name in self.env_names}
    self.base_seed = int(seed) * 100_003   # different runs play different episodes
    self.eval_seed_offset = int(eval_seed_offset)
    self.cursor = 0

  def next(self, count: int) -> list[Task]:
    tasks = []
    for i in range(self.cursor, self.cursor + count):
      env = self.env_names[i % len(self.env_names)]
      seed = (self.base_seed + i // len(self.env_names)) % self.eval_seed_offset
      tasks.append(Task(env=env, seed=seed, difficulty=self.difficulty[env]))
    self.cursor += count
    return tasks

  def state_dict(self) -> dict[str, Any]:
    return {"cursor": self.cursor}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    self.cursor = int(state["cursor"])
