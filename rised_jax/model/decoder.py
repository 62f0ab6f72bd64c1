"""One Flax NNX decoder for every `ModelConfig` family (Llama, Qwen2, Qwen3, Gemma 3 text).

Entry points:
  model(input_ids, attention_mask)         logits [B, T, V] (float32)
  model.hidden_states(...)                 [B, T, D] after the final norm
  model.logits(hidden)                     [..., V]; the train step forms logits chunk by chunk
  model.init_cache / forward_with_cache    KV-cached incremental decoding for the sampler

Padding: positions are `cumsum(mask) - 1` (clipped at 0), so left- and right-padded batches
give every row the positions it would have alone; padding keys are never attended, and a
padding query (which may see no key at all) gets finite, meaningless values, never NaN.

Speed. Every matmul with a weight is one 2-D matmul over the flattened [B·T, ...] rows
(`flat_matmul`), whatever the kernel's stored shape. The full-sequence path (training,
scoring) attends with `causal_block_attention`: query blocks skip the keys after them and the
backward pass recomputes each block's probabilities, so no [B, H, T, T] buffer is kept between
the passes. The KV-cache path uses the plain masked `attention` over the cache.

Logical axes. Every parameter carries its axis names as `out_sharding` metadata
(`nnx.get_partition_spec` maps them through the active logical-axis rules):
  vocab     vocabulary rows of the embedding, columns of the unembedding
  embed     the model (residual) dimension
  heads     query heads
  kv_heads  key/value heads
  head_dim  features of one head
  mlp       the MLP hidden dimension
  norm      RMSNorm scales
  layers    the leading axis of stacked layer parameters (`scan_layers`)
Parameters are created unsharded (`eager_sharding=False`); placing them on a mesh is the
parallel module's job. The residual stream is constrained to the logical activation axes
`ACTIVATION_AXES` (batch, length, embed) after the embedding and after every sub-layer,
against the mesh in context (none: no constraint). Kernels are laid out [in..., out...]
with heads kept as their own axis: q [embed, heads, head_dim], k/v [embed, kv_heads,
head_dim], o [heads, head_dim, embed], gate/up [embed, mlp], down [mlp, embed], unembedding
[embed, vocab].
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rised_jax import parallel
from rised_jax.model import shared_prefix
from rised_jax.model.config import ModelConfig, RopeConfig

VOCAB, EMBED, HEADS, KV_HEADS, HEAD_DIM, MLP_AXIS, NORM = (
    "vocab", "embed", "heads", "kv_heads", "head_dim", "mlp", "norm")
LOGICAL_AXES = (VOCAB, EMBED, HEADS, KV_HEADS, HEAD_DIM, MLP_AXIS, NORM)
# The leading axis of stacked (scanned) layer parameters.
LAYERS = "layers"
# Logical axes of the residual stream [B, T, D] between sub-layers.
ACTIVATION_AXES = ("activation_batch", "activation_length", "activation_embed")

# Query columns per block of `causal_block_attention`, and the most blocks per sequence:
# every block is unrolled into the compiled program, so compile time grows with their number,
# while the score work saved barely moves beyond 16 blocks ((n + 1) / 2n of the full T × T).
QUERY_BLOCK = 64
MAX_QUERY_BLOCKS = 16
# Finite, so that a query with no visible key (a padding row) softmaxes to a uniform row
# instead of NaN; far below any real score.
_MASKED_SCORE = -1e30


class KVCache(NamedTuple):
  """Keys and values of every layer for `max_len` slots per row.

  A slot is one column of the padded token grid; rows are left-padded, so a row's padding
  slots are simply marked invalid. Keys are slot-minor and values head-major, the layouts
  the attention's two dots read. Scanned layers keep one stacked array each; unrolled layers
  one array per layer (`Decoder.init_cache`), since XLA:CPU copies a layer's slice out of a
  stack before its dot reads it, on every decode step.
  """

  k: jax.Array | tuple[jax.Array, ...]   # [L, B, KVH, hd, S], or L × [B, KVH, hd, S]; RoPE applied
  v: jax.Array | tuple[jax.Array, ...]   # [L, B, KVH, S, hd], or L × [B, KVH, S, hd]
  positions: jax.Array  # [B, S] int32, RoPE position of the token in each slot
  valid: jax.Array      # [B, S] bool, the slot holds a real (non-padding) token


class LayerCache(NamedTuple):
  """One layer's keys and values: layer `index` of the stacks ([L, B, KVH, hd, S] and
  [L, B, KVH, S, hd]), or with `index` None the layer's own arrays, without the KVH axis
  when there is one KV head ([B, hd, S] and [B, S, hd]).

  The layer writes its new columns in and attends over the result. Passing the whole stack
  (rather than a slice in, a slice out and a re-stack) lets XLA update the cache in place
  inside the decode loop, where copying it cost more than the rest of a small model's decode
  step. A layer's own array of one KV head keeps no unit axis because XLA:CPU, writing into
  it and reading it through the axis' removal, writes a second copy for the dot on every step
  (docs/performance.md).
  """

  k: jax.Array
  v: jax.Array
  index: jax.Array | int | None


def _write_layer_cache(kv: LayerCache, new_k: jax.Array, new_v: jax.Array,
                       cache_index: jax.Array) -> tuple[LayerCache, jax.Array, jax.Array]:
  """Writes new keys [B, KVH, hd, T] and values [B, KVH, T, hd] at slots cache_index.. of
  the layer's cache; returns the updated cache and the layer's keys [B, KVH, hd, S] and
  values [B, KVH, S, hd] after the write."""
  new_k, new_v = new_k.astype(kv.k.dtype), new_v.astype(kv.v.dtype)
  if kv.index is not None:
    kv = LayerCache(
        jax.lax.dynamic_update_slice(kv.k, new_k[None], (kv.index, 0, 0, 0, cache_index)),
        jax.lax.dynamic_update_slice(kv.v, new_v[None], (kv.index, 0, 0, cache_index, 0)),
        kv.index)
    return kv, *(jax.lax.dynamic_index_in_dim(a, kv.index, keepdims=False)
                 for a in (kv.k, kv.v))
  if kv.k.ndim == 3:   # one KV head, stored without its axis
    kv = LayerCache(jax.lax.dynamic_update_slice(kv.k, new_k[:, 0], (0, 0, cache_index)),
                    jax.lax.dynamic_update_slice(kv.v, new_v[:, 0], (0, cache_index, 0)), None)
    return kv, kv.k[:, None], kv.v[:, None]
  kv = LayerCache(jax.lax.dynamic_update_slice(kv.k, new_k, (0, 0, 0, cache_index)),
                  jax.lax.dynamic_update_slice(kv.v, new_v, (0, 0, cache_index, 0)), None)
  return kv, kv.k, kv.v


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


def rope_tables(positions: jax.Array, inv_freq: np.ndarray, num_positions: int
                ) -> tuple[jax.Array, jax.Array]:
  """cos and sin [B, T, head_dim] for the half-split rotary layout of HF checkpoints.

  Every position lies below `num_positions`. The angle is position · inv_freq in float32, as
  HF forms it; cos and sin of positions 0 .. num_positions − 1 are computed once, in numpy at
  trace time (float64, rounded to float32), and gathered by position. Computed in the graph,
  XLA fuses cos and sin into each consumer and evaluates them again per head, in the forward
  and in the backward (about 6 % of the 4-layer d256 train step, docs/performance.md).
  """
  angles = (np.arange(num_positions, dtype=np.float32)[:, None]
            * np.asarray(inv_freq, np.float32)).astype(np.float64)
  cos, sin = (jnp.take(table(angles).astype(np.float32), positions, axis=0, mode="clip")
              for table in (np.cos, np.sin))
  return jnp.concatenate([cos, cos], axis=-1), jnp.concatenate([sin, sin], axis=-1)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates x [B, T, N, hd] by the tables [B, T, hd] (first half paired with second half)."""
  x32 = x.astype(jnp.float32)
  first, second = jnp.split(x32, 2, axis=-1)
  rotated = jnp.concatenate([-second, first], axis=-1)
  return (x32 * cos[:, :, None] + rotated * sin[:, :, None]).astype(x.dtype)


