"""The one fused, pure, sharded training step: policy gradient + self-teacher distillation.

    step(state, batch) -> (state, metrics)

A step whose loss or gradient norm is not finite leaves the state unchanged and reports
`skipped_nonfinite` = 1; so does a finite update that would move the parameters by more than
`max_update_ratio` times their norm (`update_is_acceptable`), reported as
`skipped_large_update` = 1, with the proposed ratio as `update_ratio` (see the end of
`make_step_fn`).

For each micro-batch: student hidden states (with gradient; each group's shared prefix run
once when the batch carries `prefix_ids`, `student_rows_hidden`), teacher hidden states over the
teacher rows (stop-gradient; the live parameters by default, an EMA or the frozen initial
parameters as options), then `chunked.token_stats_chunked` forms student and teacher logits one
sequence chunk at a time and reduces them to per-token log-probs, entropies and divergences.
From those [B, T] arrays the loss terms of `loss_terms.TERMS` that the config switches on: the
clipped policy-gradient loss on per-token advantages (optionally edited by CriPO's
counterfactual teacher, a second stop-gradient forward), the distillation loss on
`distill_mask` (optionally localised, CriPO's UC branch), and the optional reference-KL
penalty to the frozen initial policy (a stop-gradient forward of the student rows with
`ref_params`). Every term is a (sum, denominator) pair; denominators are computed over
the whole batch first, so accumulation over micro-batches and data-parallel shards gives the
exact global mean (`micro_batches` only trades memory for time). The one denominator that
depends on the forward pass, CriPO's kept-token count, comes from a stop-gradient pre-pass
when the batch is micro-batched (`kept_token_mask`).

`StepConfig.num_iterations` (μ) and `mini_batches` (M) apply μ · M updates to one batch (μ
passes, each over M shares of its rows), each on the loss above, all against log π_old fixed
before the first by `old_policy_pass` (see `make_step_fn`).

The batch contract is in rised_jax/types.py. Optional keys switch optional parts on, and the
StepConfig flags say which keys the step expects, so a missing key is an error before compile.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rised_jax import parallel
from rised_jax.checks import check_field_types
from rised_jax.learn import chunked, cripo, loss_terms, losses, precision

Array = jax.Array
TEACHERS = ("live", "ema", "frozen")
SCHEDULES = ("constant", "cosine", "linear")


# The loss terms' configs and CriPO's flips, by their `StepConfig` field.
TERM_CONFIGS: Mapping[str, type] = {
    **{name: term.config for name, term in loss_terms.TERMS.items()},
    "flips": loss_terms.CounterfactualConfig,
}


@dataclasses.dataclass(frozen=True)
class StepConfig:
  """Static settings of the step (hashable: the step is compiled for one of these).

  One small frozen config per loss term (`loss_terms.TERMS`) and one for CriPO's flips, each
  owning its `config.step` keys and their checks, plus the step's own settings below; a
  setting is read from its owner (`step.teacher_kl.beta`). `from_keys` builds one from the flat
  `config.step` keys (the one place that knows which config owns which key, `KEY_OWNERS`) and
  `as_keys` gives them back.
  """

  policy_gradient: loss_terms.PolicyGradientConfig = dataclasses.field(
      default_factory=loss_terms.PolicyGradientConfig)
  teacher_kl: loss_terms.TeacherKLConfig = dataclasses.field(
      default_factory=loss_terms.TeacherKLConfig)
  reference_kl: loss_terms.ReferenceKLConfig = dataclasses.field(
      default_factory=loss_terms.ReferenceKLConfig)
  flips: loss_terms.CounterfactualConfig = dataclasses.field(
      default_factory=loss_terms.CounterfactualConfig)
  # The stop-gradient teacher of the teacher KL and the flips: live | ema | frozen.
  teacher: str = "live"
  ema_rate: float = 0.05
  # The update-size guard: a step whose update has ‖Δθ‖ > max_update_ratio · ‖θ‖ is skipped
  # (`update_is_acceptable`). Healthy runs measure far below 1 (docs/running.md#the-update-size-guard).
  max_update_ratio: float = 1.0
  # PPO iterations: passes over each rollout batch (config.train.num_iterations, GRPO's μ),
  # each in `mini_batches` successive updates on a share of the rows (config.train.mini_batches),
  # all against the log-probs of the parameters before the first update (see `make_step_fn`)
  num_iterations: int = 1
  mini_batches: int = 1
  # execution
  chunk: int = 256
  micro_batches: int = 1

  def __post_init__(self):
    self.check()

  def check(self) -> None:
    """The step's own settings (each term config checked its own when it was built)."""
    for name, cls in TERM_CONFIGS.items():
      if not isinstance(getattr(self, name), cls):
        raise TypeError(f"StepConfig.{name}={getattr(self, name)!r}: expected a {cls.__name__}")
    check_field_types(self)
    if self.teacher not in TEACHERS:
      raise ValueError(f"teacher {self.teacher!r}: expected one of {TEACHERS}")
    if not self.max_update_ratio > 0:
      raise ValueError(f"max_update_ratio={self.max_update_ratio}: expected a number > 0 (the "
                       "largest accepted ‖Δθ‖ / ‖θ‖ of one update)")
    if min(self.micro_batches, self.chunk, self.num_iterations, self.mini_batches) < 1:
      raise ValueError(f"micro_batches ({self.micro_batches}), chunk ({self.chunk}), "
                       f"num_iterations ({self.num_iterations}) and mini_batches "
                       f"({self.mini_batches}) must be >= 1")

  @classmethod
  def from_keys(cls, keys: Mapping[str, Any]) -> StepConfig:
    """The step config of the flat `config.step` keys (and `config.train`'s num_iterations and
    mini_batches): each key goes to the config that owns it (`KEY_OWNERS`); a key not given
    keeps its default. An unknown key is a TypeError naming it."""
    unknown = sorted(set(keys) - set(KEY_OWNERS))
    if unknown:
      raise TypeError(f"unknown step keys {unknown}; known: {sorted(KEY_OWNERS)}")
    owned: dict[str, dict[str, Any]] = {name: {} for name in TERM_CONFIGS}
    own = {}
    for key, value in keys.items():
      (owned[KEY_OWNERS[key]] if KEY_OWNERS[key] in TERM_CONFIGS else own)[key] = value
    return cls(**{name: TERM_CONFIGS[name](**settings) for name, settings in owned.items()},
               **own)

  def as_keys(self) -> dict[str, Any]:
    """The flat `config.step` keys and their values (`KEY_OWNERS` order): `from_keys`'s inverse."""
    return {key: getattr(self if owner == key else getattr(self, owner), key)
            for key, owner in KEY_OWNERS.items()}

  def active_terms(self) -> dict[str, tuple[loss_terms.LossTerm, Any]]:
    """The loss terms switched on, in `loss_terms.TERMS` order: name → (term, its config)."""
    return {name: (term, getattr(self, name)) for name, term in loss_terms.TERMS.items()
            if getattr(self, name).active()}

  @property
  def distills(self) -> bool:
    return self.teacher_kl.active()

  @property
  def updates_per_step(self) -> int:
    return self.num_iterations * self.mini_batches

  @property
  def fixed_per_batch(self) -> bool:
    """Several updates per batch: old log-probs, CriPO's flips and kept set come from a
    stop-gradient pre-pass at the parameters before the first update (`old_policy_pass`)."""
    return self.updates_per_step > 1

  @property
  def kept_pre_pass(self) -> bool:
    """Whether the kept set and its count come from a pre-pass (see `old_policy_pass`)."""
    distill = self.teacher_kl
    return distill.localize and (self.fixed_per_batch or (distill.distill_norm == "kept-tokens"
                                                          and self.micro_batches > 1))

  @property
  def needs_teacher_params(self) -> bool:
    return (self.distills or self.flips.active()) and self.teacher != "live"

  @property
  def needs_ref_params(self) -> bool:
    return self.reference_kl.active()

  def required_keys(self) -> tuple[str, ...]:
    keys = ["input_ids", "attention_mask", "loss_mask", "advantages"]
    if self.distills:
      keys += ["teacher_input_ids", "teacher_attention_mask", "distill_mask"]
    if self.flips.active():
      keys += ["cf_teacher_input_ids", "cf_teacher_attention_mask", "cf_mask"]
    return tuple(keys)


