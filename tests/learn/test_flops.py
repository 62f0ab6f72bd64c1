"""The run's throughput meter (`learn.flops.Throughput`): FLOPs worked by hand for a small
decoder, the extra forwards a batch implies, and where the MFU's peak comes from."""
from __future__ import annotations

import numpy as np
import pytest

from rised_jax.learn import flops
from rised_jax.model import ModelConfig

# 2 layers, d 16, 4 heads of 4 (2 kv heads), MLP 32, vocab 50.
CFG = ModelConfig.from_hf({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 50,
    "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4, "rms_norm_eps": 1e-6,
    "rope_theta": 10_000.0, "tie_word_embeddings": True, "max_position_embeddings": 64,
}, source="test")


def _batch(rows=3, seq=6, teacher=False, cf=False):
  batch = {"input_ids": np.zeros((rows, seq), np.int32),
           "attention_mask": np.zeros((rows, seq), np.int32),
           "loss_mask": np.zeros((rows, seq), np.float32)}
  batch["attention_mask"][0, 1:] = 1      # 5 tokens
  batch["attention_mask"][1, 3:] = 1      # 3 tokens; row 2 is padding
  batch["loss_mask"][0, 4:] = 1.0         # 2 trained tokens
  batch["loss_mask"][1, 5] = 0.5          # 1 (a weight, still a trained token)
  if teacher:   # row 0 distils on its trained tokens
    batch["teacher_input_ids"] = batch["input_ids"].copy()
    batch["distill_mask"] = np.zeros((rows, seq), np.float32)
    batch["distill_mask"][0, 4:] = 1.0
  if cf:        # row 1's trained token reads the counterfactual teacher
    batch["cf_teacher_input_ids"] = batch["input_ids"].copy()
    batch["cf_mask"] = np.zeros((rows, seq), np.float32)
    batch["cf_mask"][1, :] = 1.0
  return batch


def test_step_metrics_hand_worked():
  # N_nonembed = 2 · (16·4·(2·4 + 2·2) + 3·16·32) = 2 · (768 + 1536) = 4608.
  assert flops.nonembedding_params(CFG) == 4608
  rows, seq = 3, 6
  linear = 2 * 4608 * rows * seq                  # 165 888
  attention = 4 * 2 * rows * seq**2 * 4 * 4       # 13 824
  unembed = 2 * 16 * 50 * rows * (seq - 1)        # 24 000
  forward = linear + attention + unembed          # 203 712
  meter = flops.Throughput(CFG, peak_flops_per_s=1e6, peak_source="test")
  got = meter.step_metrics(_batch(), seconds=0.5)
  assert got["throughput/model_tflops"] == pytest.approx(3 * forward / 1e12, rel=1e-12)
  assert got["throughput/tokens"] == 8 and got["throughput/trained_tokens"] == 3
  assert got["time/throughput/tokens_per_s"] == 16
  assert got["time/throughput/trained_tokens_per_s"] == 6
  assert got["time/throughput/mfu"] == pytest.approx(3 * forward / 0.5 / 1e6, rel=1e-12)
  # A teacher, a counterfactual teacher and the reference policy: one forward each.
  with_all = flops.Throughput(CFG, 1e6, "test", ref_kl=True).step_metrics(
      _batch(teacher=True, cf=True), seconds=0.5)
  assert with_all["throughput/model_tflops"] == pytest.approx(6 * forward / 1e12, rel=1e-12)
  # Four PPO passes, each with its teacher forward, after one forward for log π_old.
  ppo = flops.Throughput(CFG, 1e6, "test", num_iterations=4, old_policy_pass=True).step_metrics(
      _batch(teacher=True), seconds=0.5)
  assert ppo["throughput/model_tflops"] == pytest.approx((4 * 4 + 1) * forward / 1e12,
                                                         rel=1e-12)


