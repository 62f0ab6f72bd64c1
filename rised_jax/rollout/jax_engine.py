"""`JaxEngine`: the in-process batched sampler with a KV cache (an `Engine`).

One `generate` call validates every request, sorts them by prompt length, cuts them into
chunks of at most `max_batch` rows and runs each chunk as

  prefill   (jitted)  the left-padded prompts go through the model once, filling a KV cache
                      of prompt bucket + new-token bucket slots, and the first token is drawn;
  decode    (jitted)  a `lax.while_loop` feeds the last token of every row, draws the next
                      one, and stops as soon as every row is done (stop token or its own
                      max_new_tokens), or the new-token bucket is full.

Shapes are fixed by buckets so that each jitted function compiles once per bucket:
  batch   padded with inactive rows up to the next of `batch_buckets` (default: the powers
          of two below `max_batch`, and `max_batch`);
  prompt  LEFT-padded to the smallest `prompt_buckets` entry that fits the longest prompt,
          so every row's last prompt token sits in the same column;
  cache   prompt bucket + the smallest `max_new_tokens_buckets` entry that fits the largest
          max_new_tokens of the chunk.
Sampling parameters are per-row arrays (temperature, top-k, top-p, stop ids, max_new_tokens),
so requests with different parameters share one batch and one compilation; the sort for
top-k / top-p runs only when some row of the batch truncates (`lax.cond`).

Sampling:
  temperature 0 is greedy (argmax); otherwise the logits are divided by the temperature,
  truncated to the top-k and then the top-p (nucleus) set of the scaled distribution (ties
  at the threshold are kept), and sampled.
  Randomness is per row: the request's seed is folded into a base key, and step s draws with
  fold_in(row_key, s), so a request with a given seed samples the same tokens whatever else
  is in the batch (up to float reassociation in differently shaped batches).

Log-probs: `GenerationResult.logprobs` are log-softmax of the UNMODIFIED model logits
(temperature 1, no top-k/top-p truncation) at the sampled tokens, i.e. log π_θ(y_t | prefix),
the π_old of the policy-gradient ratio. They are not the log-probs of the distribution the
token was drawn from when temperature != 1 or truncation is on (the SGLang engine reports the
temperature-scaled ones); at temperature 1 without truncation the two agree.

Prefix reuse (`reuse_prefix=True`): the engine keeps the KV cache of every row of its last
`generate` call. A later request whose prompt starts with a kept row's tokens (prompt + all
output tokens but the last, whose keys were never computed; any shared prefix counts, e.g. a
reply cut short by a stop string) copies those keys/values into its own cache row and prefills
only the rest of its prompt, the "window". Multi-turn rollouts re-read the whole transcript
each turn; with reuse a turn prefills only the new environment message. A chunk with reuse
compiles per (batch, prompt, new-token, window) bucket; `window_buckets` are powers of two up
to the largest prompt bucket. Keys computed in another batch shape differ from a fresh
prefill's by float reassociation only. The kept caches are dropped by `update_weights` (they
belong to the old weights) and by `reset_prefix_cache` (the agent loop calls it at the start of
every run, so a run's rollouts do not depend on what the engine generated before).

Shared-prompt prefill (`generate(..., shared_prefill=True)`): rows of a chunk whose whole
prompts are equal (a rollout group's first turn) are prefilled once, as a batch of the
distinct prompts padded to a power of two, and the cache rows and last logits copied to every
row that shares them; each row then draws with its own key. Compiles per (batch, prompt,
new-token, distinct) bucket.

Decode chunks and compaction (`decode_chunk=n`): the decode loop runs n steps per jitted call.
Between calls the host asks `generate`'s `stop_check` about every unfinished row (the agent
loop's stop strings, which token ids alone cannot express) and, when the live rows fit a
smaller batch bucket, takes the finished rows' results (and, with prefix reuse, keeps their
cache) and gathers the live rows' cache, keys and state into that smaller batch, so finished
rows stop costing decode work. Rows keep their keys and step numbers, so the tokens are those
of the uncompacted loop. With n = None the loop runs to the end in one call, as before.

KV-cache layout: every cache operation here (row copies for reuse, sharing and compaction)
goes through `CacheLayout`, which finds each leaf's batch and slot axes from the decoder's
`init_cache` shapes, so any cache pytree (per-layer leaves, one stacked array) works.

Weights: the engine holds the model's graph definition and its state (references to its
arrays, not copies). `update_weights` swaps in another model's state of the same structure,
shapes and dtypes, which reuses every compiled function; call it after each train step (a
step that donates its parameter buffers invalidates the arrays held here).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import math
import numbers
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rised_jax.rollout.base import (MATMUL_OPERANDS, EngineDefaults, EngineLimits,
                                    GenerationRequest, GenerationResult, SamplingParams,
                                    StopCheck)
from rised_jax.checks import is_int

DEFAULT_PROMPT_BUCKETS = (128, 256, 512, 1024, 2048, 4096)
DEFAULT_NEW_TOKEN_BUCKETS = (32, 128, 512)
_NO_STOP = -1           # padding of the per-row stop-id table; never a token id
_INT32_RANGE = (-2**31, 2**31)


# ---------------------------------------------------------------------------------------------
# Pure array functions.


def truncate_logits(logits: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
  """Keeps each row's top-k logits, then its top-p (nucleus) set; the rest become -inf.

  logits [B, V] (already temperature-scaled), top_k [B] int (0: no limit), top_p [B] in
  (0, 1] (1: no limit). The nucleus is the shortest prefix of the sorted tokens whose
  probability mass reaches top_p (the first token is always kept). Tokens tied with the
  last kept logit are kept too.
  """
  vocab = logits.shape[-1]
  sorted_logits = jnp.flip(jnp.sort(logits, axis=-1), axis=-1)
  probs = jax.nn.softmax(sorted_logits, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  rank = jnp.arange(vocab)
  k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
  # top_p >= 1 keeps everything even where rounding pushes the cumulative mass past 1.
  in_nucleus = (mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0)
  kept = jnp.sum((rank[None, :] < k[:, None]) & in_nucleus, axis=-1)
  threshold = jnp.take_along_axis(sorted_logits, jnp.maximum(kept, 1)[:, None] - 1, axis=-1)
  return jnp.where(logits >= threshold, logits, -jnp.inf)


# Vocabulary entries per block of `inverse_cdf_draw`'s two-level search.
_DRAW_BLOCK = 128


def inverse_cdf_draw(scaled: jax.Array, uniforms: jax.Array) -> jax.Array:
  """[B] int32: per row the first token whose cumulative softmax(scaled) weight reaches
  uniforms[b] times the row's total, i.e. an exact draw from softmax(scaled[b]).

  scaled [B, V] (entries at -inf are never drawn), uniforms [B] in (0, 1]. One uniform per
  row instead of the V-wide Gumbel noise of `jax.random.categorical` (V random words and two
  logarithms per entry): the weights are summed in blocks of `_DRAW_BLOCK`, the block is found
  on the cumulative block sums and the token on that block's own cumulative sums, so no
  V-long prefix sum is formed. A token of zero weight cannot be reached (its cumulative sum
  equals its predecessor's); where float rounding carries the target past a block's last
  positive weight, that token is taken.
  """
  batch, vocab = scaled.shape
  blocks = -(-vocab // _DRAW_BLOCK)
  weights = jnp.exp(scaled - jnp.max(scaled, axis=-1, keepdims=True))
  weights = jnp.pad(weights, ((0, 0), (0, blocks * _DRAW_BLOCK - vocab)))
  weights = weights.reshape(batch, blocks, _DRAW_BLOCK)
  cumulative = jnp.cumsum(weights.sum(axis=-1), axis=-1)            # [B, blocks]
  target = uniforms * cumulative[:, -1]
  block = jnp.minimum(jnp.sum(cumulative < target[:, None], axis=-1), blocks - 1)
  before = jnp.where(block > 0, jnp.take_along_axis(
      cumulative, jnp.maximum(block - 1, 0)[:, None], axis=-1)[:, 0], 0.0)
  inside = jnp.take_along_axis(weights, block[:, None, None], axis=1)[:, 0]   # [B, block]
  offset = jnp.sum(before[:, None] + jnp.cumsum(inside, axis=-1) < target[:, None], axis=-1)
  last_positive = _DRAW_BLOCK - 1 - jnp.argmax((inside > 0)[:, ::-1], axis=-1)
  return (block * _DRAW_BLOCK + jnp.minimum(offset, last_positive)).astype(jnp.int32)


def sample_tokens(logits: jax.Array, uniforms: jax.Array, temperature: jax.Array,
                  top_k: jax.Array, top_p: jax.Array) -> jax.Array:
  """[B] int32 tokens: argmax where temperature is 0, else a draw from the tempered,
  truncated distribution at each row's own uniform (uniforms [B] in (0, 1], from
  `step_uniforms`), by `inverse_cdf_draw`."""
  sampling = temperature > 0
  scaled = logits / jnp.where(sampling, temperature, 1.0)[:, None]
  truncates = sampling & ((top_k > 0) | (top_p < 1.0))
  scaled = jax.lax.cond(jnp.any(truncates), lambda x: truncate_logits(x, top_k, top_p),
                        lambda x: x, scaled)
  drawn = inverse_cdf_draw(scaled, uniforms)
  return jnp.where(sampling, drawn, jnp.argmax(logits, axis=-1)).astype(jnp.int32)


def token_logprobs(logits: jax.Array, tokens: jax.Array) -> jax.Array:
  """[B] float32 log-softmax(logits)[b, tokens[b]]: the unmodified model's log-probs."""
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(log_probs, tokens[:, None], axis=-1)[:, 0]


