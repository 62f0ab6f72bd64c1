"""The step's loss as a sum of named terms (docs/ALGORITHMS.md §1.5).

    L = Σ_term  w_term · S_term / D_term

over the terms of `TERMS` that are switched on: `policy_gradient` (§1.2), `teacher_kl` (the
self-distillation divergence of RISED §1.3–1.4 and CriPO's localised injection KL §3) and
`reference_kl` (the KL to the initial policy). Each term is
- a small frozen config whose field names are the `config.step` keys it owns (so a check's error
  names the key a user set), and
- a pure function of one micro-batch's per-token arrays (`TokenInputs`) returning a `LossPart`:
  its weight w, its sum S over the micro-batch, its denominator D over the whole (mini-)batch, and
  metric sums, plus a function that turns the batch's summed metric parts into its metrics.

Every S adds up over micro-batches and data shards and D is global, so the accumulated loss is
the exact batch mean. CriPO's counterfactual flips (`CounterfactualConfig`) add no term: they edit
the advantages the policy-gradient term reads, before it runs (`train_step`).

Adding a term: its config, its part and metrics functions, one row in `TERMS` and its config
field in `train_step.StepConfig`; the config keys, checks, loss sum and metrics follow.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp

from rised_jax.checks import check_field_types
from rised_jax.learn import chunked, cripo, losses

Array = jax.Array
DISTILL_NORMS = ("distill-tokens", "kept-tokens")


class TokenInputs(NamedTuple):
  """One micro-batch's per-token arrays [B, T] (target columns), float32, as the terms read them."""

  logprob: Array                    # log π_θ(y_t): the one input with gradient
  old_logprobs: Array               # log π_old(y_t) of the ratio
  advantages: Array                 # A_t, after CriPO's flips
  loss_mask: Array                  # 1 on the tokens that carry the policy loss
  behaviour_logprobs: Array | None  # log π_sampler(y_t); None: no importance weight
  divergence: Array | None          # per-token teacher divergence (with gradient), when distilling
  distill_mask: Array | None        # 1 on the distillation tokens, when distilling
  kept_mask: Array | None           # the kept set fixed by the pre-pass (`kept_pre_pass`), or None
  ref_logprobs: Array | None        # log π_ref(y_t), with the reference KL
  beta: Array                       # β(step) of the distillation term, scalar
  denominators: Mapping[str, Array]  # the whole (mini-)batch's, from each term's `denominator`
  # (per_token, mask) -> (sum, denominator): the policy gradient's aggregation, which the
  # reference KL shares
  aggregate: Callable[[Array, Array], tuple[Array, Array]]


class LossPart(NamedTuple):
  """A term's share of one micro-batch's loss: weight · total / max(denominator, 1e-9)."""

  weight: Array | float | None   # None: 1 (the policy gradient)
  total: Array
  denominator: Array
  metric_sums: dict[str, Array]


# ----------------------------------------------------------------------------- policy gradient


@dataclasses.dataclass(frozen=True)
class PolicyGradientConfig:
  """The clipped policy-gradient term (§1.2)."""

  aggregation: str = "seq-mean-token-mean"
  eps_low: float = 0.2
  eps_high: float = 0.2
  dual_clip: float | None = None
  importance_cap: float | None = 2.0       # truncated behaviour importance weight C
  behaviour_weight: bool = True             # False: w_t = 1 (the no-correction control)
  seq_len_norm: float = 1.0                 # L_norm of seq-mean-token-sum-norm

  def __post_init__(self):
    check_field_types(self)
    losses.AGGREGATIONS.lookup(self.aggregation)

  def active(self) -> bool:
    return True


def aggregate(cfg: PolicyGradientConfig, per_token: Array, loss_mask: Array) -> tuple[Array, Array]:
  """(sum, denominator) of a per-token loss under the configured aggregation."""
  return losses.AGGREGATIONS[cfg.aggregation](per_token, loss_mask,
                                              seq_len_norm=cfg.seq_len_norm)


