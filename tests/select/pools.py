"""Synthetic candidate pools for the selection tests and benchmarks/selector_alignment.py.

Generators of (pool, tags) with a known structure, so a selector's choice can be scored
against the pool it came from:

- `beta_pool`: the tests' original generator. Four environments with Beta(0.5, 0.5) tag rates
  over 13 tags, Gaussian per-group noise, every rollout judged.
- `dirichlet_pool` (the issue's second generator): environments of unequal share
  (Dirichlet weights), each with a sparse tag-rate vector (a Dirichlet split of 0.3–3 expected
  tags per rollout), Gamma per-group noise, 5 % failed judgements. Many rollouts carry no tag
  (the judge answered `[]`), and some groups carry none at all.
- `prototype_pool`: written after the defaults (direction_weight, direction_target) were chosen
  on the other two, and run on them unchanged: a held-out check.
"""
from __future__ import annotations

import numpy as np

from rised_jax.types import Group, GroupTags, Task, Trajectory

NUM_TAGS = 13


def make_group(env, seed, tags, rewards, unjudged=None):
  """A group whose rollout i has reward (= success) rewards[i], and its judge's answer: tag
  vector tags[i] (tags None: no rollout judged), unjudged[i] marking failed judgements."""
  trajs = [Trajectory(Task(env, seed), [], [], [], 0, [], success=bool(reward > 0.5),
                      reward=float(reward)) for reward in rewards]
  if tags is None:
    group_tags = GroupTags(np.zeros((len(rewards), NUM_TAGS), np.float32),
                           np.ones(len(rewards), bool))
  else:
    group_tags = GroupTags(np.asarray(tags, np.float32).reshape(len(rewards), -1),
                           np.asarray(unjudged if unjudged is not None else
                                      [False] * len(rewards), bool))
  return Group(Task(env, seed), trajs), group_tags


def unzip(pairs):
  """[(group, tags)] -> (groups, tags)."""
  pairs = list(pairs)
  return [g for g, _ in pairs], [t for _, t in pairs]


def beta_pool(rng, num_groups, group_size=8, num_envs=4, noise=0.15):
  """Groups whose binary tags follow per-environment rates (plus per-group noise), and their
  tags."""
  env_rates = rng.beta(0.5, 0.5, size=(num_envs, NUM_TAGS))
  pairs = []
  for k in range(num_groups):
    env = int(rng.integers(num_envs))
    rates = np.clip(env_rates[env] + rng.normal(0, noise, NUM_TAGS), 0, 1)
    tags = (rng.random((group_size, NUM_TAGS)) < rates).astype(np.float32)
    rewards = (rng.random(group_size) < rng.random()).astype(np.float32)
    pairs.append(make_group(f"env{env}", k, tags, rewards))
  return unzip(pairs)


def dirichlet_pool(rng, num_groups, group_size=8, num_envs=4, unjudged_rate=0.05):
  """Groups of environments with Dirichlet tag rates (see the module docstring), and their
  tags."""
  env_share = rng.dirichlet(np.full(num_envs, 2.0))
  tags_per_rollout = rng.uniform(0.3, 3.0, num_envs)
  env_rates = tags_per_rollout[:, None] * rng.dirichlet(np.full(NUM_TAGS, 0.5), num_envs)
  env_success = rng.uniform(0.05, 0.95, num_envs)
  pairs = []
  for k in range(num_groups):
    env = int(rng.choice(num_envs, p=env_share))
    rates = np.clip(env_rates[env] * rng.gamma(4.0, 0.25, NUM_TAGS), 0, 1)
    unjudged = rng.random(group_size) < unjudged_rate
    tags = (rng.random((group_size, NUM_TAGS)) < rates) & ~unjudged[:, None]
    success = np.clip(env_success[env] + rng.normal(0, 0.2), 0, 1)
    rewards = (rng.random(group_size) < success).astype(np.float32)
    pairs.append(make_group(f"env{env}", k, tags.astype(np.float32), rewards, unjudged))
  return unzip(pairs)


