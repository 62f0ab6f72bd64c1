"""Per-token losses and aggregation against float64 numpy references and hand-worked cases."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rised_jax.learn import losses

RTOL, ATOL = 1e-5, 1e-6


# ------------------------------------------------------------------ numpy references


def np_log_softmax(z: np.ndarray) -> np.ndarray:
  z = z.astype(np.float64)
  m = z.max(axis=-1, keepdims=True)
  return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def np_policy_gradient(logp, old, adv, mask, behaviour, eps_low, eps_high, dual_clip, cap):
  """Loops over tokens; returns the loss, d loss / d logp and the four indicators."""
  loss = np.zeros(logp.shape)
  grad = np.zeros(logp.shape)
  flags = {k: np.zeros(logp.shape) for k in ("high", "low", "dual", "truncated")}
  for idx in np.ndindex(logp.shape):
    if not mask[idx]:
      continue
    rho = np.exp(float(logp[idx]) - float(old[idx]))
    a = float(adv[idx])
    w = np.exp(float(old[idx]) - float(behaviour[idx]))
    if w > cap:
      w, flags["truncated"][idx] = cap, 1.0
    surrogate = -rho * a
    clipped = -min(max(rho, 1 - eps_low), 1 + eps_high) * a
    if surrogate >= clipped:
      value, slope = surrogate, -rho * a          # d(−ρA)/d logp = −ρA
    else:
      value, slope = clipped, 0.0
    if a < 0 and value > -dual_clip * a:
      value, slope, flags["dual"][idx] = -dual_clip * a, 0.0, 1.0
    flags["high"][idx] = float(a > 0 and rho > 1 + eps_high)
    flags["low"][idx] = float(a < 0 and rho < 1 - eps_low)
    loss[idx], grad[idx] = w * value, w * slope
  return loss, grad, flags


def np_kl(p_logp: np.ndarray, q_logp: np.ndarray) -> np.ndarray:
  out = np.zeros(p_logp.shape[:-1])
  for idx in np.ndindex(out.shape):
    for v in range(p_logp.shape[-1]):
      out[idx] += np.exp(p_logp[idx + (v,)]) * (p_logp[idx + (v,)] - q_logp[idx + (v,)])
  return out


def np_divergence(name: str, s_logp: np.ndarray, t_logp: np.ndarray, beta: float = 0.5):
  if name == "forward-kl":
    return np_kl(t_logp, s_logp)
  if name == "reverse-kl":
    return np_kl(s_logp, t_logp)
  m = np.log(beta * np.exp(t_logp) + (1 - beta) * np.exp(s_logp))
  return beta * np_kl(t_logp, m) + (1 - beta) * np_kl(s_logp, m)


def np_topk_support(s_logp: np.ndarray, t_logp: np.ndarray, k: int):
  """The teacher's k most likely ids, then the tail bucket 1 − Σ_topk p (float64)."""
  s_out = np.zeros(s_logp.shape[:-1] + (k + 1,))
  t_out = np.zeros_like(s_out)
  for idx in np.ndindex(s_logp.shape[:-1]):
    ids = np.argsort(-t_logp[idx])[:k]
    for logp, out in ((s_logp, s_out), (t_logp, t_out)):
      top = logp[idx][ids]
      out[idx] = np.concatenate([top, [np.log(1.0 - np.exp(top).sum())]])
  return s_out, t_out


# ------------------------------------------------------------------ policy gradient


@pytest.fixture(scope="module")
def pg_inputs():
  rng = np.random.default_rng(1)
  shape = (4, 9)
  old = rng.uniform(-3.0, -0.1, shape).astype(np.float32)
  # Log-ratios up to ±1.5 put ρ on both sides of every clip range and above c = 3.
  logp = (old + rng.uniform(-1.5, 1.5, shape)).astype(np.float32)
  adv = rng.normal(size=shape).astype(np.float32)
  adv[0, :3] = 0.0
  behaviour = (old + rng.uniform(-1.2, 1.2, shape)).astype(np.float32)
  mask = rng.uniform(size=shape) < 0.8
  return logp, old, adv, mask, behaviour


