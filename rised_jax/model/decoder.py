"""One Flax NNX decoder for every `ModelConfig` family (Llama, Qwen2, Qwen3, Gemma 3 text).

Entry points:
  model(input_ids, attention_mask)         logits [B, T, V] (float32)
  model.hidden_states(...)                 [B, T, D] after the final norm
  model.logits(hidden)                     [..., V]; the train step forms logits chunk by chunk
  model.init_cache / forward_with_cache    KV-cached incremental decoding for the sampler

Padding: positions are `cumsum(mask) - 1` (clipped at 0), so left- and right-padded batches
give every row the positions it would have alone; padding keys are never attended, and a
padding query (which may see no key at all) gets finite, meaningless values, never NaN.

Logical axes. Every parameter carries its axis names as `out_sharding` metadata
(`nnx.get_partition_spec` maps them through the active logical-axis rules):
  vocab     vocabulary rows of the embedding, columns of the unembedding
  embed     the model (residual) dimension
  heads     query heads
  kv_heads  key/value heads
  head_dim  features of one head
  mlp       the MLP hidden dimension
  norm      RMSNorm scales
Parameters are created unsharded (`eager_sharding=False`); placing them on a mesh is the
parallel module's job. Kernels are laid out [in..., out...] with heads kept as their own axis:
q [embed, heads, head_dim], k/v [embed, kv_heads, head_dim], o [heads, head_dim, embed],
gate/up [embed, mlp], down [mlp, embed], unembedding [embed, vocab].
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rised_jax.model.config import ModelConfig, RopeConfig

VOCAB, EMBED, HEADS, KV_HEADS, HEAD_DIM, MLP_AXIS, NORM = (
    "vocab", "embed", "heads", "kv_heads", "head_dim", "mlp", "norm")
LOGICAL_AXES = (VOCAB, EMBED, HEADS, KV_HEADS, HEAD_DIM, MLP_AXIS, NORM)

# Finite, so that a query with no visible key (a padding row) softmaxes to a uniform row
# instead of NaN; far below any real score.
_MASKED_SCORE = -1e30


class KVCache(NamedTuple):
  """Keys and values of every layer for `max_len` slots per row.

  A slot is one column of the padded token grid; rows are left-padded, so a row's padding
  slots are simply marked invalid.
  """

  k: jax.Array          # [L, B, S, KVH, hd] keys, RoPE already applied
  v: jax.Array          # [L, B, S, KVH, hd]
  positions: jax.Array  # [B, S] int32, RoPE position of the token in each slot
  valid: jax.Array      # [B, S] bool, the slot holds a real (non-padding) token


# ---------------------------------------------------------------------------------------------
# Pure array functions.


def positions_from_mask(mask: jax.Array) -> jax.Array:
  """[B, T] int32 positions: the count of real tokens before each column (0 on leading pads)."""
  return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, plus_one: bool) -> jax.Array:
  """RMSNorm over the last axis in float32; multiplies by (1 + scale) when `plus_one`."""
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  scale32 = scale.astype(jnp.float32)
  return (normed * (1.0 + scale32 if plus_one else scale32)).astype(x.dtype)


def rope_tables(positions: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
  """cos and sin [B, T, head_dim] for the half-split rotary layout of HF checkpoints."""
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates x [B, T, N, hd] by the tables [B, T, hd] (first half paired with second half)."""
  x32 = x.astype(jnp.float32)
  first, second = jnp.split(x32, 2, axis=-1)
  rotated = jnp.concatenate([-second, first], axis=-1)
  return (x32 * cos[:, :, None] + rotated * sin[:, :, None]).astype(x.dtype)