def is_stop(tokens: jax.Array, stop_ids: jax.Array) -> jax.Array:
  """[B] bool: tokens[b] is one of row b's stop ids (stop_ids [B, S], padded with -1)."""
  return jnp.any(tokens[:, None] == stop_ids, axis=-1)


def row_keys(seeds: jax.Array) -> jax.Array:
  """[B] typed keys: each request's seed (uint32) folded into one base key."""
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(0), seeds)


def step_uniforms(keys: jax.Array, steps: int) -> jax.Array:
  """[B, steps] float32 in (0, 1]: row b's uniform of decode step s (0 = the token drawn
  after the prompt) is 1 - U[0, 1) under fold_in(keys[b], s); a zero target would select
  token 0 whatever its weight.

  Drawn for every step at once, before the decode loop: inside it, XLA:CPU runs each
  threefry hash as a rolled loop of small kernels, which cost about a tenth of a tiny
  model's decode step (docs/performance.md). The values are the same either way."""
  def of_row(key):
    return jax.vmap(lambda s: jax.random.uniform(jax.random.fold_in(key, s), (),
                                                 jnp.float32))(jnp.arange(steps))
  return 1.0 - jax.vmap(of_row)(keys)


def _feed_prompt(model: Any, ids: jax.Array, mask: jax.Array, cache: Any,
                 prompt_len: int) -> tuple[jax.Array, Any]:
  """Feeds the last `ids.shape[1]` prompt columns (ending at slot prompt_len - 1) into the
  cache; returns the last column's logits [B, V] and the cache."""
  width = ids.shape[1]
  if width > 1:
    # All but the last column: only the cache is kept, so XLA drops these [B, W, V] logits.
    _, cache = model.forward_with_cache(ids[:, :-1], mask[:, :-1], cache, prompt_len - width)
  logits, cache = model.forward_with_cache(ids[:, -1:], mask[:, -1:], cache, prompt_len - 1)
  return logits[:, 0], cache


def _first_tokens(logits, seeds, temperature, top_k, top_p, stop_ids, max_new, active,
                  new_tokens: int):
  """Draws token 0 of every row from the prompt's last logits [B, V]; returns the decode
  loop's starting state (keys, ids, log-probs, lengths, done)."""
  batch = logits.shape[0]
  keys = row_keys(seeds)
  tokens = sample_tokens(logits, step_uniforms(keys, 1)[:, 0], temperature, top_k, top_p)
  out_ids = jnp.zeros((batch, new_tokens), jnp.int32).at[:, 0].set(tokens)
  out_logprobs = jnp.zeros((batch, new_tokens), jnp.float32).at[:, 0].set(
      token_logprobs(logits, tokens))
  lengths = active.astype(jnp.int32)
  done = ~active | is_stop(tokens, stop_ids) | (max_new <= 1)
  return keys, out_ids, out_logprobs, lengths, done


