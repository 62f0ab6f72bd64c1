"""The fused train step against an unchunked reference, micro-batching, teachers, sharding,
multi-host and checkpoint resume."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rised_jax import parallel
from rised_jax.learn import loss_terms, train_step
from tests.helpers import step_fixtures
from tests.helpers.ports import free_port

HARNESS = Path(__file__).resolve().parents[1] / "helpers" / "step_harness.py"
REPO = HARNESS.parents[2]


def _reference_loss(model, batch, config: train_step.StepConfig, beta: float):
  """Full-logits loss written from the equations (docs/ALGORITHMS.md §1.2-1.5), no chunking."""
  pg, logp_all = _reference_policy_gradient(model, batch, config)
  t_logits = jax.lax.stop_gradient(model(jnp.asarray(batch["teacher_input_ids"]),
                                         jnp.asarray(batch["teacher_attention_mask"])))
  t_logp_all = jax.nn.log_softmax(t_logits[:, :-1], axis=-1)
  kl = (jnp.exp(t_logp_all) * (t_logp_all - logp_all)).sum(-1)
  kl = jnp.pad(kl, [(0, 0), (1, 0)])
  dmask = jnp.asarray(batch["distill_mask"])
  return pg + beta * (kl * dmask).sum() / dmask.sum()


def _reference_policy_gradient(model, batch, config: train_step.StepConfig):
  """The clipped, importance-weighted GRPO term alone, and the student's log-softmax."""
  logp, logp_all = step_fixtures.target_logprobs(model, batch)
  mask = jnp.asarray(batch["loss_mask"])
  adv = jnp.asarray(batch["advantages"])
  old = jax.lax.stop_gradient(logp)
  ratio = jnp.exp(logp - old)
  pg_config = config.policy_gradient
  per_token = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - pg_config.eps_low,
                                                 1 + pg_config.eps_high) * adv)
  weight = jnp.minimum(jnp.exp(old - jnp.asarray(batch["behaviour_logprobs"])),
                       pg_config.importance_cap)
  per_token = jnp.where(mask > 0, per_token * weight, 0.0)
  tokens = mask.sum(-1)
  seq = jnp.where(tokens > 0, (per_token * mask).sum(-1) / jnp.maximum(tokens, 1), 0.0)
  return seq.sum() / (tokens > 0).sum(), logp_all


def _one_device_mesh():
  return parallel.make_mesh(parallel.MeshShape(1, 1, 1), devices=jax.devices()[:1])


def _few_trained_tokens(batch):
  """The batch with loss and distillation on each row's last 3 response tokens at most: most
  chunks then hold no used column and skip the vocabulary projection."""
  out = dict(batch)
  keep = np.zeros_like(batch["loss_mask"])
  for r, row in enumerate(np.asarray(batch["attention_mask"])):
    keep[r, np.flatnonzero(row)[-3:]] = 1.0
  for key in ("loss_mask", "advantages", "distill_mask"):
    out[key] = batch[key] * keep
  return out


@pytest.mark.parametrize("sparse", [False, True], ids=["assembled", "few-trained-tokens"])
def test_fused_loss_and_grads_equal_unchunked_reference(sparse):
  config = step_fixtures.step_config(chunk=5)   # T = 32 is not a multiple of 5
  model = step_fixtures.tiny_model()
  batch = step_fixtures.batch(0)
  if sparse:
    batch = _few_trained_tokens(batch)
    assert 0 < batch["loss_mask"].sum() < 0.5 * step_fixtures.batch(0)["loss_mask"].sum()
  grads = assert_fused_loss_equals_reference(model, batch, config)
  assert float(jnp.abs(jnp.asarray(jax.tree.leaves(grads)[0])).max()) > 0


def assert_fused_loss_equals_reference(model, batch, config: train_step.StepConfig):
  """The fused loss of one micro-batch (`_micro_loss`) and its gradients against
  `_reference_loss` on the batch's rows (without its shared-prefix keys); returns the
  gradients."""
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  rows_only = {k: v for k, v in batch.items() if k not in train_step.SHARED_PREFIX_KEYS}
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  tokens = batch["loss_mask"].sum(-1)
  denominators = {"pg": (tokens > 0).sum().astype(jnp.float32),
                  "distill": batch["distill_mask"].sum()}

  def fused(p):
    return train_step._micro_loss(p, rest, None, graphdef, config, batch, denominators,
                                  jnp.float32(config.teacher_kl.beta))[0]

  def reference(p):
    return _reference_loss(nnx.merge(graphdef, p, rest), rows_only, config,
                           config.teacher_kl.beta)

  loss, grads = jax.value_and_grad(fused)(params)
  ref_loss, ref_grads = jax.value_and_grad(reference)(params)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
  for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6)
  return grads


