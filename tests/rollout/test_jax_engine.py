"""The KV-cache sampler against plain (cache-free) forward passes of the same tiny models.

References are independent of the sampler: log-probs and greedy tokens come from the
Decoder's full forward over the whole right-padded sequence, sampling distributions from
numpy softmax / truncation of the model's logits.
"""
import os
import re

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.helpers import model_utils as mu
from rised_jax.model import ModelConfig
from rised_jax.rollout import jax_engine
from rised_jax.rollout.base import GenerationRequest, SamplingParams
from rised_jax.rollout.jax_engine import Bucket, JaxEngine

ATOL = 1e-4
NEW = 8                      # the one new-token bucket of the test engines
PROMPT_BUCKETS = (8, 16)
REF_WIDTH = 32               # every reference forward runs at this width: one compilation
FORWARD = nnx.jit(lambda model, ids, mask: model(ids, mask))
GREEDY = SamplingParams(max_new_tokens=NEW, temperature=0.0)
SHORT_ROWS = mu.random_rows([3, 8, 5], seed=1)          # prompt bucket 8
MIXED_ROWS = mu.random_rows([2, 13, 6, 9], seed=2)      # prompt bucket 16


def make_model(name: str, seed: int = 0):
  return mu.random_decoder(ModelConfig.from_hf(mu.tiny_config(name)), seed=seed)


def full_logits(model, rows):
  """[len(rows), REF_WIDTH, V] numpy logits of right-padded rows (no cache)."""
  ids, mask = mu.padded_batch(rows, "right", width=REF_WIDTH)
  return np.asarray(FORWARD(model, ids, mask), np.float64)


def np_log_softmax(z):
  z = np.asarray(z, np.float64)
  z = z - z.max(axis=-1, keepdims=True)
  return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def reference_greedy(model, prompt, steps):
  """Greedy decoding by argmax of a full forward over the whole sequence at every step."""
  ids = list(prompt)
  for _ in range(steps):
    ids.append(int(np.argmax(full_logits(model, [ids])[0, len(ids) - 1])))
  return ids[len(prompt):]


def teacher_forced_logprobs(model, prompt, output):
  """log π(output[i] | prompt + output[:i]) from one full forward (float64 log-softmax)."""
  logp = np_log_softmax(full_logits(model, [list(prompt) + list(output)])[0])
  return np.array([logp[len(prompt) + i - 1, t] for i, t in enumerate(output)])


def requests(rows, params, seeds=None):
  seeds = seeds or [0] * len(rows)
  return [GenerationRequest(r, params, s) for r, s in zip(rows, seeds)]


@pytest.fixture(scope="module")
def model():
  return make_model("llama_gqa_tied")


@pytest.fixture(scope="module")
def engine(model):
  return JaxEngine(model, max_batch=4, batch_buckets=(1,), prompt_buckets=PROMPT_BUCKETS,
                   max_new_tokens_buckets=(NEW,))


@pytest.fixture(scope="module")
def greedy_refs(model):
  return [reference_greedy(model, r, NEW) for r in SHORT_ROWS + MIXED_ROWS]


# ------------------------------------------------------------------ pure sampling functions


def np_truncated_probs(logits, top_k, top_p):
  """Reference: softmax, keep the top-k, then the smallest prefix with mass >= top_p."""
  probs = np.exp(np_log_softmax(logits))
  order = np.argsort(-probs, kind="stable")
  keep = np.zeros(len(probs), bool)
  mass = 0.0
  for rank, v in enumerate(order):
    if (top_k and rank >= top_k) or mass >= top_p:
      break
    keep[v] = True
    mass += probs[v]
  out = np.where(keep, probs, 0.0)
  return out / out.sum()


