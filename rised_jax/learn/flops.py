"""Model FLOPs of the decoder and the train step, the device's peak rate, and MFU.

Shared by every run (`throughput/*` in metrics.jsonl, `Throughput`) and the benchmarks
(`benchmarks/common.py` re-exports these). FLOPs are counted analytically from the
architecture: matmuls only, the usual convention for MFU (PaLM, appendix B); recomputation
(remat, the chunked loss's rematerialised logits) is not model work and is not counted.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from rised_jax.model import ModelConfig

# Published dense bf16 matmul peaks per chip, FLOP/s, by `jax.Device.device_kind`; MFU is
# model FLOPs / step seconds / (this × devices). A kind not listed (CPUs) is measured once
# with `measure_matmul_rate` at its compute dtype, unless train.peak_flops_per_s is given.
PEAK_FLOPS_PER_DEVICE = {
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H100": 989e12,
    "NVIDIA H200": 989e12,
    "NVIDIA GH200 480GB": 989e12,
}


def nonembedding_params(cfg: ModelConfig) -> int:
  """Weights of the matmuls inside the layers (q, k, v, o and the gated MLP), no norms."""
  d, hd = cfg.hidden_size, cfg.head_dim
  attention = d * hd * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
  mlp = 3 * d * cfg.intermediate_size
  return cfg.num_layers * (attention + mlp)


def decoder_forward_flops(cfg: ModelConfig, rows: int, seq_len: int,
                          logit_positions: int, score_pairs: int | None = None
                          ) -> dict[str, float]:
  """Matmul FLOPs of one forward pass over `rows` × `seq_len` tokens.

  linear     2 · N_nonembed · rows · seq_len
  attention  2 · 2 · rows · score_pairs · heads · head_dim per layer (QKᵀ and PV over the
             query-key pairs of a row: by default the full T × T score matrix, no causal
             skipping)
  unembed    2 · hidden · vocab · rows · logit_positions (logit_positions per row)
  The embedding lookup is a gather (no FLOPs); norms and softmaxes are not counted.
  """
  tokens = rows * seq_len
  return {
      "linear": 2.0 * nonembedding_params(cfg) * tokens,
      "attention": (4.0 * cfg.num_layers * rows
                    * (seq_len**2 if score_pairs is None else score_pairs)
                    * cfg.num_heads * cfg.head_dim),
      "unembed": 2.0 * cfg.hidden_size * cfg.vocab_size * rows * logit_positions,
  }


def train_step_flops(cfg: ModelConfig, rows: int, seq_len: int,
                     teacher_forwards: float = 0.0,
                     head_positions: int | None = None,
                     student_layout: tuple[int, int, int] | None = None,
                     reference_forwards: float = 0.0) -> dict[str, float]:
  """Model FLOPs of one train step: forward + backward (3 × forward) of the student, plus
  `teacher_forwards` stop-gradient forwards of the same shape (the fused step's teacher)
  and `reference_forwards` of the student's (the reference KL's frozen policy).

  Logits are needed at the T − 1 predicting columns of every row, or, with `head_positions`,
  at that many columns in all (the step's head runs over the columns its loss reads only:
  `learn.chunked`). `student_layout` (sequences, columns, query-key pairs per sequence): the
  student's layers run over this layout instead of the rows (`student_layout_of`: a group's
  shared prefix once); the head still reads the rows' columns. Recomputation (the chunked
  loss rematerialises its logits in the backward pass) is not model work and is not
  counted, as usual for MFU.
  """
  forward = decoder_forward_flops(cfg, rows, seq_len, seq_len - 1)
  if head_positions is not None:
    forward["unembed"] = 2.0 * cfg.hidden_size * cfg.vocab_size * head_positions
  student = dict(forward)
  if student_layout is not None:
    sequences, columns, pairs = student_layout
    student.update({name: value for name, value in
                    decoder_forward_flops(cfg, sequences, columns, 0, pairs).items()
                    if name != "unembed"})
  parts = {name: (3.0 + reference_forwards) * student[name] + teacher_forwards * value
           for name, value in forward.items()}
  parts["total"] = sum(parts.values())
  return parts


def student_layout_of(batch: Mapping[str, Any]) -> tuple[int, int, int]:
  """(sequences, columns, query-key pairs per sequence) the step's student layers run over:
  the rows, B of T columns and T² pairs; or with shared-prefix groups (`prefix_ids` [n, P]),
  n sequences of P + G·R columns (G = B / n, R = T − P) whose prefix sees itself (P² pairs)
  and each response the prefix and itself (R · (P + R) pairs), as in its own row."""
  rows, seq_len = np.shape(batch["input_ids"])
  if "prefix_ids" not in batch:
    return rows, seq_len, seq_len**2
  groups, width = np.shape(batch["prefix_ids"])
  size, response = rows // groups, seq_len - width
  return groups, width + size * response, width**2 + size * response * seq_len


def kv_bytes_per_token(cfg: ModelConfig, itemsize: int) -> int:
  """Bytes of one token's keys and values over all layers: 2 · layers · kv_heads · head_dim ·
  itemsize."""
  return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize


def decode_read_bytes(cfg: ModelConfig, weight_bytes: int, rows: int, prompt_len: int,
                      new_tokens: int, itemsize: int) -> int:
  """The least memory traffic of decoding `new_tokens` tokens for `rows` rows after prompts of
  `prompt_len` tokens: every decode step reads the weights once (shared by the rows) and each
  row's filled KV cache. Step i (0-based) attends over prompt_len + i cached tokens, so

    new_tokens · weight_bytes
    + rows · kv_bytes_per_token · (new_tokens · prompt_len + new_tokens · (new_tokens − 1) / 2).

  Dividing by the measured memory bandwidth gives the decode's bandwidth-bound time (a
  cache allocated wider than it is filled, or one re-read per head, only adds traffic)."""
  if min(rows, prompt_len, new_tokens) < 0 or weight_bytes < 0:
    raise ValueError(f"need non-negative sizes; got weight_bytes={weight_bytes}, rows={rows}, "
                     f"prompt_len={prompt_len}, new_tokens={new_tokens}")
  cached_tokens = new_tokens * prompt_len + new_tokens * (new_tokens - 1) // 2
  return new_tokens * weight_bytes + rows * kv_bytes_per_token(cfg, itemsize) * cached_tokens


def limit_fraction(work: float, seconds: float, limit_per_s: float) -> float:
  """The fraction of a machine limit a stage reached: `work` (FLOPs, bytes) done in `seconds`
  against the limit's rate (FLOP/s, bytes/s); equally the limit-bound time over the measured
  time. MFU is this for model FLOPs and the matmul rate."""
  if seconds <= 0 or limit_per_s <= 0:
    raise ValueError(f"need seconds > 0 and limit_per_s > 0; got {seconds}, {limit_per_s}")
  return float(work) / seconds / limit_per_s


def measure_matmul_rate(size: int, min_seconds: float = 1.0, min_calls: int = 3,
                        dtype: Any = jnp.float32) -> dict[str, float]:
  """FLOP/s of a jitted [size, size] @ [size, size] in `dtype` (float32 unless told;
  2·size³ FLOPs per call).

  Calls are repeated until `min_seconds` have passed (at least `min_calls`); the rate uses
  the median call, the same statistic as the step times it is compared with. Also per
  CPU-second (all threads), for an MFU that other jobs on a shared machine disturb less.
  """
  if size < 1:
    raise ValueError(f"matmul size must be >= 1, got {size}")
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.standard_normal((size, size)), dtype)
  b = jnp.asarray(rng.standard_normal((size, size)), dtype)
  matmul = jax.jit(jnp.dot)
  matmul(a, b).block_until_ready()
  times, cpu_times = [], []
  while len(times) < min_calls or sum(times) < min_seconds:
    start, cpu_start = time.perf_counter(), time.process_time()
    matmul(a, b).block_until_ready()
    times.append(time.perf_counter() - start)
    cpu_times.append(time.process_time() - cpu_start)
  median, cpu_median = float(np.median(times)), float(np.median(cpu_times))
  return {"size": size, "calls": len(times), "median_s": median, "cpu_median_s": cpu_median,
          "flops_per_s": 2.0 * size**3 / median, "flops_per_cpu_s": 2.0 * size**3 / cpu_median}


def batch_forwards(batch: Mapping[str, Any], ref_kl: bool, micro_batches: int = 1) -> float:
  """Stop-gradient forwards the step runs besides the student's forward + backward: one of the
  frozen reference policy when the reference KL is on, and one per teacher row set the batch
  carries (`teacher_input_ids`, `cf_teacher_input_ids`) times the share of its micro-batches
  (rows m, m + M, … as the step splits them; shared-prefix groups m, m + M, …) with a token
  that reads that teacher: the step skips the others' forward
  (`train_step.teacher_rows_hidden`)."""
  units = np.shape(batch["prefix_ids" if "prefix_ids" in batch else "input_ids"])[0]

  def share(token_mask) -> float:
    mask = np.asarray(token_mask) > 0
    per_micro = mask.reshape(units // micro_batches, micro_batches, -1).any(axis=(0, 2))
    return float(per_micro.mean())

  forwards = float(ref_kl)
  if "teacher_input_ids" in batch:
    forwards += share(batch["distill_mask"])
  if "cf_teacher_input_ids" in batch:
    forwards += share(np.asarray(batch["cf_mask"]) * np.asarray(batch["loss_mask"]))
  return forwards


def peak_flops_per_s_of(device_kind: str, num_devices: int) -> float | None:
  """The published peak of `num_devices` chips of `device_kind`, or None if not listed."""
  per_device = PEAK_FLOPS_PER_DEVICE.get(device_kind)
  return None if per_device is None else per_device * num_devices


@dataclasses.dataclass(frozen=True)
class Throughput:
  """Per-step tokens/s and MFU of a run's train step (`throughput/*` and `time/*`).

  `peak_flops_per_s` is the denominator of the MFU, for all devices together; `peak_source`
  says where it came from ("published …" for a listed device kind, "measured …" for the
  matmul probe, "config" for train.peak_flops_per_s).
  """

  model: ModelConfig
  peak_flops_per_s: float
  peak_source: str
  ref_kl: bool = False
  # PPO passes over each batch (train.num_iterations): each is a full student forward +
  # backward with its teacher and reference forwards. Mini-batches split a pass's rows, not
  # its work; with several updates per batch (`StepConfig.fixed_per_batch`) one stop-gradient
  # forward first fixes log π_old.
  num_iterations: int = 1
  old_policy_pass: bool = False
  micro_batches: int = 1   # how the step splits a batch's rows (`batch_forwards`)

  @classmethod
  def for_devices(cls, model: ModelConfig, compute_dtype: str, *, ref_kl: bool,
                  peak_flops_per_s: float = 0.0, num_iterations: int = 1,
                  old_policy_pass: bool = False, micro_batches: int = 1) -> "Throughput":
    """The run's throughput meter: a configured peak, else the published one of these
    devices, else their measured matmul rate at the compute dtype (about a second)."""
    devices = jax.devices()
    if peak_flops_per_s > 0:
      return cls(model, float(peak_flops_per_s), "config", ref_kl, num_iterations,
                 old_policy_pass, micro_batches)
    kind = devices[0].device_kind
    published = peak_flops_per_s_of(kind, len(devices))
    if published is not None:
      return cls(model, published, f"published bf16 peak of {len(devices)} × {kind}", ref_kl,
                 num_iterations, old_policy_pass, micro_batches)
    rate = measure_matmul_rate(1024, min_seconds=0.5, dtype=jnp.dtype(compute_dtype))
    return cls(model, rate["flops_per_s"] * len(devices),
               f"measured {compute_dtype} 1024² matmul rate of {len(devices)} × {kind}", ref_kl,
               num_iterations, old_policy_pass, micro_batches)

  def step_metrics(self, batch: Mapping[str, Any], seconds: float) -> dict[str, float]:
    """What one executed step did in `seconds` (compile time excluded by the caller). The
    counts are the same in every run of a config; the rates, which depend on the machine,
    are under time/ (the wall-clock prefix an exact resume leaves out):

    throughput/tokens          attended (non-padding) tokens of the student rows
    throughput/trained_tokens  response tokens with loss (the policy-gradient tokens)
    throughput/model_tflops    model FLOPs of the step over its padded batch, in TFLOP:
                               `num_iterations` × `train_step_flops` with `batch_forwards`
                               extra forwards, plus the π_old forward (old_policy_pass)
    throughput/layer_columns   columns the student's layers ran over (`student_layout_of`:
                               rows × T, or fewer with shared-prefix groups)
    time/throughput/step_compute_s   `seconds`
    time/throughput/tokens_per_s, time/throughput/trained_tokens_per_s   the counts per second
    time/throughput/mfu        model FLOPs / seconds / peak_flops_per_s
    """
    rows, seq_len = np.shape(batch["input_ids"])
    layout = student_layout_of(batch)
    one_pass = train_step_flops(self.model, rows, seq_len,
                                teacher_forwards=batch_forwards(batch, False, self.micro_batches),
                                student_layout=layout, reference_forwards=float(self.ref_kl))
    forward = train_step_flops(self.model, rows, seq_len, student_layout=layout)
    flops = (self.num_iterations * one_pass["total"]
             + (forward["total"] / 3.0 if self.old_policy_pass else 0.0))
    tokens = float(np.sum(batch["attention_mask"]))
    trained = float(np.sum(np.asarray(batch["loss_mask"]) > 0))
    seconds = max(seconds, 1e-9)
    return {"throughput/tokens": tokens, "throughput/trained_tokens": trained,
            "throughput/model_tflops": flops / 1e12,
            "throughput/layer_columns": float(layout[0] * layout[1]),
            "time/throughput/step_compute_s": seconds,
            "time/throughput/tokens_per_s": tokens / seconds,
            "time/throughput/trained_tokens_per_s": trained / seconds,
            "time/throughput/mfu": flops / seconds / self.peak_flops_per_s}
