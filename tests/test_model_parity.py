"""The Decoder against transformers (torch, fp32, eager attention) and numpy references.

Every tiny family config in model_utils.TINY_CONFIGS is run on a batch of rows of different
lengths, left- and right-padded; each row's logits at its real columns must equal
transformers' logits for that row run alone (1e-4 max abs).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.core import spmd

import model_utils as mu
from rised_jax.model import LOGICAL_AXES, ModelConfig, RopeConfig, from_pretrained, hf_state_dict
from rised_jax.model import decoder as dec

torch = pytest.importorskip("torch")

ATOL = 1e-4
ROW_LENGTHS = (12, 7, 3)   # longer than the Gemma window (4)
FORWARD = nnx.jit(lambda model, ids, mask: model(ids, mask))
HIDDEN = nnx.jit(lambda model, ids, mask, positions: model.hidden_states(ids, mask, positions))
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
  hidden = HIDDEN(ours, ids, mask, dec.positions_from_mask(mask))
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


@pytest.mark.parametrize("softcap", [None, 2.0])
def test_attention_matches_numpy(softcap):
  rng = np.random.default_rng(0)
  q = rng.normal(size=(2, 5, 6, 4)).astype(np.float32)
  k = rng.normal(size=(2, 7, 2, 4)).astype(np.float32)
  v = rng.normal(size=(2, 7, 2, 4)).astype(np.float32)
  mask = rng.random((2, 5, 7)) < 0.6
  mask[1, 2] = False   # a query that sees nothing (a padding row)
  out = dec.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(mask),
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
  positions = np.asarray([[0, 1, 2], [5, 6, 7]])
  inv_freq = RopeConfig(theta=100.0).inv_freq(8)
  cos, sin = dec.rope_tables(jnp.asarray(positions), inv_freq)
  rotated = np.asarray(dec.apply_rope(jnp.asarray(heads), cos, sin))
  # Pair i is (x[i], x[i + 4]) rotated by the angle position * inv_freq[i].
  angle = positions[:, :, None, None] * inv_freq
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
