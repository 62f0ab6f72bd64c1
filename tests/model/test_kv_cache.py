"""KV-cached decoding equals one full forward pass (fp32, 1e-5) on left-padded batches.

The reference is the Decoder's own full forward, which model/test_parity.py checks against
transformers; the Gemma 3 config has a sliding window (4) shorter than the sequences (16).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.helpers import model_utils as mu
from rised_jax.model import ModelConfig

ATOL = 1e-5
PROMPT_LENGTHS = (9, 5, 2)
DECODE_STEPS = 7
MAX_LEN = 20
FORWARD = nnx.jit(lambda model, ids, mask: model(ids, mask))
TRACES = {"step": 0}


def _step(model, ids, mask, cache, cache_index):
  TRACES["step"] += 1   # runs only while tracing: counts compilations
  return model.forward_with_cache(ids, mask, cache, cache_index)


STEP = nnx.jit(_step)


@pytest.fixture(scope="module", params=["llama_gqa_tied", "qwen3_untied", "gemma3"])
def setup(request):
  """(name, model, full ids [B, 16], full mask, full-forward logits)."""
  cfg = ModelConfig.from_hf(mu.TINY_CONFIGS[request.param])
  model = mu.random_decoder(cfg, seed=7)
  prompt_ids, prompt_mask = mu.padded_batch(mu.random_rows(PROMPT_LENGTHS, seed=8), "left")
  new_ids = jnp.asarray(mu.random_rows([DECODE_STEPS] * len(PROMPT_LENGTHS), seed=9), jnp.int32)
  ids = jnp.concatenate([prompt_ids, new_ids], axis=1)
  mask = jnp.concatenate([prompt_mask, jnp.ones_like(new_ids)], axis=1)
  return request.param, model, ids, mask, np.asarray(FORWARD(model, ids, mask))


def _run(model, ids, mask, chunks):
  """Feeds the columns of ids in consecutive chunks; returns the logits of all columns."""
  cache = model.init_cache(ids.shape[0], MAX_LEN)
  start, outputs = 0, []
  for size in chunks:
    logits, cache = STEP(model, ids[:, start:start + size], mask[:, start:start + size], cache,
                         jnp.int32(start))
    outputs.append(np.asarray(logits))
    start += size
  return np.concatenate(outputs, axis=1), cache


@pytest.mark.parametrize("chunks", [(9,) + (1,) * DECODE_STEPS, (4, 5, 7)],
                         ids=["prefill+decode", "chunked"])
def test_cached_decoding_equals_full_forward(setup, chunks):
  name, model, ids, mask, reference = setup
  logits, _ = _run(model, ids, mask, chunks)
  assert np.isfinite(logits).all(), name
  real = np.asarray(mask).astype(bool)
  np.testing.assert_allclose(logits[real], reference[real], atol=ATOL, rtol=0, err_msg=name)


def test_decode_steps_compile_once(setup):
  _, model, ids, mask, _ = setup
  cache = model.init_cache(ids.shape[0], MAX_LEN)
  _, cache = STEP(model, ids[:, :9], mask[:, :9], cache, jnp.int32(0))
  before = TRACES["step"]
  for t in range(9, 9 + 3):
    _, cache = STEP(model, ids[:, t:t + 1], mask[:, t:t + 1], cache, jnp.int32(t))
  # The first single-token step may compile; later cache indices must reuse it.
  assert TRACES["step"] - before <= 1


def _stacked(cache, cfg) -> tuple[np.ndarray, np.ndarray]:
  """An unrolled decoder's per-layer cache as keys [L, B, KVH, hd, S], values [L, B, KVH, S, hd]."""
  k, v = np.stack(cache.k), np.stack(cache.v)
  return (k[:, :, None], v[:, :, None]) if cfg.num_kv_heads == 1 else (k, v)


