"""Shared-prompt prefill and decode-time compaction in JaxEngine, against independent references.

  shared prefill   the G rows of a group with one prompt are prefilled once and the cache rows
                   copied; the tokens must be those of separate prefills (greedy and sampled
                   with the same seeds), the log-probs those of a full forward (no cache).
  compaction       with `decode_chunk`, finished rows (stop token, max_new_tokens, a caller's
                   stop_check) leave the batch between decode calls; the tokens must be those
                   of the uncompacted sampler, the decode work must shrink.
  cache layout     the batch / slot axes are found from `init_cache` alone, so row copies work
                   on any cache pytree (checked on a restructured cache against numpy).
  agent loop       rollouts with the savings on are the rollouts without them.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.helpers import model_utils as mu
from rised_jax.model import ModelConfig
from rised_jax.rollout.agent_loop import AgentLoop
from rised_jax.rollout.base import GenerationRequest, SamplingParams
from rised_jax.rollout.jax_engine import Bucket, CacheLayout, JaxEngine
from rised_jax.types import Task
from benchmarks.sampler import SavingsDeclined

NEW = 8
REF_WIDTH = 32
FORWARD = nnx.jit(lambda model, ids, mask: model(ids, mask))
PROMPTS = mu.random_rows([5, 7], seed=4)        # two groups ...
G = 3                                           # ... of three rows each
ENGINE_ARGS = dict(max_batch=8, batch_buckets=(2, 4, 8), prompt_buckets=(8, 16),
                   max_new_tokens_buckets=(NEW,))


@pytest.fixture(scope="module")
def model():
  return mu.random_decoder(ModelConfig.from_hf(mu.tiny_config("llama_gqa_tied")), seed=1)


@pytest.fixture(scope="module")
def plain(model):
  return JaxEngine(model, **ENGINE_ARGS)


@pytest.fixture(scope="module")
def chunked(model):
  return JaxEngine(model, decode_chunk=2, **ENGINE_ARGS)


def teacher_forced_logprobs(model, prompt, output):
  """log π(output[i] | prompt + output[:i]) from one cache-free forward, in float64."""
  ids, mask = mu.padded_batch([list(prompt) + list(output)], "right", width=REF_WIDTH)
  z = np.asarray(FORWARD(model, ids, mask)[0], np.float64)
  z = z - z.max(axis=-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
  return np.array([logp[len(prompt) + i - 1, t] for i, t in enumerate(output)])


def group_requests(params, seeds=None):
  rows = [p for p in PROMPTS for _ in range(G)]
  seeds = seeds or [0] * len(rows)
  return [GenerationRequest(r, params, s) for r, s in zip(rows, seeds)]


def outputs(results):
  return [r.output_ids for r in results]


# ------------------------------------------------------------------ shared prefill


@pytest.mark.parametrize("params, seeds", [
    (SamplingParams(max_new_tokens=NEW, temperature=0.0), None),
    (SamplingParams(max_new_tokens=NEW, temperature=1.0), list(range(11, 11 + G * 2))),
], ids=["greedy", "sampled"])
def test_shared_prefill_equals_separate_prefills(model, plain, params, seeds):
  batch = group_requests(params, seeds)
  separate = plain.generate(batch)
  assert plain.last_shared_tokens == 0
  shared = plain.generate(batch, shared_prefill=True)
  assert outputs(shared) == outputs(separate)
  # Every row but the first of each group was not prefilled: (G - 1) rows per prompt.
  assert plain.last_shared_tokens == (G - 1) * sum(len(p) for p in PROMPTS)
  # Two distinct prompts prefill as a batch of 2, copied to the 6 rows (batch bucket 8).
  assert ("prefill", Bucket(8, 8, NEW, distinct=2)) in plain.compile_counts
  for request, result in zip(batch, shared):
    np.testing.assert_allclose(result.logprobs,
                               teacher_forced_logprobs(model, request.prompt_ids,
                                                       result.output_ids), atol=1e-4)
  if seeds:   # the rows of a group share a prompt, not their draws
    assert len({tuple(r.output_ids) for r in shared[:G]}) > 1


def test_shared_prefill_without_repeats_is_the_plain_prefill(plain):
  batch = [GenerationRequest(p, SamplingParams(max_new_tokens=NEW, temperature=0.0))
           for p in mu.random_rows([4, 6, 3], seed=8)]
  before = plain.compile_counts
  assert outputs(plain.generate(batch, shared_prefill=True)) == outputs(plain.generate(batch))
  assert plain.last_shared_tokens == 0
  assert all(bucket.distinct is None for _, bucket in set(plain.compile_counts) - set(before))


# ------------------------------------------------------------------ compaction


def test_compaction_equals_the_uncompacted_sampler(model, plain, chunked):
  # Rows end at different steps (per-row max_new_tokens), so the live rows fit the batch
  # buckets 4 and then 2 as the decode goes on.
  news = [1, 2, 4, 5, 6, 8]
  batch = [GenerationRequest(r.prompt_ids, SamplingParams(max_new_tokens=n, temperature=1.0),
                             seed=s)
           for r, n, s in zip(group_requests(SamplingParams(max_new_tokens=NEW)), news,
                              range(6))]
  reference = plain.generate(batch)
  reference_work = plain.last_row_steps
  compacted = chunked.generate(batch)
  assert outputs(compacted) == outputs(reference)
  assert [len(r.output_ids) for r in compacted] == news
  for a, b in zip(compacted, reference):
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert a.finish_reason == b.finish_reason == "length"
  # 7 decode steps x 8 rows uncompacted; compacted: steps 1-2 at 8 rows (then the 1- and
  # 2-token rows are done: 4 live), 3-4 at 4 rows (then 2 live), 5-6 and 7 at 2 rows.
  assert reference_work == 7 * 8
  assert chunked.last_row_steps == 2 * 8 + 2 * 4 + 2 * 2 + 1 * 2
  decode_batches = {b.batch for kind, b in chunked.compile_counts if kind == "decode"}
  assert {8, 4, 2} <= decode_batches
  assert set(chunked.compile_counts.values()) == {1}


def test_stop_check_ends_rows_between_decode_calls(plain, chunked):
  batch = group_requests(SamplingParams(max_new_tokens=NEW, temperature=1.0),
                         list(range(30, 36)))
  reference = outputs(plain.generate(batch))
  # End a row once its output holds an even token: the first such position is the cut.
  def cut(ids):
    return next((i + 1 for i, t in enumerate(ids) if t % 2 == 0), len(ids))

  asked = []
  def stop_check(index, ids):
    asked.append(index)
    return cut(ids) < len(ids) or ids[-1] % 2 == 0

  results = chunked.generate(batch, stop_check=stop_check)
  for result, ref in zip(results, reference):
    n = cut(ref)
    # The check is asked once 3, 5, 7 tokens are out (after every second decode step): the
    # row ends at the first of these that holds the cut, with the uncompacted tokens.
    length = min(next(m for m in (3, 5, 7, 9) if m >= n), NEW)
    assert result.output_ids == ref[:length]
    assert result.finish_reason == ("stop" if length < NEW else "length")
  assert set(asked) <= set(range(len(batch)))
  assert any(len(r.output_ids) < len(ref) for r, ref in zip(results, reference))


def test_compaction_keeps_the_caches_prefix_reuse_needs(model, plain):
  # Two turns with prefix reuse: rows that left the batch early keep their keys/values for
  # the next turn, whose tokens equal full prefills of the whole transcripts.
  fresh = plain
  reuse = JaxEngine(model, decode_chunk=2, reuse_prefix=True, **ENGINE_ARGS)
  news = [2, 8, 3, 5]
  prompts = mu.random_rows([4, 6, 5, 7], seed=9)
  rng = np.random.default_rng(3)
  for turn in range(2):
    batch = [GenerationRequest(p, SamplingParams(max_new_tokens=n, temperature=0.0))
             for p, n in zip(prompts, news)]
    got, want = reuse.generate(batch), fresh.generate(batch)
    assert outputs(got) == outputs(want)
    if turn:
      assert reuse.last_reused_tokens > 0
    prompts = [p + r.output_ids + rng.integers(3, mu.VOCAB, size=2).tolist()
               for p, r in zip(prompts, got)]


# ------------------------------------------------------------------ cache layout


class _PerLayerCache:
  """A decoder stand-in whose cache is a dict of per-layer leaves, batch axis first, plus a
  [S, B] leaf with the axes the other way round: another layout than the Decoder's."""

  def init_cache(self, batch, slots, dtype=None):
    return {"layers": [(jnp.zeros((batch, slots, 2)), jnp.zeros((batch, 3, slots)))
                       for _ in range(2)],
            "transposed": jnp.zeros((slots, batch), jnp.int32),
            "steps": jnp.zeros((4,))}


