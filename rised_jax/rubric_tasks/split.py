"""Which criteria tasks the rubric pipeline trains on, holds out, and groups its evaluation by.

The held-out tasks are a seeded random subset of the task set (`config.rubric.eval_tasks`,
`config.rubric.split_seed`) that training never samples; the evaluation reports each group of
domains (`config.rubric.eval_groups`) apart, and a domain no group lists under `OTHER_DOMAINS`.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from rised_jax.rubric_tasks.tasks import RubricTaskSet, builtin_task_set, load_jsonl

OTHER_DOMAINS = "other"   # evaluation group of a domain that no configured group lists


def load_task_set(path: str) -> RubricTaskSet:
  """The task file at `path`, or the built-in set when `path` is ""."""
  return load_jsonl(path) if path else builtin_task_set()


def split_tasks(num_tasks: int, eval_tasks: int, split_seed: int) -> tuple[list[int], list[int]]:
  """(training, held-out) task indices: a seeded random subset of `eval_tasks` is held out."""
  if not 1 <= eval_tasks < num_tasks:
    raise ValueError(f"config.rubric.eval_tasks={eval_tasks}: expected 1 <= eval_tasks < the "
                     f"{num_tasks} tasks of the task set (some must remain for training)")
  order = np.random.default_rng(split_seed).permutation(num_tasks)
  return sorted(order[eval_tasks:].tolist()), sorted(order[:eval_tasks].tolist())


def eval_group_of(domain_groups: Mapping[str, Sequence[str]]) -> dict[str, str]:
  """domain -> evaluation group, from {group: [domains]}; a domain may be in one group only."""
  group_of: dict[str, str] = {}
  for group, domains in domain_groups.items():
    if isinstance(domains, str) or not all(isinstance(d, str) for d in domains):
      raise ValueError(f"config.rubric.eval_groups.{group}={domains!r}: expected a list of "
                       "domain names")
    for domain in domains:
      if domain in group_of:
        raise ValueError(f"config.rubric.eval_groups: domain {domain!r} is in both "
                         f"{group_of[domain]!r} and {group!r}")
      group_of[domain] = group
  return group_of