def chi_square(counts, probs):
  """Pearson's statistic, bins expecting fewer than 5 draws merged into one; (stat, dof)."""
  expected = probs * counts.sum()
  small = expected < 5
  observed = np.append(counts[~small], counts[small].sum())
  expected = np.append(expected[~small], expected[small].sum())
  if expected[-1] == 0:            # no small bins to merge
    observed, expected = observed[:-1], expected[:-1]
  return float(((observed - expected) ** 2 / expected).sum()), len(expected) - 1


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (3, 1.0), (0, 0.6), (5, 0.8)])
def test_sample_tokens_matches_truncated_distribution(top_k, top_p):
  n = 4000
  logits = np.random.default_rng(0).normal(size=12).astype(np.float32) * 1.5
  temperature = 0.7
  draw = jax.jit(jax_engine.sample_tokens)
  tokens = np.asarray(draw(
      jnp.broadcast_to(jnp.asarray(logits), (n, 12)),
      jax_engine.step_uniforms(jax_engine.row_keys(jnp.arange(n, dtype=jnp.uint32)), 1)[:, 0],
      jnp.full(n, temperature), jnp.full(n, top_k, jnp.int32), jnp.full(n, top_p)))
  probs = np_truncated_probs(logits / temperature, top_k, top_p)
  counts = np.bincount(tokens, minlength=12)
  assert counts[probs == 0].sum() == 0          # nothing outside the kept set
  stat, dof = chi_square(counts, probs)
  # chi2(dof) has mean dof and sd sqrt(2 dof); 5 sd is far in the tail.
  assert stat < dof + 5 * np.sqrt(2 * dof) + 5, (stat, dof)


def test_step_uniforms_are_each_steps_folded_key_draw():
  """Drawn for all steps at once, column s of row b is still 1 - U[0, 1) under
  fold_in(key_b, s), computed here one element at a time; all lie in (0, 1]."""
  keys = jax_engine.row_keys(jnp.asarray([0, 7, 2**32 - 1], dtype=jnp.uint32))
  got = np.asarray(jax.jit(jax_engine.step_uniforms, static_argnums=1)(keys, 5))
  want = np.array([[1.0 - float(jax.random.uniform(jax.random.fold_in(keys[b], s), (),
                                                   jnp.float32)) for s in range(5)]
                   for b in range(3)], np.float32)
  np.testing.assert_array_equal(got, want)
  assert got.min() > 0 and got.max() <= 1 and len(np.unique(got)) == got.size


def np_inverse_cdf(probs, u):
  """The oracle: the first index whose float64 cumulative probability reaches u."""
  return int(np.searchsorted(np.cumsum(probs, dtype=np.float64), u * probs.sum(), side="left"))


def test_sample_tokens_is_the_inverse_cdf_of_the_row_uniform():
  """Row by row, over several vocabulary blocks: the token numpy's float64 inverse CDF of the
  tempered, truncated probabilities gives at the row's step-0 uniform (1 - U[0, 1) from its
  key folded with 0);
  greedy rows: numpy's argmax. Draws within rounding of a CDF boundary are not compared."""
  rows, vocab = 96, 300
  logits = np.random.default_rng(1).normal(size=(rows, vocab)).astype(np.float32) * 2
  temperature = np.where(np.arange(rows) % 4 == 0, 0.0, 0.8).astype(np.float32)
  top_k = np.where(np.arange(rows) % 3 == 0, 5, 0).astype(np.int32)
  top_p = np.where(np.arange(rows) % 5 == 0, 0.9, 1.0).astype(np.float32)
  keys = jax_engine.row_keys(jnp.arange(rows, dtype=jnp.uint32))
  tokens = np.asarray(jax.jit(jax_engine.sample_tokens)(
      jnp.asarray(logits), jax_engine.step_uniforms(keys, 1)[:, 0], jnp.asarray(temperature),
      jnp.asarray(top_k), jnp.asarray(top_p)))
  compared = 0
  for row in range(rows):
    if temperature[row] == 0:
      assert tokens[row] == np.argmax(logits[row]), row
      continue
    probs = np_truncated_probs(logits[row].astype(np.float64) / temperature[row],
                               top_k[row], top_p[row])
    u = 1.0 - float(jax.random.uniform(jax.random.fold_in(keys[row], 0), (), jnp.float32))
    cdf = np.cumsum(probs)
    if np.min(np.abs(cdf - u)) < 1e-5:
      continue
    assert probs[tokens[row]] > 0, row
    assert tokens[row] == np_inverse_cdf(probs, u), row
    compared += 1
  assert compared >= 65