# Each flat `config.step` key → the `StepConfig` field that owns it (a term config's field name,
# or the key itself for the step's own settings); read by `StepConfig.from_keys` and `as_keys`
# only, the boundary between the flat keys and the typed configs.
KEY_OWNERS: Mapping[str, str] = {
    **{f.name: name for name, cls in TERM_CONFIGS.items() for f in dataclasses.fields(cls)},
    **{f.name: f.name for f in dataclasses.fields(StepConfig) if f.name not in TERM_CONFIGS},
}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
  """Everything the step reads and writes; a pytree, donated to the step."""

  step: Array                  # int32 []
  params: Any                  # nnx.State of the model's nnx.Param variables
  opt_state: Any
  rng: Array                   # uint32 [2] raw key (checkpoint-friendly)
  teacher_params: Any = None   # EMA or frozen teacher; None for the live teacher
  # The initial policy of the reference KL, as the forward sees it (`precision.compute_params`:
  # compute dtype, half the memory of float32 master weights under bf16); None without it.
  ref_params: Any = None


# ----------------------------------------------------------------------------- optimizer


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  learning_rate: float = 1e-6
  warmup_steps: int = 0
  schedule: str = "constant"   # constant | cosine | linear (decay to end_lr after warm-up)
  total_steps: int = 1
  end_learning_rate: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  weight_decay: float = 0.0
  max_grad_norm: float | None = 1.0

  def __post_init__(self):
    self.check()

  def check(self) -> None:
    """The `config.optim` values (`config.optimizer_config` names the section)."""
    check_field_types(self)
    if self.schedule not in SCHEDULES:
      raise ValueError(f"schedule {self.schedule!r}: expected one of {SCHEDULES}")
    if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1) or self.eps <= 0:
      raise ValueError(f"b1={self.b1}, b2={self.b2}, eps={self.eps}: expected b1, b2 in [0, 1) "
                       "and eps > 0")
    if self.weight_decay < 0 or self.end_learning_rate < 0:
      raise ValueError(f"weight_decay={self.weight_decay}, end_learning_rate="
                       f"{self.end_learning_rate}: expected both >= 0")
    if self.learning_rate <= 0 or self.warmup_steps < 0:
      raise ValueError(f"learning_rate ({self.learning_rate}) must be > 0 and warmup_steps "
                       f"({self.warmup_steps}) >= 0")
    if self.max_grad_norm is not None and self.max_grad_norm <= 0:
      raise ValueError(f"max_grad_norm must be > 0 or None, got {self.max_grad_norm}")


