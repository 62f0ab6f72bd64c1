"""Per-token loss terms and their aggregation (docs/ALGORITHMS.md §1.2, §1.4).

Every function here is pure array math over per-token arrays of any leading shape (usually
[B, T]); vocabulary-sized inputs have a trailing axis V. Arrays that describe fixed data (old,
behaviour and reference log-probs, advantages, teacher log-probs or logits) are wrapped in
`stop_gradient`: gradients flow only into the current policy's log-probs / logits.

Masks: wherever a `mask` is accepted, tokens with mask 0 get value 0 and gradient 0. Per-token
log-prob inputs are neutralised there before any `exp`, and aggregation selects rather than
multiplies, so padding columns holding arbitrary values never turn into inf/NaN.

Contents:
- `clipped_policy_gradient`: PPO/DAPO clipped surrogate on per-token advantages, optional
  dual clip and truncated behaviour importance weight, with per-token clip indicators.
- `KL_ESTIMATORS` k1/k2/k3 and `reference_kl`: the reference-KL penalty.
- `AGGREGATIONS`: token-mean / seq-mean-token-mean / seq-mean-token-sum-norm, each returning
  (sum, denominator) so that micro-batches and data-parallel shards add up exactly.
- `DIVERGENCES` forward KL / reverse KL / generalised JSD, `logprob_divergence` and
  `token_divergence` over the full vocabulary or the teacher's top-k plus a tail bucket, and
  `sampled_token_surrogate` (the cheap estimator at the sampled token).
"""
from __future__ import annotations

from typing import Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp

from rised_jax import plugins
from rised_jax.checks import is_int

Array = jax.Array
ArrayLike = jax.typing.ArrayLike


def _active(mask: ArrayLike | None, like: Array) -> Array:
  """Boolean [like.shape] array of the tokens that carry loss (all True without a mask)."""
  if mask is None:
    return jnp.ones(like.shape, bool)
  mask = jnp.asarray(mask)
  if mask.shape != like.shape:
    raise ValueError(f"mask shape {mask.shape} does not match per-token shape {like.shape}")
  return mask > 0


def _check_same_shape(**arrays: Array) -> None:
  shapes = {name: a.shape for name, a in arrays.items()}
  if len(set(shapes.values())) != 1:
    raise ValueError(f"per-token inputs must share one shape; got {shapes}")


# ------------------------------------------------------------------ policy gradient


class PolicyGradientTerms(NamedTuple):
  """Per-token outputs of `clipped_policy_gradient`; the indicators are 0/1 float32."""

  loss: Array            # the per-token loss (0 on masked tokens)
  clipped_high: Array    # A > 0 and ρ > 1 + ε_high: the upper clip is active (no gradient)
  clipped_low: Array     # A < 0 and ρ < 1 − ε_low: the lower clip is active (no gradient)
  clipped_dual: Array    # A < 0 and ρ > c: the dual clip bounds the loss at −c·A
  weight_truncated: Array  # the behaviour importance weight hit its cap C