def test_inverse_cdf_draw_hand_worked():
  # Weights e^0 = 1 on tokens 5, 130 and 299 (three different blocks of 128), -inf elsewhere:
  # the cumulative weights are 1, 2, 3, so u in (0, 1/3] -> 5, (1/3, 2/3] -> 130, else 299.
  scaled = np.full((6, 300), -np.inf, np.float32)
  scaled[:, [5, 130, 299]] = 0.0
  u = jnp.asarray([1e-6, 0.33, 0.34, 0.66, 0.67, 1.0], jnp.float32)
  np.testing.assert_array_equal(np.asarray(jax_engine.inverse_cdf_draw(jnp.asarray(scaled), u)),
                                [5, 5, 130, 130, 299, 299])
  # Unequal weights inside one block: p = (0, 0.5, 0, 0.25, 0.25) from log-weights.
  weights = np.asarray([[0.0, 2.0, 0.0, 1.0, 1.0]] * 4)
  scaled = np.where(weights > 0, np.log(np.maximum(weights, 1.0)), -np.inf).astype(np.float32)
  u = jnp.asarray([0.1, 0.5, 0.74, 0.76], jnp.float32)
  np.testing.assert_array_equal(np.asarray(jax_engine.inverse_cdf_draw(jnp.asarray(scaled), u)),
                                [1, 1, 3, 4])


def test_truncate_logits_hand_worked():
  # probs of [2, 1, 0, -inf-ish]: e^2, e^1, e^0 normalised = 0.665, 0.245, 0.090.
  logits = jnp.asarray([[2.0, 1.0, 0.0, -30.0]] * 4)
  out = np.asarray(jax_engine.truncate_logits(logits, jnp.asarray([0, 2, 0, 1]),
                                              jnp.asarray([1.0, 1.0, 0.7, 0.5])))
  kept = np.isfinite(out)
  np.testing.assert_array_equal(kept, [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]])
  np.testing.assert_array_equal(out[kept], np.asarray(logits)[kept])


# ------------------------------------------------------------------ the engine


def test_logprobs_equal_teacher_forced_forward(model, engine):
  # Temperature 1.3 and top-k: the reported log-probs are still those of the plain model.
  params = SamplingParams(max_new_tokens=NEW, temperature=1.3, top_k=20)
  rows = MIXED_ROWS[:3]                     # lengths 2, 13, 6: one left-padded batch
  results = engine.generate(requests(rows, params, seeds=[1, 2, 3]))
  worst = 0.0
  for row, result in zip(rows, results):
    assert len(result.output_ids) == NEW and result.finish_reason == "length"
    reference = teacher_forced_logprobs(model, row, result.output_ids)
    worst = max(worst, np.abs(np.asarray(result.logprobs) - reference).max())
  assert worst < ATOL, worst


def test_greedy_equals_full_forward_argmax(engine, greedy_refs):
  results = engine.generate(requests(SHORT_ROWS + MIXED_ROWS[:1], GREEDY))
  for result, reference in zip(results, greedy_refs[:4]):
    assert result.output_ids == reference


def test_stop_tokens_end_rows_independently(engine, greedy_refs):
  refs = greedy_refs[:3]
  # Row 0 stops at its 3rd token (or earlier if that id comes sooner), row 1 at its 5th,
  # row 2 has no stop ids.
  stops = [(refs[0][2],), (refs[1][4],), ()]
  batch = [GenerationRequest(row, SamplingParams(max_new_tokens=NEW, temperature=0.0,
                                                 stop_token_ids=s))
           for row, s in zip(SHORT_ROWS, stops)]
  results = engine.generate(batch)
  for result, ref, stop in zip(results, refs, stops):
    if stop:
      cut = ref.index(stop[0]) + 1
      assert result.output_ids == ref[:cut] and result.finish_reason == "stop"
      assert len(result.logprobs) == cut
    else:
      assert result.output_ids == ref and result.finish_reason == "length"


def test_decode_stops_early_when_every_row_is_done(engine, greedy_refs):
  batch = [GenerationRequest(row, SamplingParams(max_new_tokens=NEW, temperature=0.0,
                                                 stop_token_ids=(ref[1],)))
           for row, ref in zip(SHORT_ROWS, greedy_refs)]
  results = engine.generate(batch)
  lengths = [len(r.output_ids) for r in results]
  assert max(lengths) <= 2
  assert engine.last_decode_steps == [max(lengths)]   # the loop ran no further


def test_per_row_max_new_tokens(engine, greedy_refs):
  batch = [GenerationRequest(row, SamplingParams(max_new_tokens=n, temperature=0.0))
           for row, n in zip(SHORT_ROWS, (1, 5, 8))]
  results = engine.generate(batch)
  for result, ref, n in zip(results, greedy_refs, (1, 5, 8)):
    assert result.output_ids == ref[:n] and result.finish_reason == "length"


