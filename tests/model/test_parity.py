"""The Decoder against transformers (torch, fp32, eager attention) and numpy references.

Every tiny family config in model_utils.TINY_CONFIGS is run on a batch of rows of different
lengths, left- and right-padded; each row's logits at its real columns must equal
transformers' logits for that row run alone (1e-4 max abs). The full-sequence path's
block-skipping attention must equal the plain masked attention in values and gradients, and
rows longer than a query block must still match transformers.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.core import spmd

from tests.helpers import model_utils as mu
from rised_jax.model import LOGICAL_AXES, ModelConfig, RopeConfig, from_pretrained, hf_state_dict
from rised_jax.model import decoder as dec, shared_prefix

torch = pytest.importorskip("torch")

ATOL = 1e-4
ROW_LENGTHS = (12, 7, 3)   # longer than the Gemma window (4)
FORWARD = nnx.jit(lambda model, ids, mask: model(ids, mask))
HIDDEN = nnx.jit(lambda model, ids, mask: model.hidden_states(ids, mask))
LOGITS = nnx.jit(lambda model, hidden: model.logits(hidden))


@pytest.fixture(scope="module", params=sorted(mu.TINY_CONFIGS))
def family(request) -> tuple:
  """(name, transformers model, our Decoder with its weights, rows, per-row reference logits)."""
  hf = mu.hf_model(mu.TINY_CONFIGS[request.param], seed=3)
  rows = mu.random_rows(ROW_LENGTHS, seed=4)
  return request.param, hf, mu.decoder_from_hf(hf), rows, [mu.hf_logits(hf, r) for r in rows]


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_matches_transformers(family, side):
  name, _, ours, rows, references = family
  ids, mask = mu.padded_batch(rows, side)
  logits = np.asarray(FORWARD(ours, ids, mask))
  assert np.isfinite(logits).all(), f"{name}: NaN/inf logits (padding rows included)"
  for b, reference in enumerate(references):
    cols = mu.real_columns(mask, b)
    np.testing.assert_allclose(logits[b, cols], reference, atol=ATOL, rtol=0,
                               err_msg=f"{name}, {side}-padded row {b}")


def test_shared_prefix_rows_match_transformers(family):
  """Two groups of three rows, each group's prefix run once (`shared_prefix_hidden_states`):
  every row's logits at its real columns equal transformers' on that row alone. The prefixes
  differ in length (left padding), the responses too (right padding); the rows are longer
  than the Gemma window."""
  name, hf, ours, _, _ = family
  prefixes = mu.random_rows((5, 3), seed=7)
  responses = mu.random_rows((4, 7, 2, 6, 1, 3), seed=8)
  prefix_ids, prefix_mask = mu.padded_batch(prefixes, "left")
  response_ids, response_mask = mu.padded_batch(responses, "right")
  input_ids = jnp.concatenate([jnp.repeat(prefix_ids, 3, axis=0), response_ids], axis=1)
  attention_mask = jnp.concatenate([jnp.repeat(prefix_mask, 3, axis=0), response_mask], axis=1)
  hidden = nnx.jit(lambda model, *arrays: model.shared_prefix_hidden_states(*arrays))(
      ours, prefix_ids, prefix_mask, input_ids, attention_mask)
  logits = np.asarray(LOGITS(ours, hidden))
  assert np.isfinite(logits).all(), name
  for b, response in enumerate(responses):
    reference = mu.hf_logits(hf, prefixes[b // 3] + response)
    np.testing.assert_allclose(logits[b, mu.real_columns(attention_mask, b)], reference,
                               atol=ATOL, rtol=0, err_msg=f"{name}, row {b}")


@pytest.mark.parametrize("name", ["llama_mha", "gemma3"])
def test_batch_without_mask_matches_transformers(name):
  hf = mu.hf_model(mu.TINY_CONFIGS[name], seed=6)
  rows = mu.random_rows((10, 10), seed=5)
  with torch.no_grad():
    reference = hf(torch.tensor(rows)).logits.numpy()
  logits = np.asarray(nnx.jit(lambda model, ids: model(ids))(mu.decoder_from_hf(hf),
                                                               jnp.asarray(rows, jnp.int32)))
  np.testing.assert_allclose(logits, reference, atol=ATOL, rtol=0, err_msg=name)


def test_logits_of_hidden_states_equal_forward(family):
  name, _, ours, rows, _ = family
  ids, mask = mu.padded_batch(rows, "left")
  hidden = HIDDEN(ours, ids, mask)
  assert hidden.shape == (3, max(ROW_LENGTHS), ours.cfg.hidden_size)
  np.testing.assert_allclose(np.asarray(LOGITS(ours, hidden)),
                             np.asarray(FORWARD(ours, ids, mask)), atol=1e-6, rtol=0,
                             err_msg=name)


def test_rope_frequencies_match_transformers():
  from transformers import LlamaConfig  # pylint: disable=import-outside-toplevel
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # pylint: disable=import-outside-toplevel
  cases = {
      "linear": RopeConfig(theta=10_000.0, kind="linear", factor=8.0),
      "llama3": RopeConfig(theta=500_000.0, kind="llama3", factor=8.0, low_freq_factor=1.0,
                           high_freq_factor=4.0, original_max_position_embeddings=8192),
  }
  for kind, rope in cases.items():
    hf_config = LlamaConfig(hidden_size=2048, num_attention_heads=16, head_dim=128,
                            max_position_embeddings=131072, rope_parameters=rope.to_hf())
    reference, _ = ROPE_INIT_FUNCTIONS[kind](hf_config, "cpu")
    np.testing.assert_allclose(rope.inv_freq(128), reference.numpy(), rtol=2e-6, err_msg=kind)
  default = RopeConfig(theta=10_000.0).inv_freq(8)
  np.testing.assert_allclose(default, [1.0, 0.1, 0.01, 0.001], rtol=1e-6)
  # llama3 keeps short wavelengths, divides long ones by the factor, interpolates between.
  llama3 = cases["llama3"].inv_freq(128)
  plain = RopeConfig(theta=500_000.0).inv_freq(128)
  assert llama3[0] == plain[0] and math.isclose(llama3[-1], plain[-1] / 8, rel_tol=1e-6)
  assert np.any((llama3 < plain) & (llama3 > plain / 8))


def test_positions_from_mask_hand_case():
  mask = jnp.asarray([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [0, 1, 0, 1, 1]])
  np.testing.assert_array_equal(np.asarray(dec.positions_from_mask(mask)),
                                [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2], [0, 0, 0, 1, 2]])


def _numpy_attention(q, k, v, mask, scale, softcap):
  heads, kv_heads = q.shape[2], k.shape[2]
  k = np.repeat(k, heads // kv_heads, axis=2)
  v = np.repeat(v, heads // kv_heads, axis=2)
  scores = np.einsum("bthd,bshd->bhts", q, k) * scale
  if softcap is not None:
    scores = np.tanh(scores / softcap) * softcap
  scores = np.where(mask[:, None], scores, -np.inf)
  out = np.zeros(q.shape)
  for b, h, t in np.ndindex(q.shape[0], heads, q.shape[1]):
    row = scores[b, h, t]
    if np.isinf(row).all():
      out[b, t, h] = v[b, :, h].mean(0)   # no visible key: uniform, finite
    else:
      p = np.exp(row - row.max())
      out[b, t, h] = (p / p.sum()) @ v[b, :, h]
  return out


def plain_attention(q, k, v, mask, *, scale, softcap=None):
  """`dec.attention` on keys and values laid out [B, S, KVH, hd], as the sequence passes have
  them (it reads the cache's layouts: keys [B, KVH, hd, S], values [B, KVH, S, hd])."""
  return dec.attention(q, jnp.transpose(k, (0, 2, 3, 1)), jnp.transpose(v, (0, 2, 1, 3)), mask,
                       scale=scale, softcap=softcap)


@pytest.mark.parametrize("softcap", [None, 2.0])
def test_attention_matches_numpy(softcap):
  rng = np.random.default_rng(0)
  q = rng.normal(size=(2, 5, 6, 4)).astype(np.float32)
  k = rng.normal(size=(2, 7, 2, 4)).astype(np.float32)
  v = rng.normal(size=(2, 7, 2, 4)).astype(np.float32)
  mask = rng.random((2, 5, 7)) < 0.6
  mask[1, 2] = False   # a query that sees nothing (a padding row)
  out = plain_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(mask),
                        scale=0.5, softcap=softcap)
  np.testing.assert_allclose(np.asarray(out), _numpy_attention(q, k, v, mask, 0.5, softcap),
                             atol=1e-5)