def clipped_policy_gradient(logp: ArrayLike, old_logp: ArrayLike, advantages: ArrayLike,
                            mask: ArrayLike | None = None,
                            behaviour_logp: ArrayLike | None = None, *,
                            eps_low: float = 0.2, eps_high: float = 0.2,
                            dual_clip: float | None = None,
                            importance_cap: float | None = None) -> PolicyGradientTerms:
  """The clipped policy-gradient loss of each token, on per-token advantages.

  With ρ_t = exp(logp_t − old_logp_t):
    ℓ_t = −min(ρ_t A_t, clip(ρ_t, 1 − ε_low, 1 + ε_high) A_t)
  dual clip (Ye et al., 2020), for A_t < 0 only:  ℓ_t = min(ℓ_t, −c·A_t)
  truncated behaviour importance weight (a detached multiplier):
    ℓ_t ← w_t · ℓ_t,  w_t = min(exp(old_logp_t − behaviour_logp_t), C)

  Args:
    logp: log π_θ(y_t) of the current policy (the only input that receives gradients).
    old_logp: log π_old(y_t), the policy that the ratio is taken against.
    advantages: A_t per token.
    mask: 1 on tokens that carry loss.
    behaviour_logp: log π_behaviour(y_t) of the policy that sampled y_t; None: w_t = 1.
    eps_low: lower clip range, in [0, 1).
    eps_high: upper clip range, >= 0 (DAPO's clip-higher uses eps_high > eps_low).
    dual_clip: c > 1, or None for no dual clip.
    importance_cap: C > 0, or None for an untruncated importance weight.

  Returns:
    `PolicyGradientTerms`, every field shaped like `logp`.
  """
  if not 0.0 <= eps_low < 1.0:
    raise ValueError(f"eps_low must be in [0, 1); got {eps_low}")
  if not eps_high >= 0.0:
    raise ValueError(f"eps_high must be >= 0; got {eps_high}")
  if dual_clip is not None and not dual_clip > 1.0:
    raise ValueError(f"dual_clip must be > 1 (or None); got {dual_clip}")
  if importance_cap is not None and not importance_cap > 0.0:
    raise ValueError(f"importance_cap must be > 0 (or None); got {importance_cap}")
  logp = jnp.asarray(logp, jnp.float32)
  old_logp = jax.lax.stop_gradient(jnp.asarray(old_logp, jnp.float32))
  advantages = jax.lax.stop_gradient(jnp.asarray(advantages, jnp.float32))
  _check_same_shape(logp=logp, old_logp=old_logp, advantages=advantages)
  active = _active(mask, logp)

  ratio = jnp.exp(jnp.where(active, logp - old_logp, 0.0))
  unclipped = -ratio * advantages
  clipped = -jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
  loss = jnp.maximum(unclipped, clipped)
  negative = advantages < 0
  if dual_clip is None:
    clipped_dual = jnp.zeros_like(active)
  else:
    clipped_dual = negative & (loss > -dual_clip * advantages)
    loss = jnp.where(clipped_dual, -dual_clip * advantages, loss)

  if behaviour_logp is None:
    weight_truncated = jnp.zeros_like(active)
  else:
    behaviour_logp = jax.lax.stop_gradient(jnp.asarray(behaviour_logp, jnp.float32))
    _check_same_shape(logp=logp, behaviour_logp=behaviour_logp)
    weight = jnp.exp(jnp.where(active, old_logp - behaviour_logp, 0.0))
    if importance_cap is None:
      weight_truncated = jnp.zeros_like(active)
    else:
      weight_truncated = weight > importance_cap
      weight = jnp.minimum(weight, importance_cap)
    loss = weight * loss

  def per_token(indicator: Array) -> Array:
    return (indicator & active).astype(jnp.float32)

  return PolicyGradientTerms(
      loss=jnp.where(active, loss, 0.0),
      clipped_high=per_token((advantages > 0) & (ratio > 1.0 + eps_high)),
      clipped_low=per_token(negative & (ratio < 1.0 - eps_low)),
      clipped_dual=per_token(clipped_dual),
      weight_truncated=per_token(weight_truncated),
  )


# ------------------------------------------------------------------ reference KL


def kl_k1(logp: Array, ref_logp: Array) -> Array:
  """k1 = log π_θ − log π_ref: unbiased, high variance, can be negative."""
  return logp - ref_logp


def kl_k2(logp: Array, ref_logp: Array) -> Array:
  """k2 = ½ (log π_θ − log π_ref)²: biased, low variance, >= 0."""
  return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: Array, ref_logp: Array) -> Array:
  """k3 = exp(q − p) − (q − p) − 1 with p = log π_θ, q = log π_ref: unbiased, >= 0.

  As expm1(x) − x: exp(x) − x − 1 in float32 loses every digit for |x| <= 3e-4 (it gave 0)
  and 4.7 % at 1e-3; with expm1 the error there is about 1e-4 relative."""
  log_ratio = ref_logp - logp
  return jnp.expm1(log_ratio) - log_ratio


# Per-token estimators of KL(π_θ ‖ π_ref) from tokens sampled by π_θ (Schulman, "Approximating
# KL divergence", 2020). Sign convention: with r = π_ref(y)/π_θ(y), k1 = −log r,
# k2 = ½ (log r)², k3 = (r − 1) − log r; all three vanish when the policies agree.
KL_ESTIMATORS = plugins.Registry("KL estimator", "step.ref_kl_estimator", {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
}, check=plugins.check_function("KL estimator"))


