"""Batch assembly: training rows → the dense, bucketed arrays of the Batch contract (types.py).

A row is a prefix (system prompt, maybe a hint, first observation) and a response (everything
after: agent turns and environment messages). Student and teacher rows of one rollout share the
response ids and differ only in the prefix. Every prefix is LEFT-padded to one column P, so the
response starts at column P in every student and teacher row, and responses are right-padded to
R; P and R are rounded up to buckets so the step compiles once per bucket pair.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from rised_jax.checks import (Rule, check_rules, from_section, int_at_least, is_int,
                             positive_ints)

RULES: dict[str, Rule] = {
    "prefix_multiple": int_at_least(1),
    "response_multiple": int_at_least(1),
    "length_buckets": positive_ints(0),
    "shared_prefix": ((lambda v: isinstance(v, bool)), "True or False"),
}


@dataclasses.dataclass(frozen=True)
class BatchingConfig:
  """config.batching (docs/config.md): the column multiples and width buckets of `assemble`."""

  prefix_multiple: int
  response_multiple: int
  length_buckets: tuple[int, ...]
  # A group's rows share their prefix: `assemble` adds it once per group (`prefix_ids`) and
  # the step's student forward runs it once (`model.shared_prefix`).
  shared_prefix: bool = False

  @classmethod
  def from_config(cls, section: Any) -> BatchingConfig:
    return from_section(cls, section)

  def check(self) -> None:
    check_rules("config.batching", self, RULES)


@dataclasses.dataclass
class Row:
  """One training row (one rollout)."""

  prefix_ids: Sequence[int]             # the student prefix (what the policy is trained on)
  response_ids: Sequence[int]
  response_loss_mask: Sequence[int]      # 1 on agent tokens of the response
  response_behaviour_logprobs: Sequence[float]
  advantage: float                       # broadcast to every response token
  teacher_prefix_ids: Sequence[int] | None = None   # None: no distillation for this row
  cf_teacher_prefix_ids: Sequence[int] | None = None  # CriPO counterfactual teacher
  # Whether the sampler saw `prefix_ids` (False: it sampled under a guidance hint the row is
  # trained without), so its log-probs measure the sampler's weights only where this is True.
  sampled_on_prefix: bool = True


def bucket(length: int, multiple: int) -> int:
  """Smallest multiple of `multiple` that holds `length` (at least one bucket)."""
  return max(multiple, -(-length // multiple) * multiple)


def _left_pad(ids: Sequence[int], width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  ids = np.asarray(ids, np.int32)
  out = np.full(width, pad_id, np.int32)
  mask = np.zeros(width, np.int32)
  if len(ids):
    out[width - len(ids):] = ids
    mask[width - len(ids):] = 1
  return out, mask


def assemble(rows: Sequence[Row], *, pad_id: int, num_rows: int | None = None,
             prefix_multiple: int = 64, response_multiple: int = 64,
             length_buckets: Sequence[int] = (),
             with_distill: bool = False, with_counterfactual: bool = False,
             shared_prefix: bool = False, group_size: int = 1) -> dict[str, np.ndarray]:
  """Dense arrays for the train step. Extra all-padding rows fill up to `num_rows`.

  With `shared_prefix`, rows g·G … g·G + G − 1 (G = `group_size`) are group g; when every
  group's rows (the padding rows' too) have one student prefix, the batch also holds each
  group's prefix columns once, `prefix_ids` and `prefix_mask` [num_rows / G, P], and the
  step runs each prefix once (`model.shared_prefix`). A batch with a group whose prefixes
  differ (e.g. per-rollout hints trained with) is returned without them.

  The width is P + R (each rounded up to its multiple), widened to the smallest of
  `length_buckets` that holds it by left-padding the prefixes (positions follow the
  attention mask, so the rows' values do not change): the step then compiles once per
  bucket. A batch wider than every bucket keeps its own width. With `shared_prefix` the
  bucket right-pads the responses instead, so the step compiles once per bucket and prefix
  width.

  Rows without a teacher keep their own prefix in the teacher columns and get a zero
  distill_mask, so every row has the same shape and compiles once.
  """
  if not rows:
    raise ValueError("cannot assemble a batch from zero rows")
  num_rows = len(rows) if num_rows is None else num_rows
  if num_rows < len(rows):
    raise ValueError(f"num_rows={num_rows} is smaller than the {len(rows)} rows given")
  for i, row in enumerate(rows):
    n = len(row.response_ids)
    if len(row.response_loss_mask) != n or len(row.response_behaviour_logprobs) != n:
      raise ValueError(f"row {i}: response ids ({n}), loss mask ({len(row.response_loss_mask)}) "
                       f"and behaviour log-probs ({len(row.response_behaviour_logprobs)}) differ")
    if not row.prefix_ids:
      raise ValueError(f"row {i}: empty prefix (the first response token needs a context)")

  prefixes = [len(r.prefix_ids) for r in rows]
  if with_distill:
    prefixes += [len(r.teacher_prefix_ids) for r in rows if r.teacher_prefix_ids is not None]
  if with_counterfactual:
    prefixes += [len(r.cf_teacher_prefix_ids) for r in rows if r.cf_teacher_prefix_ids is not None]
  p = bucket(max(prefixes), prefix_multiple)
  r = bucket(max(len(row.response_ids) for row in rows), response_multiple)
  t = min((width for width in length_buckets if width >= p + r), default=p + r)
  # A bucket widens the prefixes (left padding), or with shared prefixes the responses (right
  # padding): the shared prefix's width is part of the step's compiled shape
  # (`group_prefixes`), so it then follows the prompts only, not the responses' lengths.
  if shared_prefix:
    r = t - p
  else:
    p = t - r

  def zeros(dtype):
    return np.zeros((num_rows, t), dtype)

  out = {
      "input_ids": np.full((num_rows, t), pad_id, np.int32),
      "attention_mask": zeros(np.int32),
      "loss_mask": zeros(np.float32),
      "advantages": zeros(np.float32),
      "behaviour_logprobs": zeros(np.float32),
      "same_context_mask": zeros(np.float32),
  }
  if with_distill:
    out.update(teacher_input_ids=np.full((num_rows, t), pad_id, np.int32),
               teacher_attention_mask=zeros(np.int32), distill_mask=zeros(np.float32))
  if with_counterfactual:
    out.update(cf_teacher_input_ids=np.full((num_rows, t), pad_id, np.int32),
               cf_teacher_attention_mask=zeros(np.int32), cf_mask=zeros(np.float32))

  for i, row in enumerate(rows):
    n = len(row.response_ids)
    response = np.asarray(row.response_ids, np.int32)
    loss = np.asarray(row.response_loss_mask, np.float32)

    def fill(ids_key, mask_key, prefix):
      ids, mask = _left_pad(prefix, p, pad_id)
      out[ids_key][i, :p], out[mask_key][i, :p] = ids, mask
      out[ids_key][i, p:p + n] = response
      out[mask_key][i, p:p + n] = 1

    fill("input_ids", "attention_mask", row.prefix_ids)
    out["loss_mask"][i, p:p + n] = loss
    out["advantages"][i, p:p + n] = row.advantage * loss
    out["behaviour_logprobs"][i, p:p + n] = np.asarray(row.response_behaviour_logprobs) * loss
    out["same_context_mask"][i, p:p + n] = loss * float(row.sampled_on_prefix)
    teachers = []   # (ids key, attention key, mask key, teacher prefix or None)
    if with_distill:
      teachers.append(("teacher_input_ids", "teacher_attention_mask", "distill_mask",
                       row.teacher_prefix_ids))
    if with_counterfactual:
      teachers.append(("cf_teacher_input_ids", "cf_teacher_attention_mask", "cf_mask",
                       row.cf_teacher_prefix_ids))
    for ids_key, mask_key, token_mask_key, teacher_prefix in teachers:
      fill(ids_key, mask_key, row.prefix_ids if teacher_prefix is None else teacher_prefix)
      if teacher_prefix is not None:
        out[token_mask_key][i, p:p + n] = loss
  # Padding rows: one attended token so every row has a real position 0; no loss anywhere.
  for key in ("attention_mask", "teacher_attention_mask", "cf_teacher_attention_mask"):
    if key in out:
      out[key][len(rows):, p - 1] = 1
  if shared_prefix:
    out.update(group_prefixes(out["input_ids"], out["attention_mask"], p, group_size))
  return out


def group_prefixes(input_ids: np.ndarray, attention_mask: np.ndarray, prefix_width: int,
                   group_size: int) -> dict[str, np.ndarray]:
  """{"prefix_ids", "prefix_mask"} [B / G, P]: the first `prefix_width` columns of each group
  of `group_size` consecutive rows, when all its rows agree there ({} when a group's rows
  differ)."""
  rows = input_ids.shape[0]
  if not is_int(group_size) or group_size < 1 or rows % group_size:
    raise ValueError(f"group_size={group_size!r}: expected an integer >= 1 that divides the "
                     f"batch's {rows} rows")
  ids = input_ids[:, :prefix_width].reshape(rows // group_size, group_size, prefix_width)
  mask = attention_mask[:, :prefix_width].reshape(ids.shape)
  if not ((ids == ids[:, :1]).all() and (mask == mask[:, :1]).all()):
    return {}
  return {"prefix_ids": ids[:, 0].copy(), "prefix_mask": mask[:, 0].copy()}