def visible_keys(q_slots: jax.Array, q_positions: jax.Array, k_slots: jax.Array,
                 k_positions: jax.Array, k_valid: jax.Array, window: int | None,
                 segments: np.ndarray | None = None) -> jax.Array:
  """[B, Tq, Tk] bool: which keys each query sees.

  Causal by slot (column), restricted to valid keys and, for a sliding-window layer, to keys
  whose position is less than `window` before the query's. With `segments` (one id per slot
  of a full sequence, Tq = Tk: `shared_prefix.segments`), a key of segment 0 (the shared
  prefix) is seen by every later query, any other key only by queries of its own segment.
  """
  visible = k_valid[:, None, :] & (k_slots[None, None, :] <= q_slots[None, :, None])
  if segments is not None:
    visible &= (segments[None, :] == 0) | (segments[None, :] == segments[:, None])
  if window is not None:
    visible &= (q_positions[:, :, None] - k_positions[:, None, :]) < window
  return visible


def softcap_logits(logits: jax.Array, cap: float | None) -> jax.Array:
  """tanh softcapping (Gemma's attention scores and final logits); identity when cap is None."""
  return logits if cap is None else jnp.tanh(logits / cap) * cap


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, scale: float,
              softcap: float | None = None) -> jax.Array:
  """Grouped-query attention without repeating keys, over the KV cache's layout.

  q [B, T, H, hd], k [B, KVH, hd, S], v [B, KVH, S, hd], mask [B, T, S] -> [B, T, H, hd].
  Scores and softmax in float32; optional tanh softcapping of the scores before masking.
  Keys and values are stored the way the two batched dots read them (q·k and p·v with
  B × KVH as batch), so a decode step transposes only the T new columns, not the whole
  cache (docs/performance.md).
  """
  batch, length, heads, head_dim = q.shape
  kv_heads = k.shape[1]
  q = q.reshape(batch, length, kv_heads, heads // kv_heads, head_dim)
  q = jnp.transpose(q, (0, 2, 3, 1, 4))                                    # [B, KVH, G, T, hd]
  scores = jnp.einsum("bkgtd,bkds->bkgts", q, k,
                      preferred_element_type=jnp.float32) * scale
  scores = jnp.where(mask[:, None, None], softcap_logits(scores, softcap), _MASKED_SCORE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgts,bksd->bkgtd", probs, v)
  return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(batch, length, heads, head_dim)


def query_block_size(length: int) -> int:
  """Query columns per block for a sequence of `length`: QUERY_BLOCK, or the smallest
  multiple of it that needs at most MAX_QUERY_BLOCKS blocks."""
  return QUERY_BLOCK * max(1, -(-length // (QUERY_BLOCK * MAX_QUERY_BLOCKS)))


def _split_heads(x: jax.Array, kv_heads: int) -> jax.Array:
  """[B, T, N, hd] -> head-major [B, KVH, N // KVH, T, hd] (query groups per KV head)."""
  batch, length, heads, head_dim = x.shape
  return x.reshape(batch, length, kv_heads, heads // kv_heads, head_dim).transpose(0, 2, 3, 1, 4)


def _merge_heads(x: jax.Array) -> jax.Array:
  """[B, KVH, G, T, hd] -> [B, T, KVH·G, hd], the inverse of `_split_heads`."""
  batch, kv_heads, groups, length, head_dim = x.shape
  return x.transpose(0, 3, 1, 2, 4).reshape(batch, length, kv_heads * groups, head_dim)


def _block_forward(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
                   softcap: float | None) -> tuple[jax.Array, jax.Array]:
  """One query block, head-major: q [B, KVH, G, Tq, hd], k/v [B, KVH, S, hd], mask [B, Tq, S]
  -> (output [B, KVH, G, Tq, hd], log-sum-exp of the masked scores [B, KVH, G, Tq])."""
  raw = jnp.einsum("bkgtd,bksd->bkgts", q, k, preferred_element_type=jnp.float32) * scale
  scores = jnp.where(mask[:, None, None], softcap_logits(raw, softcap), _MASKED_SCORE)
  top = jnp.max(scores, axis=-1, keepdims=True)
  weights = jnp.exp(scores - top)
  total = jnp.sum(weights, axis=-1, keepdims=True)
  out = jnp.einsum("bkgts,bksd->bkgtd", (weights / total).astype(v.dtype), v)
  return out, (top + jnp.log(total))[..., 0]


def _block_backward(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                    out: jax.Array, lse: jax.Array, dout: jax.Array, scale: float,
                    softcap: float | None) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(dq, dk, dv) of one query block, from its probabilities recomputed with the saved lse.

  The softmax backward is dS = P ∘ (dP − rowsum(dO ∘ O)), zero where the mask hides a key
  (the gradient of the forward's `where`), times the softcap's 1 − tanh² and the scale.
  """
  raw = jnp.einsum("bkgtd,bksd->bkgts", q, k, preferred_element_type=jnp.float32) * scale
  scores = softcap_logits(raw, softcap)
  visible = mask[:, None, None]
  probs = jnp.exp(jnp.where(visible, scores, _MASKED_SCORE) - lse[..., None])
  dv = jnp.einsum("bkgts,bkgtd->bksd", probs.astype(dout.dtype), dout,
                  preferred_element_type=jnp.float32)
  dprobs = jnp.einsum("bkgtd,bksd->bkgts", dout, v, preferred_element_type=jnp.float32)
  row_dot = jnp.einsum("bkgtd,bkgtd->bkgt", dout, out, preferred_element_type=jnp.float32)
  dscores = jnp.where(visible, probs * (dprobs - row_dot[..., None]), 0.0)
  if softcap is not None:
    dscores = dscores * (1.0 - jnp.square(scores / softcap))
  dscores = (dscores * scale).astype(q.dtype)
  dq = jnp.einsum("bkgts,bksd->bkgtd", dscores, k, preferred_element_type=jnp.float32)
  dk = jnp.einsum("bkgts,bkgtd->bksd", dscores, q, preferred_element_type=jnp.float32)
  return dq, dk, dv


def _query_blocks(length: int, block: int) -> list[tuple[int, int]]:
  return [(start, min(start + block, length)) for start in range(0, length, block)]


def _after(x: jax.Array, previous: jax.Array) -> jax.Array:
  """x + 0·previous (`previous` broadcasts against x): an exact data dependency.

  XLA:CPU drops optimization barriers before it schedules, and its scheduler would start
  every block at once (all their scores live); depending on the previous block's result
  makes the blocks run in turn. `previous` is a per-row slice of a result, so the dependency
  stays local under any sharding of batch and heads. x changes only where `previous` is
  already inf or NaN.
  """
  return x + jnp.zeros((), x.dtype) * previous.astype(x.dtype)


def _add_to_prefix(total: jax.Array, part: jax.Array, axis: int) -> jax.Array:
  """total with `part` added to its first part.shape[axis] entries along `axis` (in place
  once compiled)."""
  head = jax.lax.slice_in_dim(total, 0, part.shape[axis], axis=axis)
  return jax.lax.dynamic_update_slice_in_dim(total, head + part, 0, axis)


def _key_start(start: int, key_layout: tuple[int, int] | None) -> int:
  """The first key column past the shared prefix that the query block starting at `start`
  may see: with `key_layout` (P, R), a packed sequence of a P-column prefix and responses of R
  columns each (`shared_prefix`), a response's queries see the prefix and their own
  response only, so the keys of the responses before it are skipped; else 0."""
  if key_layout is None or start < key_layout[0]:
    return 0
  prefix, response = key_layout
  return prefix + (start - prefix) // response * response


def _block_keys(x: jax.Array, axis: int, prefix: int, lo: int, stop: int) -> jax.Array:
  """The key columns [0, stop) of x along `axis`, without [prefix, lo) when lo > prefix."""
  if lo <= prefix:
    return jax.lax.slice_in_dim(x, 0, stop, axis=axis)
  return jnp.concatenate([jax.lax.slice_in_dim(x, 0, prefix, axis=axis),
                          jax.lax.slice_in_dim(x, lo, stop, axis=axis)], axis=axis)


def _add_block_keys(total: jax.Array, part: jax.Array, axis: int, prefix: int, lo: int
                    ) -> jax.Array:
  """total with `part` (the columns `_block_keys` took) added back at their columns."""
  if lo <= prefix:
    return _add_to_prefix(total, part, axis)
  total = _add_to_prefix(total, jax.lax.slice_in_dim(part, 0, prefix, axis=axis), axis)
  rest = jax.lax.slice_in_dim(part, prefix, part.shape[axis], axis=axis)
  here = jax.lax.slice_in_dim(total, lo, lo + rest.shape[axis], axis=axis)
  return jax.lax.dynamic_update_slice_in_dim(total, here + rest, lo, axis)


def _causal_blocks_forward(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                           scale: float, softcap: float | None, block: int,
                           key_layout: tuple[int, int] | None = None
                           ) -> tuple[jax.Array, tuple[jax.Array, ...]]:
  """(output [B, T, H, hd], residuals for the backward: head-major q, k, v, the mask, the
  head-major output and the log-sum-exp of every query's scores)."""
  kv_heads = k.shape[2]
  qh = _split_heads(q, kv_heads)
  kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
  prefix = 0 if key_layout is None else key_layout[0]
  outs, lses = [], []
  for start, stop in _query_blocks(q.shape[1], block):
    lo = _key_start(start, key_layout)
    q_block = qh[..., start:stop, :]
    if lses:
      q_block = _after(q_block, lses[-1][..., :1, None])
    out, lse = _block_forward(q_block, _block_keys(kh, 2, prefix, lo, stop),
                              _block_keys(vh, 2, prefix, lo, stop),
                              _block_keys(mask[:, start:stop], 2, prefix, lo, stop), scale,
                              softcap)
    outs.append(out)
    lses.append(lse)
  out = jnp.concatenate(outs, axis=3)
  return _merge_heads(out), (qh, kh, vh, mask, out, jnp.concatenate(lses, axis=3))


def _causal_blocks_backward(scale: float, softcap: float | None, block: int,
                            key_layout: tuple[int, int] | None,
                            residuals: tuple[jax.Array, ...], dout: jax.Array
                            ) -> tuple[jax.Array, jax.Array, jax.Array, None]:
  """(dq, dk, dv, no cotangent for the boolean mask), block by block; dk and dv accumulate
  in float32 over the blocks whose keys they are."""
  qh, kh, vh, mask, out, lse = residuals
  douth = _split_heads(dout, kh.shape[1])
  dk = jnp.zeros(kh.shape, jnp.float32)
  dv = jnp.zeros(vh.shape, jnp.float32)
  prefix = 0 if key_layout is None else key_layout[0]
  dqs = []
  for start, stop in _query_blocks(qh.shape[3], block):
    lo = _key_start(start, key_layout)
    dout_block = douth[..., start:stop, :]
    # The recomputation waits for the cotangent (else XLA may run every layer's early, all
    # live at once) and for the previous block.
    q_block = _after(qh[..., start:stop, :], dout_block[..., :1, :1])
    if dqs:
      q_block = _after(q_block, dqs[-1][..., :1, :1])
    dq_block, dk_block, dv_block = _block_backward(
        q_block, _block_keys(kh, 2, prefix, lo, stop), _block_keys(vh, 2, prefix, lo, stop),
        _block_keys(mask[:, start:stop], 2, prefix, lo, stop), out[..., start:stop, :],
        lse[..., start:stop], dout_block, scale, softcap)
    dqs.append(dq_block)
    dk = _add_block_keys(dk, dk_block, 2, prefix, lo)
    dv = _add_block_keys(dv, dv_block, 2, prefix, lo)
  dq = _merge_heads(jnp.concatenate(dqs, axis=3))
  return (dq.astype(qh.dtype), dk.transpose(0, 2, 1, 3).astype(kh.dtype),
          dv.transpose(0, 2, 1, 3).astype(vh.dtype), None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _causal_blocks(q, k, v, mask, scale, softcap, block, key_layout):
  return _causal_blocks_forward(q, k, v, mask, scale, softcap, block, key_layout)[0]


_causal_blocks.defvjp(_causal_blocks_forward, _causal_blocks_backward)


def causal_block_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *,
                           scale: float, softcap: float | None = None,
                           block: int | None = None,
                           key_layout: tuple[int, int] | None = None) -> jax.Array:
  """`attention` over one full sequence, skipping the keys that causality hides.

  q [B, T, H, hd], k/v [B, T, KVH, hd] over the same T slots, mask [B, T, T] causal by slot
  (no query sees a later slot) -> [B, T, H, hd]. Query block i (columns
  [i·block, (i+1)·block), block = `query_block_size(T)` unless given) attends only to the
  keys before its end: about half the score work of `attention` for long T. The blocks run
  in turn, and the backward pass recomputes each block's probabilities from its saved
  log-sum-exp (the flash-attention backward), so no [B, H, T, T] buffer is stored between
  the passes and the peak is one block's [B, H, block, T].

  With `key_layout` (P, R), the sequence is a shared prefix of P columns followed by
  responses of R columns (`shared_prefix.pack`) and the mask hides every other response from
  a response's queries: a query block then also skips the keys of the responses before its
  own (`_key_start`), so each response costs what it would in its own row.

  Equals `attention(q, k, v, mask)`, values and gradients, at every query that sees at least
  one key. A query that sees none (padding) gets the mean of the values of the keys its
  block reads: finite and meaningless, as with `attention`.
  """
  length = q.shape[1]
  if k.shape[1] != length or v.shape != k.shape or mask.shape[1:] != (length, length):
    raise ValueError(f"causal_block_attention: needs self-attention over one sequence; got "
                     f"q {q.shape}, k {k.shape}, v {v.shape}, mask {mask.shape}")
  block = query_block_size(length) if block is None else block
  if block < 1:
    raise ValueError(f"causal_block_attention: block must be >= 1, got {block}")
  if key_layout is not None and (min(key_layout) < 1 or (length - key_layout[0]) % key_layout[1]):
    raise ValueError(f"causal_block_attention: key_layout {key_layout} (prefix, response "
                     f"width) does not tile {length} columns")
  return _causal_blocks(q, k, v, mask, scale, softcap, block, key_layout)


def flat_matmul(x: jax.Array, kernel: jax.Array, in_dims: int,
                preferred_element_type=None) -> jax.Array:
  """Contracts the last `in_dims` axes of x with the first `in_dims` axes of kernel.

  x [..., *in] and kernel [*in, *out] -> [..., *out], computed as one 2-D matmul
  [rows, prod(in)] @ [prod(in), prod(out)]. An einsum over multi-axis kernels (e.g. q
  [embed, heads, head_dim]) leaves XLA:CPU transposing activations and gradients around the
  dots of the backward pass; the flat form has none. Only adjacent axes are merged, a sharded
  one (batch, heads) always as the major of its group, which GSPMD keeps sharded.
  """
  lead, contracted = x.shape[:x.ndim - in_dims], x.shape[x.ndim - in_dims:]
  if kernel.shape[:in_dims] != contracted:
    raise ValueError(f"flat_matmul: x {x.shape} and kernel {kernel.shape} disagree on the "
                     f"{in_dims} contracted axes")
  out_shape = kernel.shape[in_dims:]
  rows = x.reshape(-1, int(np.prod(contracted)))
  kernel = kernel.reshape(rows.shape[1], int(np.prod(out_shape)))
  if bfloat16_operands(rows, kernel):
    out = jnp.dot(rows.astype(jnp.bfloat16), kernel.astype(jnp.bfloat16),
                  preferred_element_type=jnp.float32)
    out = out.astype(preferred_element_type or x.dtype)
  else:
    out = jnp.dot(rows, kernel, preferred_element_type=preferred_element_type)
  return out.reshape(*lead, *out_shape)


def bfloat16_operands(x: jax.Array, kernel: jax.Array) -> bool:
  """Whether a float32 `flat_matmul` is traced under `jax.default_matmul_precision("bfloat16")`:
  its operands are then rounded to bfloat16 and the products summed in float32, as that
  setting asks of an accelerator's matmul unit. XLA:CPU ignores the setting, but runs this
  form on AMX / AVX512-BF16 hardware 2-6x faster than float32 (benchmarks/dot_precision.py).
  """
  return (jax.config.jax_default_matmul_precision == "bfloat16"
          and x.dtype == jnp.float32 and kernel.dtype == jnp.float32)


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


def _dense(x: jax.Array, kernel: nnx.Param, bias: nnx.Param | None, dtype,
           in_dims: int = 1) -> jax.Array:
  """x [..., *in] @ kernel [*in, *out] (+ bias [*out]) in the compute dtype, as one 2-D
  matmul (`flat_matmul`)."""
  out = flat_matmul(x, kernel[...].astype(dtype), in_dims=in_dims)
  return out if bias is None else out + bias[...].astype(dtype)


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

  def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array,
               kv: LayerCache | None = None, cache_index: jax.Array | None = None,
               key_layout: tuple[int, int] | None = None
               ) -> tuple[jax.Array, LayerCache | None]:
    """x [B, T, D] -> ([B, T, D], the updated cache: None without one). `key_layout`: see
    `causal_block_attention` (full sequences only).

    With `kv` the new keys/values are written at slots cache_index.. of this layer's part of
    the stack and the queries attend over the layer's whole cache.
    """
    # [B, T, D] -> [B, T, N, hd] through the [D, N, hd] kernels.
    q = _dense(x, self.q_proj, self.q_bias if self.qkv_bias else None, self.dtype)
    k = _dense(x, self.k_proj, self.k_bias if self.qkv_bias else None, self.dtype)
    v = _dense(x, self.v_proj, self.v_bias if self.qkv_bias else None, self.dtype)
    if self.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if kv is None:
      # Full sequence: the mask is causal over these T slots, so later keys can be skipped.
      out = causal_block_attention(q, k, v, mask, scale=self.scale, softcap=self.softcap,
                                   key_layout=key_layout)
    else:
      # The new columns in the cache's layouts: keys [B, KVH, hd, T], values [B, KVH, T, hd].
      kv, k, v = _write_layer_cache(kv, jnp.transpose(k, (0, 2, 3, 1)),
                                    jnp.transpose(v, (0, 2, 1, 3)), cache_index)
      out = attention(q, k.astype(self.dtype), v.astype(self.dtype), mask, scale=self.scale,
                      softcap=self.softcap)
    return _dense(out, self.o_proj, self.o_bias, self.dtype, in_dims=2), kv


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

  def __call__(self, x: jax.Array) -> jax.Array:
    gate = _dense(x, self.gate_proj, self.gate_bias if self.bias else None, self.dtype)
    up = _dense(x, self.up_proj, self.up_bias if self.bias else None, self.dtype)
    return _dense(self.act(gate) * up, self.down_proj, self.down_bias if self.bias else None,
                  self.dtype)


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
               kv: LayerCache | None = None, cache_index: jax.Array | None = None,
               key_layout: tuple[int, int] | None = None
               ) -> tuple[jax.Array, LayerCache | None]:
    attn_out, kv = self.attn(self.pre_attn_norm(x), cos, sin, mask, kv, cache_index,
                             key_layout)
    if self.sandwich:
      attn_out = self.post_attn_norm(attn_out)
    x = constrain_activations(x + attn_out)
    mlp_out = self.mlp(self.pre_mlp_norm(x))
    if self.sandwich:
      mlp_out = self.post_mlp_norm(mlp_out)
    return constrain_activations(x + mlp_out), kv


def constrain_activations(x: jax.Array) -> jax.Array:
  """The residual stream [B, T, D] pinned to the (batch, length, embed) activation layout of
  the mesh in context (`parallel.LOGICAL_RULES`: rows over data × fsdp, the rest replicated),
  so that GSPMD never picks another layout for it between sub-layers (e.g. the fsdp-sharded
  embed dimension of the weights). Identity outside a mesh context."""
  return parallel.constrain(x, ACTIVATION_AXES)


def _stacked_layers(cfg: ModelConfig, *, dtype, param_dtype, rngs: nnx.Rngs) -> DecoderLayer:
  """One DecoderLayer whose parameters carry a leading [L] axis (logical name `layers`), each
  layer initialised from its own split of `rngs`."""
  @nnx.split_rngs(splits=cfg.num_layers)
  @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: LAYERS})
  def make(layer_rngs: nnx.Rngs) -> DecoderLayer:
    return DecoderLayer(cfg, dtype=dtype, param_dtype=param_dtype, rngs=layer_rngs)
  return make(rngs)


def _pick(stack: jax.Array, index: jax.Array) -> jax.Array:
  """stack[index] along the leading axis (no gather when there is one entry)."""
  if stack.shape[0] == 1:
    return stack[0]
  return jax.lax.dynamic_index_in_dim(stack, index, keepdims=False)


def _scan_layers(layers: DecoderLayer, x: jax.Array, tables: list[tuple[jax.Array, jax.Array]],
                 masks: list[jax.Array], rope_of: list[int], window_of: list[int],
                 kv: tuple[jax.Array, jax.Array] | None, cache_index: jax.Array | None,
                 remat: bool, key_layout: tuple[int, int] | None = None
                 ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
  """Runs stacked layers ([L, ...] parameters) as one `lax.scan`: the layer is traced and
  compiled once, whatever L, and under a gradient only each layer's input x is kept.

  Layer i uses RoPE tables tables[rope_of[i]] and mask masks[window_of[i]] (Gemma 3 mixes
  local and global layers), picked inside the body by index. kv: the cache's keys and values
  (`KVCache`'s layouts), carried whole through the scan (each layer writes its own columns in
  place); returns the updated ones (None without a cache). With `remat`, each layer's body is
  rematerialised (`jax.checkpoint`) in the backward pass.
  """
  graphdef, params = nnx.split(layers)
  cos = jnp.stack([c for c, _ in tables])
  sin = jnp.stack([s for _, s in tables])
  mask = jnp.stack(masks)

  def body(carry, per_layer):
    x, kv = carry
    layer_params, rope, window, index = per_layer
    layer = nnx.merge(graphdef, layer_params)
    x, layer_kv = layer(x, _pick(cos, rope), _pick(sin, rope), _pick(mask, window),
                        None if kv is None else LayerCache(*kv, index), cache_index, key_layout)
    return (x, None if kv is None else (layer_kv.k, layer_kv.v)), None

  if remat:
    body = jax.checkpoint(body, prevent_cse=False)   # prevent_cse is not needed in a scan
  (x, kv), _ = jax.lax.scan(body, (x, kv), (params, jnp.asarray(rope_of, jnp.int32),
                                            jnp.asarray(window_of, jnp.int32),
                                            jnp.arange(len(rope_of), dtype=jnp.int32)))
  return x, kv


class Decoder(nnx.Module):
  """Decoder-only LM for every `ModelConfig` family.

  Args:
    cfg: the architecture.
    dtype: compute dtype (activations, matmul inputs); norms, RoPE, softmax and the returned
      logits are float32.
    param_dtype: storage dtype of the parameters.
    remat: rematerialise each layer in the backward pass (`nnx.remat`, or `jax.checkpoint`
      of the scan body), trading compute for activation memory.
    scan_layers: store the layers stacked (one DecoderLayer whose parameters are [L, ...],
      logical axis `layers`) and run them with one `lax.scan`, so that compile time and
      activation memory stop growing with depth. The HF checkpoint layout is unchanged:
      hf_io stacks on load and unstacks on export.
    rngs: random init (from_pretrained overwrites every parameter).
  """

  def __init__(self, cfg: ModelConfig, *, dtype=jnp.float32, param_dtype=jnp.float32,
               remat: bool = False, scan_layers: bool = False, rngs: nnx.Rngs):
    self.cfg = cfg
    self.dtype = dtype
    self.remat = remat
    self.scan_layers = scan_layers
    init = jax.nn.initializers.normal(cfg.initializer_range)
    self.embed = _param(rngs, init, (cfg.vocab_size, cfg.hidden_size), (VOCAB, EMBED),
                        param_dtype)
    if scan_layers:
      self.layers = _stacked_layers(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    else:
      self.layers = nnx.List([DecoderLayer(cfg, dtype=dtype, param_dtype=param_dtype,
                                           rngs=rngs) for _ in range(cfg.num_layers)])
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
              num_positions: int, cache: KVCache | None = None,
              cache_index: jax.Array | None = None,
              key_layout: tuple[int, int] | None = None
              ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
    """Runs every layer; RoPE tables and masks are built once per distinct RoPE / window.

    Every query position lies below `num_positions` (`rope_tables`). `key_layout` (P, R):
    the full sequences are packed groups, a P-column shared prefix and responses of R columns
    (`shared_prefix`), which the masks (`visible_keys`) and the attention
    (`causal_block_attention`) follow.

    Returns (hidden states after the final norm, the updated keys and values (`KVCache`'s
    layouts) when a cache is given, else None).
    """
    cfg = self.cfg
    ropes: dict[RopeConfig, int] = {}
    windows: dict[int | None, int] = {}
    rope_of = [ropes.setdefault(cfg.layer_rope(i), len(ropes)) for i in range(cfg.num_layers)]
    window_of = [windows.setdefault(cfg.layer_window(i), len(windows))
                 for i in range(cfg.num_layers)]
    tables = [rope_tables(q_positions, rope.inv_freq(cfg.head_dim), num_positions)
              for rope in ropes]
    segments = None
    if key_layout is not None:
      prefix, response = key_layout
      segments = shared_prefix.segments(prefix, (x.shape[1] - prefix) // response, response)
    masks = [visible_keys(q_slots, q_positions, k_slots, k_positions, k_valid, window, segments)
             for window in windows]
    # Remat only pays off under a gradient; decoding (with a cache) runs inside a while_loop
    # whose trace level nnx.remat must not cross.
    remat = self.remat and cache is None
    x = constrain_activations(x)
    kv = None if cache is None else (cache.k, cache.v)
    if self.scan_layers:
      x, new_kv = _scan_layers(self.layers, x, tables, masks, rope_of, window_of, kv,
                               cache_index, remat, key_layout)
      return self.final_norm(x), new_kv

    def run_layer(layer: DecoderLayer, *args):   # key_layout stays a static constant
      return layer(*args, key_layout=key_layout)

    layer_fn = nnx.remat(run_layer) if remat else run_layer
    written = []
    for i, layer in enumerate(self.layers):
      x, layer_kv = layer_fn(layer, x, *tables[rope_of[i]], masks[window_of[i]],
                             None if kv is None else LayerCache(kv[0][i], kv[1][i], None),
                             cache_index)
      written.append(layer_kv)
    return self.final_norm(x), None if kv is None else (
        tuple(c.k for c in written), tuple(c.v for c in written))

  def hidden_states(self, input_ids: jax.Array, attention_mask: jax.Array | None = None
                    ) -> jax.Array:
    """[B, T] ids -> [B, T, D] hidden states after the final norm (compute dtype)."""
    if attention_mask is None:
      attention_mask = jnp.ones(input_ids.shape, jnp.int32)
    positions = positions_from_mask(attention_mask)
    slots = jnp.arange(input_ids.shape[1])
    hidden, _ = self._layers(self._embed(input_ids), slots, positions, slots, positions,
                             attention_mask.astype(bool), num_positions=input_ids.shape[1])
    return hidden

  def shared_prefix_hidden_states(self, prefix_ids: jax.Array, prefix_mask: jax.Array,
                                  input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """`hidden_states` of rows that come in groups sharing a prefix, the prefix run once.

    prefix_ids / prefix_mask [n, P]: each group's prefix (left-padded); input_ids /
    attention_mask [n·G, T]: the rows, group g being rows g·G … g·G + G − 1, whose first P
    columns must equal their group's prefix (the caller's contract: `batching.assemble`
    checks it). The group runs as one sequence, its prefix followed by its G responses
    (`shared_prefix.pack`); each response attends to the prefix and causally to itself, at
    the positions it has in its own row. Returns [n·G, T, D], as `hidden_states(input_ids,
    attention_mask)` up to float rounding, for P + G·(T − P) columns of layer work per group
    instead of G·T (the attention skips the other responses' keys too); the backward pass
    sums the G rows' gradients into the one prefix.
    """
    width = prefix_ids.shape[1]
    group_size = input_ids.shape[0] // prefix_ids.shape[0]
    ids = shared_prefix.pack(prefix_ids, input_ids[:, width:])
    mask = shared_prefix.pack(prefix_mask, attention_mask[:, width:])
    positions = shared_prefix.positions(prefix_mask, attention_mask[:, width:])
    slots = jnp.arange(ids.shape[1])
    hidden, _ = self._layers(self._embed(ids), slots, positions, slots, positions,
                             mask.astype(bool), num_positions=input_ids.shape[1],
                             key_layout=(width, input_ids.shape[1] - width))
    return shared_prefix.unpack(hidden, width, group_size)

  def logits(self, hidden: jax.Array) -> jax.Array:
    """[..., D] hidden states -> [..., V] float32 logits (tied or untied, softcapped)."""
    # The tied embedding as a [D, V] kernel: its gradient is then hᵀ·dlogits, for which
    # XLA:CPU transposes the [N, D] hidden states instead of the V-wide logit gradients.
    kernel = self.embed[...].T if self.lm_head is None else self.lm_head[...]
    logits = flat_matmul(hidden, kernel.astype(self.dtype), in_dims=1,
                         preferred_element_type=jnp.float32)
    return softcap_logits(logits, self.cfg.final_logit_softcap)

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None
               ) -> jax.Array:
    return self.logits(self.hidden_states(input_ids, attention_mask))

  def init_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache of `max_len` slots per row (keys/values in `dtype`, default compute)."""
    cfg = self.cfg
    dtype = self.dtype if dtype is None else dtype
    if self.scan_layers:
      heads = (cfg.num_layers, batch, cfg.num_kv_heads)
      k = jnp.zeros((*heads, cfg.head_dim, max_len), dtype)
      v = jnp.zeros((*heads, max_len, cfg.head_dim), dtype)
    else:   # one array per layer (`LayerCache`)
      heads = (batch,) if cfg.num_kv_heads == 1 else (batch, cfg.num_kv_heads)
      k = tuple(jnp.zeros((*heads, cfg.head_dim, max_len), dtype) for _ in range(cfg.num_layers))
      v = tuple(jnp.zeros((*heads, max_len, cfg.head_dim), dtype) for _ in range(cfg.num_layers))
    return KVCache(k=k, v=v,
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
    # A row's positions count its real tokens, so they lie below the cache's slots.
    hidden, new_kv = self._layers(self._embed(input_ids), q_slots, new_positions, slots,
                                  positions, valid, cache.valid.shape[1], cache, cache_index)
    new_cache = KVCache(k=new_kv[0], v=new_kv[1], positions=positions, valid=valid)
    return self.logits(hidden), new_cache