def test_visible_keys_window_and_validity():
  slots = jnp.arange(6)
  positions = jnp.asarray([[0, 0, 0, 1, 2, 3]])
  valid = jnp.asarray([[False, False, True, True, True, True]])
  mask = np.asarray(dec.visible_keys(slots, positions, slots, positions, valid, window=2))
  expected = np.zeros((6, 6), bool)
  for q in range(2, 6):
    for key in range(2, q + 1):
      expected[q, key] = positions[0, q] - positions[0, key] < 2
  np.testing.assert_array_equal(mask[0], expected)


def test_rms_norm_and_rope_match_numpy():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(2, 3, 8)).astype(np.float32)
  w = rng.normal(size=8).astype(np.float32)
  normed = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(np.asarray(dec.rms_norm(jnp.asarray(x), jnp.asarray(w), 1e-6,
                                                     False)), normed * w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(dec.rms_norm(jnp.asarray(x), jnp.asarray(w), 1e-6,
                                                     True)), normed * (1 + w), rtol=1e-5,
                             atol=1e-6)
  heads = rng.normal(size=(2, 3, 2, 8)).astype(np.float32)
  # The last position is the table's last row (num_positions - 1).
  positions = np.asarray([[0, 1, 2], [5, 6, 4095]])
  inv_freq = RopeConfig(theta=100.0).inv_freq(8)
  cos, sin = dec.rope_tables(jnp.asarray(positions), inv_freq, num_positions=4096)
  rotated = np.asarray(dec.apply_rope(jnp.asarray(heads), cos, sin))
  # Pair i is (x[i], x[i + 4]) rotated by the angle position * inv_freq[i], formed in
  # float32 as HF forms it.
  angle = (positions[:, :, None, None].astype(np.float32)
           * inv_freq.astype(np.float32)).astype(np.float64)
  first, second = heads[..., :4], heads[..., 4:]
  expected = np.concatenate([first * np.cos(angle) - second * np.sin(angle),
                             second * np.cos(angle) + first * np.sin(angle)], -1)
  np.testing.assert_allclose(rotated, expected, atol=1e-5)