def test_bfloat16_operands_sample_with_the_forward_under_that_precision(model):
  """matmul_operands="bfloat16": every token's log-prob (prefill's first and the decode
  loop's) is the cache-free forward's under jax.default_matmul_precision("bfloat16"), and not
  the float32 forward's."""
  engine = JaxEngine(model, matmul_operands="bfloat16", **ENGINE_ARGS)
  results = engine.generate(group_requests(SamplingParams(max_new_tokens=NEW, temperature=0.0)))
  gap = 0.0
  for prompt, result in zip([p for p in PROMPTS for _ in range(G)], results):
    with jax.default_matmul_precision("bfloat16"):
      reference = teacher_forced_logprobs(model, prompt, result.output_ids)
    np.testing.assert_allclose(result.logprobs, reference, atol=2e-5, rtol=0)
    float32 = teacher_forced_logprobs(model, prompt, result.output_ids)
    gap = max(gap, float(np.abs(np.asarray(result.logprobs) - float32).max()))
  assert gap > 1e-3
  with pytest.raises(ValueError, match="matmul_operands must be one of"):
    JaxEngine(model, matmul_operands="float16", **ENGINE_ARGS)


@pytest.mark.parametrize("operands", ["compute", "bfloat16"])
def test_make_engine_builds_the_configured_matmul_operands(model, operands):
  from types import SimpleNamespace  # noqa: PLC0415
  from rised_jax import config as config_lib  # noqa: PLC0415
  from rised_jax.rollout import engines, settings  # noqa: PLC0415
  c = config_lib.default_config()
  c.rollout.matmul_operands = operands
  engine = engines.make_engine(settings.RolloutConfig.from_config(c.rollout), model,
                               SimpleNamespace(pad_token_id=0), weight_dir="",
                               export_dtype="float32")
  assert engine.matmul_operands == operands