def reference_kl(logp: ArrayLike, ref_logp: ArrayLike, mask: ArrayLike | None = None, *,
                 estimator: str = "k3") -> Array:
  """The per-token reference-KL penalty with the named estimator (0 on masked tokens)."""
  estimate = KL_ESTIMATORS.lookup(estimator)
  logp = jnp.asarray(logp, jnp.float32)
  ref_logp = jax.lax.stop_gradient(jnp.asarray(ref_logp, jnp.float32))
  _check_same_shape(logp=logp, ref_logp=ref_logp)
  active = _active(mask, logp)
  # Equal inputs on masked tokens give an estimate of exactly 0 with finite gradients.
  return estimate(jnp.where(active, logp, 0.0), jnp.where(active, ref_logp, 0.0))


# ------------------------------------------------------------------ aggregation


def _masked(loss: ArrayLike, mask: ArrayLike) -> tuple[Array, Array]:
  """float32 loss with masked entries replaced by 0 (so NaN/inf there cannot leak) and weights."""
  loss = jnp.asarray(loss, jnp.float32)
  if loss.ndim < 1:
    raise ValueError(f"per-token loss must have a sequence axis; got shape {loss.shape}")
  active = _active(mask, loss)
  return jnp.where(active, loss, 0.0), jnp.where(active, jnp.asarray(mask, jnp.float32), 0.0)


def token_mean(loss: ArrayLike, mask: ArrayLike, *,
               seq_len_norm: ArrayLike | None = None) -> tuple[Array, Array]:
  """(Σ mask·ℓ, Σ mask): the mean over every loss token of the global batch (DAPO).

  `seq_len_norm` is accepted, and ignored, so that every aggregation has one signature.
  """
  del seq_len_norm
  loss, weight = _masked(loss, mask)
  return (weight * loss).sum(), weight.sum()


def seq_mean_token_mean(loss: ArrayLike, mask: ArrayLike, *,
                        seq_len_norm: ArrayLike | None = None) -> tuple[Array, Array]:
  """(Σ_seq mean_t ℓ, number of non-empty sequences): mean over tokens, then sequences (GRPO).

  `seq_len_norm` is accepted, and ignored, so that every aggregation has one signature.
  """
  del seq_len_norm
  loss, weight = _masked(loss, mask)
  tokens = weight.sum(axis=-1)
  non_empty = tokens > 0
  per_seq = (weight * loss).sum(axis=-1) / jnp.where(non_empty, tokens, 1.0)
  return jnp.where(non_empty, per_seq, 0.0).sum(), non_empty.sum().astype(jnp.float32)


def seq_mean_token_sum_norm(loss: ArrayLike, mask: ArrayLike, *,
                            seq_len_norm: ArrayLike | None = None) -> tuple[Array, Array]:
  """(Σ_seq Σ_t mask·ℓ / L_norm, number of non-empty sequences) (Dr. GRPO).

  L_norm (`seq_len_norm`) is a constant, e.g. the maximum response length. Sequences without
  any loss token are not counted: they are the padding rows that bucketed batch shapes add,
  and counting them would make the mean depend on the bucket.
  """
  if seq_len_norm is None:
    raise ValueError("seq-mean-token-sum-norm needs seq_len_norm (the constant length L_norm)")
  if isinstance(seq_len_norm, (int, float)) and not seq_len_norm > 0:
    raise ValueError(f"seq_len_norm must be > 0; got {seq_len_norm}")
  loss, weight = _masked(loss, mask)
  non_empty = weight.sum(axis=-1) > 0
  total = (weight * loss).sum() / jnp.asarray(seq_len_norm, jnp.float32)
  return total, non_empty.sum().astype(jnp.float32)


# Each returns (sum, denominator); add these over micro-batches / shards, then divide once
# with `mean_from_parts`. The last axis is the sequence axis.
AGGREGATIONS = plugins.Registry("loss aggregation", "step.aggregation", {
    "token-mean": token_mean,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}, check=plugins.check_function("loss aggregation"))


def mean_from_parts(total: ArrayLike, count: ArrayLike) -> Array:
  """total / count, and 0 when count is 0 (a batch without any loss token)."""
  total = jnp.asarray(total, jnp.float32)
  count = jnp.asarray(count, jnp.float32)
  return jnp.where(count > 0, total / jnp.where(count > 0, count, 1.0), 0.0)