def test_seeds_reproducible_and_independent_of_the_batch(engine):
  params = SamplingParams(max_new_tokens=NEW, temperature=1.0)
  target = GenerationRequest(SHORT_ROWS[0], params, seed=1234)
  alone = engine.generate([target])[0]
  again = engine.generate([target])[0]
  # Other prompts, another prompt bucket (16) and another position in the batch.
  crowd = engine.generate(requests(MIXED_ROWS[1:3], params, seeds=[5, 6]) + [target])[2]
  assert alone.output_ids == again.output_ids == crowd.output_ids
  np.testing.assert_allclose(alone.logprobs, crowd.logprobs, atol=ATOL)
  other_seed = engine.generate([GenerationRequest(SHORT_ROWS[0], params, seed=1235)])[0]
  assert other_seed.output_ids != alone.output_ids


def test_top_k_one_and_tiny_top_p_are_greedy(engine, greedy_refs):
  # One call mixing greedy, top-k=1 and top-p≈0 rows at temperature 1 with other seeds.
  batch = [GenerationRequest(SHORT_ROWS[0], GREEDY),
           GenerationRequest(SHORT_ROWS[1], SamplingParams(max_new_tokens=NEW, top_k=1), 7),
           GenerationRequest(SHORT_ROWS[2], SamplingParams(max_new_tokens=NEW, top_p=1e-6), 8)]
  results = engine.generate(batch)
  for result, ref in zip(results, greedy_refs[:3]):
    assert result.output_ids == ref


def test_sampled_first_token_follows_the_model_distribution(model, engine):
  n = 2000
  prompt = SHORT_ROWS[1]
  params = SamplingParams(max_new_tokens=1, temperature=1.0)
  results = engine.generate(requests([prompt] * n, params, seeds=list(range(n))))
  counts = np.bincount([r.output_ids[0] for r in results], minlength=mu.VOCAB)
  probs = np.exp(np_log_softmax(full_logits(model, [prompt])[0, len(prompt) - 1]))
  stat, dof = chi_square(counts, probs)
  assert stat < dof + 5 * np.sqrt(2 * dof), (stat, dof)


def test_weight_swap_changes_outputs_without_recompiling(model, engine, greedy_refs):
  before = engine.compile_counts
  other = make_model("llama_gqa_tied", seed=9)
  try:
    engine.update_weights(other, version=3)
    results = engine.generate(requests(SHORT_ROWS, GREEDY))
    assert engine.version == 3
    assert [r.output_ids for r in results] == [reference_greedy(other, r, NEW)
                                               for r in SHORT_ROWS]
    assert [r.output_ids for r in results] != greedy_refs[:3]
    assert engine.compile_counts == before
  finally:
    engine.update_weights(model, version=0)
  assert [r.output_ids for r in engine.generate(requests(SHORT_ROWS, GREEDY))] == \
      greedy_refs[:3]


def test_weight_swap_refuses_another_architecture(engine):
  with pytest.raises(ValueError, match="structure"):
    engine.update_weights(make_model("llama_mha"), version=1)


def test_weight_swap_refuses_other_dtypes_naming_the_parameter(model, engine):
  graphdef, state = nnx.split(model)
  leaves, treedef = jax.tree.flatten(state)
  path = jax.tree_util.keystr(jax.tree_util.tree_leaves_with_path(state)[1][0])
  leaves[1] = leaves[1].astype(jnp.bfloat16)
  with pytest.raises(ValueError, match=re.escape(path) + r": .*'float32'\) -> .*'bfloat16'"):
    engine.update_weights(nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves)), version=1)
  assert engine.version == 0


def test_more_requests_than_max_batch_keep_their_order(engine, greedy_refs):
  rows = SHORT_ROWS + MIXED_ROWS                 # 7 requests, max_batch 4
  results = engine.generate(requests(rows, GREEDY))
  assert [r.output_ids for r in results] == greedy_refs
  assert len(engine.last_decode_steps) == 2


