"""Baseline selectors: the same trainer with the selection stage swapped (docs/ALGORITHMS.md §2.7).

| name        | chooses | options (default) |
| ----------- | ------- | ----------------- |
| uniform     | the first B groups in pool order. The task sampler draws the pool uniformly, so with pool size = B this is plain GRPO (every rollout is trained on). | seed (accepted like every selector's; unused) |
| random      | a uniformly random B-subset of the pool: the ablation of RISED's selection at the same pool size K. | seed |
| dapo        | DAPO dynamic sampling: drops groups whose rewards are all equal (std ≤ `eps`), takes B of the rest in random order (the pool size K > B stands in for DAPO's re-sampling until the batch is full). When fewer than B remain: `shortfall="pad"` fills the batch with randomly chosen zero-variance groups (no PG signal, but distillation can still use them); `shortfall="truncate"` returns the smaller batch. | shortfall ("pad"), eps (1e-6), seed |
| variance    | reward-variance prioritisation: `mode="top"` takes the B groups of largest reward variance (random tie-break); `mode="proportional"` samples B without replacement with probability ∝ variance + `floor`. | mode ("top"), floor (1e-3), seed |
| success_rate | selection by success rate alone, the control for RISED's rubric profiles: RISED's greedy composition matching (`select.rised.greedy_select`, λ = 0) on the one-number profile φ_g = the group's success rate, toward the pool's mean success rate, so the chosen batch's success rate tracks the pool's; ties in random order. | seed |
| env_curriculum | environment-level curriculum: per environment an EMA of the pass rate at a fast and a slow rate, updated from each pool; environments are sampled with probability (1 − ε)·w_e / Σw + ε / #envs, then a random group of that environment. `score="learning_progress"`: w_e = abs(fast − slow) (absolute learning progress); `score="failure_rate"`: w_e = 1 − fast (the bounded reading of "inverse pass rate"). | score ("learning_progress"), fast_rate (0.5), slow_rate (0.1), exploration ε (0.2), seed |
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from rised_jax.select.base import Selector, check_choice
from rised_jax.select.rised import greedy_select
from rised_jax.types import Group, GroupTags


class UniformSelector(Selector):
  name = "uniform"

  def _select(self, pool: Sequence[Group], tags: Sequence[GroupTags] | None, batch_size: int,
              step: int, rng: np.random.Generator) -> Sequence[int]:
    return range(min(batch_size, len(pool)))


class RandomSelector(Selector):
  name = "random"

  def _select(self, pool: Sequence[Group], tags: Sequence[GroupTags] | None, batch_size: int,
              step: int, rng: np.random.Generator) -> Sequence[int]:
    return rng.permutation(len(pool))[:batch_size]


class DapoSelector(Selector):
  name = "dapo"
  SHORTFALLS = ("pad", "truncate")

  def __init__(self, shortfall: str = "pad", eps: float = 1e-6, seed: int = 0):
    super().__init__(seed)
    check_choice(self.name, "shortfall", shortfall, self.SHORTFALLS)
    if eps < 0:
      raise ValueError(f"selector 'dapo': eps={eps}; expected >= 0")
    self.shortfall = shortfall
    self.eps = eps

  def _select(self, pool: Sequence[Group], tags: Sequence[GroupTags] | None, batch_size: int,
              step: int, rng: np.random.Generator) -> Sequence[int]:
    order = rng.permutation(len(pool))
    varied = [int(i) for i in order if pool[i].rewards.std() > self.eps]
    chosen = varied[:batch_size]
    if self.shortfall == "pad":
      flat = [int(i) for i in order if pool[i].rewards.std() <= self.eps]
      chosen += flat[:batch_size - len(chosen)]
    return chosen


class VarianceSelector(Selector):
  name = "variance"
  MODES = ("top", "proportional")

  def __init__(self, mode: str = "top", floor: float = 1e-3, seed: int = 0):
    super().__init__(seed)
    check_choice(self.name, "mode", mode, self.MODES)
    if floor <= 0:
      raise ValueError(f"selector 'variance': floor={floor}; expected > 0")
    self.mode = mode
    self.floor = floor

  def _select(self, pool: Sequence[Group], tags: Sequence[GroupTags] | None, batch_size: int,
              step: int, rng: np.random.Generator) -> Sequence[int]:
    variance = np.asarray([g.rewards.var() for g in pool], np.float64)
    count = min(batch_size, len(pool))
    if self.mode == "proportional":
      weights = variance + self.floor
      return rng.choice(len(pool), size=count, replace=False, p=weights / weights.sum())
    # Stable sort of a random permutation by descending variance: ties in random order.
    order = rng.permutation(len(pool))
    return order[np.argsort(-variance[order], kind="stable")][:count]


class SuccessRateSelector(Selector):
  name = "success_rate"

  def _select(self, pool: Sequence[Group], tags: Sequence[GroupTags] | None, batch_size: int,
              step: int, rng: np.random.Generator) -> Sequence[int]:
    if not pool:
      return []
    rates = np.asarray([[g.successes.mean()] for g in pool], np.float64)   # [K, 1]
    return greedy_select(rates, rates.mean(0), batch_size, "composition", 0.0, "dot",
                         np.zeros(len(pool)), rng.permutation(len(pool)))


class CurriculumSelector(Selector):
  name = "env_curriculum"
  SCORES = ("learning_progress", "failure_rate")

  def __init__(self, score: str = "learning_progress", fast_rate: float = 0.5,
               slow_rate: float = 0.1, exploration: float = 0.2, seed: int = 0):
    super().__init__(seed)
    check_choice(self.name, "score", score, self.SCORES)
    if not 0 < slow_rate <= fast_rate <= 1:
      raise ValueError(f"selector 'env_curriculum': slow_rate={slow_rate}, fast_rate={fast_rate}; "
                       "expected 0 < slow_rate <= fast_rate <= 1")
    if not 0 <= exploration <= 1:
      raise ValueError(f"selector 'env_curriculum': exploration={exploration}; expected [0, 1]")
    self.score = score
    self.fast_rate = fast_rate
    self.slow_rate = slow_rate
    self.exploration = exploration
    self.stats: dict[str, dict[str, float]] = {}   # env -> {"fast", "slow", "updates"}

  def update(self, pool: Sequence[Group]) -> None:
    """Folds the pool's per-environment pass rates into the EMAs (the first one seeds them).

    `select` calls it, so call `select` once per training step.
    """
    by_env: dict[str, list[float]] = {}
    for group in pool:
      by_env.setdefault(group.task.env, []).extend(group.successes.tolist())
    for env, successes in sorted(by_env.items()):
      rate = float(np.mean(successes)) if successes else 0.0
      if env not in self.stats:
        self.stats[env] = {"fast": rate, "slow": rate, "updates": 1}
        continue
      s = self.stats[env]
      s["fast"] += self.fast_rate * (rate - s["fast"])
      s["slow"] += self.slow_rate * (rate - s["slow"])
      s["updates"] += 1

  def env_probabilities(self, envs: Sequence[str]) -> np.ndarray:
    """Sampling probabilities of `envs` (all must have stats)."""
    if self.score == "learning_progress":
      w = np.asarray([abs(self.stats[e]["fast"] - self.stats[e]["slow"]) for e in envs])
    else:
      w = np.asarray([1.0 - self.stats[e]["fast"] for e in envs])
    uniform = np.full(len(envs), 1.0 / len(envs))
    if w.sum() <= 0:
      return uniform
    return (1 - self.exploration) * w / w.sum() + self.exploration * uniform

  def _select(self, pool: Sequence[Group], tags: Sequence[GroupTags] | None, batch_size: int,
              step: int, rng: np.random.Generator) -> Sequence[int]:
    self.update(pool)
    if not pool:
      return []
    remaining: dict[str, list[int]] = {}
    for i in rng.permutation(len(pool)):
      remaining.setdefault(pool[i].task.env, []).append(int(i))
    envs = sorted(remaining)
    probs = self.env_probabilities(envs)
    chosen = []
    for _ in range(min(batch_size, len(pool))):
      live = np.asarray([bool(remaining[e]) for e in envs], np.float64)
      p = probs * live
      if p.sum() <= 0:   # only zero-weight environments have groups left
        p = live
      env = envs[rng.choice(len(envs), p=p / p.sum())]
      chosen.append(remaining[env].pop())
    return chosen

  def state_dict(self) -> dict[str, Any]:
    return {"stats": {env: dict(s) for env, s in self.stats.items()}}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    if set(state) != {"stats"}:
      raise ValueError(f"selector 'env_curriculum': state has keys {sorted(state)}; expected "
                       "['stats']")
    self.stats = {str(env): {"fast": float(s["fast"]), "slow": float(s["slow"]),
                             "updates": int(s["updates"])} for env, s in state["stats"].items()}