def test_remat_gives_the_same_gradients():
  cfg = ModelConfig.from_hf(mu.TINY_CONFIGS["qwen3_untied"])
  ids, mask = mu.padded_batch(mu.random_rows((8, 5)), "left")
  weights = jax.random.normal(jax.random.key(0), (2, 8, mu.VOCAB))

  def loss(model):
    return jnp.sum(model(ids, mask) * weights)

  grads, jaxprs = {}, {}
  for remat in (False, True):
    model = mu.random_decoder(cfg, seed=1, remat=remat)
    graphdef, state = nnx.split(model)
    pure_loss = lambda s, g=graphdef: loss(nnx.merge(g, s))  # pylint: disable=cell-var-from-loop
    jaxprs[remat] = str(jax.make_jaxpr(jax.grad(pure_loss))(state))
    grads[remat] = jax.tree.leaves(jax.jit(jax.grad(pure_loss))(state))
  assert "remat" in jaxprs[True] and "remat" not in jaxprs[False]
  plain, rematted = grads[False], grads[True]
  assert len(plain) == len(rematted) > 0
  scale = max(float(jnp.abs(g).max()) for g in plain)
  assert scale > 0
  for a, b in zip(plain, rematted):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5 * scale, rtol=0)


def test_bfloat16_compute_is_close_to_float32():
  cfg = ModelConfig.from_hf(mu.TINY_CONFIGS["gemma3"])
  ids, mask = mu.padded_batch(mu.random_rows(ROW_LENGTHS), "left")
  exact = np.asarray(FORWARD(mu.random_decoder(cfg, seed=2), ids, mask))
  low = mu.random_decoder(cfg, seed=2, dtype="bfloat16", param_dtype="float32")
  assert jax.eval_shape(lambda: low.hidden_states(ids, mask)).dtype == jnp.bfloat16
  logits = np.asarray(FORWARD(low, ids, mask))
  assert logits.dtype == np.float32 and np.isfinite(logits).all()
  real = np.asarray(mask).astype(bool)
  err = np.abs(logits - exact)[real].max()
  assert 0 < err < 0.05 * np.abs(exact).max()