def test_one_compilation_per_bucket(model):
  # Its own engine: the module's shared one has compiled whatever the tests before it ran
  # (which, under pytest-xdist, depends on how the tests were spread over the workers).
  engine = JaxEngine(model, max_batch=4, batch_buckets=(1,), prompt_buckets=PROMPT_BUCKETS,
                     max_new_tokens_buckets=(NEW,))
  engine.generate(requests(SHORT_ROWS, GREEDY))
  engine.generate(requests(MIXED_ROWS[:2], SamplingParams(max_new_tokens=3, top_p=0.9)))
  engine.generate(requests(SHORT_ROWS[:1], GREEDY, seeds=[5]))
  engine.generate(requests(SHORT_ROWS[1:], GREEDY))
  counts = engine.compile_counts
  assert set(counts.values()) == {1}, counts
  # Batch buckets (1, 4): a 1-row call runs alone, every other call (2 to 4 rows) is padded
  # to 4, and a shape seen before is not compiled again.
  assert {bucket for _, bucket in counts} == {Bucket(4, 8, NEW), Bucket(4, 16, NEW),
                                             Bucket(1, 8, NEW)}
  assert {kind for kind, _ in counts} == {"prefill", "decode"}


@pytest.mark.parametrize("request_, match", [
    (GenerationRequest([], GREEDY), "prompt_ids is empty"),
    (GenerationRequest(list(range(3, 20)), GREEDY), "largest prompt bucket"),
    (GenerationRequest([3, 4], SamplingParams(max_new_tokens=NEW + 1)), "new-token bucket"),
    (GenerationRequest([3, mu.VOCAB], GREEDY), r"prompt_ids must be integers in \[0, 97\)"),
    (GenerationRequest([-1, 3], GREEDY), r"got \[-1\]"),
    (GenerationRequest([3, True], GREEDY), r"got \[True\]"),
    (GenerationRequest([3, 4.0], GREEDY), r"got \[4.0\]"),
    (GenerationRequest([3], SamplingParams(max_new_tokens=2, top_p=0.0)), "top_p"),
    (GenerationRequest([3], SamplingParams(max_new_tokens=2, temperature=-1.0)), "temperature"),
    (GenerationRequest([3], SamplingParams(max_new_tokens=2, top_k=-1)), "top_k"),
    (GenerationRequest([3], GREEDY, seed=2**31), "seed"),
])
def test_bad_requests_fail_before_compiling(model, request_, match):
  fresh = JaxEngine(model, max_batch=2, prompt_buckets=PROMPT_BUCKETS,
                    max_new_tokens_buckets=(NEW,))
  with pytest.raises(ValueError, match=match) as info:
    fresh.generate([GenerationRequest([3, 4], GREEDY), request_])
  assert "request 1" in str(info.value)
  assert fresh.compile_counts == {}


def test_sliding_window_model_logprobs_and_greedy():
  # Gemma 3 layout: window 4 is shorter than the sequences, softcapped logits.
  gemma = make_model("gemma3", seed=4)
  engine = JaxEngine(gemma, max_batch=2, prompt_buckets=(16,), max_new_tokens_buckets=(NEW,))
  rows = MIXED_ROWS[1:3]
  sampled = engine.generate(requests(rows, SamplingParams(max_new_tokens=NEW), seeds=[3, 4]))
  for row, result in zip(rows, sampled):
    np.testing.assert_allclose(result.logprobs,
                               teacher_forced_logprobs(gemma, row, result.output_ids),
                               atol=ATOL)
  greedy = engine.generate(requests(rows, GREEDY))
  assert [r.output_ids for r in greedy] == [reference_greedy(gemma, r, NEW) for r in rows]


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_batch=0), "max_batch must be a positive integer"),
    (dict(max_batch=4, batch_buckets=(8,)), "batch_buckets must not exceed max_batch=4"),
    (dict(prompt_buckets=()), "prompt_buckets must be a non-empty"),
    (dict(max_new_tokens_buckets=(0, 8)), "max_new_tokens_buckets must be a non-empty"),
    (dict(pad_id=mu.VOCAB), r"pad_id must be in \[0, 97\)"),
])
def test_bad_engine_arguments(model, kwargs, match):
  with pytest.raises(ValueError, match=match):
    JaxEngine(model, **kwargs)


