"""Per-token statistics of the fused train step, computed in sequence chunks.

The memory-saving core of the fused step (DESIGN.md, "One step of training"): from the final
hidden states of the student rows (and of the teacher rows) it forms vocabulary logits for one
chunk of `chunk` positions at a time inside a `jax.lax.scan`, reduces them at once to per-token
scalars, and drops them. The chunk body is wrapped in `jax.checkpoint`, so the backward pass
recomputes a chunk's logits instead of saving them: forward and backward both hold
O(B · chunk · V) logits, never a [B, T, V] tensor.

Alignment. `targets` are the row's own token ids: the hidden state at column t − 1 predicts
the token at column t. Every returned [B, T] array is aligned to the **target column**: entry
[b, t] is about predicting targets[b, t] from columns < t, so it lines up with `loss_mask`,
`advantages` and `old_logprobs` of the Batch contract (rised_jax/types.py). Column 0 is never
predicted and is 0 in every output. The hidden state of the last column predicts nothing and
is not used. Student and teacher rows must be column-aligned (left-padded prefixes), so one
`targets` array serves both.

- `token_stats_chunked`: student log-prob of the target, entropy, the distillation divergence
  against a teacher (optional), and optionally the teacher's log-prob of the target and log
  max-prob.
- `teacher_token_stats_chunked`: the teacher's log-prob of the target and log max-prob alone
  (a second teacher, e.g. CriPO's counterfactual one, whose logits meet no student's).

Cost that follows the trained tokens. Given `positions` ([B, T], nonzero on the target columns
whose statistics are used, e.g. loss_mask | distill_mask), each row's needed columns are first
gathered to its front (in column order) and, when T − 1 spans more than one chunk, chunks
past the longest row's count skip the vocabulary projection (a `lax.cond` in the scan, in the forward and the backward pass): the
head's cost is B · ceil(max needed per row / chunk) · chunk positions, not B · (T − 1). The
statistics of the other columns are 0.
"""
from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from rised_jax import plugins
from rised_jax.learn import losses
from rised_jax.checks import is_int

Array = jax.Array

# The divergence name that selects `losses.sampled_token_surrogate` (it needs only the target
# token's log-probs, so top-k and divergence options do not apply to it).
SAMPLED_TOKEN = "sampled-token"


class TokenStats(NamedTuple):
  """Per-token float32 [B, T] outputs of `token_stats_chunked`, aligned to target columns."""

  logprob: Array               # log p_S(y_t)
  entropy: Array               # H(p_S(· | y_<t)) = −Σ_v p_S(v) log p_S(v)
  divergence: Array            # the distillation term at t (0 without a teacher), clamped
  teacher_logprob: Array | None       # log p_T(y_t), when requested
  teacher_log_max_prob: Array | None  # log max_v p_T(v), when requested


def _check_rows(hidden: Array, targets: Array, chunk: int, logits_fn: Callable[[Array], Array],
                name: str) -> int:
  """Validates one set of rows and its head; returns the vocabulary size V."""
  if hidden.ndim != 3:
    raise ValueError(f"{name} must be [B, T, D]; got shape {hidden.shape}")
  if targets.shape != hidden.shape[:2]:
    raise ValueError(f"targets shape {targets.shape} must be the [B, T] of {name} "
                     f"{hidden.shape}")
  if not jnp.issubdtype(targets.dtype, jnp.integer):
    raise ValueError(f"targets must be integer token ids; got dtype {targets.dtype}")
  if hidden.shape[1] < 2:
    raise ValueError(f"need T >= 2 columns to predict a token; got T = {hidden.shape[1]}")
  if not is_int(chunk) or chunk < 1:
    raise ValueError(f"chunk must be a positive int; got {chunk!r}")
  # Abstract evaluation only (no FLOPs): checks the head's output and learns V.
  batch, _, width = hidden.shape
  chunk_hidden = jax.ShapeDtypeStruct((batch, chunk, width), hidden.dtype)
  logits_shape = jax.eval_shape(logits_fn, chunk_hidden).shape
  if len(logits_shape) != 3 or logits_shape[:2] != (batch, chunk):
    raise ValueError(f"the logits function of {name} must map hidden {chunk_hidden.shape} to "
                     f"logits [{batch}, {chunk}, V]; got shape {logits_shape}")
  return logits_shape[2]


