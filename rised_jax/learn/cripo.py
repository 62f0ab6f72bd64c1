"""CriPO's array math (arXiv 2607.18082; docs/ALGORITHMS.md §3), as pure functions over arrays.

Two levels, one per place in the pipeline:

- Group level (host, numpy; arrays shaped [groups, G, criteria]): weighted rubric reward, its GRPO
  advantage (`learn.advantages.grpo`), unexplored criteria (UC), suppressed criteria (SC), the best
  rollout y*, the rollouts that get a counterfactual teacher, and the per-sample diagnostics. These
  decide which teacher contexts are built, so they run before batch assembly.
- Token level (JAX, jit-able, vectorised over rows; arrays shaped [B, T]): the localisation mask of
  the criterion-injection distillation, the counterfactual flip of per-token advantages and the
  β warm-up. `learn.train_step` calls them on the per-token quantities of its chunked scan and
  counts the token diagnostics over the whole batch (`kept_frac`: kept tokens / the injection
  rows' distillation tokens; `flip_frac`: flipped tokens / the counterfactual rows' response
  tokens).

Definitions stated by the paper, and this implementation's choices ([C-choice], named options):

- Reward R_i = Σ_j ω_j r_ij / Z. Z = Σ_j ω_j as in the paper (`normalizer="sum"`; pitfalls with
  ω_j < 0 lower Z, and Z <= 0 is an error), or Σ_j |ω_j| ("abs"), or Σ_{ω_j>0} ω_j ("positive",
  R = 1 when every positive criterion is met and no pitfall). [C-choice: the alternatives]
- GRPO advantage A_i = (R_i − mean R) / (std R + eps), population std, as
  `learn.advantages.grpo`, but computed from the exact centred rewards below (float64, then
  float32): a rollout at the group mean gets A = 0 exactly, and a flat group A ≡ 0.
- Exactness of the sign decisions. SC, y* and the counterfactual rollouts depend only on signs
  and ties of sums of A_i. Since A_i is (R_i − mean R) times a positive per-group factor, they
  are decided on D_i = G·s_i − Σ_k s_k with s_i = Σ_j W_j r_ij and W_j = L·ω_j the weights
  scaled to integers (L: the common denominator of the weights). A weight that is an exact
  rational (`fractions.Fraction` or int, as `rubric_tasks` reads a task file: the number's own
  text, or a "1/18" string) is taken as it is, so a rubric normalised by its sum decides as its
  integers would; a float is read as the shortest decimal that round-trips in its dtype, so
  float32 0.1 + 0.2 = 0.3.
  D_i = G·L·Z·(R_i − mean R) is a Python integer: no rounding, no tolerance. (Dividing
  float32 sums by std R amplifies rounding to ~1e-5; an absolute tolerance of 1e-6 on float32
  advantages mislabelled SC in 6–9 % of simulated RaR-like groups.)
- UC: C_u = {j : r_ij = 0 ∀ i}; if |C_u| > 3 keep the 3 largest ω_j, ties broken by the lower
  criterion index (rubric order). Pitfalls (ω_j < 0) are excluded by default: a pitfall nobody
  committed is a success, and a teacher told to "satisfy" it would teach the pitfall
  (`include_pitfalls=True` admits them; they then rank last by weight). [C-choice]
- SC (ω_j > 0 only): S_j = {i : r_ij = 1} non-empty and (Σ_{i∈S_j} A_i < 0, or Σ_{i∈S_j} A_i = 0
  and |S_j| < G/2), decided exactly on Σ_{i∈S_j} D_i; |S_j| < G/2 is tested as 2|S_j| < G.
- y* = argmax_i A_i (exactly: argmax D_i); ties go to the lowest rollout index (the earliest
  sampled).
- Counterfactual rollouts: A_i < 0 (D_i < 0) and r_ij = 1 for at least one SC criterion j.
- Localisation (per row): KL clamped to [0, kl_clamp]; among the row's response tokens (in order),
  the first and last e = floor(edge_fraction · n) are masked (n response tokens; e may be 0); the
  remaining tokens are sorted by clamped KL, descending, ties by position (earlier first); keep
  the shortest prefix whose KL sum reaches γ · (total KL of the unmasked tokens). A row whose total
  is 0 keeps nothing. Tokens with KL 0 are never needed, so never kept. The loss uses the same
  clamp, min(KL, kl_clamp), so a token above it has no gradient; `StepConfig.clamp_loss=False`
  keeps the clamp for the ranking only. [C-choice]
- L_distill = mean KL over the kept tokens of the whole batch: `train_step`'s
  `distill_norm="kept-tokens"`, exact under micro-batching and data sharding. [C-choice:
  normalisation; the alternative "distill-tokens" divides by all distillation tokens]
- Flip: on rows with a counterfactual teacher, token t flips when A_t < 0,
  log p_S(y_t) − log p_T(y_t) > 0 and p_T(y_t) < α · max_v p_T(v) (both strict); flipped tokens get
  A_t = τ_flip = +0.1.
- β(step) = β · min(1, (step + 1) / warmup_steps) for step = 0, 1, ...: full β from step
  warmup_steps − 1 on (step 49 with the paper's 50); warmup_steps = 0 means constant β.
"""
from __future__ import annotations