def tag_profiles(tags):
  """[K, 13] float64: each group's mean tag vector over its judged rollouts (zeros if none),
  computed here from the rows, independently of rised_jax.rubrics.profiles."""
  rows = []
  for t in tags:
    judged = np.asarray(t.tags, np.float64)[~np.asarray(t.unjudged, bool)]
    rows.append(judged.mean(0) if len(judged) else np.zeros(NUM_TAGS))
  return np.stack(rows)


def untagged_fractions(tags):
  """[K]: the fraction of each group's judged rollouts whose tag row is empty (0 if none is
  judged)."""
  fractions = []
  for t in tags:
    judged = np.asarray(t.tags, np.float64)[~np.asarray(t.unjudged, bool)]
    fractions.append(float(np.mean(judged.sum(1) == 0)) if len(judged) else 0.0)
  return np.asarray(fractions)


def profiled(tags):
  """Indices of the groups with at least one judged rollout (the pool a profile is part of)."""
  return [k for k, t in enumerate(tags) if not np.all(t.unjudged)]


# --- measures of a chosen subset, and their exact expectation under a uniform random B-subset ---

def mean_gap(phi, subset):
  """‖mean of phi[subset] − mean of phi‖²."""
  return float(np.sum((phi[list(subset)].mean(0) - phi.mean(0)) ** 2))


def random_mean_gap(phi, batch_size):
  """E‖mean of a uniform random B-subset − mean‖² = (K − B) / (B (K − 1)) · σ², σ² the mean
  squared deviation of the rows (the variance of a mean sampled without replacement)."""
  num = len(phi)
  if batch_size >= num:
    return 0.0
  spread = float(np.mean(np.sum((phi - phi.mean(0)) ** 2, axis=1)))
  return (num - batch_size) / (batch_size * (num - 1)) * spread


def _cosines(x):
  norms = np.linalg.norm(x, axis=1)
  unit = x / np.where(norms > 0, norms, 1.0)[:, None]
  return unit @ unit.T


def mean_pairwise_cosine(x, subset):
  """Mean cosine over the distinct pairs of x[subset] (0 for a zero row): the batch's
  redundancy."""
  subset = list(subset)
  cos = _cosines(x[subset])
  upper = np.triu_indices(len(subset), 1)
  return float(cos[upper].mean())


def random_pairwise_cosine(x):
  """Its expectation under a uniform random subset of size ≥ 2: the mean over all the pool's
  pairs (every pair is equally likely to be in the subset)."""
  return mean_pairwise_cosine(x, range(len(x)))


def prototype_pool(rng, num_groups, group_size=4, num_envs=6, flip=0.1, unjudged_rate=0.1):
  """Third generator, written after the defaults were chosen and run once to check them:
  six environments of 2–4 behaviour prototypes each (a prototype = 1–3 tags), every rollout
  one of its environment's prototypes (or none: the judge answered `[]`) with tags flipped at
  rate `flip`/13, groups of 4, 10 % failed judgements."""
  prototypes = []
  for _ in range(num_envs):
    count = int(rng.integers(2, 5))
    protos = np.zeros((count + 1, NUM_TAGS))   # row 0: no behaviour observed
    for p in protos[1:]:
      p[rng.choice(NUM_TAGS, size=int(rng.integers(1, 4)), replace=False)] = 1
    prototypes.append((protos, rng.dirichlet(np.ones(count + 1))))
  pairs = []
  for k in range(num_groups):
    env = int(rng.integers(num_envs))
    protos, mix = prototypes[env]
    rows = protos[rng.choice(len(protos), size=group_size, p=mix)]
    flips = rng.random(rows.shape) < flip / NUM_TAGS
    unjudged = rng.random(group_size) < unjudged_rate
    tags = np.where(flips, 1 - rows, rows) * ~unjudged[:, None]
    rewards = (rng.random(group_size) < 0.5).astype(np.float32)
    pairs.append(make_group(f"env{env}", k, tags.astype(np.float32), rewards, unjudged))
  return unzip(pairs)


GENERATORS = {"beta": beta_pool, "dirichlet": dirichlet_pool, "prototype": prototype_pool}