def test_batch_forwards():
  assert flops.batch_forwards(_batch(), ref_kl=False) == 0
  assert flops.batch_forwards(_batch(teacher=True), ref_kl=False) == 1
  assert flops.batch_forwards(_batch(teacher=True, cf=True), ref_kl=True) == 3
  # A teacher no token reads is not run (train_step.teacher_rows_hidden).
  unread = _batch(teacher=True, cf=True)
  unread["distill_mask"][:] = 0
  unread["cf_mask"][1, 5] = 0   # row 1's only trained token
  assert flops.batch_forwards(unread, ref_kl=False) == 0
  # Per micro-batch: 4 rows in 2 strided micro-batches, rows {0, 2} and {1, 3}. Row 0
  # distils: micro-batch 0 runs the teacher, micro-batch 1 does not.
  four = _batch(rows=4, teacher=True)
  assert flops.batch_forwards(four, ref_kl=False, micro_batches=2) == 0.5
  four["distill_mask"][3, 5] = 1.0   # now micro-batch 1 too
  assert flops.batch_forwards(four, ref_kl=False, micro_batches=2) == 1.0
  assert flops.batch_forwards(four, ref_kl=False, micro_batches=4) == 0.5   # rows 0 and 3


def test_peak_source():
  assert flops.peak_flops_per_s_of("TPU v5p", 8) == 8 * 459e12
  assert flops.peak_flops_per_s_of("some CPU", 1) is None
  configured = flops.Throughput.for_devices(CFG, "float32", ref_kl=False, peak_flops_per_s=3e9)
  assert (configured.peak_flops_per_s, configured.peak_source) == (3e9, "config")
  measured = flops.Throughput.for_devices(CFG, "float32", ref_kl=False)   # CPU: not listed
  assert measured.peak_source.startswith("measured float32")
  assert 1e7 < measured.peak_flops_per_s < 1e14


def test_decode_read_bytes_hand_worked():
  # One token's K and V over 2 layers of 2 kv heads of 4, float32: 2·2·2·4·4 = 128 bytes.
  assert flops.kv_bytes_per_token(CFG, 4) == 128
  assert flops.kv_bytes_per_token(CFG, 2) == 64
  # 4 decode steps after 5-token prompts attend over 5, 6, 7, 8 cached tokens (26 per row):
  # 4 reads of 1000 weight bytes + 3 rows · 128 bytes · 26 tokens.
  assert flops.decode_read_bytes(CFG, 1000, rows=3, prompt_len=5, new_tokens=4,
                                 itemsize=4) == 4 * 1000 + 3 * 128 * 26
  assert flops.decode_read_bytes(CFG, 1000, rows=3, prompt_len=5, new_tokens=0, itemsize=4) == 0
  with pytest.raises(ValueError, match="non-negative"):
    flops.decode_read_bytes(CFG, 1000, rows=-1, prompt_len=5, new_tokens=4, itemsize=4)


def test_limit_fraction_hand_worked():
  # 2 GFLOP in 0.5 s is 4 GFLOP/s, half of an 8 GFLOP/s matmul rate.
  assert flops.limit_fraction(2e9, 0.5, 8e9) == pytest.approx(0.5)
  # 13 984 bytes (the decode above) in 1 µs against 20 GB/s: 13.984 GB/s, 69.92 %.
  assert flops.limit_fraction(13_984, 1e-6, 20e9) == pytest.approx(0.6992)
  for seconds, rate in ((0.0, 1.0), (1.0, 0.0)):
    with pytest.raises(ValueError, match="seconds > 0"):
      flops.limit_fraction(1.0, seconds, rate)


def test_step_flops_with_the_head_over_some_columns():
  # The head over 4 columns in all instead of 3 rows · 5: unembed 2 · 16 · 50 · 4 = 6 400 per
  # forward; the layers' FLOPs are those of the whole batch. Student + one teacher: 4 forwards.
  full = flops.train_step_flops(CFG, 3, 6, teacher_forwards=1)
  some = flops.train_step_flops(CFG, 3, 6, teacher_forwards=1, head_positions=4)
  assert full["unembed"] == 4 * 2 * 16 * 50 * 3 * 5
  assert some["unembed"] == 4 * 6_400
  assert some["linear"] == full["linear"] and some["attention"] == full["attention"]
  assert some["total"] == some["linear"] + some["attention"] + 4 * 6_400