def test_policy_gradient_matches_numpy_value_gradient_and_indicators(pg_inputs):
  logp, old, adv, mask, behaviour = pg_inputs
  hp = dict(eps_low=0.2, eps_high=0.28, dual_clip=3.0, importance_cap=1.5)

  def total(lp):
    return losses.clipped_policy_gradient(lp, old, adv, mask, behaviour, **hp).loss.sum()

  terms = losses.clipped_policy_gradient(logp, old, adv, mask, behaviour, **hp)
  want_loss, want_grad, flags = np_policy_gradient(
      logp, old, adv, mask, behaviour, hp["eps_low"], hp["eps_high"], hp["dual_clip"],
      hp["importance_cap"])
  np.testing.assert_allclose(terms.loss, want_loss, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(jax.jit(jax.grad(total))(jnp.asarray(logp)), want_grad, rtol=RTOL,
                             atol=ATOL)
  np.testing.assert_array_equal(terms.clipped_high, flags["high"])
  np.testing.assert_array_equal(terms.clipped_low, flags["low"])
  np.testing.assert_array_equal(terms.clipped_dual, flags["dual"])
  np.testing.assert_array_equal(terms.weight_truncated, flags["truncated"])
  # The inputs exercise every branch at least once.
  for name, flag in flags.items():
    assert flag.sum() > 0, name


def test_policy_gradient_without_dual_clip_or_behaviour(pg_inputs):
  logp, old, adv, mask, _ = pg_inputs
  terms = losses.clipped_policy_gradient(logp, old, adv, mask, eps_low=0.1, eps_high=0.1)
  want, _, flags = np_policy_gradient(logp, old, adv, mask, old, 0.1, 0.1, np.inf, np.inf)
  np.testing.assert_allclose(terms.loss, want, rtol=RTOL, atol=ATOL)
  np.testing.assert_array_equal(terms.clipped_dual, 0.0)
  np.testing.assert_array_equal(terms.weight_truncated, 0.0)
  np.testing.assert_array_equal(terms.clipped_low + terms.clipped_high,
                                flags["low"] + flags["high"])


def test_policy_gradient_hand_worked():
  # eps_low = eps_high = 0.2, c = 3, C = 2.
  #  ρ = 1.5, A = +1: −min(1.5, 1.2) = −1.2, upper clip active.
  #  ρ = 0.5, A = −1: −min(−0.5, −0.8) = 0.8, lower clip active.
  #  ρ = 4,   A = −1: −min(−4, −1.2) = 4 > c·|A| = 3 → 3, dual clip active.
  #  ρ = 1,   A = +2, w = min(exp(log 3), 2) = 2: 2 · (−2) = −4, weight truncated.
  #  ρ = 0.9, A = +1, w = exp(log 0.5) = 0.5: 0.5 · (−0.9) = −0.45.
  logp = np.log([1.5, 0.5, 4.0, 1.0, 0.9]).astype(np.float32)
  old = np.zeros(5, np.float32)
  adv = np.array([1.0, -1.0, -1.0, 2.0, 1.0], np.float32)
  behaviour = np.array([0.0, 0.0, 0.0, -np.log(3.0), np.log(2.0)], np.float32)
  t = losses.clipped_policy_gradient(logp, old, adv, None, behaviour, eps_low=0.2,
                                     eps_high=0.2, dual_clip=3.0, importance_cap=2.0)
  np.testing.assert_allclose(t.loss, [-1.2, 0.8, 3.0, -4.0, -0.45], rtol=1e-6)
  np.testing.assert_array_equal(t.clipped_high, [1, 0, 0, 0, 0])
  np.testing.assert_array_equal(t.clipped_low, [0, 1, 0, 0, 0])
  np.testing.assert_array_equal(t.clipped_dual, [0, 0, 1, 0, 0])
  np.testing.assert_array_equal(t.weight_truncated, [0, 0, 0, 1, 0])


def test_masked_tokens_with_extreme_log_ratios_stay_finite():
  # Padding columns may hold anything: exp(200) would overflow to inf without the mask.
  logp = np.array([0.0, -1.0], np.float32)
  old = np.array([-200.0, -1.1], np.float32)
  behaviour = np.array([-400.0, -1.1], np.float32)
  adv = np.array([-1.0, 1.0], np.float32)
  mask = np.array([0.0, 1.0], np.float32)

  def total(lp):
    return losses.clipped_policy_gradient(lp, old, adv, mask, behaviour,
                                          importance_cap=2.0).loss.sum()

  value, grad = jax.value_and_grad(total)(jnp.asarray(logp))
  np.testing.assert_allclose(value, -np.exp(0.1), rtol=1e-6)   # ρ = e^0.1 < 1.2: unclipped
  np.testing.assert_allclose(grad, [0.0, -np.exp(0.1)], rtol=1e-6)


def test_policy_gradient_rejects_bad_hyperparameters():
  x = np.zeros(3, np.float32)
  with pytest.raises(ValueError, match=r"eps_low must be in \[0, 1\); got 1.0"):
    losses.clipped_policy_gradient(x, x, x, eps_low=1.0)
  with pytest.raises(ValueError, match="dual_clip must be > 1"):
    losses.clipped_policy_gradient(x, x, x, dual_clip=0.5)
  with pytest.raises(ValueError, match="importance_cap must be > 0"):
    losses.clipped_policy_gradient(x, x, x, x, importance_cap=0.0)
  with pytest.raises(ValueError, match="per-token inputs must share one shape"):
    losses.clipped_policy_gradient(x, np.zeros(4), x)
  with pytest.raises(ValueError, match=r"mask shape \(4,\) does not match per-token shape"):
    losses.clipped_policy_gradient(x, x, x, np.ones(4))


# ------------------------------------------------------------------ reference KL


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_match_numpy(estimator):
  rng = np.random.default_rng(2)
  p = rng.uniform(-5, -0.01, (3, 7)).astype(np.float32)
  q = rng.uniform(-5, -0.01, (3, 7)).astype(np.float32)
  mask = rng.uniform(size=(3, 7)) < 0.7
  d = q.astype(np.float64) - p
  want = {"k1": -d, "k2": 0.5 * d ** 2, "k3": np.exp(d) - d - 1}[estimator] * mask
  got = losses.reference_kl(p, q, mask, estimator=estimator)
  np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_kl_estimators_hand_worked_and_in_expectation():
  # π_θ(y) = 0.5, π_ref(y) = 0.25: k1 = log 2, k2 = ½ log² 2, k3 = 0.5 + log 2 − 1.
  p, q = np.log([0.5]).astype(np.float32), np.log([0.25]).astype(np.float32)
  np.testing.assert_allclose(losses.reference_kl(p, q, estimator="k1"), [np.log(2)], rtol=1e-6)
  np.testing.assert_allclose(losses.reference_kl(p, q, estimator="k2"),
                             [0.5 * np.log(2) ** 2], rtol=1e-6)
  np.testing.assert_allclose(losses.reference_kl(p, q, estimator="k3"),
                             [np.log(2) - 0.5], rtol=1e-6)
  # Sign convention: under y ~ π_θ, E[k1] = E[k3] = KL(π_θ ‖ π_ref) exactly (sum over all y).
  pi = np.array([0.5, 0.3, 0.15, 0.05])
  ref = np.array([0.25, 0.25, 0.25, 0.25])
  kl = float((pi * np.log(pi / ref)).sum())
  for estimator in ("k1", "k3"):
    per_y = losses.reference_kl(np.log(pi).astype(np.float32), np.log(ref).astype(np.float32),
                                estimator=estimator)
    np.testing.assert_allclose(float((pi * np.asarray(per_y)).sum()), kl, rtol=1e-5)


def test_reference_kl_gradient_and_masking():
  # d k3 / dp = 1 − exp(q − p); masked tokens with an overflowing exp stay at 0 / 0.
  p = np.array([-1.0, -300.0], np.float32)
  q = np.array([-2.0, 0.0], np.float32)
  mask = np.array([1.0, 0.0], np.float32)
  value, grad = jax.value_and_grad(
      lambda x: losses.reference_kl(x, q, mask, estimator="k3").sum())(jnp.asarray(p))
  np.testing.assert_allclose(value, np.exp(-1.0) + 1.0 - 1.0, rtol=1e-6)
  np.testing.assert_allclose(grad, [1.0 - np.exp(-1.0), 0.0], rtol=1e-6)
  with pytest.raises(ValueError, match=r"^config\.step\.ref_kl_estimator: unknown KL estimator "
                     r"'k4'; known: \['k1', 'k2', 'k3'\]; or an entry point"):
    losses.reference_kl(p, q, estimator="k4")


# ------------------------------------------------------------------ aggregation


def test_aggregations_hand_worked():
  nan = np.nan   # a masked entry must not leak, even as NaN
  loss = np.array([[1, 2, 3, nan], [5, 6, 0, 0], [0, 0, 0, 0]], np.float32)
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], np.float32)   # row 2: padding
  # token-mean: (1+2+3+5+6) / 5 tokens = 17 / 5.
  # seq-mean-token-mean: (6/3 + 11/2) / 2 sequences = 7.5 / 2.
  # seq-mean-token-sum-norm, L = 4: ((1+2+3) / 4 + (5+6) / 4) / 2 sequences = 4.25 / 2.
  want = {"token-mean": (17.0, 5.0), "seq-mean-token-mean": (7.5, 2.0),
          "seq-mean-token-sum-norm": (4.25, 2.0)}
  for mode, (total, count) in want.items():
    got = losses.AGGREGATIONS[mode](loss, mask, seq_len_norm=4.0)
    np.testing.assert_allclose(got, (total, count), rtol=1e-6, err_msg=mode)
    np.testing.assert_allclose(losses.mean_from_parts(*got), total / count, rtol=1e-6)