def make_schedule(cfg: OptimizerConfig) -> optax.Schedule:
  decay_steps = max(cfg.total_steps - cfg.warmup_steps, 1)
  if cfg.schedule == "constant":
    after = optax.constant_schedule(cfg.learning_rate)
  elif cfg.schedule == "cosine":
    after = optax.cosine_decay_schedule(cfg.learning_rate, decay_steps,
                                        alpha=cfg.end_learning_rate / max(cfg.learning_rate, 1e-30))
  else:  # linear (OptimizerConfig checked the name)
    after = optax.linear_schedule(cfg.learning_rate, cfg.end_learning_rate, decay_steps)
  if cfg.warmup_steps <= 0:
    return after
  warmup = optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps)
  return optax.join_schedules([warmup, after], [cfg.warmup_steps])


def make_optimizer(cfg: OptimizerConfig,
                   updates_per_step: int = 1) -> optax.GradientTransformation:
  """AdamW with optional global-norm clipping; the learning rate is an optax schedule.

  `updates_per_step` (the step's `updates_per_step`): the optimizer counts updates, while
  warm-up and decay are in training steps, so every update of step s gets step s's rate.
  """
  if not isinstance(updates_per_step, int) or updates_per_step < 1:
    raise ValueError(f"updates_per_step={updates_per_step!r}: expected an integer >= 1")
  schedule = make_schedule(cfg)
  if updates_per_step > 1:
    per_update = schedule
    schedule = lambda count: per_update(count // updates_per_step)  # noqa: E731
  adamw = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                      weight_decay=cfg.weight_decay)
  if cfg.max_grad_norm is None:
    return adamw
  return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adamw)


# ----------------------------------------------------------------------------- the loss


def _teacher_model(params, teacher_params, graphdef, rest) -> nnx.Module:
  """The stop-gradient teacher: the live parameters, or the EMA / frozen ones."""
  frozen = params if teacher_params is None else teacher_params
  return nnx.merge(graphdef, jax.lax.stop_gradient(frozen), rest)


def teacher_rows_hidden(teacher_model, input_ids: Array, attention_mask: Array,
                        token_mask: Array) -> Array:
  """The teacher rows' hidden states, or zeros of their shape when `token_mask` (the tokens
  that read this teacher: distillation or counterfactual) is empty: such a micro-batch uses
  nothing of the teacher (every read is masked by `token_mask`), so it skips the forward, a
  quarter of a step's model FLOPs (RISED trains most steps' groups without a positive-rubric
  teacher). The cond runs one branch at run time; the zeros give finite, masked-out logits."""
  def forward(teacher):
    return teacher.hidden_states(input_ids, attention_mask)

  out = nnx.eval_shape(forward, teacher_model)
  return nnx.cond(jnp.any(token_mask > 0), forward,
                  lambda _: jnp.zeros(out.shape, out.dtype), teacher_model)


def student_rows_hidden(model, mb: Mapping[str, Array]) -> Array:
  """The student rows' hidden states [B, T, D]; a batch with `prefix_ids` (its groups' shared
  prefixes, `batching.assemble`) runs each group's prefix once
  (`Decoder.shared_prefix_hidden_states`)."""
  if "prefix_ids" in mb:
    return model.shared_prefix_hidden_states(mb["prefix_ids"], mb["prefix_mask"],
                                             mb["input_ids"], mb["attention_mask"])
  return model.hidden_states(mb["input_ids"], mb["attention_mask"])


