"""Tag profiles of groups (selection, §2.4) and tag frequencies per environment (report, §2.8).

Every function reads a pool together with the judge's answer for it: `tags[k]` is the
`GroupTags` of `pool[k]` (the judge's output; the groups themselves carry rollout facts only).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from rised_jax.rubrics.vocabulary import Vocabulary
from rised_jax.types import Group, GroupTags


def check_aligned(pool: Sequence[Group], tags: Sequence[GroupTags]) -> None:
  """Raises unless `tags[k]` has one row and one unjudged flag per rollout of `pool[k]`."""
  if len(tags) != len(pool):
    raise ValueError(f"{len(tags)} GroupTags for a pool of {len(pool)} groups")
  for k, (group, group_tags) in enumerate(zip(pool, tags)):
    size = len(group.trajectories)
    if np.ndim(group_tags.tags) != 2 or len(group_tags.tags) != size or np.shape(
        group_tags.unjudged) != (size,):
      raise ValueError(f"group {k} ({group.task.key}) has {size} rollouts but its tags have "
                       f"shape {np.shape(group_tags.tags)} and unjudged "
                       f"{np.shape(group_tags.unjudged)}; expected [{size}, V] and [{size}]")


def infer_num_tags(tags: Sequence[GroupTags]) -> int:
  """The tag-vector length shared by the groups' tag rows (0 for an empty pool)."""
  sizes = {np.shape(t.tags)[1] for t in tags}
  if len(sizes) > 1:
    raise ValueError(f"tag vectors of different lengths {sorted(sizes)} in one pool; every "
                     "rollout must be judged with the same vocabulary")
  return sizes.pop() if sizes else 0


def group_profile(group: Group, tags: GroupTags, with_success: bool = False) -> np.ndarray:
  """φ_g: the mean tag vector of the group's judged rollouts (zeros if none is judged), then
  the group's success rate when `with_success`."""
  judged = np.asarray(tags.tags, np.float32)[tags.judged]
  phi = judged.mean(0) if len(judged) else np.zeros(np.shape(tags.tags)[1], np.float32)
  if with_success:
    phi = np.concatenate([phi, [group.successes.mean()]])
  return phi.astype(np.float32)


def pool_profiles(pool: Sequence[Group], tags: Sequence[GroupTags],
                  with_success: bool = False) -> np.ndarray:
  """φ_g for every group, stacked: [K, num_tags (+1 with the success rate)] float64."""
  check_aligned(pool, tags)
  width = infer_num_tags(tags) + int(with_success)
  return np.asarray([group_profile(g, t, with_success) for g, t in zip(pool, tags)],
                    np.float64).reshape(len(pool), width)


def has_judged_rollout(tags: GroupTags) -> bool:
  return bool(tags.judged.any())


def tag_frequencies(pool: Sequence[Group], tags: Sequence[GroupTags],
                    vocab: Vocabulary) -> dict[str, dict[str, float]]:
  """Per environment, the fraction of its judged rollouts that carry each tag."""
  check_aligned(pool, tags)
  sums: dict[str, np.ndarray] = {}
  counts: dict[str, int] = {}
  for group, group_tags in zip(pool, tags):
    if np.shape(group_tags.tags)[1] != len(vocab):
      raise ValueError(f"group of {group.task.key} has tags of width "
                       f"{np.shape(group_tags.tags)[1]}; vocabulary {vocab.source} has "
                       f"{len(vocab)} entries")
    judged = np.asarray(group_tags.tags, np.float64)[group_tags.judged]
    if not len(judged):
      continue
    env = group.task.env
    sums[env] = sums.get(env, np.zeros(len(vocab))) + judged.sum(0)
    counts[env] = counts.get(env, 0) + len(judged)
  return {env: dict(zip(vocab.ids, (sums[env] / counts[env]).tolist())) for env in sorted(sums)}
