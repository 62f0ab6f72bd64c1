"""The reference KL to the frozen initial policy: computed inside the step, k1/k2/k3 checked
against numpy; trained with (the old step raised KeyError 'ref_logprobs'); saved and restored
with the run, through a file:// workdir."""
from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from etils import epath
from flax import nnx

from rised_jax import config as config_lib, parallel, pipelines, runlog, trainer
from rised_jax.learn import train_step
from rised_jax.model import ModelConfig, from_config, tiny
from rised_jax.rollout.settings import RolloutConfig
from tests.helpers import step_fixtures
from tests.helpers.run_fixtures import tiny_config as _config

COEF = 0.5


def _log_softmax(x: np.ndarray) -> np.ndarray:
  x = x.astype(np.float64)
  shifted = x - x.max(axis=-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _token_logprobs(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
  """[B, T] log p(ids[:, t] | ids[:, :t]) from full [B, T, V] logits; column 0 is 0."""
  logp = _log_softmax(logits[:, :-1])
  picked = np.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
  return np.pad(picked, [(0, 0), (1, 0)])


ESTIMATORS = {   # by hand, with r = π_ref / π_θ at the sampled token
    "k1": lambda lp, lq: lp - lq,
    "k2": lambda lp, lq: 0.5 * (lp - lq) ** 2,
    "k3": lambda lp, lq: np.exp(lq - lp) - (lq - lp) - 1.0,
}


def _numpy_ref_kl(policy, reference, batch, estimator: str) -> float:
  """seq-mean-token-mean of the estimator over the loss tokens, from each model's own full
  logits (no chunking, no shared code with the step beyond the models' forward)."""
  ids, mask = batch["input_ids"], batch["attention_mask"]
  lp = _token_logprobs(np.asarray(policy(jnp.asarray(ids), jnp.asarray(mask))), ids)
  lq = _token_logprobs(np.asarray(reference(jnp.asarray(ids), jnp.asarray(mask))), ids)
  loss_mask = batch["loss_mask"].astype(np.float64)
  per_token = ESTIMATORS[estimator](lp, lq) * loss_mask
  tokens = loss_mask.sum(-1)
  rows = tokens > 0
  return float((per_token.sum(-1)[rows] / tokens[rows]).mean())


def _cfg():
  return ModelConfig.from_hf(step_fixtures.TINY_QWEN3, source="tests/learn/test_ref_kl.py")


def _model(graphdef, params, rest):
  return nnx.merge(graphdef, jax.tree.map(jnp.asarray, params), rest)


@pytest.fixture(scope="module")
def trained():
  """Two k3 steps with ref_kl_coef > 0 on batches without 'ref_logprobs' (the old step raised
  KeyError for them); a large learning rate so that the second step's KL is well above
  float32 noise."""
  mesh = parallel.make_mesh(parallel.MeshShape(1, 1, 1), devices=jax.devices()[:1])
  config = step_fixtures.step_config(beta=0.0, ref_kl_coef=COEF, ref_kl_estimator="k3")
  optimizer = train_step.make_optimizer(train_step.OptimizerConfig(learning_rate=3e-2, eps=1e-6))
  trainable, state = train_step.create(from_config(_cfg(), 0), optimizer, config, mesh)
  history = []
  for i in range(2):
    before = jax.tree.map(np.array, state.params)   # the step donates the state
    state, metrics = trainable.step(state, trainable.put_batch(step_fixtures.batch(i)))
    history.append((before, {k: float(v) for k, v in metrics.items()}))
  return trainable, state, history


def test_reference_kl_trains_and_matches_numpy(trained):
  trainable, state, ((initial, first), (policy, second)) = trained
  assert "ref_logprobs" not in trainable.config.required_keys()
  # Step 1: the policy is the reference; the PG term moves it. The policy's and the
  # reference's forwards agree to float32 rounding (|Δ log p| ~ 2e-7), so k3 ≈ Δ²/2 ~ 1e-14:
  # k3 as expm1(x) − x keeps those digits, where exp(x) − x − 1 rounded them to 0.
  assert 0.0 <= first["ref_kl"] < 1e-12 and first["skipped_nonfinite"] == 0
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(policy),
                                                      jax.tree.leaves(initial)))
  # Step 2: the KL of the moved policy to the (independently rebuilt) initial model.
  reference = from_config(_cfg(), 0)
  expected = _numpy_ref_kl(_model(trainable.graphdef, policy, trainable.rest), reference,
                           step_fixtures.batch(1), "k3")
  assert expected > 1e-3
  np.testing.assert_allclose(second["ref_kl"], expected, rtol=1e-4)
  np.testing.assert_allclose(second["loss"], second["pg_loss"] + COEF * expected, rtol=1e-4)
  # The reference is the initial parameters and never moves.
  for leaf, start in zip(jax.tree.leaves(state.ref_params), jax.tree.leaves(initial)):
    np.testing.assert_array_equal(np.asarray(leaf), start)


