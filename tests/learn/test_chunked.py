"""Chunked token statistics: values and gradients against unchunked references, memory shape.

References: float64 numpy (values, and the analytic gradients of log-prob, entropy and forward
KL through logits = h @ W), and an unchunked JAX computation over full [B, T, V] logits built
from `losses` (itself tested against numpy) for the other divergences and the softcap head.
"""
import math
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rised_jax.learn import chunked, losses

B, T, D, V = 2, 13, 8, 48        # T − 1 = 12 predicted columns
RTOL, ATOL = 1e-5, 1e-5
SOFTCAP = 3.0


@pytest.fixture(scope="module")
def data():
  rng = np.random.default_rng(0)
  f32 = lambda x: np.asarray(x, np.float32)
  return dict(
      student=f32(rng.normal(size=(B, T, D))),
      teacher=f32(rng.normal(size=(B, T, D))),
      w=f32(2.0 * rng.normal(size=(D, V)) / np.sqrt(D)),
      targets=rng.integers(0, V, size=(B, T)).astype(np.int32),
      # Random per-column loss weights, so that a misaligned column changes the gradient.
      coef=f32(rng.normal(size=(3, B, T))),
  )


def linear_head(w):
  return lambda h: h @ w


def softcap_head(w):
  return lambda h: SOFTCAP * jnp.tanh((h @ w) / SOFTCAP)


def objective(stats: chunked.TokenStats, coef) -> jax.Array:
  return (coef[0] * stats.logprob + coef[1] * stats.entropy + coef[2] * stats.divergence).sum()


def chunked_loss(student, teacher, w, targets, coef, head=linear_head, **kwargs):
  stats = chunked.token_stats_chunked(student, teacher, head(w), targets, **kwargs)
  return objective(stats, coef), stats


def unchunked_stats(student, teacher, w, targets, head=linear_head, *, divergence="forward-kl",
                    topk=None, clamp=None, divergence_options=None, teacher_w=None):
  """The same statistics from full [B, T − 1, V] logits, aligned to the target column."""
  logp = lambda h, w: jax.nn.log_softmax(head(w)(h[:, :-1]), axis=-1)
  s_logp = logp(student, w)
  t_logp = jax.lax.stop_gradient(logp(teacher, w if teacher_w is None else teacher_w))
  y = targets[:, 1:, None]
  s_tok = jnp.take_along_axis(s_logp, y, -1)[..., 0]
  t_tok = jnp.take_along_axis(t_logp, y, -1)[..., 0]
  if divergence == chunked.SAMPLED_TOKEN:
    div = losses.sampled_token_surrogate(s_tok, t_tok, clamp=clamp)
  else:
    div = losses.logprob_divergence(s_logp, t_logp, divergence=divergence, topk=topk,
                                    clamp=clamp, options=divergence_options)
  col = lambda x: jnp.pad(x, [(0, 0), (1, 0)])
  return chunked.TokenStats(col(s_tok), col(-(jnp.exp(s_logp) * s_logp).sum(-1)), col(div),
                            col(t_tok), col(t_logp.max(-1)))