def test_parameters_carry_logical_axes():
  cfg = ModelConfig.from_hf(mu.TINY_CONFIGS["qwen3_untied"])
  model = mu.random_decoder(cfg)
  params = nnx.state(model, nnx.Param)
  flat = dict(jax.tree_util.tree_leaves_with_path(
      params, is_leaf=lambda x: isinstance(x, nnx.Variable)))
  assert flat
  for path, var in flat.items():
    axes = var.get_metadata()["out_sharding"]
    assert len(axes) == var[...].ndim and set(axes) <= set(LOGICAL_AXES), (path, axes)
  attn = model.layers[0].attn
  assert attn.q_proj.get_metadata()["out_sharding"] == ("embed", "heads", "head_dim")
  assert attn.q_proj[...].shape == (32, 4, 16)
  assert attn.k_proj.get_metadata()["out_sharding"] == ("embed", "kv_heads", "head_dim")
  assert attn.o_proj.get_metadata()["out_sharding"] == ("heads", "head_dim", "embed")
  assert model.embed.get_metadata()["out_sharding"] == ("vocab", "embed")
  assert model.lm_head.get_metadata()["out_sharding"] == ("embed", "vocab")
  rules = (("vocab", "tensor"), ("embed", "fsdp"), ("heads", "tensor"), ("kv_heads", "tensor"),
           ("mlp", "tensor"), ("head_dim", None), ("norm", None))
  with spmd.logical_axis_rules(rules):
    specs = nnx.get_partition_spec(params)
  spec = lambda var: var.get_value()  # pylint: disable=unnecessary-lambda-assignment
  P = jax.sharding.PartitionSpec  # pylint: disable=invalid-name
  assert spec(specs["layers"][0]["attn"]["q_proj"]) == P("fsdp", "tensor", None)
  assert spec(specs["layers"][0]["mlp"]["down_proj"]) == P("tensor", "fsdp")
  assert spec(specs["final_norm"]["scale"]) == P(None)


# ---------------------------------------------------------------------------------------------
# The full-sequence path: causal query blocks with a recomputing backward, flat matmuls.

LONG_ROWS = (150, 97, 30)   # beyond two default query blocks (64), not a multiple of 64


def _block_attention_inputs(side: str, window: int | None) -> tuple:
  """GQA q [3, 37, 4, 8], k/v [3, 37, 2, 8], the full-sequence mask of rows of lengths
  (37, 20, 5) padded on `side`, and loss weights that are zero at padding queries."""
  rng = np.random.default_rng(11)
  q = jnp.asarray(rng.normal(size=(3, 37, 4, 8)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(3, 37, 2, 8)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(3, 37, 2, 8)), jnp.float32)
  _, pad = mu.padded_batch(mu.random_rows((37, 20, 5)), side)
  slots, positions = jnp.arange(37), dec.positions_from_mask(pad)
  mask = dec.visible_keys(slots, positions, slots, positions, pad.astype(bool), window)
  weights = jnp.asarray(rng.normal(size=q.shape), jnp.float32) * pad[:, :, None, None]
  return q, k, v, mask, weights


def _values_and_grads(attend, q, k, v, mask, weights):
  """(output, d/dq, d/dk, d/dv of sum(sin(output) · weights)), in one jitted call."""
  def loss(q, k, v):
    out = attend(q, k, v, mask)
    return jnp.sum(jnp.sin(out) * weights), out
  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return (np.asarray(out), *map(np.asarray, grads))