@dataclasses.dataclass(frozen=True)
class CacheLayout:
  """Where each KV-cache leaf keeps its rows and slots, found from the decoder's own
  `init_cache` (the leaf axis whose size follows the batch, resp. the slot count), so that
  row copies work on any cache pytree: per-layer leaves, one stacked leaf, extra leaves.

  treedef: the cache's tree structure; batch_axes / slot_axes: per leaf (in
  `jax.tree.leaves` order) the axis, or None where the leaf has none.
  """

  treedef: Any
  batch_axes: tuple[int | None, ...]
  slot_axes: tuple[int | None, ...]

  @classmethod
  def of(cls, model: Any, dtype: Any) -> CacheLayout:
    def shapes(batch: int, slots: int):
      cache = jax.eval_shape(lambda: model.init_cache(batch, slots, dtype))
      return jax.tree.flatten(cache)

    base, treedef = shapes(2, 3)
    wider, _ = shapes(5, 3)
    longer, _ = shapes(2, 7)
    return cls(treedef=treedef, batch_axes=tuple(_changed_axis(a, b) for a, b in zip(base, wider)),
               slot_axes=tuple(_changed_axis(a, b) for a, b in zip(base, longer)))

  def slots(self, cache: Any) -> int:
    """The cache's slot count (prompt bucket + new-token bucket)."""
    leaves = jax.tree.leaves(cache)
    return next(x.shape[a] for x, a in zip(leaves, self.slot_axes) if a is not None)

  def take_rows(self, cache: Any, rows: jax.Array) -> Any:
    """The cache of rows `rows` [B'] (gathered along every leaf's batch axis)."""
    leaves = jax.tree.leaves(cache)
    return self.treedef.unflatten([x if a is None else jnp.take(x, rows, axis=a)
                                   for x, a in zip(leaves, self.batch_axes)])

  def place_rows(self, cache: Any, source: Any, rows: jax.Array, slots: jax.Array,
                 take: jax.Array) -> Any:
    """Copies cache entries where `take` [B, S] is set, from row rows[b], slot slots[b, s] of
    `source` (another call's cache, of any batch and slot count)."""
    def place(dst, src, batch_axis, slot_axis):
      if batch_axis is None or slot_axis is None:
        return dst
      dst_rs = jnp.moveaxis(dst, (batch_axis, slot_axis), (0, 1))
      picked = jnp.moveaxis(src, (batch_axis, slot_axis), (0, 1))[rows[:, None], slots]
      where = take.reshape(take.shape + (1,) * (dst_rs.ndim - 2))
      return jnp.moveaxis(jnp.where(where, picked, dst_rs), (0, 1), (batch_axis, slot_axis))

    return self.treedef.unflatten([
        place(d, s, b, a) for d, s, b, a in zip(jax.tree.leaves(cache), jax.tree.leaves(source),
                                                 self.batch_axes, self.slot_axes)])


def _changed_axis(a: Any, b: Any) -> int | None:
  """The one axis in which two shapes of the same leaf differ (None: they agree)."""
  axes = [i for i, (m, n) in enumerate(zip(a.shape, b.shape)) if m != n]
  if len(axes) > 1:
    raise ValueError(f"JaxEngine: a KV-cache leaf {a.shape} -> {b.shape} changes in more than "
                     f"one axis with one size; the cache layout is not understood")
  return axes[0] if axes else None


# ---------------------------------------------------------------------------------------------
# Host side.


@dataclasses.dataclass(frozen=True)
class Bucket:
  """One compiled shape: padded batch, prompt length and new-token capacity, for a chunk
  that reuses cached prefixes the width of the prefilled window (None: the whole prompt), and
  for a shared-prompt prefill the padded count of distinct prompts prefilled (None: every
  row is prefilled)."""

  batch: int
  prompt_len: int
  new_tokens: int
  window: int | None = None
  distinct: int | None = None


@dataclasses.dataclass
class _Kept:
  """One row of a previous call's cache: `tokens` have their keys/values in `slots` of row
  `row` of cache number `cache`."""

  tokens: np.ndarray   # [n] int32
  slots: np.ndarray    # [n] int32
  cache: int
  row: int


@dataclasses.dataclass
class _Reuse:
  """Where a chunk's cached prefixes come from: per source cache, the rows' gather indices."""

  sources: list[int]          # indices into the kept caches
  rows: list[np.ndarray]      # per source: [B] int32 source row of each destination row
  slots: list[np.ndarray]     # per source: [B, S] int32 source slot of each destination slot
  take: list[np.ndarray]      # per source: [B, S] bool, the destination slot comes from it
  tokens: int                 # prompt tokens not prefilled thanks to the cache


@dataclasses.dataclass
class _Chunk:
  """Numpy inputs of one bucketed batch; rows past `size` are inactive padding."""

  bucket: Bucket
  size: int
  prompt_ids: np.ndarray    # [B, P] int32, left-padded
  prompt_mask: np.ndarray   # [B, P] int32
  seeds: np.ndarray         # [B] uint32
  temperature: np.ndarray   # [B] float32
  top_k: np.ndarray         # [B] int32
  top_p: np.ndarray         # [B] float32
  stop_ids: np.ndarray      # [B, S] int32, padded with -1
  max_new: np.ndarray       # [B] int32
  active: np.ndarray        # [B] bool
  prompts: list[list[int]]  # the real rows' prompts
  cached: np.ndarray        # [B] int32, leading prompt tokens that come from a kept cache
  reuse: _Reuse | None = None   # None: prompt_ids are whole prompts, no cache reuse


def _check_buckets(name: str, buckets: Sequence[int]) -> tuple[int, ...]:
  values = tuple(buckets)
  if not values or any(not is_int(b) or b < 1
                       for b in values):
    raise ValueError(f"JaxEngine: {name} must be a non-empty sequence of positive integers, "
                     f"got {buckets!r}")
  return tuple(sorted(set(int(b) for b in values)))