def _distill_token_stats(model, teacher_model, config: StepConfig, mb: Mapping[str, Array], *,
                         with_teacher: bool = True):
  """Chunked student / injection-teacher token statistics of one micro-batch (the teacher's
  only when `config.distills` and `with_teacher`)."""
  student_hidden = student_rows_hidden(model, mb)
  teacher_hidden = None
  if config.distills and with_teacher:
    teacher_hidden = teacher_rows_hidden(teacher_model, mb["teacher_input_ids"],
                                         mb["teacher_attention_mask"], mb["distill_mask"])
  distill = config.teacher_kl
  return chunked.token_stats_chunked(
      student_hidden, teacher_hidden, model.logits, mb["input_ids"], chunk=config.chunk,
      divergence=distill.divergence, topk=distill.topk,
      clamp=distill.clamp if distill.clamp_loss else None,
      teacher_logits_fn=None if teacher_model is None else teacher_model.logits,
      positions=_used_positions(config, mb))


def _used_positions(config: StepConfig, mb: Mapping[str, Array]) -> Array:
  """The target columns whose token statistics the loss and metrics read: the loss tokens
  and, when distilling, the distillation tokens (the localisation chooses among those). The
  vocabulary projections run over these only (`chunked`), so the head's cost follows the
  trained tokens, not the padded batch."""
  used = mb["loss_mask"] > 0
  if config.distills:
    used = used | (mb["distill_mask"] > 0)
  return used


def _counterfactual_flips(teacher_model, config: StepConfig, mb: Mapping[str, Array],
                          student_logprob: Array, advantages: Array) -> tuple[Array, Array]:
  """CriPO's SC branch: (edited advantages, float 0/1 flip mask), from a counterfactual-teacher
  forward (stop-gradient) and the student's log-probs of the same tokens."""
  cf_mask = mb["cf_mask"] * mb["loss_mask"].astype(jnp.float32)
  cf_hidden = teacher_rows_hidden(teacher_model, mb["cf_teacher_input_ids"],
                                  mb["cf_teacher_attention_mask"], cf_mask)
  cf_logprob, cf_log_max = chunked.teacher_token_stats_chunked(
      cf_hidden, teacher_model.logits, mb["input_ids"], chunk=config.chunk, positions=cf_mask)
  edited, flipped = cripo.counterfactual_flips(
      jax.lax.stop_gradient(student_logprob), cf_logprob, cf_log_max, advantages,
      cf_mask, alpha=config.flips.flip_alpha, tau_flip=config.flips.flip_tau)
  return edited, flipped.astype(jnp.float32)


def old_policy_pass(params, rest, teacher_params, graphdef, config: StepConfig,
                    batch: Mapping[str, Array]) -> dict[str, Array]:
  """What the step fixes for the whole batch before its first update, [B, T] each, no gradient.

  One stop-gradient forward of the student (and of the teachers it needs) at `params`, micro-
  batch by micro-batch:
  - `kept_mask` (when `config.kept_pre_pass`): the localisation's kept tokens, float 0/1. The
    kept set depends on the student's and teacher's distributions, so the paper's normaliser
    (the number of kept tokens of the batch) is known only after a forward pass; under
    micro-batching the accumulation scan then uses this mask and its global count.
  - with several updates per batch (`config.fixed_per_batch`): `old_logprobs` (log π_old of
    the PPO ratio) and, with CriPO's SC branch, the flipped `advantages` and the `flipped`
    mask, so the μ updates all see the same advantages (PPO's advantages are per batch).
  Cost: one extra forward per step (docs/cripo.md measures the kept pre-pass);
  none without micro-batched kept-token localisation or μ > 1.
  """
  frozen = jax.lax.stop_gradient(params)

  def one(mb):
    model = nnx.merge(graphdef, frozen, rest)
    teacher = None
    if config.distills or config.flips.counterfactual:
      teacher = _teacher_model(frozen, teacher_params, graphdef, rest)
    stats = _distill_token_stats(model, teacher, config, mb, with_teacher=config.kept_pre_pass)
    out = {}
    if config.kept_pre_pass:
      out["kept_mask"] = loss_terms.kept_tokens(config.teacher_kl, stats.divergence,
                                                mb["distill_mask"].astype(jnp.float32))
    if config.fixed_per_batch:
      out["old_logprobs"] = stats.logprob
      if config.flips.counterfactual:
        out["advantages"], out["flipped"] = _counterfactual_flips(
            teacher, config, mb, stats.logprob, mb["advantages"].astype(jnp.float32))
    return out

  micro = _split_micro({k: v for k, v in batch.items() if jnp.ndim(v)}, config.micro_batches)
  return {k: _merge_micro(v, _groups(batch)) for k, v in jax.lax.map(one, micro).items()}


def kept_token_mask(params, rest, teacher_params, graphdef, config: StepConfig,
                    batch: Mapping[str, Array]) -> Array:
  """The localisation's kept tokens of the whole batch (`old_policy_pass`'s `kept_mask`)."""
  return old_policy_pass(params, rest, teacher_params, graphdef, config, batch)["kept_mask"]