def numpy_reference(data, with_teacher=True):
  """Values and analytic gradients (w.r.t. student hidden and W) in float64, forward KL."""
  student, teacher, w = (data[k].astype(np.float64) for k in ("student", "teacher", "w"))
  targets, coef = data["targets"], data["coef"].astype(np.float64)

  def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))

  s_logp = log_softmax(student[:, :-1] @ w)
  s_p = np.exp(s_logp)
  t_logp = log_softmax(teacher[:, :-1] @ w)
  t_p = np.exp(t_logp)
  y = targets[:, 1:]
  values = {k: np.zeros((B, T)) for k in ("logprob", "entropy", "divergence",
                                          "teacher_logprob", "teacher_log_max_prob")}
  grad_logits = np.zeros_like(s_logp)
  for b in range(B):
    for t in range(T - 1):
      onehot = np.eye(V)[y[b, t]]
      entropy = -(s_p[b, t] * s_logp[b, t]).sum()
      values["logprob"][b, t + 1] = s_logp[b, t, y[b, t]]
      values["entropy"][b, t + 1] = entropy
      a, e, c = coef[:, b, t + 1]
      # d log p(y)/dz = onehot − p;  dH/dz = −p (log p + H);  d KL(T‖S)/dz_S = p_S − p_T.
      grad_logits[b, t] = a * (onehot - s_p[b, t]) - e * s_p[b, t] * (s_logp[b, t] + entropy)
      if with_teacher:
        values["divergence"][b, t + 1] = (t_p[b, t] * (t_logp[b, t] - s_logp[b, t])).sum()
        values["teacher_logprob"][b, t + 1] = t_logp[b, t, y[b, t]]
        values["teacher_log_max_prob"][b, t + 1] = t_logp[b, t].max()
        grad_logits[b, t] += c * (s_p[b, t] - t_p[b, t])
  grad_student = np.zeros_like(student)
  grad_student[:, :-1] = grad_logits @ w.T
  grad_w = np.einsum("btd,btv->dv", student[:, :-1], grad_logits)
  return values, grad_student, grad_w