def policy_gradient_denominator(cfg: PolicyGradientConfig, batch: Mapping[str, Array]) -> Array:
  loss_mask = batch["loss_mask"].astype(jnp.float32)
  return aggregate(cfg, jnp.zeros_like(loss_mask), loss_mask)[1]


def policy_gradient(cfg: PolicyGradientConfig, x: TokenInputs) -> LossPart:
  pg = losses.clipped_policy_gradient(
      x.logprob, x.old_logprobs, x.advantages, x.loss_mask,
      x.behaviour_logprobs if cfg.behaviour_weight else None,
      eps_low=cfg.eps_low, eps_high=cfg.eps_high, dual_clip=cfg.dual_clip,
      importance_cap=cfg.importance_cap)
  total, _ = aggregate(cfg, pg.loss, x.loss_mask)
  on_loss_tokens = lambda indicator: (indicator * x.loss_mask).sum()  # noqa: E731
  return LossPart(None, total, x.denominators["pg"], dict(
      pg_loss=total,
      clip_frac_low=on_loss_tokens(pg.clipped_low),
      clip_frac_high=on_loss_tokens(pg.clipped_high),
      dual_clip_frac=on_loss_tokens(pg.clipped_dual),
      is_truncated_frac=on_loss_tokens(pg.weight_truncated),
      approx_kl_old=on_loss_tokens(losses.reference_kl(
          jax.lax.stop_gradient(x.logprob), x.old_logprobs, x.loss_mask, estimator="k3")),
  ))


def policy_gradient_metrics(cfg: PolicyGradientConfig, sums: Mapping[str, Array],
                            batch: Mapping[str, Array],
                            denominators: Mapping[str, Array]) -> dict[str, Array]:
  tokens = batch["loss_mask"].astype(jnp.float32).sum()
  per_token = lambda x: losses.mean_from_parts(x, tokens)  # noqa: E731
  return {
      "pg_loss": losses.mean_from_parts(sums["pg_loss"], denominators["pg"]),
      # clip_frac_low: A < 0 and r < 1 − ε_low; clip_frac_high: A > 0 and r > 1 + ε_high
      # (the tokens whose clipped branch is active); both 0 while r = 1.
      "clip_frac": per_token(sums["clip_frac_low"] + sums["clip_frac_high"]),
      "clip_frac_low": per_token(sums["clip_frac_low"]),
      "clip_frac_high": per_token(sums["clip_frac_high"]),
      "dual_clip_frac": per_token(sums["dual_clip_frac"]),
      "is_truncated_frac": per_token(sums["is_truncated_frac"]),
      "approx_kl_old": per_token(sums["approx_kl_old"]),
  }


# ----------------------------------------------------------------------------- teacher KL


@dataclasses.dataclass(frozen=True)
class TeacherKLConfig:
  """Self-distillation from the teacher rows (§1.3, §1.4), optionally CriPO-localised (§3);
  beta = 0 switches the term, and the teacher forward, off."""

  beta: float = 0.0
  beta_warmup_steps: int = 0
  divergence: str = "forward-kl"
  topk: int | None = None
  clamp: float | None = None
  # True: the loss uses min(d, clamp), so a token above the clamp has no gradient (verl's
  # convention); False (needs localize): the clamp only ranks tokens for the localisation.
  clamp_loss: bool = True
  localize: bool = False
  localize_gamma: float = 0.95
  localize_edge_frac: float = 0.01
  distill_norm: str = "distill-tokens"      # normaliser of L_distill, see `teacher_kl_denominator`

  def __post_init__(self):
    check_field_types(self)
    chunked.check_divergence_name(self.divergence)
    if self.distill_norm not in DISTILL_NORMS:
      raise ValueError(f"distill_norm {self.distill_norm!r}: expected one of {DISTILL_NORMS}")
    if self.beta < 0:
      raise ValueError(f"beta ({self.beta}) must be >= 0")
    if self.localize and not self.active():
      raise ValueError("localize=True needs a distillation weight beta > 0")
    if not self.clamp_loss and not (self.localize and self.clamp is not None):
      raise ValueError("clamp_loss=False keeps the clamp for the localisation ranking only, so it "
                       f"needs localize=True and a clamp; got localize={self.localize}, "
                       f"clamp={self.clamp}")

  def active(self) -> bool:
    return self.beta > 0