def _reference_logprobs(ref_params, graphdef, rest, config: StepConfig,
                        mb: Mapping[str, Array]) -> Array:
  """log π_ref(y_t) of the student rows' tokens, float32 [B, T] (target columns), no gradient."""
  ref_model = nnx.merge(graphdef, jax.lax.stop_gradient(ref_params), rest)
  hidden = student_rows_hidden(ref_model, mb)
  logprob, _ = chunked.teacher_token_stats_chunked(hidden, ref_model.logits, mb["input_ids"],
                                                   chunk=config.chunk,
                                                   positions=mb["loss_mask"])
  return logprob


def _micro_loss(params, rest, teacher_params, graphdef, config: StepConfig,
                mb: Mapping[str, Array], denominators: Mapping[str, Array], beta: Array,
                ref_params=None):
  """Loss of one micro-batch, already divided by the global denominators, plus metric sums."""
  model = nnx.merge(graphdef, params, rest)
  loss_mask = mb["loss_mask"].astype(jnp.float32)
  teacher_model = None
  if config.distills or config.flips.counterfactual:
    teacher_model = _teacher_model(params, teacher_params, graphdef, rest)
  stats = _distill_token_stats(model, teacher_model, config, mb)

  advantages = mb["advantages"].astype(jnp.float32)
  metrics: dict[str, Array] = {}
  if config.flips.counterfactual:
    if config.fixed_per_batch:   # flipped once per batch by `old_policy_pass`
      flipped = mb["flipped"]
    else:
      advantages, flipped = _counterfactual_flips(teacher_model, config, mb, stats.logprob,
                                                  advantages)
    metrics["flipped_tokens"] = flipped.sum()

  # A single update per batch takes the ratio against its own forward (r = 1 in value).
  old_logprobs = mb.get("old_logprobs", jax.lax.stop_gradient(stats.logprob))
  metrics["entropy"] = (stats.entropy * loss_mask).sum()
  if "behaviour_logprobs" in mb:   # the sampler against π_old on the same tokens: a stale or
    # wrong sampler (a weight sync that did not happen) shows here. Only where the sampler saw
    # the trained prefix: under a guidance hint its log-probs differ by the hint, not weights.
    same = mb.get("same_context_mask", loss_mask).astype(jnp.float32) * loss_mask
    metrics["logprob_diff"] = (jnp.abs(mb["behaviour_logprobs"] - old_logprobs) * same).sum()
    metrics["logprob_diff_tokens"] = same.sum()

  inputs = loss_terms.TokenInputs(
      logprob=stats.logprob, old_logprobs=old_logprobs, advantages=advantages,
      loss_mask=loss_mask, behaviour_logprobs=mb.get("behaviour_logprobs"),
      divergence=stats.divergence if config.distills else None,
      distill_mask=mb["distill_mask"].astype(jnp.float32) if config.distills else None,
      kept_mask=mb["kept_mask"] if config.kept_pre_pass else None,
      ref_logprobs=(_reference_logprobs(ref_params, graphdef, rest, config, mb)
                    if config.needs_ref_params else None),
      beta=beta, denominators=denominators,
      aggregate=functools.partial(loss_terms.aggregate, config.policy_gradient))
  parts = {name: term.part(cfg, inputs) for name, (term, cfg) in config.active_terms().items()}
  for part in parts.values():
    metrics.update(part.metric_sums)
  return loss_terms.total_loss(parts), metrics


def _groups(batch: Mapping[str, Array]) -> int:
  """The units a batch splits into: its shared-prefix groups (`prefix_ids`), else its rows."""
  return (batch["prefix_ids"] if "prefix_ids" in batch else batch["input_ids"]).shape[0]


def _split_micro(batch: Mapping[str, Array], micro_batches: int) -> dict[str, Array]:
  """[B, ...] → [M, B/M, ...] with micro-batch m = rows m, m + M, m + 2M, …; a batch with
  shared-prefix groups splits by group (group m, m + M, … with all its rows and its prefix).

  Strided (not contiguous) so that each micro-batch keeps rows from every data shard.
  """
  groups = _groups(batch)

  def one(x):
    x = x.reshape(groups // micro_batches, micro_batches, x.shape[0] // groups, *x.shape[1:])
    x = jnp.swapaxes(x, 0, 1)
    return x.reshape(micro_batches, -1, *x.shape[3:])
  return {k: one(v) for k, v in batch.items()}


def _merge_micro(x: Array, groups: int) -> Array:
  """The inverse of `_split_micro` for one array of a batch of `groups` units:
  [M, B/M, ...] → [B, ...]."""
  micro_batches = x.shape[0]
  x = x.reshape(micro_batches, groups // micro_batches, -1, *x.shape[2:])
  return jnp.swapaxes(x, 0, 1).reshape(-1, *x.shape[3:])


def update_is_acceptable(params, new_params, max_ratio: float) -> tuple[Array, Array]:
  """(accepted, ratio) of the update params → new_params: ratio = ‖Δθ‖ / ‖θ‖ over the whole
  pytree (global L2 norms, float32), accepted = ‖Δθ‖ <= max_ratio · ‖θ‖ (False when either
  norm is NaN or the difference overflows).

  A finite but absurd update (learning rate 1e30) passes every finiteness check and would
  become every later checkpoint; no healthy step moves the weights by their own norm.
  """
  def sq_norm(tree):
    return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree))

  delta = jnp.sqrt(sq_norm(jax.tree.map(lambda new, old: new.astype(jnp.float32)
                                        - old.astype(jnp.float32), new_params, params)))
  norm = jnp.sqrt(sq_norm(params))
  return delta <= max_ratio * norm, delta / norm