# chunk 4 divides the 12 predicted columns; 5 does not (padded to 15); 16 exceeds them.
@pytest.mark.parametrize("chunk", [4, 5, 16])
def test_forward_kl_matches_numpy_values_and_gradients(data, chunk):
  values, grad_student, grad_w = numpy_reference(data)
  fn = jax.jit(jax.value_and_grad(
      lambda s, t, w: chunked_loss(s, t, w, data["targets"], data["coef"], chunk=chunk,
                                   want_teacher_token_stats=True), argnums=(0, 1, 2),
      has_aux=True))
  (_, stats), (g_student, g_teacher, g_w) = fn(data["student"], data["teacher"], data["w"])
  for name, want in values.items():
    np.testing.assert_allclose(getattr(stats, name), want, rtol=RTOL, atol=ATOL, err_msg=name)
  np.testing.assert_allclose(g_student, grad_student, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(g_w, grad_w, rtol=RTOL, atol=ATOL)
  np.testing.assert_array_equal(g_teacher, 0.0)        # the teacher is a constant


def test_without_teacher_matches_numpy(data):
  values, grad_student, grad_w = numpy_reference(data, with_teacher=False)
  fn = jax.jit(jax.value_and_grad(
      lambda s, w: chunked_loss(s, None, w, data["targets"], data["coef"], chunk=5),
      argnums=(0, 1), has_aux=True))
  (_, stats), (g_student, g_w) = fn(data["student"], data["w"])
  for name in ("logprob", "entropy"):
    np.testing.assert_allclose(getattr(stats, name), values[name], rtol=RTOL, atol=ATOL)
  np.testing.assert_array_equal(stats.divergence, 0.0)
  assert stats.teacher_logprob is None and stats.teacher_log_max_prob is None
  np.testing.assert_allclose(g_student, grad_student, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(g_w, grad_w, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("head,chunk,settings", [
    (linear_head, 5, dict(divergence="reverse-kl")),
    (linear_head, 4, dict(divergence="jsd", divergence_options={"beta": 0.3})),
    (linear_head, 5, dict(divergence="forward-kl", topk=6, clamp=1.5)),
    (linear_head, 5, dict(divergence=chunked.SAMPLED_TOKEN, clamp=0.5)),
    (softcap_head, 5, dict(divergence="forward-kl")),
], ids=["reverse-kl", "jsd-0.3", "topk6-clamp", "sampled-token", "softcap"])
def test_matches_unchunked_reference(data, head, chunk, settings):
  args = (data["student"], data["teacher"], data["w"])

  def reference_loss(student, teacher, w):
    return objective(unchunked_stats(student, teacher, w, data["targets"], head, **settings),
                     data["coef"])

  got_value, got_grads = jax.jit(jax.value_and_grad(
      lambda s, t, w: chunked_loss(s, t, w, data["targets"], data["coef"], head, chunk=chunk,
                                   **settings)[0], argnums=(0, 1, 2)))(*args)
  want_value, want_grads = jax.jit(jax.value_and_grad(reference_loss, argnums=(0, 1, 2)))(*args)
  np.testing.assert_allclose(got_value, want_value, rtol=RTOL)
  for got, want, name in zip(got_grads, want_grads, ("student", "teacher", "w")):
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=name)
  assert np.abs(np.asarray(got_grads[0])).max() > 0


def test_teacher_with_its_own_head(data):
  """An EMA or frozen teacher has its own unembedding: it is used, and gets no gradient."""
  teacher_w = (0.5 * data["w"][:, ::-1]).copy()
  args = (data["student"], data["teacher"], data["w"], teacher_w)

  def chunked_total(s, t, w, tw):
    stats = chunked.token_stats_chunked(s, t, linear_head(w), data["targets"], chunk=5,
                                        teacher_logits_fn=linear_head(tw),
                                        want_teacher_token_stats=True)
    return objective(stats, data["coef"]) + stats.teacher_logprob.sum(), stats

  def reference_total(s, t, w, tw):
    stats = unchunked_stats(s, t, w, data["targets"], teacher_w=tw)
    return objective(stats, data["coef"]) + stats.teacher_logprob.sum(), stats

  (got, got_stats), got_grads = jax.jit(jax.value_and_grad(chunked_total, (0, 1, 2, 3),
                                                           True))(*args)
  (want, want_stats), want_grads = jax.jit(jax.value_and_grad(reference_total, (0, 1, 2, 3),
                                                              True))(*args)
  np.testing.assert_allclose(got, want, rtol=RTOL)
  np.testing.assert_allclose(got_stats.teacher_log_max_prob, want_stats.teacher_log_max_prob,
                             rtol=RTOL, atol=ATOL)
  for g, w_, name in zip(got_grads, want_grads, ("student", "teacher", "w", "teacher_w")):
    np.testing.assert_allclose(g, w_, rtol=RTOL, atol=ATOL, err_msg=name)
  np.testing.assert_array_equal(got_grads[3], 0.0)
  # With the student's own head instead the divergence differs: the teacher head is used.
  same_head = chunked.token_stats_chunked(*args[:2], linear_head(data["w"]), data["targets"],
                                          chunk=5)
  assert np.abs(np.asarray(same_head.divergence - got_stats.divergence)).max() > 1e-2


@pytest.mark.parametrize("chunk", [4, 5])
def test_teacher_only_pass_matches_numpy(data, chunk):
  values, _, _ = numpy_reference(data)

  def total(t, w):
    logprob, log_max = chunked.teacher_token_stats_chunked(t, linear_head(w), data["targets"],
                                                           chunk=chunk)
    return (logprob + log_max).sum(), (logprob, log_max)

  (_, (logprob, log_max)), grads = jax.jit(jax.value_and_grad(total, (0, 1), True))(
      data["teacher"], data["w"])
  np.testing.assert_allclose(logprob, values["teacher_logprob"], rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(log_max, values["teacher_log_max_prob"], rtol=RTOL, atol=ATOL)
  for g in grads:
    np.testing.assert_array_equal(g, 0.0)


def largest_intermediate(closed_jaxpr) -> tuple[int, tuple[int, ...]]:
  """The element count and shape of the largest value in a jaxpr and all its sub-jaxprs."""
  best = (0, ())

  def visit(jaxpr):
    nonlocal best
    for var in list(jaxpr.invars) + [v for eqn in jaxpr.eqns for v in eqn.outvars]:
      shape = tuple(getattr(var.aval, "shape", ()))
      best = max(best, (math.prod(shape), shape))
    for eqn in jaxpr.eqns:
      for param in eqn.params.values():
        for sub in param if isinstance(param, (tuple, list)) else (param,):
          if hasattr(sub, "eqns"):
            visit(sub)
          elif hasattr(getattr(sub, "jaxpr", None), "eqns"):
            visit(sub.jaxpr)

  visit(closed_jaxpr.jaxpr)
  return best


def test_no_full_logits_in_forward_or_backward(data):
  chunk = 4
  full_logits = B * (T - 1) * V
  settings = dict(divergence="forward-kl", topk=6, want_teacher_token_stats=True)
  args = (data["student"], data["teacher"], data["w"])

  def chunked_total(s, t, w):
    stats = chunked.token_stats_chunked(s, t, linear_head(w), data["targets"], chunk=chunk,
                                        **settings)
    return objective(stats, data["coef"]) + stats.teacher_log_max_prob.sum()

  def unchunked_total(s, t, w):
    return objective(unchunked_stats(s, t, w, data["targets"], topk=6), data["coef"])

  size, shape = largest_intermediate(jax.make_jaxpr(jax.grad(chunked_total, (0, 2)))(*args))
  assert size <= B * chunk * V, f"chunked step holds a {shape} array"
  # The check can fail: the unchunked computation does hold [B, T − 1, V] arrays.
  size, shape = largest_intermediate(jax.make_jaxpr(jax.grad(unchunked_total, (0, 2)))(*args))
  assert size >= full_logits, shape


def test_nnx_module_method_as_logits_fn(data):
  """The train step passes a bound nnx method (`model.logits`): gradients reach its params."""

  class Head(nnx.Module):

    def __init__(self, w):
      self.w = nnx.Param(jnp.asarray(w))

    def logits(self, h):
      return h @ self.w[...]

  def loss(head, student, teacher):
    stats = chunked.token_stats_chunked(student, teacher, head.logits, data["targets"], chunk=5)
    return objective(stats, data["coef"])

  grads = nnx.jit(nnx.grad(loss))(Head(data["w"]), data["student"], data["teacher"])
  _, _, grad_w = numpy_reference(data)
  np.testing.assert_allclose(grads.w[...], grad_w, rtol=RTOL, atol=ATOL)


def test_bad_inputs_are_rejected_before_the_scan(data):
  s, t, w, y = data["student"], data["teacher"], data["w"], data["targets"]
  head = linear_head(w)
  cases = [
      (dict(student_hidden=s[0]), r"student_hidden must be \[B, T, D\]; got shape \(13, 8\)"),
      (dict(targets=y[:, :-1]), r"targets shape \(2, 12\) must be the \[B, T\]"),
      (dict(targets=y.astype(np.float32)), "targets must be integer token ids"),
      (dict(teacher_hidden=t[:, :-1]), r"teacher_hidden shape \(2, 12, 8\) must equal"),
      (dict(chunk=0), "chunk must be a positive int; got 0"),
      (dict(divergence="kl"), r"unknown distillation divergence 'kl'; known: "
       r"\['forward-kl', 'jsd', 'reverse-kl'\]; .*; or 'sampled-token'"),
      (dict(divergence=chunked.SAMPLED_TOKEN, topk=4), "takes no topk or divergence options"),
      (dict(topk=V + 1), r"topk must be in \[1, vocabulary size 48\]; got 49"),
      (dict(logits_fn=lambda h: (h @ w)[..., 0]), r"the logits function of student_hidden must "
       r"map hidden \(2, 4, 8\) to logits \[2, 4, V\]; got shape \(2, 4\)"),
      (dict(teacher_logits_fn=lambda h: h @ w[:, :-1]),
       "teacher vocabulary size 47 != student's 48"),
      (dict(teacher_hidden=None, want_teacher_token_stats=True),
       "want_teacher_token_stats=True needs teacher_hidden"),
      (dict(divergence="jsd", divergence_options={"beta": 0.0}), r"jsd beta must be in \(0, 1\)"),
      (dict(student_hidden=s[:, :1], teacher_hidden=t[:, :1], targets=y[:, :1]),
       "need T >= 2 columns"),
  ]
  for overrides, message in cases:
    kwargs = dict(student_hidden=s, teacher_hidden=t, logits_fn=head, targets=y, chunk=4)
    kwargs.update(overrides)
    with pytest.raises(ValueError, match=message):
      chunked.token_stats_chunked(**kwargs)
  with pytest.raises(ValueError, match=r"teacher_hidden must be \[B, T, D\]"):
    chunked.teacher_token_stats_chunked(t[0], head, y, chunk=4)


def _positions():
  """Needed target columns: row 0 four scattered ones, row 1 the last two (of T = 13)."""
  positions = np.zeros((B, T), np.float32)
  positions[0, [3, 4, 5, 9]] = 1.0
  positions[1, [11, 12]] = 0.5      # a loss weight, still a needed column
  return positions


@pytest.mark.parametrize("chunk", [2, 3, 16])
def test_positions_match_numpy_on_the_needed_columns(data, chunk):
  """With `positions`, the needed columns' values and the gradients of an objective over them
  equal the float64 reference (unneeded columns weigh 0 there); the other columns are 0."""
  positions = _positions()
  needed = positions > 0
  masked = dict(data, coef=data["coef"] * needed)
  values, grad_student, grad_w = numpy_reference(masked)
  fn = jax.jit(jax.value_and_grad(
      lambda s, t, w: chunked_loss(s, t, w, data["targets"], masked["coef"], chunk=chunk,
                                   want_teacher_token_stats=True, positions=positions),
      argnums=(0, 1, 2), has_aux=True))
  (_, stats), (g_student, g_teacher, g_w) = fn(data["student"], data["teacher"], data["w"])
  for name, want in values.items():
    np.testing.assert_allclose(getattr(stats, name), np.where(needed, want, 0.0), rtol=RTOL,
                               atol=ATOL, err_msg=name)
  np.testing.assert_allclose(g_student, grad_student, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(g_w, grad_w, rtol=RTOL, atol=ATOL)
  np.testing.assert_array_equal(g_teacher, 0.0)
  logprob, log_max = jax.jit(lambda t: chunked.teacher_token_stats_chunked(
      t, linear_head(data["w"]), data["targets"], chunk=chunk, positions=positions))(
          data["teacher"])
  np.testing.assert_allclose(logprob, np.where(needed, values["teacher_logprob"], 0.0),
                             rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(log_max, np.where(needed, values["teacher_log_max_prob"], 0.0),
                             rtol=RTOL, atol=ATOL)


def test_positions_run_the_head_over_the_needed_chunks_only(data):
  """The head runs once per chunk that holds a needed column after packing: row 0's four
  needed columns fill 2 chunks of 2, so 2 of the 6 chunks, not all 6."""
  calls = []

  def counting_head(h):
    jax.debug.callback(lambda: calls.append(1))
    return h @ data["w"]

  def run(positions, chunk=2):
    calls.clear()
    stats = jax.jit(lambda s: chunked.token_stats_chunked(
        s, None, counting_head, data["targets"], chunk=chunk, positions=positions))(
            data["student"])
    jax.block_until_ready(stats)
    return len(calls)

  assert run(None) == 6
  assert run(_positions()) == 2
  assert run(np.zeros((B, T), np.float32)) == 0
  assert run(_positions(), chunk=16) == 1   # one chunk: nothing to skip, no packing


def test_positions_shape_is_checked(data):
  with pytest.raises(ValueError, match="positions shape"):
    chunked.token_stats_chunked(data["student"], None, linear_head(data["w"]), data["targets"],
                                chunk=4, positions=np.ones((B, T - 1)))
