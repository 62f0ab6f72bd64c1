"""The fused step with CriPO's branches on real teacher rows, against an independent reference.

The reference is written per row from the paper's definitions: each row unpadded (its prefix and
its response only), full-vocabulary logits of the whole row at once (no chunking), the KL,
localisation, flip rule and the seq-mean-token-mean GRPO loss in numpy / plain jnp. The step sees
the same rows left-padded into buckets, chunked, micro-batched. Compared: loss, gradients, the
kept and flipped token counts, and the micro-batch invariance of the kept-token normaliser.
"""
from __future__ import annotations

import dataclasses
import math
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
from rised_jax.learn import batching, train_step
from tests.helpers import step_fixtures

ROWS = 8
CLAMP = 10.0
GAMMA = 0.95
EDGE = 0.1          # large enough that 10–30-token answers have edges (the paper's 1 % needs ≥ 100)
ALPHA, TAU = 0.1, 0.1
BETA = 0.2
CAP = 2.0


def peaky_model():
  """The tiny Qwen3 with its head scaled up, so that p_T(y) < α max p_T happens often."""
  model = step_fixtures.tiny_model()
  model.lm_head[...] = model.lm_head[...] * 25.0
  return model


def cripo_rows(seed: int = 3) -> list[batching.Row]:
  """Rows of mixed-sign advantage; every third row distils; the negative rows and row 1 (A > 0:
  the step's rule must check A < 0 itself) have a counterfactual teacher."""
  rng = np.random.default_rng(seed)
  vocab = step_fixtures.VOCAB
  rows = []
  for r in range(ROWS):
    n = int(rng.integers(6, 31))
    advantage = float(rng.normal())
    advantage = -abs(advantage) if r % 2 == 0 else abs(advantage) if r == 1 else advantage
    rows.append(batching.Row(
        prefix_ids=rng.integers(1, vocab, rng.integers(3, 9)).tolist(),
        response_ids=rng.integers(1, vocab, n).tolist(),
        response_loss_mask=(rng.random(n) < 0.85).astype(int).tolist(),
        response_behaviour_logprobs=(-rng.random(n) * 4).tolist(),
        advantage=advantage,
        teacher_prefix_ids=(rng.integers(1, vocab, rng.integers(3, 11)).tolist()
                            if r % 3 == 0 else None),
        cf_teacher_prefix_ids=(rng.integers(1, vocab, rng.integers(3, 11)).tolist()
                               if advantage < 0 or r == 1 else None)))
  return rows


def step_config(**overrides) -> train_step.StepConfig:
  base = dict(beta=BETA, chunk=8, clamp=CLAMP, localize=True, localize_gamma=GAMMA,
              localize_edge_frac=EDGE, distill_norm="kept-tokens", counterfactual=True,
              flip_alpha=ALPHA, flip_tau=TAU, importance_cap=CAP)
  base.update(overrides)
  return train_step.StepConfig.from_keys(base)


def assemble(rows):
  return batching.assemble(rows, pad_id=0, prefix_multiple=4, response_multiple=8,
                           with_distill=True, with_counterfactual=True)


# ------------------------------------------------------------------------------ the reference


def response_log_softmax(model, prefix, response):
  """log p(· | row[:t]) at the response positions of the unpadded row: [n, V] float32."""
  ids = jnp.asarray([list(prefix) + list(response)], jnp.int32)
  logits = model(ids, jnp.ones_like(ids))[0]
  return jax.nn.log_softmax(logits[len(prefix) - 1:-1].astype(jnp.float32), axis=-1)