def test_cache_contents_after_prefill(setup):
  _, model, ids, mask, _ = setup
  cfg = model.cfg
  _, cache = _run(model, ids, mask, (9,))
  # Unrolled layers: one array per layer, without the KV-head axis when there is one head.
  heads = (3,) if cfg.num_kv_heads == 1 else (3, cfg.num_kv_heads)
  assert [a.shape for a in cache.k] == [(*heads, cfg.head_dim, MAX_LEN)] * cfg.num_layers
  assert [a.shape for a in cache.v] == [(*heads, MAX_LEN, cfg.head_dim)] * cfg.num_layers
  assert cache.k[0].dtype == jnp.float32 and cache.positions.dtype == jnp.int32
  valid = np.zeros((3, MAX_LEN), bool)
  positions = np.zeros((3, MAX_LEN), np.int32)
  for b, length in enumerate(PROMPT_LENGTHS):
    valid[b, 9 - length:9] = True
    positions[b, 9 - length:9] = np.arange(length)
  np.testing.assert_array_equal(np.asarray(cache.valid), valid)
  np.testing.assert_array_equal(np.asarray(cache.positions), positions)
  keys, values = _stacked(cache, cfg)
  # Unwritten slots stay zero.
  assert not keys[..., 9:].any() and not values[:, :, :, 9:].any()
  # Written slots hold the real tokens' keys and values.
  for b, length in enumerate(PROMPT_LENGTHS):
    assert np.abs(keys[:, b, ..., 9 - length:9]).min(axis=-2).all()
    assert np.abs(values[:, b, :, 9 - length:9]).max(axis=-1).all()


def test_rewinding_the_cache_index_discards_later_slots(setup):
  name, model, ids, mask, reference = setup
  _, cache = _run(model, ids, mask, (9, 1, 1))
  # Write 3 other tokens at 11.., then rewind to 11 and feed the true ones.
  junk = jnp.full((3, 3), 5, jnp.int32)
  _, cache = STEP(model, junk, jnp.ones_like(junk), cache, jnp.int32(11))
  logits, _ = STEP(model, ids[:, 11:16], mask[:, 11:16], cache, jnp.int32(11))
  np.testing.assert_allclose(np.asarray(logits), reference[:, 11:16], atol=ATOL, rtol=0,
                             err_msg=name)


def test_gemma_window_is_shorter_than_the_sequence():
  cfg = ModelConfig.from_hf(mu.TINY_CONFIGS["gemma3"])
  assert cfg.sliding_window < max(PROMPT_LENGTHS) + DECODE_STEPS
  assert set(cfg.layer_types) == {"sliding_attention", "full_attention"}


def test_bfloat16_cache_stays_close():
  cfg = ModelConfig.from_hf(mu.TINY_CONFIGS["llama_gqa_tied"])
  model = mu.random_decoder(cfg, seed=7, dtype="bfloat16", param_dtype="float32")
  ids, mask = mu.padded_batch(mu.random_rows((6, 3), seed=10), "left")
  reference = np.asarray(FORWARD(model, ids, mask))
  cache = model.init_cache(2, 8)
  assert {a.dtype for a in cache.k + cache.v} == {jnp.dtype(jnp.bfloat16)}
  logits, cache = STEP(model, ids, mask, cache, jnp.int32(0))
  real = np.asarray(mask).astype(bool)
  np.testing.assert_allclose(np.asarray(logits)[real], reference[real], atol=0.05, rtol=0)
  assert jax.tree.map(lambda x: x.shape, cache) == jax.tree.map(
      lambda x: x.shape, model.init_cache(2, 8))


@pytest.mark.parametrize("name", ["qwen3_untied", "llama_gqa_tied"], ids=["1_kv_head", "2"])
@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
def test_decode_loop_updates_the_cache_in_place(scan_layers, name):
  """Inside a decode loop no instruction copies as much as one layer's keys: each layer writes
  its column into its cache in place. (Slicing a layer out, writing into the copy and
  re-stacking copied the whole cache two to three times per step; a layer's own array of
  one KV head, kept with its unit axis, was copied three times per step.)"""
  cfg = ModelConfig.from_hf(mu.TINY_CONFIGS[name])
  model = mu.random_decoder(cfg, seed=7, scan_layers=scan_layers)
  graphdef, state = nnx.split(model)
  rows, slots = 4, 64
  cache = model.init_cache(rows, slots)
  layer_elements = rows * slots * cfg.num_kv_heads * cfg.head_dim

  @jax.jit
  def decode(state, cache):
    def body(i, carry):
      cache, token = carry
      logits, cache = nnx.merge(graphdef, state).forward_with_cache(
          token[:, None], jnp.ones((rows, 1), jnp.int32), cache, i)
      return cache, jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
    return jax.lax.fori_loop(0, slots, body, (cache, jnp.zeros((rows,), jnp.int32)))

  text = decode.lower(state, cache).compile().as_text()
  loop_bodies = [b for b in text.split("\n\n") if "region" in b.split("\n", 1)[0]
                 or "body" in b.split("\n", 1)[0]]
  copies = [line for body in loop_bodies for line in body.split("\n") if " copy(" in line]
  big = [line for line in copies
         if np.prod([int(d) for d in line.split("[", 1)[1].split("]", 1)[0].split(",") if d])
         >= layer_elements]
  assert loop_bodies and not big, big