def test_cache_layout_copies_rows_of_any_pytree():
  layout = CacheLayout.of(_PerLayerCache(), None)
  # Leaves in key order: layers (4 leaves), steps, transposed.
  assert layout.batch_axes == (0, 0, 0, 0, None, 1)
  assert layout.slot_axes == (1, 2, 1, 2, None, 0)
  rng = np.random.default_rng(0)
  source = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape) * 100, x.dtype),
                        _PerLayerCache().init_cache(3, 5))
  rows = np.array([2, 0, 2, 1])
  taken = layout.take_rows(source, jnp.asarray(rows))
  np.testing.assert_array_equal(taken["transposed"], np.asarray(source["transposed"])[:, rows])
  np.testing.assert_array_equal(taken["layers"][1][1], np.asarray(source["layers"][1][1])[rows])
  np.testing.assert_array_equal(taken["steps"], source["steps"])
  # place_rows: destination row b, slot s takes source row rows[b], slot slots[b, s] where set.
  dest = _PerLayerCache().init_cache(4, 6)
  slots = rng.integers(0, 5, size=(4, 6))
  take = rng.random((4, 6)) < 0.5
  placed = layout.place_rows(dest, source, jnp.asarray(rows), jnp.asarray(slots),
                             jnp.asarray(take))
  k = np.asarray(source["layers"][0][1])                 # [B, 3, S]
  want = np.zeros((4, 3, 6))
  for b in range(4):
    for s in range(6):
      if take[b, s]:
        want[b, :, s] = k[rows[b], :, slots[b, s]]
  np.testing.assert_array_equal(placed["layers"][0][1], want)
  np.testing.assert_array_equal(placed["transposed"],
                                np.where(take.T, np.asarray(source["transposed"])[
                                    slots.T, rows[None, :]], 0))


def test_cache_layout_of_the_decoder(model):
  layout = CacheLayout.of(model, None)
  leaves = jax.tree.leaves(model.init_cache(3, 11))
  for leaf, batch_axis, slot_axis in zip(leaves, layout.batch_axes, layout.slot_axes):
    assert leaf.shape[batch_axis] == 3 and leaf.shape[slot_axis] == 11


# ------------------------------------------------------------------ agent loop


def test_agent_loop_rollouts_are_unchanged_by_the_savings():
  tokenizer = mu.tiny_tokenizer()
  cfg = ModelConfig.from_hf(mu.tiny_config("llama_gqa_tied", vocab_size=tokenizer.vocab_size,
                                           max_position_embeddings=1024))
  model = mu.random_decoder(cfg, seed=3)
  args = dict(max_batch=8, batch_buckets=(2, 4, 8), prompt_buckets=(512,),
              max_new_tokens_buckets=(8,))
  loop_args = dict(max_turns=2, max_new_tokens_per_turn=8, max_total_tokens=512,
                   sampling=SamplingParams(max_new_tokens=8), stop_strings=["e"])
  tasks = [Task("maze", 1), Task("countdown", 2)]
  fast = JaxEngine(model, decode_chunk=2, **args)
  runs = [AgentLoop(engine, tokenizer, **loop_args).run(tasks, group_size=3, seed=5).groups
          for engine in (SavingsDeclined(JaxEngine(model, **args)), fast)]
  assert [[t.token_ids for t in g.trajectories] for g in runs[0]] == \
      [[t.token_ids for t in g.trajectories] for g in runs[1]]
  for a, b in zip(*runs):
    for x, y in zip(a.trajectories, b.trajectories):
      np.testing.assert_allclose(x.behaviour_logprobs, y.behaviour_logprobs, atol=1e-5)
  assert any(bucket.distinct == 2 for kind, bucket in fast.compile_counts if kind == "prefill")
