"""Roll-outs split across the processes of a multi-host run.

With a server engine (`Engine.collective` False) on more than one process, each process rolls
out and judges only its share of the step's K groups, `parallel.process_share`: a contiguous
block of the task list that every process draws whole (so the task cursor, and every memory
fed from the gathered pool, stays the same everywhere). The judge stage then gathers, in one
collective (`parallel.allgather_objects`), every process's groups and per-group judge results
(concatenated in process order: the pool the one-process run has, since the engine seeds
depend on the task and rollout, never on the position) and its counters (summed), so
selection and everything after it run on identical inputs on every process and the server
sees each request once, however many hosts there are. The gather is the judge stage's, which
the trainer runs in the foreground: a background roll-out (`rollout.async_rollouts`) makes no
collective that could interleave with the train step's on some process and not on another.

A failure on one process (an exception in its roll-out or judge) is carried to the gather
instead of raised at once, so no process waits in the collective for one that has stopped:
the failing process re-raises its own error there, the others raise `ShareFailed` naming it.
The in-process engine samples collectively, so with it every process rolls out everything.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence, TypeVar

import jax

from rised_jax import parallel
from rised_jax.rollout.agent_loop import EnvironmentFailure, Rollouts

T = TypeVar("T")


class ShareFailed(RuntimeError):
  """Another process's share of the roll-out or judge failed (its log has the error)."""


def splits(engine: Any) -> bool:
  """Whether the roll-outs are split: several processes and an engine each may call alone."""
  return jax.process_count() > 1 and not engine.collective


def require_groups(record: T, num_tasks: int) -> T:
  """`record` when its pool kept a group, else the error that every one of the step's
  `num_tasks` groups was dropped (checked once for the whole pool: after the gather when
  split, where a share that lost every group to environment errors is not yet a failure)."""
  if record.pool:
    return record
  env_errors = int(record.faults.get("rollout/env_errors", 0))
  if env_errors:
    raise EnvironmentFailure(f"step {record.step}: every one of the {num_tasks} rollout groups "
                             f"was dropped; {env_errors} episodes ended in an environment error "
                             "(see the log), the others' engine requests failed")
  raise RuntimeError(f"step {record.step}: every one of the {num_tasks} rollout groups was "
                     "dropped because engine requests failed after their retries (see the "
                     "log for the server's errors)")


def run_share(loop: Any, tasks: Sequence[Any], split: bool, **options: Any) -> Rollouts:
  """`loop.run(own_share(tasks), **options)` (an `AgentLoop`); when split, a share that lost
  every group to environment errors is its `Rollouts` without groups (with its counts), not
  yet an `EnvironmentFailure`: the whole pool is judged after the gather."""
  try:
    return loop.run(own_share(tasks, split), **options)
  except EnvironmentFailure as failure:
    if not split or failure.rollouts is None:
      raise
    return failure.rollouts


def own_share(items: Sequence[T], split: bool) -> list[T]:
  """This process's block of `items` when `split`, else all of them."""
  return list(items[parallel.process_share(len(items))] if split else items)


@dataclasses.dataclass(frozen=True)
class Share:
  """What one process rolled out and judged: per-group fields (tuples in pool order), counters
  (summed at the gather), and its failure, if any (not sent: only its message travels)."""

  fields: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
  counters: Mapping[str, float] = dataclasses.field(default_factory=dict)
  error: BaseException | None = None


def attempt(split: bool, fn: Callable[[], T]) -> tuple[T | None, BaseException | None]:
  """(fn(), None); when `split`, an exception of fn is returned as (None, error) instead of
  raised, for `gather` to raise on every process."""
  if not split:
    return fn(), None
  try:
    return fn(), None
  except Exception as error:  # noqa: BLE001 - raised at the gather, on every process
    return None, error


def gather(share: Share, what: str) -> Share:
  """Every process's share joined: fields concatenated in process order, counters summed.
  Raises on every process when any process's share failed."""
  parts = parallel.allgather_objects(
      (dict(share.fields), dict(share.counters),
       None if share.error is None else f"{type(share.error).__name__}: {share.error}"))
  failed = [(p, message) for p, (_, _, message) in enumerate(parts) if message is not None]
  if share.error is not None:
    raise share.error
  if failed:
    raise ShareFailed(f"{what}: the roll-out or judge failed on process(es) "
                      f"{[p for p, _ in failed]} (first: {failed[0][1]}); process "
                      f"{jax.process_index()} stops too")
  fields = {name: tuple(x for part, _, _ in parts for x in part[name]) for name in share.fields}
  counters: dict[str, float] = {}
  for _, part_counters, _ in parts:
    for name, value in part_counters.items():
      counters[name] = counters.get(name, 0.0) + float(value)
  return Share(fields=fields, counters=counters)