@pytest.mark.parametrize("estimator", ["k1", "k2"])
def test_the_configured_estimator_is_the_one_added_to_the_loss(trained, estimator):
  """Zero advantages make the policy-gradient term exactly 0: the loss is COEF · KL."""
  trainable, state, _ = trained
  config = dataclasses.replace(trainable.config, reference_kl=dataclasses.replace(
      trainable.config.reference_kl, ref_kl_estimator=estimator))
  batch = step_fixtures.batch(2)
  batch["advantages"] = np.zeros_like(batch["advantages"])
  rows = (batch["loss_mask"].sum(-1) > 0).sum()
  loss, metrics = jax.jit(lambda p, r, b: train_step._micro_loss(
      p, trainable.rest, None, trainable.graphdef, config, b, {"pg": jnp.float32(rows)},
      jnp.float32(0.0), r))(state.params, state.ref_params, batch)
  expected = _numpy_ref_kl(trainable.model(state), from_config(_cfg(), 0), batch, estimator)
  assert abs(expected) > 1e-3
  np.testing.assert_allclose(float(metrics["ref_kl"]) / rows, expected, rtol=1e-4)
  np.testing.assert_allclose(float(loss), COEF * expected, rtol=1e-4)


def test_bf16_reference_is_the_initial_policy_exactly():
  """Under bf16 compute the reference keeps what the forward uses (matrices in bf16, norm
  scales as stored), so at the start its KL is exactly 0, with half the memory."""
  model = from_config(_cfg(), 0, dtype="bfloat16", param_dtype="float32")
  mesh = parallel.make_mesh(parallel.MeshShape(1, 1, 1), devices=jax.devices()[:1])
  config = step_fixtures.step_config(beta=0.0, ref_kl_coef=COEF, ref_kl_estimator="k3")
  trainable, state = train_step.create(model, step_fixtures.optimizer(), config, mesh)
  dtypes = {jax.tree_util.keystr(p): str(x.dtype)
            for p, x in jax.tree_util.tree_leaves_with_path(state.ref_params)}
  assert {d for k, d in dtypes.items() if "norm" in k} == {"float32"}
  assert {d for k, d in dtypes.items() if "norm" not in k} == {"bfloat16"}
  assert {str(x.dtype) for x in jax.tree.leaves(state.params)} == {"float32"}
  batch = step_fixtures.batch(0)
  rows = (batch["loss_mask"].sum(-1) > 0).sum()
  _, metrics = jax.jit(lambda p, r, b: train_step._micro_loss(
      p, trainable.rest, None, trainable.graphdef, config, b, {"pg": jnp.float32(rows)},
      jnp.float32(0.0), r))(state.params, state.ref_params, batch)
  assert float(metrics["ref_kl"]) == 0.0


def test_validation_accepts_reference_kl():
  config = _config("grpo", "runs/tiny_model", **{"step.ref_kl_coef": 0.1})
  pipelines.validate(config)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
  return tiny.write(tmp_path_factory.mktemp("tiny") / "model", ["frozenlake", "maze"])