def check_divergence_name(divergence: str) -> None:
  """`divergence` names a `losses.DIVERGENCES` entry or the sampled-token surrogate."""
  if divergence != SAMPLED_TOKEN and divergence not in losses.DIVERGENCES:
    raise plugins.PluginError(losses.DIVERGENCES.unknown_message(
        divergence, f"{SAMPLED_TOKEN!r} (the surrogate at the sampled token)"))


def _check_distillation(divergence: str, topk: int | None, clamp: float | None,
                        divergence_options: Mapping[str, float] | None, vocab: int) -> None:
  if divergence == SAMPLED_TOKEN:
    if topk is not None or divergence_options:
      raise ValueError(f"divergence {SAMPLED_TOKEN!r} takes no topk or divergence options; got "
                       f"topk={topk!r}, divergence_options={divergence_options!r}")
    losses.check_clamp(clamp)
    return
  check_divergence_name(divergence)
  losses.resolve_divergence(divergence, topk, clamp, divergence_options)
  if topk is not None and topk > vocab:
    raise ValueError(f"topk must be in [1, vocabulary size {vocab}]; got {topk}")


def _log_softmax_fn(logits_fn: Callable[[Array], Array]) -> Callable[[Array], Array]:
  return lambda hidden: jax.nn.log_softmax(logits_fn(hidden).astype(jnp.float32), axis=-1)


