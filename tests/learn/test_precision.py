"""Mixed precision: float32 master weights and Adam state under bf16 compute
(rised_jax/learn/precision.py); the sampler and the export see the compute dtype."""
from __future__ import annotations

import json
import os
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rised_jax import config as config_lib, parallel, pipelines, trainer
from rised_jax.learn import batching, train_step
from rised_jax.pipelines import stages
from rised_jax.model import ModelConfig, from_config, tiny
from tests.helpers import step_fixtures
from tests.helpers.run_fixtures import REPO, load_config_file, tiny_config as _config


def _cfg():
  return ModelConfig.from_hf(step_fixtures.TINY_QWEN3, source="tests/learn/test_precision.py")


def _every_token_batch() -> dict[str, np.ndarray]:
  """Rows in which every token id but the pad id (0) occurs, so every parameter (each
  embedding row included) has a gradient."""
  ids = np.arange(1, step_fixtures.VOCAB)
  rows = []
  for r, chunk in enumerate(np.array_split(ids, step_fixtures.ROWS)):
    chunk = chunk.tolist()
    rows.append(batching.Row(prefix_ids=chunk[:3], response_ids=chunk[3:],
                             response_loss_mask=[1] * (len(chunk) - 3),
                             response_behaviour_logprobs=[-4.5] * (len(chunk) - 3),
                             advantage=1.0 if r % 2 else -1.0))
  return batching.assemble(rows, pad_id=0, prefix_multiple=4, response_multiple=8)


def _changed_fraction(compute_dtype: str, param_dtype: str) -> float:
  """Fraction of the master weights one AdamW step at lr 1e-6 changes."""
  model = from_config(_cfg(), 0, dtype=compute_dtype, param_dtype=param_dtype)
  mesh = parallel.make_mesh(parallel.MeshShape(1, 1, 1), devices=jax.devices()[:1])
  optimizer = train_step.make_optimizer(train_step.OptimizerConfig(learning_rate=1e-6))
  trainable, state = train_step.create(model, optimizer, step_fixtures.step_config(beta=0.0),
                                       mesh)
  assert {str(x.dtype) for x in jax.tree.leaves(state.opt_state)
          if jnp.issubdtype(x.dtype, jnp.floating)} == {param_dtype}
  before = jax.tree.map(np.array, state.params)
  state, metrics = trainable.step(state, trainable.put_batch(_every_token_batch()))
  assert metrics["skipped_nonfinite"] == 0
  changed = sum(int((np.asarray(a) != b).sum())
                for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(before)))
  return changed / sum(b.size for b in jax.tree.leaves(before))


@pytest.mark.slow
def test_a_small_adamw_step_changes_the_float32_master_weights():
  """Adam's first step moves each weight by about lr = 1e-6, far below bf16's spacing at a
  typical weight (|w| ≈ 0.02: 2^-13 ≈ 1.2e-4): bf16 master weights keep almost all of them."""
  assert _changed_fraction("bfloat16", "float32") >= 0.99
  assert _changed_fraction("bfloat16", "bfloat16") < 0.1   # the old model.dtype=bfloat16


def test_bf16_compute_loss_is_close_to_float32():
  """The same float32 weights, forward in bf16 and in float32.

  Tolerance: bf16 keeps 8 significant bits (unit roundoff 2^-8 ≈ 0.4 %); every matmul input is
  rounded once and the norms, softmax and log-softmax run in float32, so through 2 layers and
  the head each log-prob, and with them the behaviour weights and the loss (a mean over
  tokens, whose rounding errors partly cancel), moves by a few roundoffs at most: 1 % is 2.5
  roundoffs (measured: 0.15 %). The gap must also be non-zero, else the "bf16" forward ran in
  float32.
  """
  batch = {k: jnp.asarray(v) for k, v in step_fixtures.batch(0).items()}
  config = step_fixtures.step_config()
  rows = (batch["loss_mask"].sum(-1) > 0).sum()
  denominators = {"pg": jnp.float32(rows), "distill": batch["distill_mask"].sum()}
  losses = {}
  for dtype in ("float32", "bfloat16"):
    graphdef, params, rest = nnx.split(
        from_config(_cfg(), 0, dtype=dtype, param_dtype="float32"), nnx.Param, ...)
    losses[dtype] = float(jax.jit(lambda p, b: train_step._micro_loss(
        p, rest, None, graphdef, config, b, denominators, jnp.float32(config.teacher_kl.beta))[0])(
            params, batch))
  np.testing.assert_allclose(losses["bfloat16"], losses["float32"], rtol=1e-2)
  assert losses["bfloat16"] != losses["float32"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
  return tiny.write(tmp_path_factory.mktemp("tiny") / "model", ["frozenlake", "maze"])


def test_sampler_and_export_hold_the_compute_dtype(tiny_model, tmp_path):
  config = _config("grpo", tiny_model, **{"model.compute_dtype": "bfloat16"})
  run = trainer.build(config, tmp_path / "run")
  run.checkpointer.close()
  master = {jax.tree_util.keystr(p): x for p, x in
            jax.tree_util.tree_leaves_with_path(run.state.params)}
  assert {str(x.dtype) for x in master.values()} == {"float32"}
  held = nnx.merge(run.engine._graphdef, run.engine._state)
  sampler = {jax.tree_util.keystr(p): x for p, x in
             jax.tree_util.tree_leaves_with_path(nnx.state(held, nnx.Param))}
  for key, value in sampler.items():
    # The forward casts matrices to bf16 and applies the norm scales in float32.
    assert str(value.dtype) == ("float32" if "norm" in key else "bfloat16"), key
    np.testing.assert_array_equal(np.asarray(value, np.float32),
                                  np.asarray(master[key].astype(value.dtype), np.float32))
  with config.unlocked():
    config.rollout.engine = "sglang"
  engine = trainer._engine(stages.stage_configs(config), run.config.workdir,
                           run.trainable.compute_model(run.state), run.tokenizer)
  out = engine.export_weights(run.trainable.compute_model(run.state), 1)
  dtypes = {}
  for name in sorted(p for p in os.listdir(out) if p.endswith(".safetensors")):
    dtypes.update(_safetensors_dtypes(os.path.join(out, name)))
  assert len(dtypes) == len(master) and set(dtypes.values()) == {"BF16"}
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["torch_dtype"] == "bfloat16"


def _safetensors_dtypes(path: str) -> dict[str, str]:
  """Tensor name -> dtype from a safetensors file's own header (8-byte length, then JSON)."""
  with open(path, "rb") as f:
    (length,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(length))
  return {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}


def test_the_old_dtype_key_is_refused_naming_the_new_ones():
  config = _config("grpo", "runs/tiny_model")
  config.model.dtype = "bfloat16"
  with pytest.raises(ValueError, match=r"config\.model\.dtype='bfloat16': this key was replaced "
                     r"by config\.model\.compute_dtype .* config\.model\.param_dtype"):
    pipelines.validate(config)


@pytest.mark.parametrize("name", ["rised_qwen3_multienv.py", "cripo_qwen3_1p7b.py",
                                  "cripo_qwen3_4b.py", "compare_qwen3_0p6b_1gpu.py",
                                  "rised_babyai_scienceworld.py"])
def test_paper_scale_configs_keep_float32_master_weights(name):
  config = load_config_file(REPO / "experiments" / "configs" / name, None)
  assert (config.model.param_dtype, config.model.compute_dtype) == ("float32", "bfloat16")