@pytest.mark.parametrize("distills", [False, True], ids=["no-distill-tokens", "distill-tokens"])
def test_a_teacher_that_no_token_reads_is_not_run(distills):
  """A frozen teacher whose decoder layers are all NaN: with no distillation token its forward
  must be skipped (the loss and gradients are the GRPO reference's, finite); with one, its NaN
  reaches the loss, so the first case can only pass when the forward is skipped. (Its
  embedding and head stay finite: the head still runs on the zero hidden states of a skipped
  forward, whose divergence every read masks out.)"""
  config = step_fixtures.step_config(chunk=5, teacher="frozen")
  model = step_fixtures.tiny_model()
  batch = step_fixtures.batch(0)
  if not distills:
    batch["distill_mask"][:] = 0
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  nan_teacher = jax.tree_util.tree_map_with_path(
      lambda path, x: jnp.full_like(x, jnp.nan) if "layers" in jax.tree_util.keystr(path) else x,
      params)
  assert any(np.isnan(x).all() for x in jax.tree.leaves(nan_teacher))
  tokens = batch["loss_mask"].sum(-1)
  denominators = {"pg": (tokens > 0).sum().astype(jnp.float32),
                  "distill": jnp.maximum(batch["distill_mask"].sum(), 1.0)}

  def fused(p):
    return train_step._micro_loss(p, rest, nan_teacher, graphdef, config, batch, denominators,
                                  jnp.float32(config.teacher_kl.beta))[0]

  loss, grads = jax.value_and_grad(fused)(params)
  if distills:
    assert not np.isfinite(float(loss))
    return
  ref_loss, ref_grads = jax.value_and_grad(
      lambda p: _reference_policy_gradient(nnx.merge(graphdef, p, rest), batch, config)[0])(params)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
  for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6)


def _run_steps(config, steps=2, optimizer=None, remat=False):
  trainable, state = train_step.create(step_fixtures.tiny_model(remat=remat),
                                       optimizer or step_fixtures.optimizer(), config,
                                       _one_device_mesh())
  history = []
  for i in range(steps):
    state, metrics = trainable.step(state, trainable.put_batch(step_fixtures.batch(i)))
    history.append({k: float(v) for k, v in metrics.items()})
  return state, history


def test_micro_batched_accumulation_equals_full_batch():
  # Plain SGD, so that parameters compare the accumulated gradients themselves (Adam's
  # m/sqrt(v) would amplify float32 reordering noise on near-zero gradients).
  sgd = optax.sgd(0.5)
  full_state, full = _run_steps(step_fixtures.step_config(micro_batches=1), optimizer=sgd)
  for micro in (2, 4):
    state, hist = _run_steps(step_fixtures.step_config(micro_batches=micro), optimizer=sgd)
    for a, b in zip(full, hist):
      for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6, err_msg=key)
    moved = 0.0
    for a, b, p0 in zip(jax.tree.leaves(full_state.params), jax.tree.leaves(state.params),
                        jax.tree.leaves(nnx.state(step_fixtures.tiny_model(), nnx.Param))):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
      moved = max(moved, float(np.abs(np.asarray(a) - np.asarray(p0)).max()))
    assert moved > 1e-3   # the steps really changed the parameters