# Batch keys with one row per shared-prefix group (`batching.group_prefixes`), not per row.
SHARED_PREFIX_KEYS = ("prefix_ids", "prefix_mask")

# Step metrics that count tokens or rows of the batch (the others are means or fractions).
COUNT_METRICS = ("loss_tokens", "sequences", "distill_tokens", "kept_tokens", "cf_tokens",
                 "flipped_tokens", "rollout/logprob_diff_tokens")


def make_step_fn(graphdef, rest, optimizer: optax.GradientTransformation,
                 config: StepConfig) -> Callable[[TrainState, Mapping[str, Array]],
                                                 tuple[TrainState, dict[str, Array]]]:
  """The pure step; `create` compiles it with shardings.

  `config.num_iterations` (μ) passes over the same batch, each in `config.mini_batches` (M)
  successive updates on a share of its rows (each loss the mean over its mini-batch). With
  μ · M = 1 the ratio is taken against the update's own forward (r = 1 in value, the on-policy
  step). Otherwise `old_policy_pass` first fixes log π_old (and CriPO's flips and kept set) at
  the parameters before the first update, then every later update's ratio r = π_θ / π_old
  moves away from 1 and the ε_low / ε_high and dual clips act. The step counter, the RNG, the
  β schedule and the EMA teacher advance once per batch; the optimizer's count (and so its
  schedule, see `make_optimizer`) once per update. Metrics are means over the μ · M updates,
  counts (`COUNT_METRICS`) those of the whole batch.
  """
  grad_fn = jax.value_and_grad(_micro_loss, has_aux=True)

  def gradients(params, state: TrainState, batch, denominators, beta):
    """(loss, metric sums, gradients) of the whole batch at `params`, micro-batch by micro-batch."""
    def accumulate(carry, mb):
      grads, loss, metric_sums = carry
      (mb_loss, mb_metrics), mb_grads = grad_fn(params, rest, state.teacher_params, graphdef,
                                                config, mb, denominators, beta,
                                                state.ref_params)
      grads = jax.tree.map(jnp.add, grads, mb_grads)
      metric_sums = jax.tree.map(jnp.add, metric_sums, mb_metrics)
      return (grads, loss + mb_loss, metric_sums), None

    if config.micro_batches == 1:
      (loss, metric_sums), grads = grad_fn(params, rest, state.teacher_params, graphdef,
                                           config, batch, denominators, beta, state.ref_params)
    else:
      # The first micro-batch starts the accumulators (no eval_shape of the loss: tracing a
      # model merged from outer-trace values breaks nnx.remat's trace-level check).
      micro = _split_micro(batch, config.micro_batches)
      (loss, metric_sums), grads = grad_fn(
          params, rest, state.teacher_params, graphdef, config,
          {k: v[0] for k, v in micro.items()}, denominators, beta, state.ref_params)
      (grads, loss, metric_sums), _ = jax.lax.scan(
          accumulate, (grads, loss, metric_sums), {k: v[1:] for k, v in micro.items()})
    return loss, metric_sums, grads

  def update(params, opt_state, state: TrainState, batch, beta, allowed=True):
    """One optimizer update on the (mini-)batch: (params, opt_state, metrics, applied). The
    loss is its own mean; `allowed` False (an earlier update of the batch was skipped), a
    non-finite loss or an unacceptably large update applies nothing."""
    terms = config.active_terms()
    denominators = {term.denominator[0]: term.denominator[1](cfg, batch)
                    for term, cfg in terms.values() if term.denominator is not None}
    loss, metric_sums, grads = gradients(params, state, batch, denominators, beta)
    grad_norm = optax.tree.norm(grads)
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)

    loss_mask = batch["loss_mask"].astype(jnp.float32)
    tokens = loss_mask.sum()
    metrics = {
        "loss": loss,
        "entropy": losses.mean_from_parts(metric_sums["entropy"], tokens),
        "grad_norm": grad_norm,
        "beta": beta,
        "loss_tokens": tokens,
        "sequences": (loss_mask.sum(-1) > 0).sum().astype(jnp.float32),
    }
    for term, cfg in terms.values():
      metrics.update(term.metrics(cfg, metric_sums, batch, denominators))
    if "logprob_diff" in metric_sums:   # mean |log π_sampler − log π_old| per compared token
      metrics["rollout/logprob_diff"] = losses.mean_from_parts(
          metric_sums["logprob_diff"], metric_sums["logprob_diff_tokens"])
      metrics["rollout/logprob_diff_tokens"] = metric_sums["logprob_diff_tokens"]
    if config.flips.counterfactual:
      metrics.update(loss_terms.counterfactual_metrics(config.flips, metric_sums, batch))

    # A non-finite loss or gradient (or an update that overflows the parameters) applies
    # nothing: parameters and optimizer state stay bit-identical.
    finite = (jnp.isfinite(loss) & jnp.isfinite(grad_norm)
              & jnp.all(jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(new_params)])))
    # So does a finite update far larger than any healthy one (`update_is_acceptable`).
    acceptable, update_ratio = update_is_acceptable(params, new_params, config.max_update_ratio)
    applied = finite & acceptable & allowed
    params, opt_state = jax.tree.map(lambda new, old: jnp.where(applied, new, old),
                                     (new_params, new_opt_state), (params, opt_state))
    metrics["skipped_nonfinite"] = 1.0 - finite.astype(jnp.float32)
    metrics["skipped_large_update"] = (finite & ~acceptable).astype(jnp.float32)
    metrics["update_ratio"] = update_ratio
    return params, opt_state, metrics, applied

  def step(state: TrainState, batch: Mapping[str, Array]):
    beta = cripo.beta_schedule(state.step, config.teacher_kl.beta,
                               config.teacher_kl.beta_warmup_steps)
    if config.kept_pre_pass or config.fixed_per_batch:
      fixed = old_policy_pass(state.params, rest, state.teacher_params, graphdef, config, batch)
      if "old_logprobs" in batch:   # a batch that brings its own π_old keeps it
        fixed.pop("old_logprobs", None)
      batch = {**batch, **fixed}

    if config.updates_per_step == 1:
      params, opt_state, metrics, applied = update(state.params, state.opt_state, state, batch,
                                                   beta)
      first_applied = applied
    else:
      # Mini-batch m holds rows m, m + M, … (strided like micro-batches: every data shard
      # keeps rows in each); update u trains on mini-batch u mod M.
      minis = _split_micro({k: v for k, v in batch.items() if jnp.ndim(v)}, config.mini_batches)

      def one_update(carry, index):
        params, opt_state, allowed = carry
        mini = {k: v[index % config.mini_batches] for k, v in minis.items()}
        params, opt_state, metrics, applied = update(params, opt_state, state, mini, beta,
                                                     allowed)
        return (params, opt_state, applied), (metrics, applied)

      # Once an update is skipped, so is every later one of the batch: the updates before
      # the first non-finite one stay applied.
      (params, opt_state, _), (per_update, applied) = jax.lax.scan(
          one_update, (state.params, state.opt_state, jnp.asarray(True)),
          jnp.arange(config.updates_per_step))
      metrics = jax.tree.map(lambda x: x.mean(axis=0), per_update)
      for name in COUNT_METRICS:   # of the whole batch: the sum over its mini-batches
        if name in metrics:
          metrics[name] = metrics[name] * config.mini_batches
      for name in ("skipped_nonfinite", "skipped_large_update"):   # any update of the batch
        metrics[name] = per_update[name].max()
      first_applied = applied[0]

    teacher_params = state.teacher_params
    if config.teacher == "ema" and teacher_params is not None:
      teacher_params = jax.tree.map(lambda t, p: t + config.ema_rate * (p - t),
                                    teacher_params, params)
    new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                           rng=jax.random.split(state.rng)[0] if state.rng.ndim == 1
                           else state.rng, teacher_params=teacher_params,
                           ref_params=state.ref_params)
    # A batch none of whose updates applied leaves the whole state, step counter and RNG
    # included, bit-identical, so `state.step` counts the batches trained on and the trainer
    # decides when to give up (`skipped_<reason>` is 1 when any update of the batch was).
    new_state = jax.tree.map(lambda new, old: jnp.where(first_applied, new, old), new_state,
                             state)
    return new_state, metrics

  return step