@pytest.mark.parametrize("side, window, softcap, block", [
    ("left", None, None, 8),    # 37 columns: 4 blocks of 8 and one of 5
    ("left", 6, None, 8),       # sliding window
    ("left", 6, 2.0, 5),
    ("right", None, 2.0, 8),
    ("right", 6, None, 8),
    ("left", 6, None, 64),      # one block, longer than the sequence
])
def test_block_attention_equals_masked_attention(side, window, softcap, block):
  q, k, v, mask, weights = _block_attention_inputs(side, window)
  sees_a_key = np.asarray(mask).any(-1)
  if side == "left":
    assert not sees_a_key.all()   # the case includes padding queries that see nothing
  plain = _values_and_grads(
      lambda q, k, v, m: plain_attention(q, k, v, m, scale=0.3, softcap=softcap),
      q, k, v, mask, weights)
  blocked = _values_and_grads(
      lambda q, k, v, m: dec.causal_block_attention(q, k, v, m, scale=0.3, softcap=softcap,
                                                    block=block),
      q, k, v, mask, weights)
  for name, ours in zip(("output", "dq", "dk", "dv"), blocked):
    assert np.isfinite(ours).all(), name
  np.testing.assert_allclose(blocked[0][sees_a_key], plain[0][sees_a_key], atol=1e-5, rtol=0)
  for name, ours, reference in zip(("dq", "dk", "dv"), blocked[1:], plain[1:]):
    assert np.abs(reference).max() > 0.1, name
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0, err_msg=name)


@pytest.mark.parametrize("window, softcap, block", [
    (None, None, 8),    # blocks that straddle the prefix's end and the responses' ends
    (6, 2.0, 5),
    (None, None, 10),   # blocks of a response's width, offset by the 7-column prefix
    (None, None, 64),   # one block
])
def test_block_attention_skipping_other_responses_equals_masked_attention(window, softcap,
                                                                         block):
  """Two packed groups, each a 7-column prefix and 3 responses of 10 columns (37 columns,
  `shared_prefix`): skipping the keys of the earlier responses (`key_layout`) changes
  neither the values nor the gradients of the plain masked attention."""
  rng = np.random.default_rng(12)
  q = jnp.asarray(rng.normal(size=(2, 37, 4, 8)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(2, 37, 2, 8)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(2, 37, 2, 8)), jnp.float32)
  _, prefix_mask = mu.padded_batch(mu.random_rows((7, 4)), "left")
  _, response_mask = mu.padded_batch(mu.random_rows((10, 3, 6, 1, 10, 8)), "right")
  valid = shared_prefix.pack(prefix_mask, response_mask).astype(bool)
  positions = shared_prefix.positions(prefix_mask, response_mask)
  slots = jnp.arange(37)
  mask = dec.visible_keys(slots, positions, slots, positions, valid, window,
                          shared_prefix.segments(7, 3, 10))
  weights = jnp.asarray(rng.normal(size=q.shape), jnp.float32) * valid[:, :, None, None]
  plain = _values_and_grads(
      lambda q, k, v, m: plain_attention(q, k, v, m, scale=0.3, softcap=softcap),
      q, k, v, mask, weights)
  skipping = _values_and_grads(
      lambda q, k, v, m: dec.causal_block_attention(q, k, v, m, scale=0.3, softcap=softcap,
                                                    block=block, key_layout=(7, 10)),
      q, k, v, mask, weights)
  sees_a_key = np.asarray(mask).any(-1)
  np.testing.assert_allclose(skipping[0][sees_a_key], plain[0][sees_a_key], atol=1e-5, rtol=0)
  for name, ours, reference in zip(("dq", "dk", "dv"), skipping[1:], plain[1:]):
    assert np.abs(reference).max() > 0.1, name
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0, err_msg=name)
  with pytest.raises(ValueError, match=r"key_layout \(7, 11\) .* does not tile 37 columns"):
    dec.causal_block_attention(q, k, v, mask, scale=0.3, key_layout=(7, 11))


def test_block_attention_refuses_cross_attention():
  q = jnp.zeros((1, 4, 2, 8))
  kv = jnp.zeros((1, 6, 1, 8))
  with pytest.raises(ValueError, match="self-attention over one sequence"):
    dec.causal_block_attention(q, kv, kv, jnp.ones((1, 4, 6), bool), scale=1.0)
  with pytest.raises(ValueError, match="block must be >= 1"):
    dec.causal_block_attention(q, q[:, :, :1], q[:, :, :1], jnp.ones((1, 4, 4), bool),
                               scale=1.0, block=0)