def test_micro_batches_with_remat_equal_the_full_batch():
  """The SmolLM2 main job runs remat + micro-batches: nnx.remat under the micro-batch scan."""
  sgd = optax.sgd(0.5)
  full_state, full = _run_steps(step_fixtures.step_config(), steps=1, optimizer=sgd)
  state, hist = _run_steps(step_fixtures.step_config(micro_batches=2), steps=1, optimizer=sgd,
                           remat=True)
  np.testing.assert_allclose(full[0]["loss"], hist[0]["loss"], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(full_state.params), jax.tree.leaves(state.params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_token_mean_micro_batches_with_seq_sum_norm():
  for agg in ("token-mean", "seq-mean-token-sum-norm"):
    cfg = dict(aggregation=agg, seq_len_norm=16.0)
    _, full = _run_steps(step_fixtures.step_config(micro_batches=1, **cfg), steps=1)
    _, micro = _run_steps(step_fixtures.step_config(micro_batches=2, **cfg), steps=1)
    np.testing.assert_allclose(full[0]["loss"], micro[0]["loss"], rtol=1e-5)


def test_ema_and_frozen_teachers():
  ema = step_fixtures.step_config(teacher="ema", ema_rate=0.25)
  trainable, state = train_step.create(step_fixtures.tiny_model(), step_fixtures.optimizer(),
                                       ema, _one_device_mesh())
  init = jax.tree.map(np.asarray, state.params)
  state, _ = trainable.step(state, trainable.put_batch(step_fixtures.batch(0)))
  for t, p, p0 in zip(jax.tree.leaves(state.teacher_params), jax.tree.leaves(state.params),
                      jax.tree.leaves(init)):
    np.testing.assert_allclose(t, p0 + 0.25 * (np.asarray(p) - p0), rtol=1e-6, atol=1e-7)

  frozen = dataclasses.replace(ema, teacher="frozen")
  trainable, state = train_step.create(step_fixtures.tiny_model(), step_fixtures.optimizer(),
                                       frozen, _one_device_mesh())
  for i in range(2):
    state, _ = trainable.step(state, trainable.put_batch(step_fixtures.batch(i)))
  for t, p0 in zip(jax.tree.leaves(state.teacher_params), jax.tree.leaves(init)):
    np.testing.assert_array_equal(t, p0)


def test_no_teacher_rows_and_beta_zero_give_plain_grpo():
  """Distillation with an all-zero distill mask, or β = 0, leaves the GRPO update unchanged."""
  _, plain = _run_steps(step_fixtures.step_config(beta=0.0), steps=1)
  trainable, state = train_step.create(step_fixtures.tiny_model(), step_fixtures.optimizer(),
                                       step_fixtures.step_config(beta=0.1), _one_device_mesh())
  batch = step_fixtures.batch(0)
  batch["distill_mask"][:] = 0
  _, metrics = trainable.step(state, trainable.put_batch(batch))
  np.testing.assert_allclose(float(metrics["loss"]), plain[0]["loss"], rtol=1e-6)
  np.testing.assert_allclose(float(metrics["grad_norm"]), plain[0]["grad_norm"], rtol=1e-5)


def test_missing_batch_key_is_a_clear_error():
  trainable, _ = train_step.create(step_fixtures.tiny_model(), step_fixtures.optimizer(),
                                   step_fixtures.step_config(), _one_device_mesh())
  batch = step_fixtures.batch(0)
  del batch["teacher_input_ids"]
  with pytest.raises(KeyError, match="teacher_input_ids"):
    trainable.put_batch(batch)


def test_bad_step_config_is_a_clear_error():
  with pytest.raises(ValueError, match="aggregation"):
    train_step.StepConfig(policy_gradient=loss_terms.PolicyGradientConfig(aggregation="mean"))


# ----------------------------------------------------------------------------- subprocesses


def _harness(tmp_path: Path, name: str, *args: str, env_extra=None, background=False):
  out = tmp_path / f"{name}.npz"
  cmd = [sys.executable, str(HARNESS), "--out", str(out), *args]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  env.update(env_extra or {})
  if background:
    return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True), out
  proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  return out


def _load(path: Path):
  data = np.load(path)
  params = {k: data[k] for k in data.files if k.startswith("param")}
  return data["metrics"], params, int(data["step"])


def _assert_same(a, b, *, exact=False, tol=1e-5):
  metrics_a, params_a, step_a = a
  metrics_b, params_b, step_b = b
  assert step_a == step_b
  assert params_a.keys() == params_b.keys()
  if exact:
    np.testing.assert_array_equal(metrics_a, metrics_b)
    for k in params_a:
      np.testing.assert_array_equal(params_a[k], params_b[k], err_msg=k)
  else:
    np.testing.assert_allclose(metrics_a, metrics_b, rtol=tol, atol=tol)
    for k in params_a:
      np.testing.assert_allclose(params_a[k], params_b[k], rtol=tol, atol=tol, err_msg=k)


@pytest.fixture(scope="module")
def single_device_run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("single")
  return _load(_harness(tmp, "single", "--devices", "1", "--mesh", "1,1,1", "--steps", "3"))


@pytest.mark.parametrize("mesh", ["1,2,2", "1,4,1", "2,2,1"])
def test_sharded_step_equals_single_device(tmp_path, single_device_run, mesh):
  sharded = _load(_harness(tmp_path, "sharded", "--devices", "4", "--mesh", mesh, "--steps", "3"))
  _assert_same(single_device_run, sharded)



def test_sharded_shared_prefix_step_equals_single_device(tmp_path):
  """Groups of 2 rows sharing a prefix: on one device, sharded over 4 (one group a data
  shard), and over 2 with two micro-batches of one group on each.

  Compiled afresh: the 4-device executable of this step, loaded from JAX's persistent
  compilation cache, deadlocks in a collective rendezvous on XLA:CPU (jax 0.10.2; the row
  layout's does not; docs/performance.md)."""
  group = ("--shared-prefix", "2", "--steps", "2")
  fresh = {"JAX_ENABLE_COMPILATION_CACHE": "false"}
  single = _load(_harness(tmp_path, "single_shared", "--devices", "1", "--mesh", "1,1,1",
                          *group, env_extra=fresh))
  _assert_same(single, _load(_harness(tmp_path, "sharded_shared", "--devices", "4", "--mesh",
                                      "2,2,1", *group, env_extra=fresh)))
  _assert_same(single, _load(_harness(tmp_path, "micro_shared", "--devices", "2", "--mesh",
                                      "1,2,1", "--micro-batches", "2", *group,
                                      env_extra=fresh)))


def _two_processes(tmp_path: Path, *args: str, env_extra=None):
  """The harness as two processes of 2 CPU devices each (mesh 1,2,2); process 0's output."""
  port = free_port()
  procs = [_harness(tmp_path, f"host{pid}", "--devices", "2", "--mesh", "1,2,2", *args,
                    "--num-processes", "2", "--process-id", str(pid),
                    "--coordinator", f"127.0.0.1:{port}", env_extra=env_extra, background=True)
           for pid in range(2)]
  outputs = [proc.communicate(timeout=600)[0] for proc, _ in procs]
  for (proc, _), stdout in zip(procs, outputs):
    assert proc.returncode == 0, stdout
  return _load(procs[0][1])


def test_multi_host_two_processes_equal_single_device(tmp_path, single_device_run):
  _assert_same(single_device_run, _two_processes(tmp_path, "--steps", "3"))


def test_multi_host_shared_prefix_step_equals_single_device(tmp_path):
  """Groups of 2 rows sharing a prefix, over two processes (compiled afresh, as above)."""
  group = ("--shared-prefix", "2", "--steps", "2")
  fresh = {"JAX_ENABLE_COMPILATION_CACHE": "false"}
  single = _load(_harness(tmp_path, "single_shared", "--devices", "1", "--mesh", "1,1,1",
                          *group, env_extra=fresh))
  _assert_same(single, _two_processes(tmp_path, *group, env_extra=fresh))


def test_checkpoint_resume_is_bit_exact_and_reshards(tmp_path):
  straight = _load(_harness(tmp_path, "straight", "--devices", "4", "--mesh", "1,4,1",
                            "--steps", "6"))
  ckpt = tmp_path / "ckpt"
  _harness(tmp_path, "first", "--devices", "4", "--mesh", "1,4,1", "--steps", "3",
           "--save-dir", str(ckpt))
  resumed = _load(_harness(tmp_path, "resumed", "--devices", "4", "--mesh", "1,4,1",
                           "--steps", "3", "--first-step", "3", "--save-dir", str(ckpt),
                           "--restore"))
  _assert_same((straight[0][3:], straight[1], straight[2]), resumed, exact=True)
  # Restore onto a different mesh: same numbers up to reduction order.
  other = _load(_harness(tmp_path, "other_mesh", "--devices", "4", "--mesh", "1,2,2",
                         "--steps", "3", "--first-step", "3", "--save-dir", str(ckpt),
                         "--restore"))
  _assert_same((straight[0][3:], straight[1], straight[2]), other)


@pytest.mark.parametrize("schedule, expected", [
    # warm-up 0 → 1 over 2 steps, then 8 decay steps to end_learning_rate = 0
    ("constant", [0.0, 0.5, 1.0, 1.0, 1.0, 1.0]),
    ("cosine", [0.0, 0.5, 1.0, 0.5 * (1 + np.cos(np.pi * 2 / 8)), 0.5, 0.0]),
    ("linear", [0.0, 0.5, 1.0, 0.75, 0.5, 0.0]),
])
def test_learning_rate_schedules(schedule, expected):
  lr = train_step.make_schedule(train_step.OptimizerConfig(
      learning_rate=1.0, warmup_steps=2, schedule=schedule, total_steps=10))
  np.testing.assert_allclose([float(lr(s)) for s in (0, 1, 2, 4, 6, 10)], expected, atol=1e-6)
  with pytest.raises(ValueError, match="schedule"):
    train_step.OptimizerConfig(schedule="step")
