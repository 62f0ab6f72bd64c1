"""Pass-rate evaluation (docs/ALGORITHMS.md §4) on a fixed set of distinct held-out instances.

The evaluation set of an environment is its first `episodes` distinct instances (by
`envs.instance_key`) among the seeds seed_offset, seed_offset + 1, …: a fixed, seeded list, the
same for every run of a config. Different seeds can generate the same instance, so counting
seeds would count some games twice (and the training stream, `rised_jax.tasks`, skips these
instances by key, not by seed). The key is what the agent can tell apart: for a game seen in
part (Maze's egocentric view) the first observation and the oracle's plan, so many layouts are
one instance (`rised_jax.envs.base`, "Instance keys"). Pass rates and their Wilson intervals
are over these distinct situations: "episodes" counts them, "tasks" the tasks evaluated.

Each instance is played `samples` times (k) with the evaluation sampling settings: k = 1 with
temperature 0 is the greedy pass rate (the default); k > 1 needs a temperature > 0 and gives
pass@k, the share of instances solved in at least one of k sampled episodes. Never a hint or a
rubric in the prompt: the agent loop is called with no hints, and the prompt is the
environment's own.

Errored episodes (an exception in the environment, `AgentLoop`): the instance of an errored
episode is left out of the pass rate — pass@k of an instance needs all k of its episodes, and
counting a crash as a failure would charge the policy for the environment — and counted per
environment as "env_errors" (episodes) next to "episodes" (the situations evaluated), logged as
eval/{env}/env_errors. An environment none of whose instances could be evaluated (every one
errored, or lost to failed engine requests) has no pass rate: `evaluate` raises
`EnvironmentFailure` rather than report a table without it.

`episode_records` gives one plain record per episode for the run log's eval_episodes.jsonl:
{"env", "instance", "seed", "sample", "success", "turns", "actions", "tags"}; "tags" are the
ids a judge set (the pipeline passes its rule-based judge; null without one).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping, Sequence

from rised_jax import envs
from rised_jax.rollout import hosts
from rised_jax.rollout.agent_loop import AgentLoop, EnvironmentFailure
from rised_jax.rollout.env_pool import EnvError
from rised_jax.stats import wilson_interval
from rised_jax.types import Group, GroupTags, Task
from rised_jax.checks import (Rule, check_rules, from_section, int_at_least, is_int,
                              number_at_least)

log = logging.getLogger(__name__)

# Seeds scanned per requested instance before concluding the instance space is too small.
SEEDS_PER_INSTANCE = 50

RULES: dict[str, Rule] = {
    "episodes_per_env": int_at_least(1),
    "seed_offset": int_at_least(0),
    "temperature": number_at_least(0, "a finite number >= 0 (0: greedy)"),
}


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """config.eval, the evaluation stage's typed config (built at `pipelines.stages`): instances
  per environment, the held-out seeds' offset, and the sampling (pass@k at a temperature)."""

  episodes_per_env: int
  seed_offset: int
  temperature: float
  pass_at_k: int

  @classmethod
  def from_config(cls, section: Any) -> EvalConfig:
    return from_section(cls, section)

  def check(self) -> None:
    check_rules("config.eval", self, RULES)
    check_sampling(self.pass_at_k, self.temperature)


def eval_instances(env_name: str, difficulty: Mapping[str, Any], episodes: int,
                   seed_offset: int) -> list[Task]:
  """The first `episodes` distinct instances of seeds seed_offset, seed_offset + 1, …"""
  tasks, seen = [], set()
  limit = seed_offset + SEEDS_PER_INSTANCE * episodes + 1000
  seed = seed_offset
  while len(tasks) < episodes and seed < limit:
    key = envs.instance_key(env_name, seed, difficulty)
    if key not in seen:
      seen.add(key)
      tasks.append(Task(env=env_name, seed=seed, difficulty=dict(difficulty)))
    seed += 1
  if len(tasks) < episodes:
    raise ValueError(f"eval: {env_name} with difficulty {dict(difficulty)} has only {len(tasks)} "
                     f"distinct instances in seeds [{seed_offset}, {limit}); "
                     f"eval.episodes_per_env={episodes} asks for more (and training needs "
                     "instances of its own): lower it or use a larger difficulty")
  return tasks


def eval_tasks(env_names: Sequence[str], difficulty: Mapping[str, Mapping[str, Any]],
               episodes: int, seed_offset: int) -> list[Task]:
  """The evaluation set: `eval_instances` of every environment, in order."""
  return [task for name in env_names
          for task in eval_instances(name, difficulty.get(name, {}), episodes, seed_offset)]


def instance_keys(tasks: Sequence[Task]) -> dict[str, set[str]]:
  """{env: the instance keys of its tasks} (what the training stream must skip)."""
  keys: dict[str, set[str]] = {}
  for task in tasks:
    keys.setdefault(task.env, set()).add(envs.instance_key(task.env, task.seed, task.difficulty))
  return keys