# ----------------------------------------------------------------------------- set-up


@dataclasses.dataclass
class Trainable:
  """The compiled step and what it needs: graph definition, non-param state, shardings."""

  graphdef: Any
  rest: Any
  optimizer: optax.GradientTransformation
  config: StepConfig
  mesh: Mesh
  state_shardings: Any
  step: Callable[[TrainState, Mapping[str, Array]], tuple[TrainState, dict[str, Array]]]
  compute_dtype: Any
  uncast_paths: frozenset   # `precision.uncast_param_paths` of the model

  def model(self, state: TrainState) -> nnx.Module:
    """The model with the state's (master) parameters."""
    return nnx.merge(self.graphdef, state.params, self.rest)

  def compute_model(self, state: TrainState, *, copy: bool = False) -> nnx.Module:
    """The model with the state's parameters as the forward sees them (compute dtype): what the
    sampler holds and what weight sync exports. The same arrays when the dtypes agree, unless
    `copy` (a sampler that keeps running while the next step donates `state`)."""
    params = precision.compute_params(state.params, self.compute_dtype, self.uncast_paths,
                                      copy=copy)
    return nnx.merge(self.graphdef, params, self.rest)

  def put_batch(self, batch: Mapping[str, np.ndarray]) -> dict[str, Array]:
    """Checks the batch keys and places this process's rows as the global batch."""
    missing = [k for k in self.config.required_keys() if k not in batch]
    if missing:
      raise KeyError(f"batch lacks {missing} needed by this StepConfig; it has {sorted(batch)}")
    rows = {k: np.asarray(v).shape[0] for k, v in batch.items() if np.ndim(v)}
    row_counts = {k: n for k, n in rows.items() if k not in SHARED_PREFIX_KEYS}
    if len(set(row_counts.values())) != 1:
      raise ValueError(f"batch arrays disagree on the number of rows: {row_counts}")
    data_shards = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
    units, what = rows["input_ids"] * jax.process_count(), "rows"
    if "prefix_ids" in batch:   # the step splits such a batch by group
      groups, width = np.shape(batch["prefix_ids"])
      if (rows["input_ids"] % groups or np.shape(batch.get("prefix_mask")) != (groups, width)
          or width >= np.shape(batch["input_ids"])[1]):
        raise ValueError(f"prefix_ids {np.shape(batch['prefix_ids'])} for input_ids "
                         f"{np.shape(batch['input_ids'])}: expected whole groups of rows, a "
                         "prefix narrower than the rows and a prefix_mask of its shape")
      size = rows["input_ids"] // groups
      for prefix_key, row_key in (("prefix_ids", "input_ids"), ("prefix_mask", "attention_mask")):
        if not np.array_equal(np.repeat(np.asarray(batch[prefix_key]), size, axis=0),
                              np.asarray(batch[row_key])[:, :width]):
          raise ValueError(f"{prefix_key} is not the first {width} columns of {row_key} in "
                           f"every group of {size} rows (a group's rows must share their "
                           "prefix: batching.group_prefixes)")
      units, what = groups * jax.process_count(), "shared-prefix groups"
    if units % (data_shards * self.config.micro_batches * self.config.mini_batches):
      raise ValueError(
          f"global batch of {units} {what} must be divisible by data×fsdp ({data_shards}) × "
          f"micro_batches ({self.config.micro_batches}) × mini_batches "
          f"({self.config.mini_batches})")
    return parallel.global_batch(batch, self.mesh)


