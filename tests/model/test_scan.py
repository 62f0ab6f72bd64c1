"""`scan_layers`: the decoder's layers stacked and run under one `lax.scan`, against the
unrolled decoder, transformers, the HF export and the KV-cache sampler; and the activation
sharding constraints, on one device and on a 4-fake-device mesh.

Tolerances (fp32): scanned and unrolled compute the same arithmetic in a different XLA
program (fusions, and so float summation order, differ), so logits agree to 1e-5 and each
gradient to 1e-5 of that tensor's largest entry; against transformers the parity harness's
1e-4; the export, the HF tensors and greedy tokens must be identical.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from tests.helpers import model_utils as mu
from rised_jax import parallel
from rised_jax.model import ModelConfig, from_pretrained, hf_state_dict, save_pretrained
from rised_jax.model import decoder as dec
from rised_jax.rollout.base import GenerationRequest, SamplingParams
from rised_jax.rollout.jax_engine import JaxEngine

ATOL = 1e-5
GRAD_RTOL = 1e-5
PARITY_ATOL = 1e-4
# Tiny configs: gemma3 has local and global layers (two RoPE tables, two masks picked per
# layer inside the scan body), sandwich norms, softcapping; qwen3_untied QK-norm, biases,
# MQA, an untied head.
ROWS = mu.random_rows((12, 7, 3), seed=4)
FORWARD = nnx.jit(lambda model, ids, mask: model(ids, mask))
REPO = Path(__file__).resolve().parents[2]


def _models(name: str, **kwargs):
  cfg = ModelConfig.from_hf(mu.TINY_CONFIGS[name])
  return (mu.random_decoder(cfg, seed=7, **kwargs),
          mu.random_decoder(cfg, seed=7, scan_layers=True, **kwargs))


def _loss(model, ids, mask):
  logits = model(ids, mask)
  return jnp.sum(jax.nn.log_softmax(logits)[..., 5] * mask)


def _hf_grads(model, ids, mask) -> dict[str, np.ndarray]:
  """d loss / d parameter under HF tensor names (the gradient written into a model of the
  same structure, then exported as a state dict)."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  grads = jax.jit(jax.grad(lambda p: _loss(nnx.merge(graphdef, p, rest), ids, mask)))(params)
  return hf_state_dict(nnx.merge(graphdef, grads, rest))


def test_stacked_parameters_carry_the_layers_axis():
  _, scanned = _models("gemma3")
  q = scanned.layers.attn.q_proj
  cfg = scanned.cfg
  assert q.shape == (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.head_dim)
  assert q.get_metadata()["out_sharding"] == (dec.LAYERS, dec.EMBED, dec.HEADS, dec.HEAD_DIM)
  mesh = parallel.make_mesh()
  spec = parallel.state_shardings(nnx.state(scanned, nnx.Param), mesh)["layers"]["attn"]
  assert spec["q_proj"].get_value().spec == parallel.logical_to_spec(
      (dec.LAYERS, dec.EMBED, dec.HEADS, dec.HEAD_DIM), q.shape, mesh)


@pytest.mark.parametrize("name, remat", [("gemma3", True), ("qwen3_untied", False)])
def test_scanned_logits_and_gradients_equal_unrolled(name, remat):
  unrolled, scanned = _models(name, remat=remat)
  ids, mask = mu.padded_batch(ROWS, "left")
  np.testing.assert_allclose(np.asarray(FORWARD(scanned, ids, mask)),
                             np.asarray(FORWARD(unrolled, ids, mask)), atol=ATOL, rtol=0)
  reference, grads = _hf_grads(unrolled, ids, mask), _hf_grads(scanned, ids, mask)
  assert grads.keys() == reference.keys()
  for key, expected in reference.items():
    scale = float(np.abs(expected).max())
    assert scale > 0, key   # every parameter is reached by the loss
    np.testing.assert_allclose(grads[key], expected, atol=GRAD_RTOL * scale, rtol=0,
                               err_msg=f"{name}: d loss / d {key}")


def test_scanned_model_matches_transformers():
  torch = pytest.importorskip("torch")
  hf = mu.hf_model(mu.TINY_CONFIGS["gemma3"], seed=3)
  ours = mu.decoder_from_hf(hf, scan_layers=True)
  assert ours.scan_layers
  ids, mask = mu.padded_batch(ROWS, "left")
  logits = np.asarray(FORWARD(ours, ids, mask))
  with torch.no_grad():
    for b, row in enumerate(ROWS):
      np.testing.assert_allclose(logits[b, mu.real_columns(mask, b)], mu.hf_logits(hf, row),
                                 atol=PARITY_ATOL, rtol=0, err_msg=f"row {b}")


def test_save_load_round_trip_keeps_the_hf_layout(tmp_path):
  unrolled, scanned = _models("gemma3")
  tokenizer = mu.tiny_tokenizer()
  save_pretrained(unrolled, tokenizer, tmp_path / "unrolled")
  save_pretrained(scanned, tokenizer, tmp_path / "scanned")
  reloaded, _ = from_pretrained(tmp_path / "scanned", scan_layers=True)
  assert reloaded.scan_layers and reloaded.layers.mlp.up_proj.shape[0] == 4
  save_pretrained(reloaded, tokenizer, tmp_path / "again", max_shard_bytes=20_000)
  expected = load_file(tmp_path / "unrolled" / "model.safetensors")
  assert any(k.startswith("model.layers.3.") for k in expected)
  for export in ("scanned", "again"):
    files = sorted((tmp_path / export).glob("*.safetensors"))
    tensors = {k: v for f in files for k, v in load_file(f).items()}
    assert tensors.keys() == expected.keys(), export
    for key, value in expected.items():
      np.testing.assert_array_equal(tensors[key], value, err_msg=f"{export}: {key}")
  # The unrolled model loads the scanned export, and vice versa, to the same logits.
  ids, mask = mu.padded_batch(ROWS, "right")
  crossed, _ = from_pretrained(tmp_path / "again")
  np.testing.assert_array_equal(np.asarray(FORWARD(crossed, ids, mask)),
                                np.asarray(FORWARD(unrolled, ids, mask)))