def jitted(model, fn):
  """fn(model) compiled once as a function of the parameters (eager model calls are slow)."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  return jax.jit(lambda p: fn(nnx.merge(graphdef, p, rest))), params


def reference_kept(kl: np.ndarray, distilled: np.ndarray) -> np.ndarray:
  """Localisation by loops: edges by position among the distilled tokens, then greedy by KL."""
  kept = np.zeros(len(kl), bool)
  positions = np.flatnonzero(distilled)
  n = len(positions)
  edge = math.floor(EDGE * n + 1e-9)
  inner = positions[edge:n - edge]
  values = np.minimum(kl[inner], CLAMP).astype(np.float64)
  total = values.sum()
  if total <= 0:
    return kept
  running = 0.0
  for k in sorted(range(len(inner)), key=lambda k: (-values[k], k)):
    kept[inner[k]] = True
    running += values[k]
    if running >= GAMMA * total * (1 - 1e-6):
      break
  return kept


def reference_distributions(model, rows):
  """Per row, the [n, V] log-probs under the student, injection and counterfactual prefixes."""
  def all_rows(m):
    return [{name: response_log_softmax(m, prefix, row.response_ids)
             for name, prefix in (("student", row.prefix_ids), ("teacher", row.teacher_prefix_ids),
                                  ("cf", row.cf_teacher_prefix_ids)) if prefix is not None}
            for row in rows]
  fn, params = jitted(model, all_rows)
  return [{k: np.asarray(v) for k, v in d.items()} for d in fn(params)]


def reference_masks(model, rows):
  """Per row: kept tokens (UC branch) and flipped tokens (SC branch), from full logits."""
  kept, flipped = [], []
  for row, dists in zip(rows, reference_distributions(model, rows)):
    loss = np.asarray(row.response_loss_mask) > 0
    student = dists["student"]
    y = np.asarray(row.response_ids)
    logp_s = student[np.arange(len(y)), y]
    if row.teacher_prefix_ids is not None:
      teacher = dists["teacher"].astype(np.float64)
      kl = (np.exp(teacher) * (teacher - student)).sum(-1)
      kept.append(reference_kept(kl, loss))
    else:
      kept.append(np.zeros(len(y), bool))
    if row.cf_teacher_prefix_ids is not None and row.advantage < 0:
      cf = dists["cf"]
      logp_t = cf[np.arange(len(y)), y]
      flipped.append(loss & (logp_s - logp_t > 0) & (logp_t - cf.max(-1) < math.log(ALPHA)))
    else:
      flipped.append(np.zeros(len(y), bool))
  return kept, flipped


def reference_loss(model, rows, kept, flipped, *, beta, distill=True, clamp_loss=True):
  """seq-mean-token-mean GRPO on the edited advantages + β · (Σ kept KL / number kept)."""
  row_losses, kl_sum = [], 0.0
  for row, keep, flip in zip(rows, kept, flipped):
    loss = jnp.asarray(row.response_loss_mask, jnp.float32)
    y = jnp.asarray(row.response_ids)
    student = response_log_softmax(model, row.prefix_ids, row.response_ids)
    logp = student[jnp.arange(len(row.response_ids)), y]
    old = jax.lax.stop_gradient(logp)
    advantage = jnp.where(jnp.asarray(flip), TAU, row.advantage)
    ratio = jnp.exp(logp - old)
    per_token = -jnp.minimum(ratio * advantage, jnp.clip(ratio, 0.8, 1.2) * advantage)
    weight = jnp.minimum(jnp.exp(old - jnp.asarray(row.response_behaviour_logprobs)), CAP)
    count = int(np.sum(row.response_loss_mask))
    if count:
      row_losses.append((per_token * weight * loss).sum() / count)
    if distill and row.teacher_prefix_ids is not None:
      teacher = jax.lax.stop_gradient(
          response_log_softmax(model, row.teacher_prefix_ids, row.response_ids))
      kl = (jnp.exp(teacher) * (teacher - student)).sum(-1)
      kl = jnp.minimum(kl, CLAMP) if clamp_loss else kl
      kl_sum = kl_sum + (kl * jnp.asarray(keep)).sum()
  total = sum(row_losses) / len(row_losses)
  kept_count = sum(int(k.sum()) for k in kept)
  if distill and kept_count:
    total = total + beta * kl_sum / kept_count
  return total


# ------------------------------------------------------------------------------ the step


def one_sgd_step(model, config, batch, mesh=None):
  """Metrics and the gradient (parameters before − after one SGD step with rate 1)."""
  mesh = mesh or parallel.make_mesh(parallel.MeshShape(1, 1, 1), devices=jax.devices()[:1])
  trainable, state = train_step.create(model, optax.sgd(1.0), config, mesh)
  before = jax.tree.map(np.asarray, jax.device_get(state.params))
  state, metrics = trainable.step(state, trainable.put_batch(batch))
  after = jax.device_get(state.params)
  grads = jax.tree.map(lambda b, a: b - np.asarray(a), before, after)
  return {k: float(v) for k, v in metrics.items()}, grads


def reference_grads(model, rows, kept, flipped, **kwargs):
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def loss_fn(p):
    return reference_loss(nnx.merge(graphdef, p, rest), rows, kept, flipped, **kwargs)

  return jax.jit(jax.value_and_grad(loss_fn))(params)


def assert_grads_close(grads, ref_grads):
  for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=2e-3, atol=2e-6)


@pytest.fixture(scope="module")
def reference():
  model, rows = peaky_model(), cripo_rows()
  kept, flipped = reference_masks(model, rows)
  loss, grads = reference_grads(model, rows, kept, flipped, beta=BETA)
  return dict(rows=rows, kept=kept, flipped=flipped, loss=float(loss), grads=grads)


def test_the_reference_case_exercises_both_branches(reference):
  kept, flipped, rows = reference["kept"], reference["flipped"], reference["rows"]
  distilled = sum(int(np.sum(r.response_loss_mask)) for r in rows if r.teacher_prefix_ids)
  assert 0 < sum(k.sum() for k in kept) < distilled               # localisation drops tokens
  assert sum(f.sum() for f in flipped) >= 5                      # flips happen


@pytest.mark.parametrize("micro_batches", [1, 2, 4, 8])
def test_fused_step_with_both_branches_equals_the_per_row_reference(reference, micro_batches):
  metrics, grads = one_sgd_step(peaky_model(), step_config(micro_batches=micro_batches),
                                assemble(reference["rows"]))
  rows, kept, flipped = reference["rows"], reference["kept"], reference["flipped"]
  assert metrics["kept_tokens"] == sum(k.sum() for k in kept)
  assert metrics["flipped_tokens"] == sum(f.sum() for f in flipped)
  distill_tokens = sum(int(np.sum(r.response_loss_mask)) for r in rows if r.teacher_prefix_ids)
  cf_tokens = sum(int(np.sum(r.response_loss_mask)) for r in rows if r.cf_teacher_prefix_ids)
  assert (metrics["distill_tokens"], metrics["cf_tokens"]) == (distill_tokens, cf_tokens)
  assert metrics["kept_frac"] == pytest.approx(metrics["kept_tokens"] / distill_tokens)
  assert metrics["flip_frac"] == pytest.approx(metrics["flipped_tokens"] / cf_tokens)
  np.testing.assert_allclose(metrics["loss"], reference["loss"], rtol=1e-5, atol=1e-6)
  assert_grads_close(grads, reference["grads"])


def test_clamp_for_the_ranking_only_keeps_the_gradient_of_the_top_tokens(reference):
  """clamp_loss=False: tokens with KL > 10 (two here) are ranked as 10 but trained unclamped."""
  rows, kept, flipped = reference["rows"], reference["kept"], reference["flipped"]
  loss, ref_grads = reference_grads(peaky_model(), rows, kept, flipped, beta=BETA,
                                    clamp_loss=False)
  assert float(loss) > reference["loss"] + 1e-4     # the clamp was active in the paper setting
  metrics, grads = one_sgd_step(peaky_model(), step_config(micro_batches=2, clamp_loss=False),
                                assemble(rows))
  assert metrics["kept_tokens"] == sum(k.sum() for k in kept)
  np.testing.assert_allclose(metrics["loss"], float(loss), rtol=1e-5, atol=1e-6)
  assert_grads_close(grads, ref_grads)


SHARDED = """
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, numpy as np
from rised_jax import parallel
from tests.learn import test_cripo_step as t
mesh = parallel.make_mesh(parallel.MeshShape(2, 2, 1))
metrics, grads = t.one_sgd_step(t.peaky_model(), t.step_config(micro_batches=2),
                                t.assemble(t.cripo_rows()), mesh)