def create(model: nnx.Module, optimizer: optax.GradientTransformation, config: StepConfig,
           mesh: Mesh, *, seed: int = 0,
           rules: Mapping[str, str | None] = parallel.LOGICAL_RULES) -> tuple[Trainable, TrainState]:
  """Shards the model's parameters over `mesh`, builds the train state and the jitted step."""
  uncast_paths = precision.uncast_param_paths(model)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  param_shardings = parallel.state_shardings(params, mesh, rules)
  params = jax.device_put(params, param_shardings)
  opt_shapes = jax.eval_shape(optimizer.init, params)
  opt_shardings = parallel.like_params_shardings(opt_shapes, params, param_shardings, mesh)
  opt_state = jax.jit(optimizer.init, out_shardings=opt_shardings)(params)
  replicated = NamedSharding(mesh, P())
  teacher_params = None
  teacher_shardings = None
  if config.needs_teacher_params:
    teacher_params = jax.tree.map(jnp.copy, params)
    teacher_shardings = param_shardings
  ref_params = ref_shardings = None
  if config.needs_ref_params:   # a copy: the step donates `params`
    ref_params = jax.device_put(
        precision.compute_params(params, model.dtype, uncast_paths, copy=True), param_shardings)
    ref_shardings = param_shardings
  state = TrainState(step=jax.device_put(jnp.zeros((), jnp.int32), replicated), params=params,
                     opt_state=opt_state,
                     rng=jax.device_put(jax.random.key_data(jax.random.key(seed)), replicated),
                     teacher_params=teacher_params, ref_params=ref_params)
  state_shardings = TrainState(step=replicated, params=param_shardings, opt_state=opt_shardings,
                               rng=replicated, teacher_params=teacher_shardings,
                               ref_params=ref_shardings)
  # Traced under the mesh: the decoder's activation sharding constraints apply against it.
  step_fn = parallel.under_mesh(make_step_fn(graphdef, rest, optimizer, config), mesh)
  # The batch keeps the shardings `Trainable.put_batch` gave it.
  jitted = jax.jit(step_fn, in_shardings=(state_shardings, None),
                   out_shardings=(state_shardings, replicated), donate_argnums=0)
  return Trainable(graphdef=graphdef, rest=rest, optimizer=optimizer, config=config, mesh=mesh,
                   state_shardings=state_shardings, step=jitted, compute_dtype=model.dtype,
                   uncast_paths=uncast_paths), state