def np_aggregate(mode: str, loss: np.ndarray, mask: np.ndarray, norm: float):
  total, count = 0.0, 0.0
  for row, m in zip(loss.astype(np.float64), mask):
    n = m.sum()
    if n == 0:
      continue
    count += 1
    s = sum(l for l, k in zip(row, m) if k)
    total += s / n if mode == "seq-mean-token-mean" else s / norm
  if mode == "token-mean":
    return (loss * mask).sum(), mask.sum()
  return total, count


@pytest.mark.parametrize("mode", sorted(losses.AGGREGATIONS))
def test_aggregation_is_exact_under_micro_batching(mode):
  rng = np.random.default_rng(3)
  loss = rng.normal(size=(8, 10)).astype(np.float32)
  mask = (rng.uniform(size=(8, 10)) < 0.6).astype(np.float32)
  mask[[2, 5]] = 0.0                      # padding rows
  mask[3] = 0.0
  mask[3, 0] = 1.0                        # one-token row
  aggregate = losses.AGGREGATIONS[mode]
  full = losses.mean_from_parts(*aggregate(loss, mask, seq_len_norm=10.0))
  want_total, want_count = np_aggregate(mode, loss, mask.astype(bool), 10.0)
  np.testing.assert_allclose(full, want_total / want_count, rtol=RTOL)
  # Uneven micro-batches (3, 3, 2 rows), e.g. also data-parallel shards: add parts, divide once.
  parts = [aggregate(loss[a:b], mask[a:b], seq_len_norm=10.0) for a, b in ((0, 3), (3, 6), (6, 8))]
  total = sum(p[0] for p in parts)
  count = sum(p[1] for p in parts)
  np.testing.assert_allclose(count, want_count, rtol=0)
  np.testing.assert_allclose(losses.mean_from_parts(total, count), full, rtol=1e-6)