def kept_tokens(cfg: TeacherKLConfig, divergence: Array, distill_mask: Array) -> Array:
  """CriPO's kept tokens (float 0/1 [B, T]) from the per-token divergence (no gradient)."""
  return cripo.localisation_mask(
      jax.lax.stop_gradient(divergence), distill_mask, gamma=cfg.localize_gamma,
      kl_clamp=cfg.clamp if cfg.clamp is not None else float("inf"),
      edge_fraction=cfg.localize_edge_frac).astype(jnp.float32)


def teacher_kl_denominator(cfg: TeacherKLConfig, batch: Mapping[str, Array]) -> Array:
  """The normaliser of L_distill when it is known before the forward pass.

  "distill-tokens": the number of tokens in `distill_mask`, so L_distill is the mean divergence
  over every distillation token, localisation zeroing the tokens it drops. "kept-tokens" (the
  paper's "mean KL over the kept tokens"): without localisation the kept tokens are the
  distillation tokens; with it, the count of the kept set, taken from the pre-pass's
  `kept_mask` when the batch has one (`train_step.old_policy_pass`); otherwise the one
  micro-batch is the whole batch and `teacher_kl` counts it in its pass.
  """
  if cfg.distill_norm == "kept-tokens" and "kept_mask" in batch:
    return batch["kept_mask"].sum()
  return batch["distill_mask"].astype(jnp.float32).sum()


def teacher_kl(cfg: TeacherKLConfig, x: TokenInputs) -> LossPart:
  distill_mask = x.distill_mask
  if x.kept_mask is not None:
    distill_mask = x.kept_mask
  elif cfg.localize:
    distill_mask = kept_tokens(cfg, x.divergence, distill_mask)
  total = (x.divergence * distill_mask).sum()
  # One micro-batch and the whole batch in this pass: its kept count is the global one.
  denominator = (distill_mask.sum() if cfg.localize and cfg.distill_norm == "kept-tokens"
                 and x.kept_mask is None else x.denominators["distill"])
  return LossPart(x.beta, total, denominator,
                  dict(distill_loss=total, kept_tokens=distill_mask.sum()))


def teacher_kl_metrics(cfg: TeacherKLConfig, sums: Mapping[str, Array],
                       batch: Mapping[str, Array],
                       denominators: Mapping[str, Array]) -> dict[str, Array]:
  # kept_frac: kept tokens over the injection rows' distillation tokens.
  distill_tokens = (batch["distill_mask"] > 0).sum().astype(jnp.float32)
  return {
      "distill_loss": losses.mean_from_parts(sums["distill_loss"], sums["kept_tokens"]),
      "distill_tokens": distill_tokens,
      "kept_tokens": sums["kept_tokens"],
      "kept_frac": losses.mean_from_parts(sums["kept_tokens"], distill_tokens),
  }


# ----------------------------------------------------------------------------- reference KL


@dataclasses.dataclass(frozen=True)
class ReferenceKLConfig:
  """The KL penalty to the initial policy (its frozen parameters are `TrainState.ref_params`),
  aggregated like the policy gradient and over its denominator."""

  ref_kl_coef: float = 0.0
  ref_kl_estimator: str = "k3"

  def __post_init__(self):
    check_field_types(self)
    if self.ref_kl_coef < 0:
      raise ValueError(f"ref_kl_coef ({self.ref_kl_coef}) must be >= 0")
    losses.KL_ESTIMATORS.lookup(self.ref_kl_estimator)

  def active(self) -> bool:
    return self.ref_kl_coef > 0