def _smallest_fitting(buckets: Sequence[int], size: int) -> int:
  return next(b for b in buckets if b >= size)


class JaxEngine(EngineDefaults):
  """Batched KV-cache sampler over a `rised_jax.model.Decoder` (see the module docstring).

  Args:
    model: the decoder (`init_cache`, `forward_with_cache`, `cfg.vocab_size`).
    max_batch: most rows in one compiled batch; larger calls run in several chunks.
    batch_buckets: allowed padded batch sizes (max_batch is always one); fewer buckets mean
      fewer compilations and more padding rows.
    prompt_buckets: allowed padded prompt lengths; the largest is the longest prompt accepted.
    max_new_tokens_buckets: allowed new-token capacities; the largest is the most
      max_new_tokens a request may ask for.
    dtype: KV-cache dtype (default: the model's compute dtype).
    max_stop_tokens: size of the per-row stop-id table (a request may list at most this many).
    pad_id: token id written into padding columns (masked out, never attended).
    reuse_prefix: keep the last call's KV cache and prefill only what a prompt adds to it
      (see the module docstring).
    decode_chunk: decode steps per jitted call (None: one call to the end). Between calls
      finished rows leave the batch when the live ones fit a smaller batch bucket, and
      `generate`'s stop_check may end rows (see the module docstring).
  """

  collective = True   # one sampling program over every process's devices (`Engine`)

  def __init__(self, model: Any, *, max_batch: int = 16,
               batch_buckets: Sequence[int] | None = None,
               prompt_buckets: Sequence[int] = DEFAULT_PROMPT_BUCKETS,
               max_new_tokens_buckets: Sequence[int] = DEFAULT_NEW_TOKEN_BUCKETS,
               dtype: Any = None, max_stop_tokens: int = 8, pad_id: int = 0,
               reuse_prefix: bool = False, decode_chunk: int | None = None,
               matmul_operands: str = "compute"):
    for name in ("init_cache", "forward_with_cache", "cfg"):
      if not hasattr(model, name):
        raise TypeError(f"JaxEngine: model must be a rised_jax.model.Decoder (it has no "
                        f"{name!r}), got {type(model).__name__}")
    if not is_int(max_batch) or max_batch < 1:
      raise ValueError(f"JaxEngine: max_batch must be a positive integer, got {max_batch!r}")
    if not is_int(max_stop_tokens) or \
        max_stop_tokens < 1:
      raise ValueError(f"JaxEngine: max_stop_tokens must be a positive integer, "
                       f"got {max_stop_tokens!r}")
    if decode_chunk is not None and (isinstance(decode_chunk, bool) or
                                     not isinstance(decode_chunk, int) or decode_chunk < 1):
      raise ValueError(f"JaxEngine: decode_chunk must be a positive integer or None, "
                       f"got {decode_chunk!r}")
    self.decode_chunk = decode_chunk
    if matmul_operands not in MATMUL_OPERANDS:
      raise ValueError(f"JaxEngine: matmul_operands must be one of {MATMUL_OPERANDS}, "
                       f"got {matmul_operands!r}")
    self.matmul_operands = matmul_operands
    self.vocab_size = int(model.cfg.vocab_size)
    if not 0 <= pad_id < self.vocab_size:
      raise ValueError(f"JaxEngine: pad_id must be in [0, {self.vocab_size}), got {pad_id!r}")
    self.max_batch = max_batch
    if batch_buckets is None:
      batch_buckets = [2**i for i in range(max_batch.bit_length()) if 2**i < max_batch]
    elif _check_buckets("batch_buckets", batch_buckets)[-1] > max_batch:
      raise ValueError(f"JaxEngine: batch_buckets must not exceed max_batch={max_batch}, "
                       f"got {batch_buckets!r}")
    self.batch_buckets = tuple(sorted({*batch_buckets, max_batch}))
    self.prompt_buckets = _check_buckets("prompt_buckets", prompt_buckets)
    self.new_token_buckets = _check_buckets("max_new_tokens_buckets", max_new_tokens_buckets)
    self.max_stop_tokens = max_stop_tokens
    self.pad_id = pad_id
    self.cache_dtype = dtype
    self.version = 0
    self._graphdef, self._state = nnx.split(model)
    self._traces: collections.Counter[tuple[str, Bucket]] = collections.Counter()
    self._prefill = jax.jit(self._traced(self._prefill_fn), static_argnames="new_tokens")
    self._prefill_window = jax.jit(self._traced(self._prefill_window_fn),
                                   static_argnames="new_tokens")
    self._prefill_shared = jax.jit(self._traced(self._prefill_shared_fn),
                                   static_argnames="new_tokens")
    self.layout = CacheLayout.of(model, dtype)
    self._place = jax.jit(self.layout.place_rows)
    self._compact = jax.jit(self._compact_fn)
    self._decode = jax.jit(self._traced(self._decode_fn))
    self.last_decode_steps: list[int] = []   # per chunk of the last call: tokens per row drawn
    self.reuse_prefix = bool(reuse_prefix)
    top = self.prompt_buckets[-1]
    self.window_buckets = tuple(sorted({*self.prompt_buckets,
                                        *(2**i for i in range(4, top.bit_length()) if 2**i < top)}))
    self._kept_caches: list[Any] = []
    self._kept_rows: list[_Kept] = []
    self.last_reused_tokens = 0   # prompt tokens of the last call served from kept caches
    self.last_shared_tokens = 0   # prompt tokens of the last call not prefilled: shared prompts
    self.last_row_steps = 0       # decode steps x batch rows the last call ran (padding too)

  # ---- public API -------------------------------------------------------------------------

  @property
  def compile_counts(self) -> dict[tuple[str, Bucket], int]:
    """How many times ("prefill" | "decode", bucket) was traced (= compiled) so far."""
    return dict(self._traces)

  def update_weights(self, model: Any, version: int) -> None:
    """Uses `model`'s current parameters from now on, without recompiling.

    The model must have this engine's architecture: the same graph and the same parameter
    shapes and dtypes (anything else would need new compilations and is refused).
    """
    graphdef, state = nnx.split(model)
    if graphdef != self._graphdef:
      raise ValueError("JaxEngine.update_weights: the model's structure (config or module "
                       "graph) differs from the engine's; build a new JaxEngine for it")
    if _signature(state) != _signature(self._state):
      old, new = _shapes_and_dtypes(self._state), _shapes_and_dtypes(state)
      diffs = [f"{path}: {a} -> {b}" for (path, a), (_, b) in zip(old, new) if a != b]
      raise ValueError(f"JaxEngine.update_weights: parameter shapes/dtypes differ from the "
                       f"engine's ({'; '.join(diffs[:4]) or 'different parameter set'}); "
                       f"build a new JaxEngine for it")
    self._state = state
    self.version = int(version)
    self.reset_prefix_cache()   # the kept keys/values belong to the old weights

  def limits(self) -> EngineLimits:
    return EngineLimits.of_buckets(self.prompt_buckets, self.new_token_buckets)

  def reset_prefix_cache(self) -> None:
    """Forgets the kept caches: the next call prefills every prompt whole."""
    self._kept_caches, self._kept_rows = [], []

  def generate(self, requests: Sequence[GenerationRequest], *, shared_prefill: bool = False,
               stop_check: StopCheck | None = None
               ) -> list[GenerationResult]:
    """One result per request, in order (see the module docstring for the semantics).

    shared_prefill: rows of a chunk with the same whole prompt (and no kept prefix) are
      prefilled once and their cache rows copied (a rollout group's first turn).
    stop_check(request index, output ids so far) -> True ends that row; it is asked between
      `decode_chunk` calls for each unfinished row, so a row may end up to decode_chunk
      tokens after the point the check would first have accepted (the caller cuts there).
    """
    requests = list(requests)
    for index, request in enumerate(requests):
      self._validate(request, index)
    cached = [self._cached_length(list(r.prompt_ids)) for r in requests]
    # Similar uncached lengths share a chunk, so a chunk's window is no wider than it must be.
    order = sorted(range(len(requests)),
                   key=lambda i: (len(requests[i].prompt_ids) - cached[i][0],
                                  len(requests[i].prompt_ids)))
    results: list[GenerationResult | None] = [None] * len(requests)
    self.last_decode_steps = []
    self.last_reused_tokens = self.last_shared_tokens = self.last_row_steps = 0
    kept_caches = self._kept_caches
    self._kept_caches, self._kept_rows = [], []
    for start in range(0, len(order), self.max_batch):
      indices = order[start:start + self.max_batch]
      chunk = self._pack([requests[i] for i in indices], [cached[i] for i in indices])
      for i, result in zip(indices, self._run(chunk, kept_caches, shared_prefill,
                                              lambda b, ids, indices=indices:
                                              stop_check(indices[b], ids)
                                              if stop_check else False)):
        results[i] = result
    return results

  # ---- prefix reuse -----------------------------------------------------------------------

  def _cached_length(self, prompt: list[int]) -> tuple[int, _Kept | None]:
    """The longest prefix of `prompt` (all but its last token) that a kept row holds."""
    best, best_row = 0, None
    if not self.reuse_prefix:
      return best, best_row
    wanted = np.asarray(prompt[:-1], np.int32)
    for kept in self._kept_rows:
      n = min(len(wanted), len(kept.tokens))
      if n <= best:
        continue
      same = wanted[:n] == kept.tokens[:n]
      length = n if same.all() else int(np.argmin(same))
      if length > best:
        best, best_row = length, kept
    return best, best_row

  def _keep(self, chunk: _Chunk, b: int, cache: int, row: int, out_ids: np.ndarray,
            length: int) -> None:
    """Records where chunk row b's prompt and output tokens (but the last) sit: in row `row` of
    kept cache number `cache`."""
    prompt_len = chunk.bucket.prompt_len
    width = chunk.prompt_ids.shape[1]
    prompt = chunk.prompts[b]
    cached, n_out = int(chunk.cached[b]), length - 1
    uncached = len(prompt) - cached
    slots = np.concatenate([
        np.arange(prompt_len - width - cached, prompt_len - width),
        np.arange(prompt_len - uncached, prompt_len),
        np.arange(prompt_len, prompt_len + n_out)]).astype(np.int32)
    tokens = np.asarray(list(prompt) + [int(t) for t in out_ids[:n_out]], np.int32)
    self._kept_rows.append(_Kept(tokens=tokens, slots=slots, cache=cache, row=row))

  # ---- validation and packing ---------------------------------------------------------------

  def _validate(self, request: GenerationRequest, index: int) -> None:
    """Raises ValueError naming the request and field, before anything is compiled."""
    where = f"JaxEngine: generation request {index}"
    prompt = list(request.prompt_ids)
    if not prompt:
      raise ValueError(f"{where}: prompt_ids is empty; at least one token is needed")
    # Plain ints in range (the usual case) are checked without is_int's ABC test per token,
    # which cost 5 % of a tiny model's rollout.
    valid = (all(type(t) is int for t in prompt)   # pylint: disable=unidiomatic-typecheck
             and 0 <= min(prompt) and max(prompt) < self.vocab_size)
    bad = [] if valid else [t for t in prompt if not is_int(t) or not 0 <= t < self.vocab_size]
    if bad:
      raise ValueError(f"{where}: prompt_ids must be integers in [0, {self.vocab_size}), "
                       f"got {bad[:5]!r}")
    if len(prompt) > self.prompt_buckets[-1]:
      raise ValueError(f"{where}: the prompt has {len(prompt)} tokens, more than the largest "
                       f"prompt bucket ({self.prompt_buckets[-1]}); raise prompt_buckets")
    params = request.params
    if not isinstance(params, SamplingParams):
      raise ValueError(f"{where}: params must be a SamplingParams, got {type(params).__name__}")
    new = params.max_new_tokens
    if not is_int(new) or new < 1:
      raise ValueError(f"{where}: max_new_tokens must be an integer >= 1, got {new!r}")
    if new > self.new_token_buckets[-1]:
      raise ValueError(f"{where}: max_new_tokens={new} is above the largest new-token bucket "
                       f"({self.new_token_buckets[-1]}); raise max_new_tokens_buckets")
    if not (isinstance(params.temperature, numbers.Real) and math.isfinite(params.temperature)
            and params.temperature >= 0):
      raise ValueError(f"{where}: temperature must be finite and >= 0, "
                       f"got {params.temperature!r}")
    if not (isinstance(params.top_p, numbers.Real) and 0 < params.top_p <= 1):
      raise ValueError(f"{where}: top_p must be in (0, 1], got {params.top_p!r}")
    if not is_int(params.top_k) or \
        params.top_k < 0:
      raise ValueError(f"{where}: top_k must be an integer >= 0 (0: no truncation), "
                       f"got {params.top_k!r}")
    stops = list(params.stop_token_ids)
    if any(not is_int(t)
           or not 0 <= t < self.vocab_size for t in stops):
      raise ValueError(f"{where}: stop_token_ids must be integers in [0, {self.vocab_size}), "
                       f"got {stops!r}")
    if len(set(stops)) > self.max_stop_tokens:
      raise ValueError(f"{where}: {len(set(stops))} stop tokens, more than max_stop_tokens="
                       f"{self.max_stop_tokens}; raise it when building the JaxEngine")
    seed = request.seed
    if not is_int(seed) or \
        not _INT32_RANGE[0] <= seed < _INT32_RANGE[1]:
      raise ValueError(f"{where}: seed must be an integer in the int32 range, got {seed!r}")

  def _pack(self, requests: Sequence[GenerationRequest],
            cached: Sequence[tuple[int, _Kept | None]]) -> _Chunk:
    size = len(requests)
    lengths = [len(r.prompt_ids) for r in requests]
    prompt_len = _smallest_fitting(self.prompt_buckets, max(lengths))
    window = None
    counts = [c for c, _ in cached]
    if any(counts):
      window = _smallest_fitting(self.window_buckets, max(n - c for n, c in zip(lengths, counts)))
      # The kept prefix must fit before the window: shorten it where the prompt bucket is full.
      counts = [min(c, self.prompt_buckets[-1] - window) for c in counts]
      prompt_len = _smallest_fitting(self.prompt_buckets, max(c + window for c in counts))
    bucket = Bucket(
        batch=_smallest_fitting(self.batch_buckets, size), prompt_len=prompt_len,
        new_tokens=_smallest_fitting(self.new_token_buckets,
                                     max(r.params.max_new_tokens for r in requests)),
        window=window)
    batch, width = bucket.batch, window or prompt_len
    chunk = _Chunk(
        bucket=bucket, size=size,
        prompt_ids=np.full((batch, width), self.pad_id, np.int32),
        prompt_mask=np.zeros((batch, width), np.int32),
        seeds=np.zeros(batch, np.uint32), temperature=np.zeros(batch, np.float32),
        top_k=np.zeros(batch, np.int32), top_p=np.ones(batch, np.float32),
        stop_ids=np.full((batch, self.max_stop_tokens), _NO_STOP, np.int32),
        max_new=np.ones(batch, np.int32), active=np.zeros(batch, bool),
        prompts=[list(r.prompt_ids) for r in requests], cached=np.zeros(batch, np.int32))
    # Inactive padding rows hold one real token so that no row is entirely masked.
    chunk.prompt_mask[size:, -1] = 1
    if window:
      chunk.reuse = self._gather_plan(bucket,
                                      [(c, kept) for c, (_, kept) in zip(counts, cached)])
      chunk.cached[:size] = counts
    for b, request in enumerate(requests):
      prompt, params = list(request.prompt_ids), request.params
      fed = prompt[int(chunk.cached[b]):]
      chunk.prompt_ids[b, width - len(fed):] = fed
      chunk.prompt_mask[b, width - len(fed):] = 1
      chunk.seeds[b] = int(request.seed) % 2**32
      chunk.temperature[b] = params.temperature
      chunk.top_k[b] = params.top_k
      chunk.top_p[b] = params.top_p
      stops = sorted(set(int(t) for t in params.stop_token_ids))
      chunk.stop_ids[b, :len(stops)] = stops
      chunk.max_new[b] = params.max_new_tokens
      chunk.active[b] = True
    return chunk

  def _gather_plan(self, bucket: Bucket,
                   cached: Sequence[tuple[int, _Kept | None]]) -> _Reuse:
    """Index arrays that copy each row's kept prefix to the slots just before its window."""
    slots = bucket.prompt_len + bucket.new_tokens
    start = bucket.prompt_len - bucket.window
    plan = _Reuse(sources=[], rows=[], slots=[], take=[], tokens=0)
    for b, (count, kept) in enumerate(cached):
      if not count:
        continue
      if kept.cache not in plan.sources:
        plan.sources.append(kept.cache)
        plan.rows.append(np.zeros(bucket.batch, np.int32))
        plan.slots.append(np.zeros((bucket.batch, slots), np.int32))
        plan.take.append(np.zeros((bucket.batch, slots), bool))
      i = plan.sources.index(kept.cache)
      plan.rows[i][b] = kept.row
      plan.slots[i][b, start - count:start] = kept.slots[:count]
      plan.take[i][b, start - count:start] = True
      plan.tokens += count
    return plan

  def _initial_cache(self, chunk: _Chunk, kept_caches: Sequence[Any]) -> Any:
    """A fresh cache with the kept prefixes of `chunk.reuse` in place."""
    bucket = chunk.bucket
    model = nnx.merge(self._graphdef, self._state)
    cache = model.init_cache(bucket.batch, bucket.prompt_len + bucket.new_tokens,
                             self.cache_dtype)
    plan = chunk.reuse
    for source, rows, slots, take in zip(plan.sources, plan.rows, plan.slots, plan.take):
      cache = self._place(cache, kept_caches[source], rows, slots, take)
    self.last_reused_tokens += plan.tokens
    return cache

  def _prefill_chunk(self, chunk: _Chunk, kept_caches: Sequence[Any], shared: bool):
    """The prefill of `chunk` (whole prompts, windows after kept prefixes, or each distinct
    prompt once): (cache, keys, ids, log-probs, lengths, done) on the device."""
    sampling = (chunk.temperature, chunk.top_k, chunk.top_p, chunk.stop_ids, chunk.max_new)
    tail = (chunk.seeds, *sampling, chunk.active)
    if chunk.reuse is not None:
      return self._prefill_window(self._state, self._initial_cache(chunk, kept_caches),
                                  chunk.prompt_ids, chunk.prompt_mask, *tail,
                                  new_tokens=chunk.bucket.new_tokens)
    distinct = self._distinct_prompts(chunk) if shared else None
    if distinct is None:
      return self._prefill(self._state, chunk.prompt_ids, chunk.prompt_mask, *tail,
                           new_tokens=chunk.bucket.new_tokens)
    ids, mask, source = distinct
    return self._prefill_shared(self._state, ids, mask, source, *tail,
                                new_tokens=chunk.bucket.new_tokens)

  def _distinct_prompts(self, chunk: _Chunk):
    """(ids [U', P], mask [U', P], source [B]) where the chunk's rows have U distinct prompts
    (U' the power of two >= U) and row b is prefilled as distinct row source[b]; None when that
    would not make the prefill batch smaller."""
    index_of: dict[bytes, int] = {}   # prompt -> its distinct row
    rows: list[int] = []              # the first chunk row of each distinct prompt
    source = np.zeros(chunk.bucket.batch, np.int32)
    for b in range(chunk.size):
      key = chunk.prompt_ids[b].tobytes()
      if key not in index_of:
        index_of[key] = len(rows)
        rows.append(b)
      source[b] = index_of[key]
    # A power of two, not a batch bucket: a job with coarse buckets (16, 32) still prefills
    # its 4 distinct prompts as 4 rows (one compilation per power of two).
    padded = 1 << (len(rows) - 1).bit_length()
    if padded >= chunk.bucket.batch:
      return None
    self.last_shared_tokens += sum(len(chunk.prompts[b]) for b in range(chunk.size)
                                   if b not in rows)
    # Padding rows repeat the last prompt; only the chunk's inactive padding rows read them.
    rows += [rows[-1]] * (padded - len(rows))
    source[chunk.size:] = padded - 1
    return chunk.prompt_ids[rows], chunk.prompt_mask[rows], source

  def _run(self, chunk: _Chunk, kept_caches: Sequence[Any], shared: bool,
           stop_check: StopCheck) -> list[GenerationResult]:
    """Prefill, then decode `decode_chunk` steps at a time; between calls finished rows leave
    the batch when the live ones fit a smaller batch bucket (their results and caches are
    taken first)."""
    new_tokens = chunk.bucket.new_tokens
    cache, keys, ids, logprobs, lengths, done = self._prefill_chunk(chunk, kept_caches, shared)
    sampling = [chunk.temperature, chunk.top_k, chunk.top_p, chunk.stop_ids, chunk.max_new]
    position_row = np.where(np.arange(chunk.bucket.batch) < chunk.size,
                            np.arange(chunk.bucket.batch), -1)   # chunk row at each position
    final_ids = np.zeros((chunk.size, new_tokens), np.int32)
    final_logprobs = np.zeros((chunk.size, new_tokens), np.float32)
    final_lengths = np.zeros(chunk.size, np.int32)
    checked = np.zeros(chunk.size, bool)   # ended by stop_check
    step = 1
    while True:
      limit = new_tokens if self.decode_chunk is None else min(step + self.decode_chunk,
                                                               new_tokens)
      start = step
      ids, logprobs, lengths, done, step, cache = self._decode(
          self._state, cache, keys, ids, logprobs, lengths, done, step, limit, *sampling)
      ids, logprobs, lengths, done, step = jax.device_get((ids, logprobs, lengths, done, step))
      step, done = int(step), np.array(done)
      self.last_row_steps += (step - start) * len(position_row)
      over = step >= new_tokens
      if not over:
        for b in np.flatnonzero(~done & (position_row >= 0)):
          if stop_check(int(position_row[b]), [int(t) for t in ids[b, :lengths[b]]]):
            done[b] = checked[position_row[b]] = True
      over = over or bool(done.all())
      live = np.flatnonzero(~done)
      smaller = None if over else _smallest_fitting(self.batch_buckets, len(live))
      if over or smaller < len(position_row):
        leaving = np.flatnonzero((position_row >= 0) & (done | over))
        if self.reuse_prefix and len(leaving):
          self._kept_caches.append(cache)
        for b in leaving:
          r = int(position_row[b])
          final_ids[r], final_logprobs[r], final_lengths[r] = ids[b], logprobs[b], lengths[b]
          if self.reuse_prefix:
            self._keep(chunk, r, len(self._kept_caches) - 1, int(b), ids[b], int(lengths[b]))
        if over:
          break
        # Live rows first, then finished ones as inactive padding (done stays set).
        order = np.concatenate([live, np.flatnonzero(done)])[:smaller].astype(np.int32)
        cache, keys = self._compact(cache, keys, order)
        ids, logprobs, lengths, done = ids[order], logprobs[order], lengths[order], done[order]
        sampling = [a[order] for a in sampling]
        position_row = np.where(np.arange(smaller) < len(live), position_row[order], -1)
    self.last_decode_steps.append(step)
    results = []
    for b in range(chunk.size):
      n = int(final_lengths[b])
      out = [int(t) for t in final_ids[b, :n]]
      stopped = checked[b] or out[-1] in chunk.stop_ids[b]
      results.append(GenerationResult(output_ids=out,
                                      logprobs=[float(x) for x in final_logprobs[b, :n]],
                                      finish_reason="stop" if stopped else "length"))
    return results

  # ---- jitted functions -------------------------------------------------------------------

  def _traced(self, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` traced under the engine's matmul precision: with matmul_operands="bfloat16" the
    model's dense layers and head round their float32 operands to bfloat16 and sum in float32
    (`decoder.bfloat16_operands`); norms and sampling stay in the compute dtype. Attention's
    einsums keep float32 operands: exact on XLA:CPU, which ignores the precision setting, while
    a GPU or TPU applies the setting to them too."""
    if self.matmul_operands == "compute":
      return fn

    @functools.wraps(fn)
    def under_precision(*args, **kwargs):
      with jax.default_matmul_precision("bfloat16"):
        return fn(*args, **kwargs)
    return under_precision

  def _prefill_fn(self, state, prompt_ids, prompt_mask, seeds, temperature, top_k, top_p,
                  stop_ids, max_new, active, *, new_tokens: int):
    """Fills the cache with the prompts and draws token 0 of every row."""
    batch, prompt_len = prompt_ids.shape
    self._traces[("prefill", Bucket(batch, prompt_len, new_tokens))] += 1
    model = nnx.merge(self._graphdef, state)
    cache = model.init_cache(batch, prompt_len + new_tokens, self.cache_dtype)
    logits, cache = _feed_prompt(model, prompt_ids, prompt_mask, cache, prompt_len)
    return (cache, *_first_tokens(logits, seeds, temperature, top_k, top_p, stop_ids, max_new,
                                  active, new_tokens))

  def _prefill_window_fn(self, state, cache, window_ids, window_mask, seeds, temperature, top_k,
                         top_p, stop_ids, max_new, active, *, new_tokens: int):
    """`_prefill_fn` on a cache that already holds each row's kept prefix just before the last
    `window` prompt slots: only the window is fed."""
    batch, window = window_ids.shape
    prompt_len = self.layout.slots(cache) - new_tokens
    self._traces[("prefill", Bucket(batch, prompt_len, new_tokens, window))] += 1
    model = nnx.merge(self._graphdef, state)
    logits, cache = _feed_prompt(model, window_ids, window_mask, cache, prompt_len)
    return (cache, *_first_tokens(logits, seeds, temperature, top_k, top_p, stop_ids, max_new,
                                  active, new_tokens))

  def _prefill_shared_fn(self, state, distinct_ids, distinct_mask, source, seeds, temperature,
                         top_k, top_p, stop_ids, max_new, active, *, new_tokens: int):
    """`_prefill_fn` that feeds each distinct prompt once ([U', P]) and copies its cache rows
    and last logits to the rows that share it (row b from distinct row source[b])."""
    distinct, prompt_len = distinct_ids.shape
    batch = source.shape[0]
    self._traces[("prefill", Bucket(batch, prompt_len, new_tokens, distinct=distinct))] += 1
    model = nnx.merge(self._graphdef, state)
    cache = model.init_cache(distinct, prompt_len + new_tokens, self.cache_dtype)
    logits, cache = _feed_prompt(model, distinct_ids, distinct_mask, cache, prompt_len)
    cache = self.layout.take_rows(cache, source)
    return (cache, *_first_tokens(logits[source], seeds, temperature, top_k, top_p, stop_ids,
                                  max_new, active, new_tokens))

  def _compact_fn(self, cache, keys, order):
    """The cache and row keys of rows `order` [B'] (a smaller batch)."""
    slots = self.layout.slots(cache)
    self._traces[("compact", Bucket(order.shape[0], slots, keys.shape[0]))] += 1
    return self.layout.take_rows(cache, order), keys[order]

  def _decode_fn(self, state, cache, keys, out_ids, out_logprobs, lengths, done, step, limit,
                 temperature, top_k, top_p, stop_ids, max_new):
    """Draws tokens step.. until every row is done or step reaches `limit`; returns
    (ids [B, N], log-probs [B, N], lengths [B], done [B], the next step, the cache)."""
    batch, new_tokens = out_ids.shape
    prompt_len = self.layout.slots(cache) - new_tokens
    self._traces[("decode", Bucket(batch, prompt_len, new_tokens))] += 1
    model = nnx.merge(self._graphdef, state)
    feed_mask = jnp.ones((batch, 1), jnp.int32)
    uniforms = step_uniforms(keys, new_tokens)

    def unfinished(carry):
      step, _, _, _, _, done = carry
      return (step < limit) & ~jnp.all(done)

    def next_token(carry):
      step, cache, out_ids, out_logprobs, lengths, done = carry
      # The token drawn at step - 1 goes into slot prompt_len + step - 1.
      last = jax.lax.dynamic_slice_in_dim(out_ids, step - 1, 1, axis=1)
      logits, cache = model.forward_with_cache(last, feed_mask, cache, prompt_len + step - 1)
      logits = logits[:, 0]
      tokens = sample_tokens(logits, jax.lax.dynamic_index_in_dim(uniforms, step, axis=1,
                                                                  keepdims=False),
                             temperature, top_k, top_p)
      out_ids = jax.lax.dynamic_update_slice_in_dim(out_ids, tokens[:, None], step, axis=1)
      out_logprobs = jax.lax.dynamic_update_slice_in_dim(
          out_logprobs, token_logprobs(logits, tokens)[:, None], step, axis=1)
      lengths = jnp.where(done, lengths, step + 1)
      done = done | is_stop(tokens, stop_ids) | (step + 1 >= max_new)
      return step + 1, cache, out_ids, out_logprobs, lengths, done

    step, cache, out_ids, out_logprobs, lengths, done = jax.lax.while_loop(
        unfinished, next_token, (jnp.asarray(step, jnp.int32), cache, out_ids, out_logprobs,
                                 lengths, done))
    return out_ids, out_logprobs, lengths, done, step, cache


def _signature(state: Any) -> tuple[Any, list[tuple[tuple[int, ...], Any]]]:
  """The tree structure and every leaf's shape and dtype: what a weight sync must keep (a
  tenth of the time `_shapes_and_dtypes` takes, which names the leaves for the error)."""
  leaves, treedef = jax.tree.flatten(state)
  return treedef, [(x.shape, x.dtype) for x in leaves]


def _shapes_and_dtypes(state: Any) -> list[tuple[str, tuple[tuple[int, ...], str]]]:
  return [(jax.tree_util.keystr(path), (tuple(x.shape), str(x.dtype)))
          for path, x in jax.tree_util.tree_leaves_with_path(state)]