def test_kv_cache_greedy_decode_is_token_identical():
  unrolled, scanned = _models("gemma3")
  greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
  requests = [GenerationRequest(row, greedy) for row in mu.random_rows((3, 8, 5, 11), seed=1)]
  outputs = []
  for model in (unrolled, scanned):
    engine = JaxEngine(model, max_batch=4, batch_buckets=(4,), prompt_buckets=(16,),
                       max_new_tokens_buckets=(8,))
    outputs.append(engine.generate(requests))
  for want, got in zip(*outputs):
    assert got.output_ids == want.output_ids and len(got.output_ids) == 8
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=ATOL, rtol=0)


def _constraints(model, mesh) -> list[str]:
  """The sharding constraints in the lowered forward pass, traced under `mesh` (or none)."""
  ids, mask = mu.padded_batch(ROWS, "left")
  graphdef, state = nnx.split(model)
  forward = lambda s, i, m: nnx.merge(graphdef, s).hidden_states(i, m)  # noqa: E731
  if mesh is not None:
    forward = parallel.under_mesh(forward, mesh)
  text = jax.jit(forward).lower(state, ids, mask).as_text()
  return [line for line in text.splitlines() if "sharding_constraint" in line]


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_residual_stream_is_constrained_after_every_sub_layer(scan):
  unrolled, scanned = _models("gemma3")
  model = scanned if scan else unrolled
  mesh = parallel.make_mesh()
  found = _constraints(model, mesh)
  # The embedding, then attention and MLP of each layer (the scan body is traced once).
  assert len(found) == 1 + 2 * (1 if scan else model.cfg.num_layers), found
  batch_over = '[{"data", "fsdp"}, {}, {}]'
  assert all(batch_over in line for line in found), found
  assert not _constraints(model, None)


def test_activation_rules_split_rows_over_data_and_fsdp():
  mesh = jax.sharding.AbstractMesh((2, 2, 1), parallel.MESH_AXES)
  spec = lambda shape: parallel.logical_to_spec(dec.ACTIVATION_AXES, shape, mesh)  # noqa: E731
  assert spec((8, 5, 64)) == jax.sharding.PartitionSpec(("data", "fsdp"), None, None)
  # Rows that data × fsdp does not divide stay replicated, as parameters do.
  assert spec((6, 5, 64)) == jax.sharding.PartitionSpec(None, None, None)


def _sharded_and_single_device_steps(out: str) -> None:
  """Child process (4 fake CPU devices): two GRPO steps of the scanned tiny Qwen3 on one
  device and on the (data 1, fsdp 2, tensor 2) mesh; writes metrics and parameters.

  Plain SGD: the parameters then differ by lr × the gradients' difference, where Adam would
  turn float reordering noise on near-zero gradients into O(lr) differences.
  """
  import optax  # pylint: disable=import-outside-toplevel
  from tests.helpers import step_fixtures  # pylint: disable=import-outside-toplevel
  from rised_jax.learn import train_step  # pylint: disable=import-outside-toplevel
  result = {}
  for name, mesh in (("single", parallel.make_mesh(parallel.MeshShape(1, 1, 1),
                                                   jax.devices()[:1])),
                     ("sharded", parallel.make_mesh(parallel.MeshShape(1, 2, 2)))):
    trainable, state = train_step.create(step_fixtures.tiny_model(scan_layers=True),
                                         optax.sgd(0.5),
                                         step_fixtures.step_config(beta=0.0), mesh)
    for i in range(2):
      state, metrics = trainable.step(state, trainable.put_batch(step_fixtures.batch(i)))
      result.update({f"{name}/step{i}/{k}": np.asarray(v) for k, v in metrics.items()})
    for path, leaf in jax.tree_util.tree_flatten_with_path(state.params)[0]:
      result[f"{name}/param{jax.tree_util.keystr(path)}"] = np.asarray(leaf)
  np.savez(out, **result)


def test_scanned_sharded_step_equals_single_device(tmp_path):
  out = tmp_path / "steps.npz"
  proc = subprocess.run([sys.executable, __file__, str(out)], cwd=REPO, capture_output=True,
                        text=True, timeout=600,
                        env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO),
                                 XLA_FLAGS="--xla_force_host_platform_device_count=4"))
  assert proc.returncode == 0, proc.stdout + proc.stderr
  result = dict(np.load(out))
  single = {k.split("/", 1)[1]: v for k, v in result.items() if k.startswith("single/")}
  sharded = {k.split("/", 1)[1]: v for k, v in result.items() if k.startswith("sharded/")}
  assert single.keys() == sharded.keys() and "param['layers']['attn']['q_proj'].value" in single
  assert np.isfinite(single["step1/loss"]) and single["step1/loss"] != single["step0/loss"]
  for key, value in single.items():
    np.testing.assert_allclose(sharded[key], value, rtol=1e-5, atol=1e-5, err_msg=key)


if __name__ == "__main__":
  _sharded_and_single_device_steps(sys.argv[1])