def test_aggregation_edge_cases():
  zeros = np.zeros((2, 3), np.float32)
  assert float(losses.mean_from_parts(*losses.token_mean(zeros + 1, zeros))) == 0.0
  with pytest.raises(ValueError, match="seq-mean-token-sum-norm needs seq_len_norm"):
    losses.seq_mean_token_sum_norm(zeros, zeros)
  with pytest.raises(ValueError, match="seq_len_norm must be > 0; got 0"):
    losses.seq_mean_token_sum_norm(zeros, zeros, seq_len_norm=0)


# ------------------------------------------------------------------ distillation divergences


@pytest.fixture(scope="module")
def logits():
  rng = np.random.default_rng(4)
  student = (2.0 * rng.normal(size=(3, 5, 16))).astype(np.float32)
  teacher = (2.0 * rng.normal(size=(3, 5, 16))).astype(np.float32)
  mask = rng.uniform(size=(3, 5)) < 0.8
  return student, teacher, mask


@pytest.mark.parametrize("name,options", [("forward-kl", {}), ("reverse-kl", {}),
                                          ("jsd", {}), ("jsd", {"beta": 0.2})])
@pytest.mark.parametrize("topk", [None, 4])
def test_divergences_match_numpy(logits, name, options, topk):
  student, teacher, mask = logits
  s_logp, t_logp = np_log_softmax(student), np_log_softmax(teacher)
  if topk is not None:
    s_logp, t_logp = np_topk_support(s_logp, t_logp, topk)
  want = np_divergence(name, s_logp, t_logp, **options) * mask
  got = losses.token_divergence(student, teacher, mask, divergence=name, topk=topk,
                                options=options)
  np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", sorted(losses.DIVERGENCES))
