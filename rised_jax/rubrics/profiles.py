"""Tag profiles of groups (selection, §2.4) and tag frequencies per environment (report, §2.8)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from rised_jax.rubrics.vocabulary import Vocabulary
from rised_jax.types import Group, Trajectory


def is_tagged(traj: Trajectory) -> bool:
  return traj.tags is not None and not traj.untagged


def infer_num_tags(groups: Sequence[Group]) -> int:
  """The tag-vector length shared by the tagged rollouts of `groups` (0 if none is tagged)."""
  sizes = {np.shape(t.tags) for g in groups for t in g.trajectories if is_tagged(t)}
  if len(sizes) > 1:
    raise ValueError(f"tag vectors of different shapes {sorted(sizes)} in one pool; every "
                     "rollout must be judged with the same vocabulary")
  if not sizes:
    return 0
  (shape,) = sizes
  if len(shape) != 1:
    raise ValueError(f"tag vectors have shape {shape}; expected one dimension")
  return shape[0]


def pool_profiles(pool: Sequence[Group], with_success: bool = False) -> np.ndarray:
  """φ_g for every group, stacked: [K, num_tags (+1 with the success rate)] float64."""
  num_tags = infer_num_tags(pool)
  width = num_tags + int(with_success)
  return np.asarray([g.profile(num_tags, with_success) for g in pool],
                    np.float64).reshape(len(pool), width)


def has_tagged_rollout(group: Group) -> bool:
  return any(is_tagged(t) for t in group.trajectories)


def tag_frequencies(groups: Sequence[Group], vocab: Vocabulary) -> dict[str, dict[str, float]]:
  """Per environment, the fraction of its tagged rollouts that carry each tag."""
  sums: dict[str, np.ndarray] = {}
  counts: dict[str, int] = {}
  for group in groups:
    for traj in group.trajectories:
      if not is_tagged(traj):
        continue
      if np.shape(traj.tags) != (len(vocab),):
        raise ValueError(f"rollout of {traj.task.key} has tags of shape {np.shape(traj.tags)}; "
                         f"vocabulary {vocab.source} has {len(vocab)} entries")
      env = traj.task.env
      sums[env] = sums.get(env, np.zeros(len(vocab))) + np.asarray(traj.tags, np.float64)
      counts[env] = counts.get(env, 0) + 1
  return {env: dict(zip(vocab.ids, (sums[env] / counts[env]).tolist())) for env in sorted(sums)}