# ------------------------------------------------------------------ distillation divergences


def _kl(p_logp: Array, q_logp: Array) -> Array:
  """KL(p ‖ q) over the last axis, from normalised log-probs."""
  return (jnp.exp(p_logp) * (p_logp - q_logp)).sum(axis=-1)


def forward_kl(student_logp: Array, teacher_logp: Array) -> Array:
  """KL(p_T ‖ p_S) = Σ_v p_T(v) (log p_T(v) − log p_S(v)): mode-covering."""
  return _kl(teacher_logp, student_logp)


def reverse_kl(student_logp: Array, teacher_logp: Array) -> Array:
  """KL(p_S ‖ p_T) = Σ_v p_S(v) (log p_S(v) − log p_T(v)): mode-seeking."""
  return _kl(student_logp, teacher_logp)


def generalized_jsd(student_logp: Array, teacher_logp: Array, *, beta: float = 0.5) -> Array:
  """Generalised Jensen–Shannon divergence JSD_β (the convention of GKD, Agarwal et al. 2024).

  M = β p_T + (1 − β) p_S,  JSD_β = β KL(p_T ‖ M) + (1 − β) KL(p_S ‖ M),  β ∈ (0, 1).
  β = 0.5 is the symmetric JSD (bounded by log 2). Limits: JSD_β → 0 at both ends, with
  JSD_β / β → KL(p_T ‖ p_S) as β → 0 and JSD_β / (1 − β) → KL(p_S ‖ p_T) as β → 1; the end
  points themselves are rejected rather than silently replaced by the (unscaled) KLs: use
  "forward-kl" or "reverse-kl" for those.
  """
  if not 0.0 < beta < 1.0:
    raise ValueError(f"jsd beta must be in (0, 1); got {beta} "
                     "(use 'forward-kl' / 'reverse-kl' for the limits)")
  mixture_logp = jnp.logaddexp(jnp.log(beta) + teacher_logp,
                               jnp.log1p(-beta) + student_logp)
  return beta * _kl(teacher_logp, mixture_logp) + (1.0 - beta) * _kl(student_logp, mixture_logp)


# Signature (student_logp [..., S], teacher_logp [..., S], **options) -> [...]: normalised
# log-probs over a common support S (the vocabulary, or top-k plus tail).
DIVERGENCES = plugins.Registry("distillation divergence", "step.divergence", {
    "forward-kl": forward_kl,
    "reverse-kl": reverse_kl,
    "jsd": generalized_jsd,
}, check=plugins.check_function("distillation divergence"))


def topk_support(student_logp: Array, teacher_logp: Array,
                 topk: int) -> tuple[Array, Array]:
  """Both distributions on the teacher's top-k ids plus one tail bucket: [..., k + 1].

  The tail bucket holds log(1 − Σ_topk p), computed as the log-sum-exp of the log-probs
  outside the top-k (no cancellation, exact even when the tail is tiny). The student's tail is
  its mass outside the same k ids. With k = V there is no tail: the support is the vocabulary,
  permuted, and the divergences equal their full-vocabulary values.
  """
  vocab = teacher_logp.shape[-1]
  if not 1 <= topk <= vocab:
    raise ValueError(f"topk must be in [1, vocabulary size {vocab}]; got {topk}")
  teacher_top, ids = jax.lax.top_k(teacher_logp, topk)
  student_top = jnp.take_along_axis(student_logp, ids, axis=-1)
  if topk == vocab:
    return student_top, teacher_top

  def tail(logp: Array) -> Array:
    outside = jnp.put_along_axis(logp, ids, -jnp.inf, axis=-1, inplace=False)
    return jax.nn.logsumexp(outside, axis=-1, keepdims=True)

  return (jnp.concatenate([student_top, tail(student_logp)], axis=-1),
          jnp.concatenate([teacher_top, tail(teacher_logp)], axis=-1))


def check_clamp(clamp: float | None) -> None:
  if clamp is not None and not clamp > 0:
    raise ValueError(f"clamp must be > 0 (or None); got {clamp}")