def test_a_training_model_with_remat_samples_like_one_without(model, greedy_refs):
  """The trainer's model has remat on; decoding must not enter nnx.remat inside the loop."""
  remat_model = mu.random_decoder(ModelConfig.from_hf(mu.tiny_config("llama_gqa_tied")), seed=0,
                                  remat=True)
  engine = JaxEngine(remat_model, max_batch=4, batch_buckets=(4,), prompt_buckets=PROMPT_BUCKETS,
                     max_new_tokens_buckets=(NEW,))
  results = engine.generate(requests(SHORT_ROWS, GREEDY))
  assert [r.output_ids for r in results] == greedy_refs[:len(SHORT_ROWS)]


# ------------------------------------------------------------------ prefix reuse


def next_turn_prompts(prompts, results, rng, keep_cut=2, added=3):
  """Each transcript so far + its reply without the last `keep_cut` ids (a reply cut by a
  stop string) + `added` new ids (an environment message)."""
  return [list(p) + list(r.output_ids[:max(1, len(r.output_ids) - keep_cut)])
          + [int(t) for t in rng.integers(3, mu.VOCAB, size=added)]
          for p, r in zip(prompts, results)]


# Gemma 3 (sliding windows, the heavier compile) runs in the full suite; llama in both tiers.
@pytest.mark.parametrize("name", ["llama_gqa_tied",
                                  pytest.param("gemma3", marks=pytest.mark.slow)])
def test_prefix_reuse_matches_fresh_prefill_over_turns(name):
  # Three turns of growing transcripts: with reuse each turn prefills only the new ids, and
  # tokens and log-probs are those of a fresh prefill and of a full forward.
  model = make_model(name, seed=2)
  kwargs = dict(max_batch=4, prompt_buckets=(16, 32, 64), max_new_tokens_buckets=(NEW,))
  plain, reuse = JaxEngine(model, **kwargs), JaxEngine(model, reuse_prefix=True, **kwargs)
  rng = np.random.default_rng(0)
  prompts = [list(r) for r in mu.random_rows([5, 11, 3], seed=4)]
  params = SamplingParams(max_new_tokens=6, temperature=1.0)
  kept = None   # per row: the ids the reuse engine holds keys/values for
  for turn in range(3):   # the last transcript still fits REF_WIDTH
    batch = [GenerationRequest(p, params, seed=10 * turn + i) for i, p in enumerate(prompts)]
    fresh, reused = plain.generate(batch), reuse.generate(batch)
    assert [r.output_ids for r in reused] == [r.output_ids for r in fresh]
    for prompt, result, other in zip(prompts, reused, fresh):
      np.testing.assert_allclose(result.logprobs, other.logprobs, atol=1e-5)
      np.testing.assert_allclose(result.logprobs,
                                 teacher_forced_logprobs(model, prompt, result.output_ids),
                                 atol=ATOL)
    # Reused: the longest common prefix of each prompt with the kept ids of its last turn.
    expected = 0 if kept is None else sum(
        next(i for i, (a, b) in enumerate(zip(p + [-1], k + [-2])) if a != b)
        for p, k in zip(prompts, kept))
    assert reuse.last_reused_tokens == expected
    kept = [p + r.output_ids[:-1] for p, r in zip(prompts, reused)]
    prompts = next_turn_prompts(prompts, reused, rng)
  assert reuse.last_reused_tokens > 0
  windows = {bucket.window for kind, bucket in reuse.compile_counts if kind == "prefill"}
  assert windows == {None, 16}


def test_prefix_reuse_is_dropped_with_new_weights_and_on_reset(model):
  reuse = JaxEngine(model, max_batch=4, prompt_buckets=(16, 32), max_new_tokens_buckets=(NEW,),
                    reuse_prefix=True)
  first = reuse.generate(requests(SHORT_ROWS, GREEDY))
  follow = next_turn_prompts(SHORT_ROWS, first, np.random.default_rng(1))
  reuse.generate(requests(follow, GREEDY))
  assert reuse.last_reused_tokens > 0
  reuse.reset_prefix_cache()
  reuse.generate(requests(follow, GREEDY))
  assert reuse.last_reused_tokens == 0
  other = make_model("llama_gqa_tied", seed=9)
  reuse.update_weights(other, version=1)
  results = reuse.generate(requests(follow, GREEDY))
  assert reuse.last_reused_tokens == 0     # keys of the old weights are never reused
  assert [r.output_ids for r in results] == [reference_greedy(other, p, NEW) for p in follow]
