"""Training task streams (`Stream`): which tasks each step rolls out. `TaskStream` draws
(environment, seed) tasks for the agentic pipeline; `ShuffledStream` draws indices of a fixed
task list, in a fresh seeded order each epoch, for the rubric pipeline.

Tasks cycle through the configured environments in order, each with the next seed of that
environment that is neither held out nor generates a held-out instance: the evaluation set is
a list of instances (`rised_jax.evaluate.eval_tasks`), and different seeds can generate the
same instance (the same Wordle secret, the same Countdown numbers and target, Maze layouts
that look alike from the start and share their winning plan), so the stream skips every seed
whose `envs.instance_key` (what the agent can tell apart) is in `exclude[env]`. Seeds at and above
`eval_seed_offset` (where evaluation draws from) are never reached either.

Small instance spaces repeat: `repeat_warnings(stream, count)` says, per environment, when the
next `count` tasks hold fewer distinct instances than draws (the pipeline warns with it for
the whole run). The stream's position (cursor and per-environment seed index) is host state,
saved with every checkpoint.
"""
from __future__ import annotations

import copy
from typing import Any, Collection, Mapping, Protocol, Sequence

import numpy as np

from rised_jax import envs
from rised_jax.types import Task

# Consecutive held-out instances after which the stream gives up: the training instances of
# this environment are (nearly) all in the evaluation set.
MAX_SKIPPED_SEEDS = 10_000


class Stream(Protocol):
  """What a pipeline draws its training tasks from: the next `count` tasks, and a position
  that is host state (saved with every checkpoint, so a resumed run draws on)."""

  def next(self, count: int) -> list[Any]: ...
  def state_dict(self) -> dict[str, Any]: ...
  def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class TaskStream:
  """Environment tasks (module docstring): the agentic pipeline's stream."""

  def __init__(self, env_names: Sequence[str], difficulty: Mapping[str, Mapping[str, Any]],
               *, seed: int = 0, eval_seed_offset: int = 1_000_000,
               exclude: Mapping[str, Collection[str]] | None = None):
    if not env_names:
      raise ValueError("TaskStream needs at least one environment")
    self.env_names = list(env_names)
    self.difficulty = {name: dict(difficulty.get(name, {})) for name in self.env_names}
    self.base_seed = int(seed) * 100_003   # different runs play different episodes
    self.eval_seed_offset = int(eval_seed_offset)
    self.exclude = {name: frozenset((exclude or {}).get(name, ())) for name in self.env_names}
    self.cursor = 0
    self.next_index = {name: 0 for name in self.env_names}   # seeds tried so far, per env

  def next(self, count: int) -> list[Task]:
    tasks = []
    for i in range(self.cursor, self.cursor + count):
      env = self.env_names[i % len(self.env_names)]
      tasks.append(Task(env=env, seed=self._next_seed(env), difficulty=self.difficulty[env]))
    self.cursor += count
    return tasks

  def _next_seed(self, env: str) -> int:
    for _ in range(MAX_SKIPPED_SEEDS):
      seed = (self.base_seed + self.next_index[env]) % self.eval_seed_offset
      self.next_index[env] += 1
      if envs.instance_key(env, seed, self.difficulty[env]) not in self.exclude[env]:
        return seed
    raise ValueError(f"TaskStream: {MAX_SKIPPED_SEEDS} consecutive seeds of {env} (difficulty "
                     f"{self.difficulty[env]}) generate held-out instances: the evaluation set "
                     "holds (nearly) every instance; lower eval.episodes_per_env or use a larger "
                     "difficulty")

  def state_dict(self) -> dict[str, Any]:
    return {"cursor": self.cursor, "next_index": dict(self.next_index)}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    if set(state) != {"cursor", "next_index"} or set(state["next_index"]) != set(self.env_names):
      raise ValueError(f"TaskStream: state {dict(state)!r:.200} does not match this stream; "
                       f"expected keys ['cursor', 'next_index'] with next_index over "
                       f"{self.env_names}")
    self.cursor = int(state["cursor"])
    self.next_index = {name: int(state["next_index"][name]) for name in self.env_names}


def repeat_warnings(stream: TaskStream, count: int) -> list[str]:
  """One message per environment whose share of the next `count` tasks repeats an instance.

  The stream itself does not move (a copy draws the tasks).
  """
  preview = copy.deepcopy(stream)
  keys: dict[str, list[str]] = {}
  for task in preview.next(count):
    keys.setdefault(task.env, []).append(envs.instance_key(task.env, task.seed, task.difficulty))
  return [f"{env}: the next {len(drawn)} training tasks hold only {len(set(drawn))} distinct "
          f"instances (difficulty {stream.difficulty[env]}, {len(stream.exclude[env])} held out "
          "for evaluation): training repeats instances"
          for env, drawn in keys.items() if len(set(drawn)) < len(drawn)]


class ShuffledStream:
  """Indices into a fixed task list (the rubric pipeline's training tasks) in a fresh seeded
  order every epoch; the cursor is the host state."""

  def __init__(self, indices: Sequence[int], seed: int = 0):
    if not indices:
      raise ValueError("ShuffledStream needs at least one task")
    self.indices = np.asarray(indices, np.int64)
    self.seed = int(seed)
    self.cursor = 0

  def _epoch(self, epoch: int) -> np.ndarray:
    return np.random.default_rng([self.seed, epoch]).permutation(self.indices)

  def next(self, count: int) -> list[int]:
    out, order, order_epoch = [], None, -1
    for k in range(self.cursor, self.cursor + count):
      epoch, position = divmod(k, len(self.indices))
      if epoch != order_epoch:
        order, order_epoch = self._epoch(epoch), epoch
      out.append(int(order[position]))
    self.cursor += count
    return out

  def state_dict(self) -> dict[str, Any]:
    return {"cursor": self.cursor}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    self.cursor = int(state["cursor"])