def check_sampling(samples: Any, temperature: float) -> int:
  """Validates eval.pass_at_k against eval.temperature; returns k."""
  if not is_int(samples) or samples < 1:
    raise ValueError(f"config.eval.pass_at_k={samples!r}: expected an integer >= 1")
  if samples > 1 and not temperature > 0:
    raise ValueError(f"config.eval.pass_at_k={samples} with config.eval.temperature="
                     f"{temperature}: greedy episodes are all the same; pass@k needs a "
                     "temperature > 0")
  return samples


def pass_rates(groups: Sequence[Group]) -> dict[str, dict[str, float]]:
  """Per environment, over distinct situations (`envs.instance_key`): the share solved in at
  least one of a group's episodes (pass@k; the success rate for k = 1), its 95 % Wilson
  interval, the situation count as "episodes" (the interval's n) and the evaluated tasks as
  "tasks". An evaluation set (`eval_instances`) holds one task per situation, so the two
  counts agree; tasks that repeat a situation under other seeds count once, solved only if
  every one of them is (the agent cannot tell them apart, so they are one observation)."""
  by_env: dict[str, dict[str, list[bool]]] = {}
  for group in groups:
    task = group.task
    key = envs.instance_key(task.env, task.seed, task.difficulty)
    by_env.setdefault(task.env, {}).setdefault(key, []).append(
        any(t.success for t in group.trajectories))
  results = {}
  for env, situations in by_env.items():
    wins, n = sum(all(solved) for solved in situations.values()), len(situations)
    low, high = wilson_interval(wins, n)
    results[env] = {"pass_rate": wins / n, "ci_low": low, "ci_high": high, "episodes": n,
                    "tasks": sum(len(solved) for solved in situations.values())}
  return results


def add_env_errors(results: dict[str, dict[str, float]], tasks: Sequence[Task],
                   errors: Sequence[EnvError]) -> dict[str, dict[str, float]]:
  """Adds "env_errors" (errored episodes) to every environment's results; raises
  EnvironmentFailure for an environment of `tasks` without any evaluated instance."""
  for env in dict.fromkeys(task.env for task in tasks):
    own = [e for e in errors if e.task.env == env]
    if env not in results:
      instances = sum(task.env == env for task in tasks)
      first = f" (first: {own[0].stage}: {own[0].message})" if own else ""
      raise EnvironmentFailure(
          f"evaluation: none of the {instances} instances of {env} could be evaluated: "
          f"{len(own)} episodes raised in the environment{first}, the others' engine requests "
          "failed; there is no pass rate to report")
    results[env]["env_errors"] = len(own)
  return results


def episode_records(groups: Sequence[Group], tags: Sequence[GroupTags] | None = None,
                    vocab=None) -> list[dict[str, Any]]:
  """One record per evaluation episode (see the module docstring); `tags[k]` is a judge's
  answer for `groups[k]` (None: not judged), `vocab` names the tags."""
  if tags is not None and len(tags) != len(groups):
    raise ValueError(f"episode_records: {len(tags)} GroupTags for {len(groups)} groups")
  records = []
  for k, group in enumerate(groups):
    task = group.task
    key = envs.instance_key(task.env, task.seed, task.difficulty)
    for sample, traj in enumerate(group.trajectories):
      named = (None if tags is None or vocab is None or tags[k].unjudged[sample]
               else vocab.ids_of(tags[k].tags[sample]))
      records.append({"env": task.env, "instance": key, "seed": int(task.seed),
                      "sample": sample, "success": bool(traj.success), "turns": len(traj.turns),
                      "actions": [turn.action_text for turn in traj.turns], "tags": named})
  return records


def evaluate(loop: AgentLoop, env_names: Sequence[str],
             difficulty: Mapping[str, Mapping[str, Any]], *, episodes: int, seed_offset: int,
             seed: int = 0, samples: int = 1, split: bool = False
             ) -> tuple[dict[str, dict[str, float]], list[Group]]:
  """Pass rate per environment on the held-out instances, and the evaluated groups; each
  environment's results hold its "env_errors". No hints: `loop.run(..., hints=None)`.
  `split` (`rollout.hosts.splits`): each process plays its share of the instances and all
  get every group, in order, and every environment error."""
  tasks = eval_tasks(env_names, difficulty, episodes, seed_offset)
  rollouts, error = hosts.attempt(split, lambda: hosts.run_share(
      loop, tasks, split, group_size=samples, hints=None, seed=seed, desc="eval"))
  groups, errors = ((), ()) if error is not None else (rollouts.groups, rollouts.env_errors)
  if split:
    whole = hosts.gather(hosts.Share(fields={"groups": groups, "env_errors": errors},
                                     error=error), "evaluation")
    groups, errors = whole.fields["groups"], whole.fields["env_errors"]
  if len(groups) < len(tasks):   # the results' episode counts show which envs lost them
    log.warning("evaluation: %d instances dropped (failed engine requests or environment "
                "errors; see eval/{env}/env_errors)", len(tasks) - len(groups))
  return add_env_errors(pass_rates(groups), tasks, errors), list(groups)