def test_topk_with_whole_vocabulary_equals_full(logits, name):
  student, teacher, _ = logits
  full = losses.token_divergence(student, teacher, divergence=name)
  topv = losses.token_divergence(student, teacher, divergence=name, topk=student.shape[-1])
  np.testing.assert_allclose(topv, full, rtol=RTOL, atol=ATOL)


def test_jsd_symmetry_and_limits(logits):
  student, teacher, _ = logits
  jsd = lambda s, t, beta: np.asarray(losses.token_divergence(
      s, t, divergence="jsd", options={"beta": beta}))
  np.testing.assert_allclose(jsd(student, teacher, 0.5), jsd(teacher, student, 0.5), rtol=RTOL)
  assert np.all(jsd(student, teacher, 0.5) <= np.log(2) + 1e-6)
  # JSD_β / β → KL(p_T ‖ p_S) as β → 0 and JSD_β / (1 − β) → KL(p_S ‖ p_T) as β → 1; the
  # O(β) remainder grows with the KL, so compare on flatter distributions.
  student, teacher = 0.5 * student, 0.5 * teacher
  forward = np.asarray(losses.token_divergence(student, teacher, divergence="forward-kl"))
  reverse = np.asarray(losses.token_divergence(student, teacher, divergence="reverse-kl"))
  np.testing.assert_allclose(jsd(student, teacher, 1e-3) / 1e-3, forward, rtol=1e-2)
  np.testing.assert_allclose(jsd(student, teacher, 1 - 1e-3) / 1e-3, reverse, rtol=1e-2)


def test_topk_tail_is_stable_when_tiny():
  # The teacher's top-2 hold all but ~e^-40 of the mass: 1 − Σ_topk p rounds to 0 in float32,
  # but the tail bucket must keep its true log-mass (≈ −40 + log 14).
  teacher = np.zeros((1, 16), np.float32)
  teacher[0, :2] = 40.0
  student = np.linspace(-1.0, 1.0, 16, dtype=np.float32)[None]
  s_logp, t_logp = np_log_softmax(student), np_log_softmax(teacher)
  t_tail = np.log(np.exp(t_logp[0, 2:]).sum())
  s_tail = np.log(np.exp(s_logp[0, 2:]).sum())
  s_sup = np.concatenate([s_logp[0, :2], [s_tail]])[None]
  t_sup = np.concatenate([t_logp[0, :2], [t_tail]])[None]
  for name in losses.DIVERGENCES:
    got = losses.token_divergence(student, teacher, divergence=name, topk=2)
    np.testing.assert_allclose(got, np_divergence(name, s_sup, t_sup), rtol=RTOL, err_msg=name)
  got_s, got_t = losses.topk_support(jnp.asarray(s_logp, jnp.float32),
                                     jnp.asarray(t_logp, jnp.float32), 2)
  np.testing.assert_allclose(got_t[0, 2], t_tail, rtol=1e-5)
  np.testing.assert_allclose(got_s[0, 2], s_tail, rtol=1e-5)