np.savez(sys.argv[1], *jax.tree.leaves(grads), **{"metric_" + k: v for k, v in metrics.items()})
"""


def test_kept_token_normaliser_is_exact_over_data_shards_and_micro_batches(reference, tmp_path):
  """4 devices (data 2 × fsdp 2) × 2 micro-batches: the same update as the reference."""
  out = tmp_path / "sharded.npz"
  repo = Path(__file__).resolve().parents[2]
  env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
  subprocess.run([sys.executable, "-c", SHARDED, str(out)], check=True, cwd=repo, env=env,
                 timeout=600)
  result = np.load(out)
  assert result["metric_kept_tokens"] == sum(k.sum() for k in reference["kept"])
  assert result["metric_flipped_tokens"] == sum(f.sum() for f in reference["flipped"])
  np.testing.assert_allclose(result["metric_loss"], reference["loss"], rtol=1e-5, atol=1e-6)
  assert_grads_close([result[f"arr_{i}"] for i in range(len(jax.tree.leaves(reference["grads"])))],
                     reference["grads"])


def test_both_branches_off_is_plain_rubric_grpo_of_the_reference(reference):
  rows = reference["rows"]
  none = [np.zeros(len(r.response_ids), bool) for r in rows]
  loss, ref_grads = reference_grads(peaky_model(), rows, none, none, beta=0.0, distill=False)
  metrics, grads = one_sgd_step(
      peaky_model(), step_config(beta=0.0, localize=False, counterfactual=False),
      assemble(rows))
  np.testing.assert_allclose(metrics["loss"], float(loss), rtol=1e-5, atol=1e-6)
  assert_grads_close(grads, ref_grads)
  # ... and it differs from the CriPO step on these rows (both branches change the update).
  assert abs(metrics["loss"] - reference["loss"]) > 1e-3


def test_distill_tokens_normaliser_is_kept_fraction_times_the_paper_one(reference):
  """The alternative normaliser: L_distill divided by all distillation tokens, not kept ones."""
  metrics, _ = one_sgd_step(peaky_model(), step_config(distill_norm="distill-tokens",
                                                       micro_batches=4),
                            assemble(reference["rows"]))
  kept = sum(k.sum() for k in reference["kept"])
  none = [np.zeros(len(r.response_ids), bool) for r in reference["rows"]]
  pg_only = float(reference_grads(peaky_model(), reference["rows"], none, reference["flipped"],
                                  beta=BETA, distill=False)[0])
  distill_paper = (reference["loss"] - pg_only) / BETA
  np.testing.assert_allclose(metrics["loss"], pg_only + BETA * distill_paper * kept
                             / metrics["distill_tokens"], rtol=1e-5)


def test_pre_pass_runs_only_when_needed():
  assert step_config(micro_batches=2).kept_pre_pass
  assert not step_config(micro_batches=1).kept_pre_pass
  assert not step_config(micro_batches=2, distill_norm="distill-tokens").kept_pre_pass
  localized = step_config(micro_batches=2)
  assert not dataclasses.replace(localized, teacher_kl=dataclasses.replace(
      localized.teacher_kl, localize=False)).kept_pre_pass


def test_several_iterations_keep_the_old_policys_kept_set_and_flips(reference):
  """μ = 2: both updates use the kept set and flips of the parameters before the first update
  (the reference's), although the updated parameters would choose other ones."""
  config = step_config(num_iterations=2, max_update_ratio=100.0)   # a large move on purpose
  mesh = parallel.make_mesh(parallel.MeshShape(1, 1, 1), devices=jax.devices()[:1])
  trainable, state = train_step.create(peaky_model(), optax.sgd(3.0), config, mesh)
  batch = trainable.put_batch(assemble(reference["rows"]))
  state, metrics = trainable.step(state, batch)
  kept = sum(k.sum() for k in reference["kept"])
  flipped = sum(f.sum() for f in reference["flipped"])
  assert float(metrics["skipped_large_update"]) == 0
  assert (float(metrics["kept_tokens"]), float(metrics["flipped_tokens"])) == (kept, flipped)
  after = train_step.old_policy_pass(state.params, trainable.rest, None, trainable.graphdef,
                                     config, batch)
  assert (float(after["kept_mask"].sum()), float(after["flipped"].sum())) != (kept, flipped)