def test_a_file_url_workdir_saves_and_restores_the_reference(tiny_model, tmp_path):
  """A real round trip through a file:// workdir (epath has no file:// backend: it used to
  raise KeyError 'file://'): config.json, the logs and a checkpoint land in the local
  directory, and a rebuilt run resumes the saved master and reference parameters bit for bit
  (both perturbed before the save, so a reference rebuilt from the model would differ)."""
  local = tmp_path / "run"
  url = local.as_uri()
  assert url.startswith("file:///")
  config = _config("grpo", tiny_model, **{"step.ref_kl_coef": 0.1})
  run = trainer.build(config, url)
  assert config.workdir == str(local)
  bump = lambda tree: jax.tree.map(lambda x: x + jnp.asarray(0.5, x.dtype), tree)  # noqa: E731
  run.state = dataclasses.replace(run.state, params=bump(run.state.params),
                                  ref_params=bump(run.state.ref_params))
  saved = jax.tree.map(np.array, (run.state.params, run.state.ref_params))
  run.log.scalars(1, {"loss": 0.5})
  run.checkpointer.save(1, run.state, run.host_state())
  run.checkpointer.close()
  run.log.close()

  again = trainer.build(_config("grpo", tiny_model, **{"step.ref_kl_coef": 0.1}), url)
  assert trainer.resume(again) == 1
  again.checkpointer.close()
  restored = jax.tree.map(np.asarray, (again.state.params, again.state.ref_params))
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(saved), strict=True):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(a, b)
  assert [m["loss"] for m in runlog.read_jsonl(local / runlog.METRICS_FILE)] == [0.5]
  assert json.loads((local / "config.json").read_text())["workdir"] == str(local)
  assert (local / "checkpoints" / "1").is_dir()


def test_workdir_urls_are_resolved_or_refused_by_name(tmp_path, monkeypatch):
  # gcsfs (the `gcs` extra) is not installed here; its absence has a test of its own.
  monkeypatch.setattr(trainer, "_check_bucket_backend", lambda scheme, workdir: None)
  assert trainer.resolve_workdir(f"file://localhost{tmp_path}") == epath.Path(tmp_path)
  assert os.fspath(trainer.resolve_workdir("gs://bucket/run")) == "gs://bucket/run"
  with pytest.raises(ValueError, match=r"workdir 'file://host/x': a file:// URL must name a "
                     r"local path"):
    trainer.resolve_workdir("file://host/x")
  with pytest.raises(ValueError, match=r"workdir 'ftp://x/run': expected a local path, a "
                     r"file:// URL or a bucket URL"):
    trainer.resolve_workdir("ftp://x/run")


def test_sglang_weight_sync_under_a_bucket_workdir_needs_a_local_weight_dir(tmp_path,
                                                                          monkeypatch):
  """The export used to land in ./gs:/bucket/run/weights under the cwd; now a bucket workdir
  needs rollout.sglang.weight_dir, refused before anything loads or touches the bucket."""
  monkeypatch.setattr(trainer, "_check_bucket_backend", lambda scheme, workdir: None)
  config = _config("grpo", "runs/tiny_model", **{"rollout.engine": "sglang"})
  with pytest.raises(ValueError, match=r"config\.rollout\.sglang\.weight_dir is empty and the "
                     r"workdir gs://bucket/run is a bucket URL"):
    trainer._prepare(config, "gs://bucket/run")
  config = _config("grpo", "runs/tiny_model", **{"rollout.engine": "sglang",
                                                 "rollout.sglang.weight_dir": str(tmp_path)})
  with config.unlocked():
    config.workdir = "gs://bucket/run"
  assert trainer._weight_dir(RolloutConfig.from_config(config.rollout), config.workdir) == str(
      tmp_path)
  with config.unlocked():
    config.workdir, config.rollout.sglang.weight_dir = str(tmp_path / "run"), ""
  assert trainer._weight_dir(RolloutConfig.from_config(config.rollout), config.workdir) == str(
      tmp_path / "run" / "weights")