import dataclasses
import fractions
import math
import numbers
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rised_jax.checks import is_int

REWARD_NORMALIZERS = ("sum", "abs", "positive")
PAPER_BETA = {"qwen3-1.7b": 0.05, "qwen3-4b": 0.03}


@dataclasses.dataclass(frozen=True)
class CriPOGroupConfig:
  """Options of the group-level stage (`analyse_groups`); defaults are the paper's.

  The token-level hyperparameters (γ, KL clamp, edge fraction, α, τ_flip, β and its warm-up) are
  keyword arguments of the token-level functions, set by the train step's static config.
  """

  reward_normalizer: str = "sum"
  adv_eps: float = 1e-6
  max_uc: int = 3
  uc_include_pitfalls: bool = False

  def __post_init__(self):
    if self.reward_normalizer not in REWARD_NORMALIZERS:
      raise ValueError(f"cripo.reward_normalizer={self.reward_normalizer!r}; expected one of "
                       f"{REWARD_NORMALIZERS}")
    if not is_int(self.max_uc) or self.max_uc < 0:
      raise ValueError(f"cripo.max_uc={self.max_uc!r}; expected an integer >= 0")
    if not self.adv_eps >= 0:
      raise ValueError(f"cripo.adv_eps={self.adv_eps!r}; expected a number >= 0")


def _check_static_range(name: str, value: object, low: float, high: float) -> None:
  """Rejects an out-of-range Python number before tracing; traced values pass through."""
  if isinstance(value, (int, float)) and not low < value <= high:
    raise ValueError(f"{name}={value}; expected {low} < {name} <= {high}")


# ---------------------------------------------------------------------------------------------
# Group level (numpy).