def test_forward_kl_gradient_is_student_minus_teacher_probs(logits):
  # d KL(p_T ‖ p_S) / d z_S = p_S − p_T; the teacher is a constant (zero gradient).
  student, teacher, mask = logits
  grad_s, grad_t = jax.grad(
      lambda s, t: losses.token_divergence(s, t, mask, divergence="forward-kl").sum(),
      argnums=(0, 1))(jnp.asarray(student), jnp.asarray(teacher))
  want = (np.exp(np_log_softmax(student)) - np.exp(np_log_softmax(teacher))) * mask[..., None]
  np.testing.assert_allclose(grad_s, want, rtol=RTOL, atol=ATOL)
  np.testing.assert_array_equal(grad_t, 0.0)


def test_clamp_caps_value_and_stops_gradient(logits):
  student, teacher, _ = logits
  raw = np.asarray(losses.token_divergence(student, teacher, divergence="forward-kl"))
  clamp = float(np.median(raw))
  clamped_fn = lambda s: losses.token_divergence(s, teacher, divergence="forward-kl",
                                                 clamp=clamp)
  np.testing.assert_allclose(clamped_fn(student), np.minimum(raw, clamp), rtol=RTOL)
  grad = np.asarray(jax.grad(lambda s: clamped_fn(s).sum())(jnp.asarray(student)))
  over = raw > clamp
  assert over.any() and (~over).any()
  np.testing.assert_array_equal(grad[over], 0.0)
  assert np.all(np.abs(grad[~over]).sum(-1) > 0)


def test_sampled_token_surrogate_value_and_gradient(logits):
  student, teacher, mask = logits
  rng = np.random.default_rng(5)
  y = rng.integers(0, student.shape[-1], size=student.shape[:-1])
  t_logp = np_log_softmax(teacher)
  t_tok = np.take_along_axis(t_logp, y[..., None], -1)[..., 0]

  def surrogate(s_logits, clamp):
    s_logp = jax.nn.log_softmax(s_logits, axis=-1)
    s_tok = jnp.take_along_axis(s_logp, y[..., None], -1)[..., 0]
    return losses.sampled_token_surrogate(s_tok, t_tok.astype(np.float32), mask, clamp=clamp)

  s_logp = np_log_softmax(student)
  s_tok = np.take_along_axis(s_logp, y[..., None], -1)[..., 0]
  for clamp in (None, 0.5):
    weight = s_tok - t_tok
    if clamp is not None:
      weight = np.clip(weight, -clamp, clamp)
    np.testing.assert_allclose(surrogate(jnp.asarray(student), clamp), weight * mask,
                               rtol=RTOL, atol=ATOL)
    # ∇ = w · ∇ log p_S(y) = w · (onehot(y) − p_S) with respect to the student logits.
    onehot = np.eye(student.shape[-1])[y]
    want = (weight * mask)[..., None] * (onehot - np.exp(s_logp))
    grad = jax.grad(lambda s: surrogate(s, clamp).sum())(jnp.asarray(student))
    np.testing.assert_allclose(grad, want, rtol=RTOL, atol=ATOL)


def test_divergence_settings_are_validated(logits):
  student, teacher, _ = logits
  with pytest.raises(ValueError, match=r"^config\.step\.divergence: unknown distillation "
                     r"divergence 'kl'; known: \['forward-kl', 'jsd', 'reverse-kl'\]"):
    losses.token_divergence(student, teacher, divergence="kl")
  with pytest.raises(ValueError, match=r"jsd beta must be in \(0, 1\); got 1.0"):
    losses.token_divergence(student, teacher, divergence="jsd", options={"beta": 1.0})
  with pytest.raises(ValueError, match=r"'forward-kl' has no option\(s\) \['beta'\]"):
    losses.token_divergence(student, teacher, options={"beta": 0.5})
  with pytest.raises(ValueError, match=r"topk must be in \[1, vocabulary size 16\]; got 17"):
    losses.token_divergence(student, teacher, topk=17)
  with pytest.raises(ValueError, match="topk must be a positive int or None; got 0"):
    losses.token_divergence(student, teacher, topk=0)
  with pytest.raises(ValueError, match="clamp must be > 0"):
    losses.token_divergence(student, teacher, clamp=-1.0)
