"""Pass-rate evaluation (ALGORITHMS.md §4).

Episodes on a fixed list of held-out seeds per environment, one rollout per task, with the
evaluation sampling settings (greedy by default) and never a hint or a rubric in the prompt:
the agent loop is called with no hints, and the prompt is the environment's own.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from rised_jax.rollout.agent_loop import AgentLoop
from rised_jax.runlog import wilson_interval
from rised_jax.types import Group, Task


def eval_tasks(env_names: Sequence[str], difficulty: Mapping[str, Mapping[str, Any]],
               episodes: int, seed_offset: int) -> list[Task]:
  return [Task(env=name, seed=seed_offset + k, difficulty=dict(difficulty.get(name, {})))
          for name in env_names for k in range(episodes)]


def pass_rates(groups: Sequence[Group]) -> dict[str, dict[str, float]]:
  """Per environment: pass rate, its 95 % Wilson interval and the episode count."""
  by_env: dict[str, list[bool]] = {}
  for group in groups:
    by_env.setdefault(group.task.env, []).extend(t.success for t in group.trajectories)
  results = {}
  for env, outcomes in by_env.items():
    wins, n = sum(outcomes), len(outcomes)
    low, high = wilson_interval(wins, n)
    results[env] = {"pass_rate": wins / n, "ci_low": low, "ci_high": high, "episodes": n}
  return results


def evaluate(loop: AgentLoop, env_names: Sequence[str],
             difficulty: Mapping[str, Mapping[str, Any]], *, episodes: int, seed_offset: int,
             seed: int = 0) -> dict[str, dict[str, float]]:
  """Pass rate per environment on held-out seeds (no hints: `loop.run(..., hints=None)`)."""
  tasks = eval_tasks(env_names, difficulty, episodes, seed_offset)
  return pass_rates(loop.run(tasks, group_size=1, hints=None, seed=seed, desc="eval"))