def pad_criteria(verdicts: Sequence[np.ndarray], weights: Sequence[np.ndarray]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Stacks groups whose prompts have different numbers of criteria.

  Args:
    verdicts: per group, r_ij as [G, C_g] (0/1); every group has the same G.
    weights: per group, ω as [C_g].
  Returns:
    verdicts [groups, G, C] float32, weights [groups, C] and criterion_mask [groups, C] bool,
    padded to C = max C_g (padding: r = 0, ω = 0, mask False). The weights stay exact
    (object) when any group's are exact rationals (`rubric_tasks.RubricTask.weights`), else
    float32.
  """
  if len(verdicts) != len(weights) or not verdicts:
    raise ValueError(f"need one weight vector per group and at least one group; got {len(verdicts)} "
                     f"verdict arrays and {len(weights)} weight vectors")
  verdicts = [np.asarray(v, np.float32) for v in verdicts]
  exact = any(np.asarray(w).dtype == object for w in weights)
  weights = [np.asarray(w, object if exact else np.float32) for w in weights]
  group_size = verdicts[0].shape[0]
  for g, (v, w) in enumerate(zip(verdicts, weights)):
    if v.ndim != 2 or w.ndim != 1 or v.shape != (group_size, w.shape[0]):
      raise ValueError(f"group {g}: verdicts {v.shape} and weights {w.shape} do not match "
                       f"[G={group_size}, C] and [C]")
  num_criteria = max(w.shape[0] for w in weights)
  padded_v = np.zeros((len(verdicts), group_size, num_criteria), np.float32)
  padded_w = np.zeros((len(verdicts), num_criteria), object if exact else np.float32)
  mask = np.zeros((len(verdicts), num_criteria), bool)
  for g, (v, w) in enumerate(zip(verdicts, weights)):
    padded_v[g, :, :w.shape[0]] = v
    padded_w[g, :w.shape[0]] = w
    mask[g, :w.shape[0]] = True
  return padded_v, padded_w, mask


def _validated(verdicts, weights, criterion_mask):
  """float64 verdicts (0 where masked), float64 weights (0 where masked), bool mask."""
  verdicts = np.asarray(verdicts, np.float64)
  weights = np.asarray(weights, np.float64)
  if verdicts.ndim != 3 or weights.shape != (verdicts.shape[0], verdicts.shape[2]):
    raise ValueError(f"verdicts must be [groups, G, C] and weights [groups, C]; got {verdicts.shape} "
                     f"and {weights.shape}")
  mask = (np.ones(weights.shape, bool) if criterion_mask is None
          else np.asarray(criterion_mask, bool))
  if mask.shape != weights.shape:
    raise ValueError(f"criterion_mask {mask.shape} must match weights {weights.shape}")
  verdicts = np.where(mask[:, None, :], verdicts, 0.0)
  if not np.isin(verdicts, (0.0, 1.0)).all():
    raise ValueError("verdicts r_ij must be 0 or 1")
  if not np.isfinite(weights).all():
    raise ValueError("weights must be finite")
  return verdicts, np.where(mask, weights, 0.0), mask


def _denominators(weights: np.ndarray, normalizer: str) -> np.ndarray:
  """Z per group for `normalizer`, from weights [groups, C] (float or exact integers)."""
  if normalizer == "sum":
    return weights.sum(-1)
  if normalizer == "abs":
    return np.abs(weights).sum(-1)
  if normalizer == "positive":
    return np.where(weights > 0, weights, 0 * weights).sum(-1)
  raise ValueError(f"normalizer={normalizer!r}; expected one of {REWARD_NORMALIZERS}")


def _check_denominators(denominator: np.ndarray, weights: np.ndarray, normalizer: str) -> None:
  bad = np.flatnonzero(denominator <= 0)
  if bad.size:
    g = int(bad[0])
    raise ValueError(f"group {g}: reward normaliser {normalizer!r} gives {float(denominator[g]):g} <= 0 for "
                     f"weights {weights[g].tolist()}; use normalizer 'positive' or 'abs' for such rubrics")


def weighted_rewards(verdicts: np.ndarray, weights: np.ndarray, criterion_mask: np.ndarray | None = None,
                     normalizer: str = "sum") -> np.ndarray:
  """R_i = Σ_j ω_j r_ij / Z per rollout, float32 [groups, G] (Z: see the module docstring)."""
  verdicts, weights, _ = _validated(verdicts, weights, criterion_mask)
  denominator = _denominators(weights, normalizer)
  _check_denominators(denominator, weights, normalizer)
  return (np.einsum("gic,gc->gi", verdicts, weights) / denominator[:, None]).astype(np.float32)


def _exact_weight(weight) -> fractions.Fraction:
  """An exact rational (Fraction, int) as it is; a float as the shortest decimal that
  round-trips in its own dtype (a float32 0.1 is 1/10, not 13421773/134217728)."""
  if isinstance(weight, numbers.Rational):
    return fractions.Fraction(weight)
  return fractions.Fraction(np.format_float_positional(weight, unique=True, trim="-"))


def _integer_weights(weights: np.ndarray) -> np.ndarray:
  """W = L·ω as Python ints, object [groups, C]; L per group (see the module docstring)."""
  weights = np.asarray(weights)
  as_fractions = [[_exact_weight(w) for w in row] for row in weights]
  out = np.empty(weights.shape, object)
  for g, row in enumerate(as_fractions):
    scale = math.lcm(*(f.denominator for f in row)) if row else 1
    out[g] = [int(f * scale) for f in row]
  return out


def _exact_scores(verdicts, weights, criterion_mask) -> tuple[np.ndarray, np.ndarray]:
  """(D object [groups, G], integer weights W object [groups, C]); see `exact_centred_rewards`."""
  verdicts_f, _, mask = _validated(verdicts, weights, criterion_mask)
  integer_weights = _integer_weights(np.where(mask, np.asarray(weights), 0))
  met = verdicts_f.astype(np.int64).astype(object)
  scores = np.einsum("gic,gc->gi", met, integer_weights)          # s_i, exact
  return verdicts_f.shape[1] * scores - scores.sum(-1, keepdims=True), integer_weights


def exact_centred_rewards(verdicts: np.ndarray, weights: np.ndarray,
                          criterion_mask: np.ndarray | None = None) -> np.ndarray:
  """D_i = G·s_i − Σ_k s_k with s_i = Σ_j W_j r_ij: Python ints, object [groups, G].

  D_i = G·L·Z·(R_i − mean R) for every normaliser Z > 0, so D has the signs, zeros and order
  of A_i and of every sum of A_i over a set of rollouts, exactly (module docstring).
  """
  return _exact_scores(verdicts, weights, criterion_mask)[0]


def exact_advantages(verdicts: np.ndarray, weights: np.ndarray, criterion_mask: np.ndarray | None = None,
                     normalizer: str = "sum", eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
  """(GRPO advantages float32 [groups, G], exact centred rewards D object [groups, G]).

  A_i = (R_i − mean R) / (std R + eps) (population std), with R_i − mean R = D_i / (G·L·Z)
  formed as an exact fraction and rounded once to float64: A_i = 0 exactly where D_i = 0
  and has the sign of D_i elsewhere.
  """
  if not eps >= 0:
    raise ValueError(f"eps={eps!r}; expected a number >= 0")
  centred, integer_weights = _exact_scores(verdicts, weights, criterion_mask)
  scale = _denominators(integer_weights, normalizer)           # L·Z per group, exact
  _check_denominators(scale, np.asarray(weights, np.float64), normalizer)
  group_size = centred.shape[1]
  deviation = np.array([[float(fractions.Fraction(d, group_size * z)) for d in row]
                        for row, z in zip(centred, scale)], np.float64).reshape(centred.shape)
  std = np.sqrt((deviation ** 2).mean(-1, keepdims=True))
  return (deviation / (std + eps)).astype(np.float32), centred


def unexplored_criteria(verdicts: np.ndarray, weights: np.ndarray, criterion_mask: np.ndarray | None = None,
                        max_uc: int = 3, include_pitfalls: bool = False) -> np.ndarray:
  """UC mask, bool [groups, C]: criteria no rollout met, at most max_uc per group.

  Kept: the largest weights; among equal weights the lower criterion index.
  """
  verdicts, weights, mask = _validated(verdicts, weights, criterion_mask)
  candidates = mask & (verdicts.sum(1) == 0)
  if not include_pitfalls:
    candidates &= weights > 0
  # Stable sort of −ω puts larger weights first and keeps rubric order among equal weights.
  sort_key = np.where(candidates, -weights, np.inf)
  order = np.argsort(sort_key, axis=-1, kind="stable")
  rank = np.argsort(order, axis=-1, kind="stable")
  return candidates & (rank < max_uc)


def suppressed_criteria(verdicts: np.ndarray, weights: np.ndarray, centred: np.ndarray,
                        criterion_mask: np.ndarray | None = None) -> np.ndarray:
  """SC mask, bool [groups, C] (rule in the module docstring).

  Args:
    centred: [groups, G], any positive per-group multiple of A_i, compared exactly: pass
      `exact_centred_rewards` (Python ints), not float advantages.
  """
  verdicts, weights, mask = _validated(verdicts, weights, criterion_mask)
  centred = np.asarray(centred)
  if centred.shape != verdicts.shape[:2]:
    raise ValueError(f"centred rewards {centred.shape} must be [groups, G] = {verdicts.shape[:2]}")
  group_size = verdicts.shape[1]
  met = verdicts.astype(np.int64)
  satisfied = met.sum(1)                                       # |S_j|
  subset_sum = np.einsum("gic,gi->gc", met.astype(object), centred.astype(object))  # Σ_{i∈S_j} D_i
  negative = (subset_sum < 0).astype(bool)
  tie_minority = (subset_sum == 0).astype(bool) & (2 * satisfied < group_size)
  return mask & (weights > 0) & (satisfied > 0) & (negative | tie_minority)


def best_rollout(centred: np.ndarray) -> np.ndarray:
  """y*: index of the highest A_i per group (pass the exact D_i), int [groups]; ties: lowest index."""
  centred = np.asarray(centred)
  if centred.ndim != 2:
    raise ValueError(f"advantages must be [groups, G]; got {centred.shape}")
  return np.argmax(centred, axis=-1)     # the first maximum


def counterfactual_rollouts(verdicts: np.ndarray, sc_mask: np.ndarray, centred: np.ndarray) -> np.ndarray:
  """Rollouts that get a counterfactual teacher, bool [groups, G]: A_i < 0 (D_i < 0) and ≥ 1 SC met."""
  verdicts = np.asarray(verdicts) > 0
  meets_sc = (verdicts & np.asarray(sc_mask, bool)[:, None, :]).any(-1)
  return meets_sc & (np.asarray(centred) < 0).astype(bool)


@dataclasses.dataclass(frozen=True)
class GroupAnalysis:
  """Everything CriPO decides per group before the batch is assembled."""

  rewards: np.ndarray          # [groups, G] R_i
  advantages: np.ndarray       # [groups, G] A_i, float32
  centred: np.ndarray          # [groups, G] exact D_i (Python ints), the sign of A_i
  uc_mask: np.ndarray          # [groups, C] criteria for the injection teacher
  sc_mask: np.ndarray          # [groups, C]
  best: np.ndarray             # [groups] y* index (its teacher applies only where uc_mask.any())
  cf_rollouts: np.ndarray      # [groups, G] rollouts that get a counterfactual teacher
  cf_criteria: np.ndarray      # [groups, G, C] the SC criteria each of those rollouts meets


def analyse_groups(verdicts: np.ndarray, weights: np.ndarray, criterion_mask: np.ndarray | None,
                   config: CriPOGroupConfig) -> GroupAnalysis:
  """Runs the group-level definitions in order: reward, advantage, UC, SC, y*, SC targets."""
  rewards = weighted_rewards(verdicts, weights, criterion_mask, config.reward_normalizer)
  advantages, centred = exact_advantages(verdicts, weights, criterion_mask, config.reward_normalizer,
                                         config.adv_eps)
  uc = unexplored_criteria(verdicts, weights, criterion_mask, config.max_uc, config.uc_include_pitfalls)
  sc = suppressed_criteria(verdicts, weights, centred, criterion_mask)
  cf = counterfactual_rollouts(verdicts, sc, centred)
  cf_criteria = (np.asarray(verdicts) > 0) & sc[:, None, :] & cf[:, :, None]
  return GroupAnalysis(rewards, advantages, centred, uc, sc, best_rollout(centred), cf, cf_criteria)


def group_diagnostics(uc_mask: np.ndarray, sc_mask: np.ndarray) -> dict[str, float]:
  """Per-sample rates; a sample is one prompt (its group of G rollouts), where UC/SC live."""
  uc_mask, sc_mask = np.asarray(uc_mask, bool), np.asarray(sc_mask, bool)
  return {
      "cripo/frac_samples_with_uc": float(uc_mask.any(-1).mean()),
      "cripo/frac_samples_with_sc": float(sc_mask.any(-1).mean()),
      "cripo/sc_per_sample": float(sc_mask.sum(-1).mean()),
  }


# ---------------------------------------------------------------------------------------------
# Token level (JAX).


def _edge_ratio(edge_fraction: float) -> fractions.Fraction:
  """edge_fraction as an exact ratio, so floor(edge_fraction · n) is integer arithmetic."""
  if not 0.0 <= edge_fraction < 0.5:
    raise ValueError(f"edge_fraction={edge_fraction}; expected 0 <= edge_fraction < 0.5")
  ratio = fractions.Fraction(edge_fraction).limit_denominator(1000)
  if abs(float(ratio) - edge_fraction) > 1e-12:
    raise ValueError(f"edge_fraction={edge_fraction} is not a ratio with denominator <= 1000 (e.g. 0.01)")
  return ratio


def localisation_mask(kl: jnp.ndarray, response_mask: jnp.ndarray, *, gamma: float = 0.95,
                      kl_clamp: float = 10.0, edge_fraction: float = 0.01) -> jnp.ndarray:
  """Tokens kept for the injection distillation, bool [B, T] (rule in the module docstring).

  Args:
    kl: per-token forward KL(p_T ‖ p_S) [B, T], finite.
    response_mask: [B, T], nonzero on the response tokens of the rows being distilled.
    gamma, kl_clamp: may be traced; edge_fraction is a Python float (static).
  """
  ratio = _edge_ratio(edge_fraction)
  _check_static_range("gamma", gamma, 0.0, 1.0)
  _check_static_range("kl_clamp", kl_clamp, 0.0, float("inf"))
  response = response_mask > 0
  count = response.sum(-1, keepdims=True)                     # n
  position = jnp.cumsum(response, axis=-1) - 1                # index among the response tokens
  edge = (count * ratio.numerator) // ratio.denominator       # floor(edge_fraction · n)
  eligible = response & (position >= edge) & (position < count - edge)
  values = jnp.where(eligible, jnp.clip(kl, 0.0, kl_clamp), 0.0)
  order = jnp.argsort(values, axis=-1, descending=True, stable=True)
  prefix = jnp.cumsum(jnp.take_along_axis(values, order, axis=-1), axis=-1)
  total = prefix[:, -1:]
  # The shortest prefix reaching γ·total has length 1 + #{k : prefix_k < γ·total}.
  keep_count = jnp.where(total > 0, jnp.sum(prefix < gamma * total, axis=-1, keepdims=True) + 1, 0)
  rank = jnp.argsort(order, axis=-1)                          # sorted position of each token
  return rank < keep_count


def counterfactual_flips(student_logprobs: jnp.ndarray, teacher_logprobs: jnp.ndarray,
                         teacher_max_logprobs: jnp.ndarray, advantages: jnp.ndarray, cf_mask: jnp.ndarray,
                         *, alpha: float = 0.1, tau_flip: float = 0.1) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Edits per-token advantages with the counterfactual teacher; all inputs [B, T].

  Args:
    student_logprobs: log p_S(y_t) under the student context.
    teacher_logprobs: log p_T(y_t) under the counterfactual teacher context.
    teacher_max_logprobs: log max_v p_T(v) at the same position.
    advantages: per-token A_t.
    cf_mask: nonzero on the response tokens of the rollouts with a counterfactual teacher.
  Returns:
    (edited advantages, bool flip mask): flipped tokens carry tau_flip, others keep A_t.
  """
  _check_static_range("alpha", alpha, 0.0, 1.0)
  flip = ((cf_mask > 0) & (advantages < 0)
          & (student_logprobs - teacher_logprobs > 0)
          & (teacher_logprobs - teacher_max_logprobs < jnp.log(alpha)))
  return jnp.where(flip, jnp.asarray(tau_flip, advantages.dtype), advantages), flip


def beta_schedule(step: jax.typing.ArrayLike, beta: float, warmup_steps: int = 50) -> jnp.ndarray:
  """β(step) = β · min(1, (step + 1) / warmup_steps); constant β when warmup_steps is 0."""
  if warmup_steps < 0:
    raise ValueError(f"warmup_steps={warmup_steps}; expected an integer >= 0")
  if warmup_steps == 0:
    return jnp.asarray(beta, jnp.float32)
  ramp = (jnp.asarray(step, jnp.float32) + 1.0) / warmup_steps
  return jnp.asarray(beta, jnp.float32) * jnp.clip(ramp, 0.0, 1.0)