def resolve_divergence(divergence: str, topk: int | None, clamp: float | None,
                             options: Mapping[str, float] | None) -> Callable[..., Array]:
  """Validates the distillation settings; returns the divergence with its options bound."""
  if topk is not None and (not is_int(topk) or topk < 1):
    raise ValueError(f"topk must be a positive int or None; got {topk!r}")
  check_clamp(clamp)
  return DIVERGENCES.bind(divergence, **(options or {}))


def logprob_divergence(student_logp: Array, teacher_logp: Array,
                       mask: ArrayLike | None = None, *, divergence: str = "forward-kl",
                       topk: int | None = None, clamp: float | None = None,
                       options: Mapping[str, float] | None = None) -> Array:
  """The divergence at each token from normalised log-probs [..., V]; returns [...].

  Args:
    student_logp: log p_S over the vocabulary (receives gradients).
    teacher_logp: log p_T over the vocabulary (a constant: stop_gradient inside).
    mask: 1 on tokens where the divergence applies; 0 elsewhere gives 0.
    divergence: a key of `DIVERGENCES`.
    topk: None for the full vocabulary, else the teacher's top-k plus a tail bucket.
    clamp: per-token maximum (the value is min(d, clamp), so a clamped token has no gradient).
    options: the divergence's options, e.g. {"beta": 0.5} for "jsd".
  """
  divergence_fn = resolve_divergence(divergence, topk, clamp, options)
  student_logp = jnp.asarray(student_logp, jnp.float32)
  teacher_logp = jax.lax.stop_gradient(jnp.asarray(teacher_logp, jnp.float32))
  _check_same_shape(student_logp=student_logp, teacher_logp=teacher_logp)
  if topk is not None:
    student_logp, teacher_logp = topk_support(student_logp, teacher_logp, topk)
  per_token = divergence_fn(student_logp, teacher_logp)
  if clamp is not None:
    per_token = jnp.minimum(per_token, clamp)
  return jnp.where(_active(mask, per_token), per_token, 0.0)


def token_divergence(student_logits: ArrayLike, teacher_logits: ArrayLike,
                     mask: ArrayLike | None = None, *, divergence: str = "forward-kl",
                     topk: int | None = None, clamp: float | None = None,
                     options: Mapping[str, float] | None = None) -> Array:
  """`logprob_divergence` from unnormalised logits [..., V] (computed in float32)."""
  return logprob_divergence(
      jax.nn.log_softmax(jnp.asarray(student_logits, jnp.float32), axis=-1),
      jax.nn.log_softmax(jnp.asarray(teacher_logits, jnp.float32), axis=-1),
      mask, divergence=divergence, topk=topk, clamp=clamp, options=options)


def sampled_token_surrogate(student_token_logp: ArrayLike, teacher_token_logp: ArrayLike,
                            mask: ArrayLike | None = None, *,
                            clamp: float | None = None) -> Array:
  """The sampled-token distillation estimator at y_t, as a per-token surrogate loss.

  Its gradient is w_t · ∇ log p_S(y_t) with the detached weight
  w_t = log p_S(y_t) − log p_T(y_t) (clipped to [−clamp, clamp] when `clamp` is given): the
  REINFORCE-style gradient of the reverse KL(p_S ‖ p_T) when y_t was sampled from p_S.
  Its VALUE is w_t itself (the one-sample k1 estimate of that KL, useful as a metric), not a
  loss whose derivative is the gradient above: it is a surrogate, meant only to be
  differentiated and averaged.
  """
  check_clamp(clamp)
  student_token_logp = jnp.asarray(student_token_logp, jnp.float32)
  teacher_token_logp = jax.lax.stop_gradient(jnp.asarray(teacher_token_logp, jnp.float32))
  _check_same_shape(student_token_logp=student_token_logp,
                    teacher_token_logp=teacher_token_logp)
  active = _active(mask, student_token_logp)
  student_token_logp = jnp.where(active, student_token_logp, 0.0)
  weight = jax.lax.stop_gradient(
      student_token_logp - jnp.where(active, teacher_token_logp, 0.0))
  if clamp is not None:
    weight = jnp.clip(weight, -clamp, clamp)
  # (x − stop_gradient(x)) is 0 in value and 1 in derivative: value w, gradient w·∇x.
  return weight * (1.0 + student_token_logp - jax.lax.stop_gradient(student_token_logp))