def visible_keys(q_slots: jax.Array, q_positions: jax.Array, k_slots: jax.Array,
                 k_positions: jax.Array, k_valid: jax.Array, window: int | None) -> jax.Array:
  """[B, Tq, Tk] bool: which keys each query sees.

  Causal by slot (column), restricted to valid keys and, for a sliding-window layer, to keys
  whose position is less than `window` before the query's.
  """
  visible = k_valid[:, None, :] & (k_slots[None, None, :] <= q_slots[None, :, None])
  if window is not None:
    visible &= (q_positions[:, :, None] - k_positions[:, None, :]) < window
  return visible


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, scale: float,
              softcap: float | None = None) -> jax.Array:
  """Grouped-query attention without repeating keys.

  q [B, T, H, hd], k/v [B, S, KVH, hd], mask [B, T, S] -> [B, T, H, hd]. Scores and softmax
  in float32; optional tanh softcapping of the scores before masking.
  """
  batch, length, heads, head_dim = q.shape
  kv_heads = k.shape[2]
  q = q.reshape(batch, length, kv_heads, heads // kv_heads, head_dim)
  scores = jnp.einsum("btkgd,bskd->bkgts", q, k,
                      preferred_element_type=jnp.float32) * scale
  if softcap is not None:
    scores = jnp.tanh(scores / softcap) * softcap
  scores = jnp.where(mask[:, None, None], scores, _MASKED_SCORE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
  return out.reshape(batch, length, heads, head_dim)


def softcap_logits(logits: jax.Array, cap: float | None) -> jax.Array:
  return logits if cap is None else jnp.tanh(logits / cap) * cap


_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "silu": jax.nn.silu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}


# ---------------------------------------------------------------------------------------------
# Modules.


def _param(rngs: nnx.Rngs, init: Callable, shape: tuple[int, ...], axes: tuple[str, ...],
           dtype) -> nnx.Param:
  return nnx.Param(init(rngs.params(), shape, dtype), out_sharding=axes, eager_sharding=False)


class RMSNorm(nnx.Module):
  """RMSNorm with a learned scale (stored as an offset from one when `plus_one`)."""

  def __init__(self, dim: int, *, eps: float, plus_one: bool, param_dtype):
    init = jnp.zeros if plus_one else jnp.ones
    self.scale = nnx.Param(init((dim,), param_dtype), out_sharding=(NORM,),
                           eager_sharding=False)
    self.eps = eps
    self.plus_one = plus_one

  def __call__(self, x: jax.Array) -> jax.Array:
    return rms_norm(x, self.scale[...], self.eps, self.plus_one)


class Attention(nnx.Module):
  """Self-attention with optional q/k/v/o biases and QK-norm; RoPE and mask come from outside."""

  def __init__(self, cfg: ModelConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    kernel = jax.nn.initializers.normal(cfg.initializer_range)
    zeros = jax.nn.initializers.zeros
    d, h, kvh, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    self.q_proj = _param(rngs, kernel, (d, h, hd), (EMBED, HEADS, HEAD_DIM), param_dtype)
    self.k_proj = _param(rngs, kernel, (d, kvh, hd), (EMBED, KV_HEADS, HEAD_DIM), param_dtype)
    self.v_proj = _param(rngs, kernel, (d, kvh, hd), (EMBED, KV_HEADS, HEAD_DIM), param_dtype)
    self.o_proj = _param(rngs, kernel, (h, hd, d), (HEADS, HEAD_DIM, EMBED), param_dtype)
    if cfg.qkv_bias:
      self.q_bias = _param(rngs, zeros, (h, hd), (HEADS, HEAD_DIM), param_dtype)
      self.k_bias = _param(rngs, zeros, (kvh, hd), (KV_HEADS, HEAD_DIM), param_dtype)
      self.v_bias = _param(rngs, zeros, (kvh, hd), (KV_HEADS, HEAD_DIM), param_dtype)
    self.o_bias = (_param(rngs, zeros, (d,), (EMBED,), param_dtype) if cfg.o_bias else None)
    if cfg.qk_norm:
      norm = dict(eps=cfg.rms_norm_eps, plus_one=cfg.norm_plus_one, param_dtype=param_dtype)
      self.q_norm = RMSNorm(hd, **norm)
      self.k_norm = RMSNorm(hd, **norm)
    self.qkv_bias = cfg.qkv_bias
    self.qk_norm = cfg.qk_norm
    self.scale = cfg.attn_scale
    self.softcap = cfg.attn_logit_softcap
    self.dtype = dtype

  def _project(self, x: jax.Array, kernel: nnx.Param, bias: nnx.Param | None) -> jax.Array:
    out = jnp.einsum("btd,dnk->btnk", x, kernel[...].astype(self.dtype))
    return out if bias is None else out + bias[...].astype(self.dtype)

  def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array,
               kv: tuple[jax.Array, jax.Array] | None = None,
               cache_index: jax.Array | None = None
               ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """x [B, T, D] -> ([B, T, D], (keys, values) attended to).

    With `kv` (one layer's cache [B, S, KVH, hd]) the new keys/values are written at slots
    cache_index.. and the queries attend over the whole cache.
    """
    q = self._project(x, self.q_proj, self.q_bias if self.qkv_bias else None)
    k = self._project(x, self.k_proj, self.k_bias if self.qkv_bias else None)
    v = self._project(x, self.v_proj, self.v_bias if self.qkv_bias else None)
    if self.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if kv is not None:
      start = (0, cache_index, 0, 0)
      k = jax.lax.dynamic_update_slice(kv[0], k.astype(kv[0].dtype), start)
      v = jax.lax.dynamic_update_slice(kv[1], v.astype(kv[1].dtype), start)
    out = attention(q, k.astype(self.dtype), v.astype(self.dtype), mask, scale=self.scale,
                    softcap=self.softcap)
    out = jnp.einsum("bthk,hkd->btd", out, self.o_proj[...].astype(self.dtype))
    if self.o_bias is not None:
      out = out + self.o_bias[...].astype(self.dtype)
    return out, (k, v)


class MLP(nnx.Module):
  """Gated MLP: down(act(gate(x)) * up(x))."""

  def __init__(self, cfg: ModelConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    kernel = jax.nn.initializers.normal(cfg.initializer_range)
    zeros = jax.nn.initializers.zeros
    d, f = cfg.hidden_size, cfg.intermediate_size
    self.gate_proj = _param(rngs, kernel, (d, f), (EMBED, MLP_AXIS), param_dtype)
    self.up_proj = _param(rngs, kernel, (d, f), (EMBED, MLP_AXIS), param_dtype)
    self.down_proj = _param(rngs, kernel, (f, d), (MLP_AXIS, EMBED), param_dtype)
    if cfg.mlp_bias:
      self.gate_bias = _param(rngs, zeros, (f,), (MLP_AXIS,), param_dtype)
      self.up_bias = _param(rngs, zeros, (f,), (MLP_AXIS,), param_dtype)
      self.down_bias = _param(rngs, zeros, (d,), (EMBED,), param_dtype)
    self.bias = cfg.mlp_bias
    self.act = _ACTIVATIONS[cfg.hidden_act]
    self.dtype = dtype

  def _linear(self, x: jax.Array, kernel: nnx.Param, bias: nnx.Param | None) -> jax.Array:
    out = x @ kernel[...].astype(self.dtype)
    return out if bias is None else out + bias[...].astype(self.dtype)

  def __call__(self, x: jax.Array) -> jax.Array:
    gate = self._linear(x, self.gate_proj, self.gate_bias if self.bias else None)
    up = self._linear(x, self.up_proj, self.up_bias if self.bias else None)
    return self._linear(self.act(gate) * up, self.down_proj,
                        self.down_bias if self.bias else None)


class DecoderLayer(nnx.Module):
  """Pre-norm residual block; Gemma adds a norm after attention and after the MLP."""

  def __init__(self, cfg: ModelConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    norm = dict(eps=cfg.rms_norm_eps, plus_one=cfg.norm_plus_one, param_dtype=param_dtype)
    self.pre_attn_norm = RMSNorm(cfg.hidden_size, **norm)
    self.attn = Attention(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.pre_mlp_norm = RMSNorm(cfg.hidden_size, **norm)
    self.mlp = MLP(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    if cfg.sandwich_norms:
      self.post_attn_norm = RMSNorm(cfg.hidden_size, **norm)
      self.post_mlp_norm = RMSNorm(cfg.hidden_size, **norm)
    self.sandwich = cfg.sandwich_norms

  def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array,
               kv: tuple[jax.Array, jax.Array] | None = None,
               cache_index: jax.Array | None = None
               ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    attn_out, kv = self.attn(self.pre_attn_norm(x), cos, sin, mask, kv, cache_index)
    if self.sandwich:
      attn_out = self.post_attn_norm(attn_out)
    x = x + attn_out
    mlp_out = self.mlp(self.pre_mlp_norm(x))
    if self.sandwich:
      mlp_out = self.post_mlp_norm(mlp_out)
    return x + mlp_out, kv


def _run_layer(layer: DecoderLayer, *args):
  return layer(*args)


class Decoder(nnx.Module):
  """Decoder-only LM for every `ModelConfig` family.

  Args:
    cfg: the architecture.
    dtype: compute dtype (activations, matmul inputs); norms, RoPE, softmax and the returned
      logits are float32.
    param_dtype: storage dtype of the parameters.
    remat: rematerialise each layer in the backward pass (`nnx.remat`), trading compute for
      activation memory.
    rngs: random init (from_pretrained overwrites every parameter).
  """

  def __init__(self, cfg: ModelConfig, *, dtype=jnp.float32, param_dtype=jnp.float32,
               remat: bool = False, rngs: nnx.Rngs):
    self.cfg = cfg
    self.dtype = dtype
    self.remat = remat
    init = jax.nn.initializers.normal(cfg.initializer_range)
    self.embed = _param(rngs, init, (cfg.vocab_size, cfg.hidden_size), (VOCAB, EMBED),
                        param_dtype)
    self.layers = nnx.List([DecoderLayer(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
                            for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps,
                              plus_one=cfg.norm_plus_one, param_dtype=param_dtype)
    self.lm_head = (None if cfg.tie_word_embeddings else
                    _param(rngs, init, (cfg.hidden_size, cfg.vocab_size), (EMBED, VOCAB),
                           param_dtype))

  def _embed(self, input_ids: jax.Array) -> jax.Array:
    x = jnp.take(self.embed[...], input_ids, axis=0).astype(self.dtype)
    if self.cfg.embed_scale is not None:
      x = x * jnp.asarray(self.cfg.embed_scale, self.dtype)
    return x

  def _layers(self, x: jax.Array, q_slots: jax.Array, q_positions: jax.Array,
              k_slots: jax.Array, k_positions: jax.Array, k_valid: jax.Array,
              cache: KVCache | None = None, cache_index: jax.Array | None = None
              ) -> tuple[jax.Array, list[tuple[jax.Array, jax.Array]]]:
    """Runs every layer; RoPE tables and masks are built once per distinct RoPE / window."""
    cfg = self.cfg
    tables: dict[RopeConfig, tuple[jax.Array, jax.Array]] = {}
    masks: dict[int | None, jax.Array] = {}
    # Remat only pays off under a gradient; decoding (with a cache) runs inside a while_loop
    # whose trace level nnx.remat must not cross.
    layer_fn = nnx.remat(_run_layer) if self.remat and cache is None else _run_layer
    new_kv = []
    for i, layer in enumerate(self.layers):
      rope, window = cfg.layer_rope(i), cfg.layer_window(i)
      if rope not in tables:
        tables[rope] = rope_tables(q_positions, rope.inv_freq(cfg.head_dim))
      if window not in masks:
        masks[window] = visible_keys(q_slots, q_positions, k_slots, k_positions, k_valid,
                                     window)
      kv = None if cache is None else (cache.k[i], cache.v[i])
      x, layer_kv = layer_fn(layer, x, *tables[rope], masks[window], kv, cache_index)
      new_kv.append(layer_kv)
    return self.final_norm(x), new_kv

  def hidden_states(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                    positions: jax.Array | None = None) -> jax.Array:
    """[B, T] ids -> [B, T, D] hidden states after the final norm (compute dtype)."""
    if attention_mask is None:
      attention_mask = jnp.ones(input_ids.shape, jnp.int32)
    if positions is None:
      positions = positions_from_mask(attention_mask)
    slots = jnp.arange(input_ids.shape[1])
    hidden, _ = self._layers(self._embed(input_ids), slots, positions, slots, positions,
                             attention_mask.astype(bool))
    return hidden

  def logits(self, hidden: jax.Array) -> jax.Array:
    """[..., D] hidden states -> [..., V] float32 logits (tied or untied, softcapped)."""
    if self.lm_head is None:
      logits = jnp.einsum("...d,vd->...v", hidden, self.embed[...].astype(self.dtype),
                          preferred_element_type=jnp.float32)
    else:
      logits = jnp.einsum("...d,dv->...v", hidden, self.lm_head[...].astype(self.dtype),
                          preferred_element_type=jnp.float32)
    return softcap_logits(logits, self.cfg.final_logit_softcap)

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
               positions: jax.Array | None = None) -> jax.Array:
    return self.logits(self.hidden_states(input_ids, attention_mask, positions))

  def init_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache of `max_len` slots per row (keys/values in `dtype`, default compute)."""
    cfg = self.cfg
    shape = (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim)
    dtype = self.dtype if dtype is None else dtype
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                   positions=jnp.zeros((batch, max_len), jnp.int32),
                   valid=jnp.zeros((batch, max_len), bool))

  def forward_with_cache(self, input_ids: jax.Array, attention_mask_new: jax.Array,
                         cache: KVCache, cache_index: jax.Array | int
                         ) -> tuple[jax.Array, KVCache]:
    """Runs t new tokens per row against the cache; jit-able with a traced `cache_index`.

    input_ids / attention_mask_new [B, t]: the new columns, written to slots
    cache_index .. cache_index + t - 1 of every row (0 in the mask marks left padding).
    Slots at and after cache_index are treated as empty (so rewinding is allowed).
    Each row's positions continue its own count of real tokens.
    Returns (logits [B, t, V] float32, the updated cache).
    """
    new_len = input_ids.shape[1]
    cache_index = jnp.asarray(cache_index, jnp.int32)
    slots = jnp.arange(cache.valid.shape[1])
    kept = cache.valid & (slots[None, :] < cache_index)
    seen = jnp.sum(kept, axis=1, dtype=jnp.int32)
    new_mask = attention_mask_new.astype(jnp.int32)
    new_positions = seen[:, None] + jnp.maximum(jnp.cumsum(new_mask, axis=1) - 1, 0)
    positions = jax.lax.dynamic_update_slice(cache.positions, new_positions, (0, cache_index))
    valid = jax.lax.dynamic_update_slice(kept, new_mask.astype(bool), (0, cache_index))
    q_slots = cache_index + jnp.arange(new_len)
    hidden, new_kv = self._layers(self._embed(input_ids), q_slots, new_positions, slots,
                                  positions, valid, cache, cache_index)
    new_cache = KVCache(k=jnp.stack([k for k, _ in new_kv]), v=jnp.stack([v for _, v in new_kv]),
                        positions=positions, valid=valid)
    return self.logits(hidden), new_cache