def test_query_block_size_hand_cases():
  sizes = {n: dec.query_block_size(n) for n in (1, 64, 1024, 1025, 1088, 4096, 4097)}
  assert sizes == {1: 64, 64: 64, 1024: 64, 1025: 128, 1088: 128, 4096: 256, 4097: 320}
  assert all(-(-n // size) <= dec.MAX_QUERY_BLOCKS for n, size in sizes.items())


def test_block_attention_skips_work_and_keeps_no_score_matrix():
  """Compiled (not timed) figures at T = 256 in 4 blocks of 64: the forward does about
  (4 + 1) / 8 of the full attention's FLOPs; through stacked layers, the gradient's scratch
  memory grows by a fraction of one [B, H, T, T] score matrix per layer (the block attention
  keeps only per-row statistics for its backward pass), the plain attention's by more than
  one (measured: 0.1 and 2.1)."""
  batch, length, heads, kv_heads, head_dim = 1, 256, 4, 2, 8
  rng = np.random.default_rng(12)
  q = jnp.asarray(rng.normal(size=(batch, length, heads, head_dim)), jnp.float32)
  kv = jnp.asarray(rng.normal(size=(batch, length, kv_heads, head_dim)), jnp.float32)
  slots, ones = jnp.arange(length), jnp.ones((batch, length), bool)
  positions = dec.positions_from_mask(ones)
  mask = dec.visible_keys(slots, positions, slots, positions, ones, None)
  score_matrix_bytes = batch * heads * length * length * 4
  flops, temp_bytes = {}, {}
  for name, attend in (("plain", plain_attention), ("block", dec.causal_block_attention)):
    forward = jax.jit(lambda q, kv, m, f=attend: f(q, kv, kv, m, scale=0.3))
    cost = forward.lower(q, kv, mask).compile().cost_analysis()
    flops[name] = (cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"]
    for layers in (1, 3):
      def stacked(q, kv, m, f=attend, layers=layers):
        x = q
        for _ in range(layers):
          x = jnp.tanh(f(x, kv, kv, m, scale=0.3))
        return jnp.sum(x)
      compiled = jax.jit(jax.grad(stacked, argnums=(0, 1))).lower(q, kv, mask).compile()
      temp_bytes[name, layers] = compiled.memory_analysis().temp_size_in_bytes
  assert flops["block"] < 0.7 * flops["plain"], flops
  growth = {name: (temp_bytes[name, 3] - temp_bytes[name, 1]) / 2 for name in flops}
  assert growth["plain"] > score_matrix_bytes, temp_bytes
  assert growth["block"] < score_matrix_bytes / 4, temp_bytes
  assert temp_bytes["block", 3] < temp_bytes["plain", 3] / 4, temp_bytes


@pytest.mark.parametrize("name", ["gemma3", "qwen2_sliding"])
def test_rows_longer_than_a_query_block_match_transformers(name):
  """Left-padded rows spanning three query blocks, sliding and global layers."""
  hf = mu.hf_model(mu.tiny_config(name, max_position_embeddings=256), seed=7)
  rows = mu.random_rows(LONG_ROWS, seed=8)
  ids, mask = mu.padded_batch(rows, "left")
  assert dec.query_block_size(ids.shape[1]) < ids.shape[1] - dec.QUERY_BLOCK
  logits = np.asarray(FORWARD(mu.decoder_from_hf(hf), ids, mask))
  assert np.isfinite(logits).all()
  for b, row in enumerate(rows):
    np.testing.assert_allclose(logits[b, mu.real_columns(mask, b)], mu.hf_logits(hf, row),
                               atol=ATOL, rtol=0, err_msg=f"{name} row {b}")


def test_decoder_gradients_equal_those_of_plain_attention(monkeypatch):
  """Every parameter's gradient of a loss over the real columns of left-padded rows longer
  than a query block: block attention under remat equals the plain masked attention."""
  cfg = ModelConfig.from_hf(mu.tiny_config("gemma3", max_position_embeddings=256))
  ids, mask = mu.padded_batch(mu.random_rows(LONG_ROWS[:2], seed=9), "left")
  weights = jax.random.normal(jax.random.key(1), (*ids.shape, mu.VOCAB)) * mask[..., None]

  def grads(remat):
    graphdef, state = nnx.split(mu.random_decoder(cfg, seed=3, remat=remat))
    loss = lambda s: jnp.sum(nnx.merge(graphdef, s)(ids, mask) * weights)  # pylint: disable=unnecessary-lambda-assignment
    return jax.tree.leaves(jax.jit(jax.grad(loss))(state))

  blocked = grads(remat=True)
  monkeypatch.setattr(dec, "causal_block_attention",
                      lambda q, k, v, m, *, scale, softcap, key_layout: plain_attention(
                          q, k, v, m, scale=scale, softcap=softcap))
  plain = grads(remat=False)
  assert len(plain) == len(blocked) > 0
  scale = max(float(jnp.abs(g).max()) for g in plain)
  assert scale > 0
  for reference, ours in zip(plain, blocked):
    np.testing.assert_allclose(np.asarray(ours), np.asarray(reference), atol=1e-5 * scale,
                               rtol=0)


@pytest.mark.parametrize("in_dims", [1, 2])
def test_flat_matmul_matches_numpy(in_dims):
  rng = np.random.default_rng(13)
  x = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
  kernel = rng.normal(size=(4, 5, 6) if in_dims == 2 else (5, 3, 2)).astype(np.float32)
  spec = "btij,ijo->bto" if in_dims == 2 else "btij,jno->btino"
  out = dec.flat_matmul(jnp.asarray(x), jnp.asarray(kernel), in_dims=in_dims)
  np.testing.assert_allclose(np.asarray(out), np.einsum(spec, x, kernel), rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="disagree on the 2 contracted axes"):
    dec.flat_matmul(jnp.asarray(x), jnp.zeros((5, 4, 6)), in_dims=2)


def test_flat_matmul_bfloat16_operands_match_numpy():
  """Under jax.default_matmul_precision("bfloat16") a float32 flat_matmul rounds both operands
  to bfloat16 (ml_dtypes' rounding) and sums in float32; outside it, nothing is rounded."""
  import ml_dtypes  # noqa: PLC0415 - jax's own dependency
  rng = np.random.default_rng(14)
  x = rng.normal(size=(3, 4, 64)).astype(np.float32)
  kernel = rng.normal(size=(64, 2, 8)).astype(np.float32)
  exact = np.einsum("bti,ijo->btjo", x.astype(np.float64), kernel.astype(np.float64))
  rounded = np.einsum("bti,ijo->btjo", *(a.astype(ml_dtypes.bfloat16).astype(np.float64)
                                         for a in (x, kernel)))
  scale = np.abs(exact).max()
  assert np.abs(rounded - exact).max() > 1e-3 * scale      # the rounding is visible
  matmul = jax.jit(lambda a, b: dec.flat_matmul(a, b, in_dims=1))
  with jax.default_matmul_precision("bfloat16"):
    out = np.asarray(matmul(jnp.asarray(x), jnp.asarray(kernel)), np.float64)
  assert out.dtype == np.float64 and np.abs(out - rounded).max() <= 1e-5 * scale
  out = np.asarray(matmul(jnp.asarray(x), jnp.asarray(kernel)), np.float64)
  assert np.abs(out - exact).max() <= 1e-5 * scale


@pytest.mark.slow
def test_packaged_smollm2_matches_transformers():
  """SmolLM2-135M-Instruct (30 layers, GQA 9:3, tied) from its packaged GGUF: our logits
  equal transformers' LlamaForCausalLM holding the same weights."""
  from transformers import AutoConfig, AutoModelForCausalLM  # pylint: disable=import-outside-toplevel
  try:
    model, tokenizer = from_pretrained("smollm2-135m-instruct")
  except FileNotFoundError as e:
    pytest.skip(f"packaged SmolLM2 not installed: {e}")
  ids = tokenizer.encode_chat([{"role": "user", "content": "What is 2 + 2?"}])
  hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**model.cfg.to_hf()),
                                        attn_implementation="eager", dtype=torch.float32)
  result = hf.load_state_dict({k: torch.tensor(v) for k, v in hf_state_dict(model).items()},
                              strict=False)
  assert set(result.missing_keys) <= {"lm_head.weight"} and not result.unexpected_keys
  hf.tie_weights()
  with torch.no_grad():
    reference = hf(torch.tensor([ids])).logits[0].numpy()
  logits = np.asarray(FORWARD(model, jnp.asarray([ids], jnp.int32), jnp.ones((1, len(ids)),
                                                                             jnp.int32)))[0]
  # 30 layers and logits up to ~40: measured 1e-4, allowed 1e-3.
  np.testing.assert_allclose(logits, reference, atol=ATOL * 10, rtol=0)
  assert (logits.argmax(-1) == reference.argmax(-1)).all()
