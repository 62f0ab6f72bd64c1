"""Environment instances shared by the episodes of an agent loop, and what it does with a crash.

An instance is built once per concurrent episode slot and reused: `acquire` hands out an idle
instance of the task's (environment, difficulty), or builds one; `release` takes it back after
the episode (the next `reset(seed)` reinitialises it, as the protocol requires). A remote
environment thus opens one server session per slot, not one per episode.

Idle instances are closed by `close`, and at the latest when the process exits (an AgentGym
server keeps a session until /close, so a finished run must not leave its sessions behind).

`discard` is for an instance whose `reset` or `step` raised: it is closed (best effort) and
never handed out again, so the next episode of that environment gets a freshly built one
(`rebuilt` counts them).
"""
from __future__ import annotations

import atexit
import dataclasses
import weakref
from typing import Any

from rised_jax import envs
from rised_jax.types import Task


@dataclasses.dataclass(frozen=True)
class EnvError:
  """An episode ended by an exception in its environment (or a step result that breaks the
  protocol); `stage` is "reset" or "step", `message` names the exception."""

  task: Task
  rollout: int
  stage: str
  message: str


def _pool_key(task: Task) -> tuple:
  return task.env, tuple(sorted((str(k), repr(v)) for k, v in task.difficulty.items()))


_POOLS: "weakref.WeakSet[EnvPool]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
  for pool in list(_POOLS):
    pool.close()


class EnvPool:
  """Idle environment instances per (environment, difficulty); see the module docstring."""

  def __init__(self):
    self._idle: dict[tuple, list[Any]] = {}
    self.rebuilt = 0   # instances discarded after a crash (each replaced on the next acquire)
    _POOLS.add(self)

  def acquire(self, task: Task) -> Any:
    idle = self._idle.get(_pool_key(task))
    return idle.pop() if idle else envs.make(task.env, **dict(task.difficulty))

  def release(self, task: Task, env: Any) -> None:
    self._idle.setdefault(_pool_key(task), []).append(env)

  def discard(self, env: Any) -> None:
    if env is not None:
      envs.close(env)
    self.rebuilt += 1

  def close(self) -> None:
    """Closes every idle instance (a remote session each)."""
    for idle in self._idle.values():
      for env in idle:
        envs.close(env)
    self._idle.clear()