def _token_logprob(logp: Array, targets: Array) -> Array:
  return jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def _scan_chunks(chunk_fn: Callable[..., dict[str, Array]], rows: Sequence[Array | None],
                 targets: Array, chunk: int, positions: Array | None = None) -> dict[str, Array]:
  """Maps chunk_fn over sequence chunks; returns its outputs as [B, T] target-column arrays.

  chunk_fn(targets [B, c], *rows [B, c, D] or None) → {name: [B, c]} sees the T − 1 predicting
  columns of each row, `chunk` at a time; column 0 of every output is 0. The chunk body is
  rematerialised: the backward pass recomputes a chunk's logits instead of saving them (CSE
  prevention is unnecessary inside a scan). With `positions` only the needed columns are
  computed (module docstring); every other output is 0.
  """
  predicted = targets.shape[1] - 1
  # A chunk wider than the row would only project padding through the vocabulary head.
  chunk = min(chunk, predicted)
  num_chunks = -(-predicted // chunk)
  columns = (targets[:, 1:], *(None if r is None else r[:, :-1] for r in rows))
  if positions is not None:
    needed = positions[:, 1:] > 0
  # One chunk has nothing to skip: no packing then, only the unused columns zeroed.
  packed = positions is not None and num_chunks > 1
  if packed:
    # Stable: a row's needed columns first, in column order; `unpack` is the inverse.
    order = jnp.argsort(~needed, axis=1, stable=True)
    unpack = jnp.argsort(order, axis=1)
    columns = tuple(None if x is None else _take_columns(x, order) for x in columns)
    needed_chunks = -(-needed.sum(axis=1).max() // chunk)

  def to_chunks(x: Array | None) -> Array | None:
    """[B, L, ...] → [num_chunks, B, chunk, ...], zero-padding L up to num_chunks · chunk."""
    if x is None:
      return None
    x = jnp.pad(x, [(0, 0), (0, num_chunks * chunk - predicted)] + [(0, 0)] * (x.ndim - 2))
    return jnp.swapaxes(x.reshape(x.shape[0], num_chunks, chunk, *x.shape[2:]), 0, 1)

  def from_chunks(x: Array) -> Array:
    """[num_chunks, B, chunk] → [B, T]: drop the padding (unpack), put 0 in column 0."""
    x = jnp.swapaxes(x, 0, 1).reshape(x.shape[1], -1)[:, :predicted]
    if packed:
      x = _take_columns(x, unpack)
    if positions is not None:
      x = jnp.where(needed, x, 0.0)
    return jnp.pad(x, [(0, 0), (1, 0)])

  body = jax.checkpoint(chunk_fn, prevent_cse=False)
  xs = tuple(to_chunks(x) for x in columns)
  if not packed:
    step = lambda carry, x: (carry, body(*x))  # noqa: E731
  else:
    def step(carry, indexed):
      index, x = indexed
      skipped = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(body, *x))
      return carry, jax.lax.cond(index < needed_chunks, lambda: body(*x), lambda: skipped)
    xs = (jnp.arange(num_chunks), xs)
  _, stacked = jax.lax.scan(step, None, xs)
  return {name: from_chunks(x) for name, x in stacked.items()}


def _take_columns(x: Array, order: Array) -> Array:
  """x [B, L, ...] with each row's columns in `order` [B, L]."""
  return jnp.take_along_axis(x, order.reshape(order.shape + (1,) * (x.ndim - 2)), axis=1)


def _check_positions(positions: jax.typing.ArrayLike | None, targets: Array) -> Array | None:
  if positions is None:
    return None
  positions = jnp.asarray(positions)
  if positions.shape != targets.shape:
    raise ValueError(f"positions shape {positions.shape} must be the [B, T] of targets "
                     f"{targets.shape}")
  return positions


def token_stats_chunked(student_hidden: jax.typing.ArrayLike,
                        teacher_hidden: jax.typing.ArrayLike | None,
                        logits_fn: Callable[[Array], Array],
                        targets: jax.typing.ArrayLike, *, chunk: int,
                        divergence: str = "forward-kl", topk: int | None = None,
                        clamp: float | None = None, want_teacher_token_stats: bool = False,
                        divergence_options: Mapping[str, float] | None = None,
                        teacher_logits_fn: Callable[[Array], Array] | None = None,
                        positions: jax.typing.ArrayLike | None = None) -> TokenStats:
  """Student log-probs, entropy and the distillation divergence per token, chunk by chunk.

  Args:
    student_hidden: [B, T, D] final hidden states of the student rows.
    teacher_hidden: [B, T, D] of the teacher rows (column-aligned), or None. A constant: the
      teacher's hidden states and logits are under stop_gradient.
    logits_fn: hidden [B, c, D] → logits [B, c, V]; closes over the unembedding (e.g.
      `model.logits`), whose parameters receive gradients through the student path only.
    targets: [B, T] int token ids of the student rows, in [0, V).
    chunk: positions per chunk; T − 1 need not be a multiple (padded internally).
    divergence: a key of `losses.DIVERGENCES`, or "sampled-token" for
      `losses.sampled_token_surrogate`.
    topk: None (full vocabulary) or the teacher's top-k plus a tail bucket.
    clamp: per-token maximum of the divergence (see `losses.logprob_divergence`).
    want_teacher_token_stats: also return log p_T(y_t) and log max_v p_T(v) (CriPO's
      counterfactual selection rule); needs a teacher.
    divergence_options: options of the divergence, e.g. {"beta": 0.5} for "jsd".
    teacher_logits_fn: the teacher's head when its parameters differ from the student's (EMA
      or frozen teacher); None: `logits_fn`. Its output is under stop_gradient.
    positions: None (every column) or [B, T], nonzero on the target columns whose statistics
      are needed; the head runs over those only (module docstring), the rest are 0.

  Returns:
    `TokenStats`, each field float32 [B, T] aligned to target columns (column 0 is 0).
  """
  student_hidden = jnp.asarray(student_hidden)
  targets = jnp.asarray(targets)
  teacher_logits_fn = logits_fn if teacher_logits_fn is None else teacher_logits_fn
  vocab = _check_rows(student_hidden, targets, chunk, logits_fn, "student_hidden")
  if teacher_hidden is None:
    if want_teacher_token_stats:
      raise ValueError("want_teacher_token_stats=True needs teacher_hidden")
  else:
    teacher_hidden = jax.lax.stop_gradient(jnp.asarray(teacher_hidden))
    if teacher_hidden.shape != student_hidden.shape:
      raise ValueError(f"teacher_hidden shape {teacher_hidden.shape} must equal student_hidden "
                       f"shape {student_hidden.shape} (column-aligned rows)")
    teacher_vocab = _check_rows(teacher_hidden, targets, chunk, teacher_logits_fn,
                                "teacher_hidden")
    if teacher_vocab != vocab:
      raise ValueError(f"teacher vocabulary size {teacher_vocab} != student's {vocab}")
  _check_distillation(divergence, topk, clamp, divergence_options, vocab)
  student_log_softmax = _log_softmax_fn(logits_fn)
  teacher_log_softmax = _log_softmax_fn(teacher_logits_fn)

  def chunk_stats(targets_c: Array, student_h: Array,
                  teacher_h: Array | None) -> dict[str, Array]:
    student_logp = student_log_softmax(student_h)
    token_logp = _token_logprob(student_logp, targets_c)
    stats = {
        "logprob": token_logp,
        "entropy": -(jnp.exp(student_logp) * student_logp).sum(axis=-1),
    }
    if teacher_h is None:
      return stats
    teacher_logp = jax.lax.stop_gradient(teacher_log_softmax(teacher_h))
    teacher_token_logp = _token_logprob(teacher_logp, targets_c)
    if divergence == SAMPLED_TOKEN:
      stats["divergence"] = losses.sampled_token_surrogate(token_logp, teacher_token_logp,
                                                           clamp=clamp)
    else:
      stats["divergence"] = losses.logprob_divergence(
          student_logp, teacher_logp, divergence=divergence, topk=topk, clamp=clamp,
          options=divergence_options)
    if want_teacher_token_stats:
      stats["teacher_logprob"] = teacher_token_logp
      stats["teacher_log_max_prob"] = teacher_logp.max(axis=-1)
    return stats

  per_token = _scan_chunks(chunk_stats, (student_hidden, teacher_hidden), targets, chunk,
                           _check_positions(positions, targets))
  return TokenStats(
      logprob=per_token["logprob"],
      entropy=per_token["entropy"],
      divergence=per_token.get("divergence", jnp.zeros_like(per_token["logprob"])),
      teacher_logprob=per_token.get("teacher_logprob"),
      teacher_log_max_prob=per_token.get("teacher_log_max_prob"),
  )


def teacher_token_stats_chunked(teacher_hidden: jax.typing.ArrayLike,
                                logits_fn: Callable[[Array], Array],
                                targets: jax.typing.ArrayLike, *, chunk: int,
                                positions: jax.typing.ArrayLike | None = None
                                ) -> tuple[Array, Array]:
  """log p_T(y_t) and log max_v p_T(v) of a teacher alone (e.g. CriPO's counterfactual one).

  Same chunking, alignment, targets and `positions` convention as `token_stats_chunked`;
  everything is under stop_gradient. Returns two float32 [B, T] arrays (column 0 is 0).
  """
  teacher_hidden = jax.lax.stop_gradient(jnp.asarray(teacher_hidden))
  targets = jnp.asarray(targets)
  _check_rows(teacher_hidden, targets, chunk, logits_fn, "teacher_hidden")
  log_softmax = _log_softmax_fn(logits_fn)

  def chunk_stats(targets_c: Array, teacher_h: Array) -> dict[str, Array]:
    logp = jax.lax.stop_gradient(log_softmax(teacher_h))
    return {"logprob": _token_logprob(logp, targets_c), "log_max_prob": logp.max(axis=-1)}

  per_token = _scan_chunks(chunk_stats, (teacher_hidden,), targets, chunk,
                           _check_positions(positions, targets))
  return per_token["logprob"], per_token["log_max_prob"]
