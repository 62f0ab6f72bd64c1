"""RISED's profile-guided group selection (docs/ALGORITHMS.md §2.4).

Profile of a group: φ_g = the mean tag vector of its judged rollouts ⊕ the fraction of them
whose tag row is empty ("no behaviour observed": the judge answered `[]`, a valid verdict),
optionally ⊕ its success rate (`with_success`). The no-tag column makes a judged tagless group
a behaviour like any other (matched at its share of the pool, redundant with other tagless
groups) instead of a zero vector that similarity never penalises. A group with no judged
rollout (the judge failed on all of them, or never ran) has NO profile: it takes no part in
the pool composition, alignment, redundancy or history, and is chosen only when fewer than B
groups have a profile, after all of them, in the step's random order. Pool composition: φ̄ =
the mean φ_g over the profiled groups; u_g = φ_g/‖φ_g‖ its direction, ū = the mean u_g. B
groups are chosen greedily; ties are broken by a per-step random order, so identical profiles
are not biased toward the front of the pool.

Objectives (`objective`), with S the groups chosen so far and `redundancy(g) = max_{s∈S}
sim(φ_g, φ_s)` (0 while S is empty):
- "composition" (default), composition matching of the mean profile and the mean direction:
      argmin_g  ‖mean_{S∪{g}} φ − φ̄‖² + α²·‖mean_{S∪{g}} u − c·ū‖² + λ·redundancy(g)
  (α = direction_weight, c = direction_target; similarity and redundancy are then taken over
  the matched features [φ, α·u]). It is kernel herding under k(a, b) = a·b + α²·cos(a, b): the
  first term brings the batch's mean profile to the pool's; the second, expanded, is
  Σ_{s∈S} cos(g, s) − c·(|S| + 1)·mean_pool cos(g, ·), an MMR with *mean* redundancy and λ ≈
  1/c. A batch whose mean direction equals the pool's has mean pairwise cosine (B‖ū‖² − 1) /
  (B − 1), below the pool's; c < 1 aims slightly more diverse, so the greedy batch is no more
  redundant than a random one (measured: docs/changes/selector.md).
- "mmr", maximal marginal relevance:
      argmax_g  sim(φ_g, φ̄) − λ·redundancy(g)
  With λ = 2 the max-redundancy term outweighs alignment once S covers the main behaviours,
  so MMR then picks outliers: fine for B ≤ K/4 up to K = 64, worse than a random subset at K =
  128 (1.1× at B = 32, 3.5–4× at B = 64).
Both subtract `history_penalty(g)` from the score when a history reading is on (below).

Options — every one is this project's reconstruction **[R-choice]**:

| option          | default   | alternatives           | meaning |
| --------------- | --------- | ---------------------- | ------- |
| objective       | "composition" | "mmr"              | the greedy objective above |
| lam             | None: 0.0 for "composition", 2.0 for "mmr" | any float ≥ 0 | λ, weight of the max-redundancy term (cosine, in [0, 1]). λ = 0 makes MMR pure alignment (top-B by sim(φ_g, φ̄)); composition needs none (its direction term is the redundancy) |
| direction_weight | 2.0      | any float ≥ 0          | α ("composition" only): weight of matching the mean direction; 0 = match the mean profile alone |
| direction_target | 0.9      | [0, 1]                 | c ("composition" only): the direction target is c·ū; 1 = the pool's mean direction, smaller = more diverse |
| similarity      | "cosine"  | "dot"                  | sim(a, b); cosine of a zero vector is 0 |
| with_success    | False     | True                   | append the group's success rate to φ_g |
| history         | "none"    | "task", "profile"      | what "already-selected data" means: "none" = only the groups already in this step's S (the λ term); "task" = instances (`envs.instance_key`; seeds that generate the same game are the same instance) chosen in recent steps; "profile" = profiles similar to those chosen in recent steps |
| history_weight  | 0.5       | any float ≥ 0          | μ, weight of the history penalty (in the objective's units: against composition's squared distances, ~0.001–0.1, μ = 0.5 dominates; scale it down there) |
| history_decay   | 0.5       | (0, 1]                 | γ: a choice made d steps ago weighs γ^d |
| history_window  | 8         | int ≥ 1                | a choice made at step t weighs on steps t + 1 … t + window |

History penalties: "task": μ·γ^(t − t_last) if the group's instance was chosen at step t_last
within the window (tasks of environments outside the registry, e.g. synthetic pools, are
their own instance: `Task.key`); "profile": μ·max_{(t_h, φ_h)} γ^(t − t_h)·sim(φ_g, φ_h) over
the remembered chosen profiles. The training stream never repeats a seed, so "task" fires only
where the instance space is small enough for seeds to collide (the stream warns then);
"profile" fires whenever a candidate resembles a recent choice. The memory is updated with
this step's choice, forgets by the same bound the weight uses (so a step selected again, or
resumed, sees the same memory), and is saved by `state_dict()`.

What the objectives achieve (benchmarks/selector_alignment.py; three pool generators of
tests/select/pools.py; K = 4 … 128): the default's chosen mean tag profile is at most ~0.2× a
random subset's expected squared distance to φ̄ for K ≥ 32 (B = K/4 and K/2) and below it down
to K = 4, B = 1, with a batch less redundant than random. Composition matching of the mean
alone (direction_weight = 0) aligns as well but its batch is more redundant than random's.
As B → K every subset's mean approaches φ̄ and no greedy choice gains much (greedy forward
selection is at parity with random at B = K − 1).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from rised_jax import envs
from rised_jax.rubrics.profiles import has_judged_rollout, pool_profiles
from rised_jax.select.base import Selector, argmax_with_ties, check_choice
from rised_jax.types import Group, GroupTags, Task


def instance_of(task: Task) -> str:
  """The instance key of a task (its `Task.key` for a name that is no environment)."""
  if envs.is_environment(task.env):
    return envs.instance_key(task.env, task.seed, task.difficulty)
  return task.key


def unit_rows(x: np.ndarray) -> np.ndarray:
  """Each row of x [N, D] divided by its norm; zero rows stay zero."""
  x = np.asarray(x, np.float64)
  norms = np.linalg.norm(x, axis=-1, keepdims=True)
  return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """Pairwise cosine similarity of the rows of a [N, D] and b [M, D]; 0 for zero rows."""
  return unit_rows(a) @ unit_rows(b).T


def pairwise_similarity(kind: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
  if kind == "cosine":
    return cosine_similarity(a, b)
  return np.asarray(a, np.float64) @ np.asarray(b, np.float64).T


def untagged_fraction(tags: GroupTags) -> float:
  """The fraction of a group's judged rollouts whose tag row is empty (the judge answered `[]`:
  no behaviour of the vocabulary observed); 0 when none is judged."""
  judged = np.asarray(tags.tags, np.float64)[tags.judged]
  return float(np.mean(judged.sum(axis=1) == 0)) if len(judged) else 0.0


def matching_features(profiles: np.ndarray, direction_weight: float,
                      direction_target: float) -> tuple[np.ndarray, np.ndarray]:
  """The features composition matching compares and their target: ψ_g = [φ_g, α·φ_g/‖φ_g‖],
  shape [K, 2D], toward [φ̄, α·c·mean_g φ_g/‖φ_g‖] (α = direction_weight, c = direction_target)."""
  directions = unit_rows(profiles)
  features = np.concatenate([profiles, direction_weight * directions], axis=1)
  target = np.concatenate([profiles.mean(0), direction_weight * direction_target
                           * directions.mean(0)])
  return features, target


def greedy_select(profiles: np.ndarray, target: np.ndarray, batch_size: int, objective: str,
                  lam: float, sim: str, penalty: np.ndarray, order: np.ndarray) -> list[int]:
  """Greedy MMR / composition matching over profiles [K, D] toward `target` [D].

  `penalty` [K] is subtracted from every score (history); `order` breaks ties.
  """
  num_groups = len(profiles)
  pairwise = pairwise_similarity(sim, profiles, profiles)
  alignment = pairwise_similarity(sim, profiles, target[None])[:, 0]
  redundancy = np.zeros(num_groups)
  available = np.ones(num_groups, bool)
  total = np.zeros(profiles.shape[1])
  chosen: list[int] = []
  for _ in range(min(batch_size, num_groups)):
    if objective == "mmr":
      score = alignment - lam * redundancy
    else:
      means = (total + profiles) / (len(chosen) + 1)
      score = -(np.sum((means - target) ** 2, axis=1) + lam * redundancy)
    score = np.where(available, score - penalty, -np.inf)
    pick = argmax_with_ties(score, order)
    chosen.append(pick)
    available[pick] = False
    total += profiles[pick]
    # max over S of sim(φ_g, φ_s); the first pick sets it (redundancy is 0 while S is empty).
    redundancy = (pairwise[:, pick] if len(chosen) == 1
                  else np.maximum(redundancy, pairwise[:, pick]))
  return chosen


def behaviour_profiles(pool: Sequence[Group], tags: Sequence[GroupTags],
                       with_success: bool) -> np.ndarray:
  """φ_g for every group [K, V + 1 (+ 1)]: its mean tag vector over judged rollouts, the
  fraction of those with no tag ("no behaviour observed"), then its success rate if asked."""
  untagged = np.asarray([[untagged_fraction(t)] for t in tags], np.float64).reshape(-1, 1)
  columns = [pool_profiles(pool, tags), untagged]
  if with_success:
    columns.append(np.asarray([[g.successes.mean()] for g in pool], np.float64).reshape(-1, 1))
  return np.concatenate(columns, axis=1)


class RisedSelector(Selector):
  """Profile-guided selection; see the module docstring for the options."""

  name = "rised"
  OBJECTIVES = ("composition", "mmr")
  SIMILARITIES = ("cosine", "dot")
  HISTORIES = ("none", "task", "profile")
  DEFAULT_LAM = {"mmr": 2.0, "composition": 0.0}

  def __init__(self, objective: str = "composition", lam: float | None = None,
               similarity: str = "cosine", with_success: bool = False,
               direction_weight: float = 2.0, direction_target: float = 0.9,
               history: str = "none", history_weight: float = 0.5, history_decay: float = 0.5,
               history_window: int = 8, seed: int = 0):
    super().__init__(seed)
    check_choice(self.name, "objective", objective, self.OBJECTIVES)
    check_choice(self.name, "similarity", similarity, self.SIMILARITIES)
    check_choice(self.name, "history", history, self.HISTORIES)
    lam = self.DEFAULT_LAM[objective] if lam is None else lam
    if lam < 0 or history_weight < 0 or direction_weight < 0:
      raise ValueError(f"selector 'rised': lam={lam}, history_weight={history_weight}, "
                       f"direction_weight={direction_weight}; expected values >= 0")
    if not 0 <= direction_target <= 1:
      raise ValueError(f"selector 'rised': direction_target={direction_target}; expected [0, 1]")
    if not 0 < history_decay <= 1:
      raise ValueError(f"selector 'rised': history_decay={history_decay}; expected (0, 1]")
    if history_window < 1:
      raise ValueError(f"selector 'rised': history_window={history_window}; expected >= 1")
    self.objective = objective
    self.lam = float(lam)
    self.similarity = similarity
    self.with_success = with_success
    self.direction_weight = float(direction_weight)
    self.direction_target = float(direction_target)
    self.history = history
    self.history_weight = float(history_weight)
    self.history_decay = float(history_decay)
    self.history_window = int(history_window)
    self._task_steps: dict[str, int] = {}              # task key -> last step chosen
    self._profiles: list[tuple[int, np.ndarray]] = []  # (step, φ) of recent choices

  def _select(self, pool: Sequence[Group], tags: Sequence[GroupTags] | None, batch_size: int,
              step: int, rng: np.random.Generator) -> list[int]:
    if not pool:
      return []
    if tags is None:   # nothing judged: no group has a profile
      tags = [GroupTags(np.zeros((len(g.trajectories), 0), np.float32),
                        np.ones(len(g.trajectories), bool)) for g in pool]
    profiles = behaviour_profiles(pool, tags, self.with_success)
    order = rng.permutation(len(pool))
    has_profile = np.asarray([has_judged_rollout(t) for t in tags])
    profiled = [int(i) for i in order if has_profile[i]]     # in the step's random order
    self._forget(step)
    chosen = []
    if profiled:
      sub = profiles[profiled]
      penalty = self._history_penalty([pool[i] for i in profiled], sub, step)
      if self.objective == "composition":
        features, target = matching_features(sub, self.direction_weight, self.direction_target)
      else:
        features, target = sub, sub.mean(0)
      picks = greedy_select(features, target, batch_size, self.objective, self.lam,
                            self.similarity, penalty, np.arange(len(profiled)))
      chosen = [profiled[i] for i in picks]
    self._remember(pool, profiles, chosen, step)
    # Groups without a profile: only after every profiled group, in the same random order.
    return chosen + [int(i) for i in order if not has_profile[i]][:batch_size - len(chosen)]

  def _remembered(self, step: int, then: int) -> bool:
    """Whether a choice made at step `then` weighs on step `step`: at ages 1 … history_window.
    (Age 0, this step's own choice, is seen only when a step is selected twice: it is no
    earlier choice.)"""
    return 1 <= step - then <= self.history_window

  def _age_weight(self, step: int, then: int) -> float:
    return self.history_decay ** (step - then) if self._remembered(step, then) else 0.0

  def _forget(self, step: int) -> None:
    """Drops the choices older than the window at this step, by the bound `_remembered` uses:
    memory and weight cannot disagree about a boundary age."""
    self._task_steps = {k: t for k, t in self._task_steps.items()
                        if step - t <= self.history_window}
    self._profiles = [(t, phi) for t, phi in self._profiles if step - t <= self.history_window]

  def _history_penalty(self, pool: Sequence[Group], profiles: np.ndarray,
                       step: int) -> np.ndarray:
    penalty = np.zeros(len(pool))
    if self.history == "task":
      for i, group in enumerate(pool):
        if instance_of(group.task) in self._task_steps:
          penalty[i] = self._age_weight(step, self._task_steps[instance_of(group.task)])
    elif self.history == "profile" and self._profiles:
      past = np.stack([phi for _, phi in self._profiles])
      if past.shape[1] != profiles.shape[1]:
        raise ValueError(f"selector 'rised': remembered profiles have {past.shape[1]} entries, "
                         f"this pool's have {profiles.shape[1]}; the vocabulary or "
                         "with_success changed between steps")
      weights = np.asarray([self._age_weight(step, t) for t, _ in self._profiles])
      penalty = np.max(pairwise_similarity(self.similarity, profiles, past) * weights, axis=1)
    return self.history_weight * penalty

  def _remember(self, pool: Sequence[Group], profiles: np.ndarray, chosen: list[int],
                step: int) -> None:
    if self.history == "task":
      for i in chosen:
        self._task_steps[instance_of(pool[i].task)] = step
    elif self.history == "profile":
      self._profiles += [(step, profiles[i]) for i in chosen]

  def state_dict(self) -> dict[str, Any]:
    return {"task_steps": dict(self._task_steps),
            "profiles": [[t, phi.tolist()] for t, phi in self._profiles]}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    expected = {"task_steps", "profiles"}
    if set(state) != expected:
      raise ValueError(f"selector 'rised': state has keys {sorted(state)}; expected "
                       f"{sorted(expected)}")
    self._task_steps = {str(k): int(t) for k, t in state["task_steps"].items()}
    self._profiles = [(int(t), np.asarray(phi, np.float64)) for t, phi in state["profiles"]]