def reference_kl(cfg: ReferenceKLConfig, x: TokenInputs) -> LossPart:
  per_token = losses.reference_kl(x.logprob, x.ref_logprobs, x.loss_mask,
                                  estimator=cfg.ref_kl_estimator)
  total, _ = x.aggregate(per_token, x.loss_mask)
  return LossPart(cfg.ref_kl_coef, total, x.denominators["pg"], dict(ref_kl=total))


def reference_kl_metrics(cfg: ReferenceKLConfig, sums: Mapping[str, Array],
                         batch: Mapping[str, Array],
                         denominators: Mapping[str, Array]) -> dict[str, Array]:
  return {"ref_kl": losses.mean_from_parts(sums["ref_kl"], denominators["pg"])}


# ----------------------------------------------------------------------------- CriPO's flips


@dataclasses.dataclass(frozen=True)
class CounterfactualConfig:
  """CriPO's SC branch (§3): the counterfactual teacher's token-advantage flips. No loss term of
  its own: the step edits the advantages `policy_gradient` reads (`cripo.counterfactual_flips`)."""

  counterfactual: bool = False
  flip_alpha: float = 0.1
  flip_tau: float = 0.1

  def __post_init__(self):
    check_field_types(self)

  def active(self) -> bool:
    return self.counterfactual


def counterfactual_metrics(cfg: CounterfactualConfig, sums: Mapping[str, Array],
                           batch: Mapping[str, Array]) -> dict[str, Array]:
  # flip_frac: flipped tokens over the counterfactual rows' response (loss) tokens.
  cf_tokens = (batch["cf_mask"] * batch["loss_mask"].astype(jnp.float32) > 0
               ).sum().astype(jnp.float32)
  return {"cf_tokens": cf_tokens, "flipped_tokens": sums["flipped_tokens"],
          "flip_frac": losses.mean_from_parts(sums["flipped_tokens"], cf_tokens)}


# ----------------------------------------------------------------------------- the table


@dataclasses.dataclass(frozen=True)
class LossTerm:
  """One row of `TERMS`: the term's config class and its functions.

  `part(cfg, inputs)` is its `LossPart` of one micro-batch; `metrics(cfg, sums, batch,
  denominators)` its step metrics from the batch's metric sums; `denominator` (name,
  fn(cfg, batch)) its denominator over the whole (mini-)batch, which the step computes before
  the micro-batch loop and passes as `TokenInputs.denominators[name]` ("pg": the policy
  gradient's, "distill": the teacher KL's); None for a term that divides by another's.
  """

  config: type
  part: Callable[[Any, TokenInputs], LossPart]
  metrics: Callable[[Any, Mapping[str, Array], Mapping[str, Array], Mapping[str, Array]],
                    dict[str, Array]]
  denominator: tuple[str, Callable[[Any, Mapping[str, Array]], Array]] | None = None


# The loss terms, in the order they are added (name: the term's `StepConfig` field).
TERMS: Mapping[str, LossTerm] = {
    "policy_gradient": LossTerm(PolicyGradientConfig, policy_gradient, policy_gradient_metrics,
                                ("pg", policy_gradient_denominator)),
    "teacher_kl": LossTerm(TeacherKLConfig, teacher_kl, teacher_kl_metrics,
                           ("distill", teacher_kl_denominator)),
    "reference_kl": LossTerm(ReferenceKLConfig, reference_kl, reference_kl_metrics),
}


def total_loss(parts: Mapping[str, LossPart]) -> Array:
  """Σ_term w · S / max(D, 1e-9), in `TERMS` order."""
  loss = None
  for part in parts.values():
    share = part.total if part.weight is None else part.weight * part.total
    share = share / jnp.maximum(part.denominator, 1e-9)
    loss = share if loss is None else loss + share
  return loss
