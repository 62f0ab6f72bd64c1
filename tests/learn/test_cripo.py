"""CriPO's array math against hand-worked examples and numpy loop references; teacher contexts."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rised_jax.learn import cripo
from rised_jax.rubric_tasks import tasks
from rised_jax.teach import cripo_prefix


@pytest.fixture(scope="module")
def localise():
  """Jitted localisation with the paper's settings (compiled once per input shape)."""
  return jax.jit(functools.partial(cripo.localisation_mask, gamma=0.95, kl_clamp=10.0, edge_fraction=0.01))


@pytest.fixture(scope="module")
def flips():
  return jax.jit(functools.partial(cripo.counterfactual_flips, alpha=0.1, tau_flip=0.1))


# --- reward and advantage -------------------------------------------------------------------

# One group, G = 3, weights (3, 2, 1, −2); the last criterion is a pitfall.
WEIGHTS = np.array([[3.0, 2.0, 1.0, -2.0]])
VERDICTS = np.array([[[1, 1, 1, 0],     # 3 + 2 + 1     = 6
                      [1, 0, 0, 1],     # 3 − 2         = 1
                      [0, 0, 0, 0]]])   #                 0


@pytest.mark.parametrize("normalizer, denominator", [
    ("sum", 4.0),        # 3 + 2 + 1 − 2: the paper's Σ_j ω_j
    ("abs", 8.0),        # 3 + 2 + 1 + 2
    ("positive", 6.0),   # 3 + 2 + 1
])
def test_weighted_reward_with_a_pitfall(normalizer, denominator):
  rewards = cripo.weighted_rewards(VERDICTS, WEIGHTS, normalizer=normalizer)
  np.testing.assert_allclose(rewards, [[6.0 / denominator, 1.0 / denominator, 0.0]], rtol=1e-6)


def test_reward_normaliser_must_be_positive():
  # Σ ω = 1 − 1 = 0 in group 1: the paper's normaliser is undefined; the error says what to use.
  with pytest.raises(ValueError, match=r"group 1: .*'sum' gives 0 <= 0.*'positive'"):
    cripo.weighted_rewards(np.zeros((2, 2, 2)), np.array([[1.0, 1.0], [1.0, -1.0]]))
  np.testing.assert_allclose(
      cripo.weighted_rewards(np.array([[[1, 0], [1, 1]]]), np.array([[1.0, -1.0]]), normalizer="positive"),
      [[1.0, 0.0]])
  with pytest.raises(ValueError, match="0 or 1"):
    cripo.weighted_rewards(np.full((1, 2, 2), 0.5), np.ones((1, 2)))


def test_padded_criteria_are_ignored():
  verdicts, weights, mask = cripo.pad_criteria(
      [VERDICTS[0], np.array([[1, 0], [0, 1], [1, 1]])], [WEIGHTS[0], np.array([1.0, 3.0])])
  assert verdicts.shape == (2, 3, 4) and mask.tolist() == [[True] * 4, [True, True, False, False]]
  rewards = cripo.weighted_rewards(verdicts, weights, mask)
  # Group 1 by hand: Z = 4; rewards 1/4, 3/4, 4/4.
  np.testing.assert_allclose(rewards, [[1.5, 0.25, 0.0], [0.25, 0.75, 1.0]], rtol=1e-6)
  with pytest.raises(ValueError, match="group 1"):
    cripo.pad_criteria([VERDICTS[0], np.ones((2, 2))], [WEIGHTS[0], np.ones(2)])


# --- UC ---------------------------------------------------------------------------------------


def test_uc_keeps_top3_by_weight_and_excludes_pitfalls():
  weights = np.array([[1.0, 5.0, 3.0, 3.0, 2.0, -4.0]])
  verdicts = np.zeros((1, 2, 6))
  verdicts[0, 1, 4] = 1                                   # criterion 4 is met by rollout 1
  # Candidates (never met, positive): 0 (ω 1), 1 (ω 5), 2 (ω 3), 3 (ω 3) -> top 3: 1, 2, 3.
  uc = cripo.unexplored_criteria(verdicts, weights)
  assert uc.tolist() == [[False, True, True, True, False, False]]
  # The pitfall 5 (never committed) joins only when asked, and then ranks last by weight.
  assert cripo.unexplored_criteria(verdicts, weights, include_pitfalls=True, max_uc=10).tolist() == [
      [True, True, True, True, False, True]]
  assert cripo.unexplored_criteria(verdicts, weights, include_pitfalls=True).tolist() == uc.tolist()


def test_uc_tie_rule_lower_index_wins():
  # All unmet, weights (2, 3, 2, 2): 1 first, then the ω = 2 tie goes to indices 0 and 2, not 3.
  uc = cripo.unexplored_criteria(np.zeros((1, 4, 4)), np.array([[2.0, 3.0, 2.0, 2.0]]))
  assert uc.tolist() == [[True, True, True, False]]
  # A masked (padding) criterion is never a candidate.
  uc = cripo.unexplored_criteria(np.zeros((1, 4, 4)), np.array([[2.0, 3.0, 2.0, 9.0]]),
                                 criterion_mask=np.array([[True, True, True, False]]))
  assert uc.tolist() == [[True, True, True, False]]


# --- SC ---------------------------------------------------------------------------------------


def test_sc_both_branches_tie_rule_and_positive_weights_only():
  advantages = np.array([[1.0, 0.5, 0.0, -0.25, -0.25, -1.0]])     # G = 6, G/2 = 3
  weights = np.array([[2.0, 2.0, 1.0, 3.0, -2.0, 1.0, 1.0]])
  members = [[0, 5],      # Σ A = 0, |S| = 2 < 3          -> SC (tie branch)
             [1, 3, 4],   # Σ A = 0, |S| = 3 = G/2        -> not SC
             [3],         # Σ A = −0.25 < 0               -> SC (negative branch)
             [0, 1],      # Σ A = 1.5 > 0                 -> not SC
             [5],         # Σ A = −1 but ω < 0 (pitfall)  -> not SC
             [],          # S empty                       -> not SC
             [2]]         # Σ A = 0 (A_2 = 0), |S| = 1    -> SC
  verdicts = np.zeros((1, 6, 7))
  for j, rollouts in enumerate(members):
    verdicts[0, rollouts, j] = 1
  sc = cripo.suppressed_criteria(verdicts, weights, advantages)
  assert sc.tolist() == [[True, False, True, False, False, False, True]]
  # Rollouts for the counterfactual teacher: A < 0 and meet an SC criterion. Rollout 3 meets SC 2,
  # rollout 5 meets SC 0; rollout 4 meets only criterion 1; rollout 2 meets SC 6 but has A = 0.
  assert cripo.counterfactual_rollouts(verdicts, sc, advantages).tolist() == [
      [False, False, False, True, False, True]]


def test_sc_zero_sum_is_decided_exactly():
  # Replaces the old float32 tolerance test (|Σ A| <= 1e-6 counted as 0): the sums are now exact.
  # Weights 0.1, 0.2, 0.3, 0.6 (float32, as a task file loads them) read as 1/10, 2/10, 3/10,
  # 6/10: rollout 0 scores 0.1 + 0.2, rollout 1 0.3, both exactly the group mean 0.3.
  weights = np.array([[0.1, 0.2, 0.3, 0.6]], np.float32)
  verdicts = np.array([[[1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]]])
  centred = cripo.exact_centred_rewards(verdicts, weights)
  assert centred.tolist() == [[0, 0, 12, -12]]             # D = 4 s − Σ s with s = (3, 3, 6, 0)
  # Criteria 0, 1 (rollout 0) and 2 (rollout 1): Σ A = 0 exactly and |S| = 1 < G/2: SC.
  assert cripo.suppressed_criteria(verdicts, weights, centred).tolist() == [[True, True, True, False]]
  advantages, _ = cripo.exact_advantages(verdicts, weights)
  assert advantages[0, :2].tolist() == [0.0, 0.0]
  assert not cripo.counterfactual_rollouts(verdicts, [[True, True, True, False]], centred).any()


def test_best_rollout_ties_go_to_the_lowest_index():
  assert cripo.best_rollout(np.array([[0.5, 1.2, 1.2, -1.0], [0.0, 0.0, 0.0, 0.0]])).tolist() == [1, 0]


def test_analyse_groups_on_checked_answers():
  task = {t.id: t for t in tasks.builtin_task_set().tasks}["sky-blue"]
  # Criteria: scattering (3), wavelength (2), violet (1), 2-4 sentences (1), ocean pitfall (−2).
  answers = [
      "Sunlight is scattered by air molecules. Shorter wavelengths scatter more strongly. This is Rayleigh "
      "scattering. Blue light therefore fills the sky. We see it everywhere. It is beautiful.",  # 1 1 0 0 0
      "The sky reflects the ocean. That is why it is blue.",                                     # 0 0 0 1 1
      "It is blue. Nobody knows why.",                                                           # 0 0 0 1 0
      "Blue."]                                                                                   # 0 0 0 0 0
  verdicts = tasks.check_group(task, answers)[None]
  np.testing.assert_array_equal(verdicts[0], [[1, 1, 0, 0, 0], [0, 0, 0, 1, 1], [0, 0, 0, 1, 0], [0, 0, 0, 0, 0]])
  analysis = cripo.analyse_groups(verdicts, task.weights[None], None, cripo.CriPOGroupConfig())
  # Σ ω = 5: R = (5, −1, 1, 0)/5, mean 0.25, so A ∝ (0.75, −0.45, −0.05, −0.25).
  np.testing.assert_allclose(analysis.rewards[0], [1.0, -0.2, 0.2, 0.0], rtol=1e-6)
  # Population variance (0.75² + 0.45² + 0.05² + 0.25²)/4 = 0.2075.
  np.testing.assert_allclose(analysis.advantages[0], np.array([0.75, -0.45, -0.05, -0.25]) / (
      math.sqrt(0.2075) + 1e-6), rtol=1e-5)
  assert analysis.best.tolist() == [0]
  assert analysis.uc_mask.tolist() == [[False, False, True, False, False]]      # "violet": never met
  # "length" is met only by rollouts 1 and 2: Σ A ∝ −0.5 < 0, so it is suppressed; the pitfall,
  # also met only by a negative rollout, is not a candidate.
  assert analysis.sc_mask.tolist() == [[False, False, False, True, False]]
  assert analysis.cf_rollouts.tolist() == [[False, True, True, False]]
  assert analysis.cf_criteria[0, 1].tolist() == [False, False, False, True, False]
  assert cripo.group_diagnostics(analysis.uc_mask, analysis.sc_mask)["cripo/sc_per_sample"] == 1.0


# --- localisation -----------------------------------------------------------------------------


def test_localisation_keeps_the_smallest_set_not_a_positional_prefix(localise):
  kl = jnp.array([[0.5, 1.0, 1.5, 2.0, 15.0]])
  # n = 5: floor(0.05) = 0 edge tokens. Clamped: (0.5, 1, 1.5, 2, 10), total 15, γ·total = 14.25.
  # Sorted: 10, 2, 1.5, 1, 0.5 -> prefix sums 10, 12, 13.5, 14.5: four tokens, position 0 dropped.
  # Walking left to right until 95 % would need all five tokens (0.5 + 1 + 1.5 + 2 = 5 < 14.25).
  keep = localise(kl, jnp.ones_like(kl))
  assert np.asarray(keep).tolist() == [[False, True, True, True, True]]


def test_localisation_clamp_and_inclusive_threshold():
  kl = jnp.array([[40.0, 1.0, 1.0, 1.0, 1.0]])
  ones = jnp.ones_like(kl)
  # Unclamped: total 44, 0.95·44 = 41.8: 40, 41, 42 -> three tokens. Clamped at 10: total 14,
  # 13.3: 10, 11, 12, 13, 14 -> all five.
  assert np.asarray(cripo.localisation_mask(kl, ones, kl_clamp=1e9)).sum() == 3
  assert np.asarray(cripo.localisation_mask(kl, ones)).sum() == 5
  # γ = 0.5 on (6, 4, 3, 3, 4): total 20, threshold 10 = 6 + 4 exactly, so two tokens; the tie
  # between the two 4s goes to the earlier position (1, not 4).
  keep = cripo.localisation_mask(jnp.array([[6.0, 4.0, 3.0, 3.0, 4.0]]), ones, gamma=0.5)
  assert np.asarray(keep).tolist() == [[True, True, False, False, False]]


def test_localisation_edges_on_a_200_token_row(localise):
  # Columns 0-4 prompt, 5-204 the 200 response tokens, 205-209 padding.
  kl = np.zeros((2, 210), np.float32)
  response = np.zeros((2, 210), np.float32)
  response[0, 5:205] = 1
  response[1, 5:204] = 1                                    # 199 tokens: floor(1.99) = 1 edge token
  kl[:, :5] = kl[:, 205:] = 50.0                            # outside the response: ignored
  kl[:, [5, 6, 203, 204]] = 9.0                             # first two and last two response tokens
  kl[:, [50, 100, 150]] = [6.0, 3.0, 1.0]
  keep = np.asarray(localise(jnp.asarray(kl), jnp.asarray(response)))
  # Row 0: floor(0.01·200) = 2 -> response positions 0, 1, 198, 199 (columns 5, 6, 203, 204) are
  # masked. Left: 6, 3, 1, total 10, threshold 9.5 -> 6 + 3 = 9 < 9.5, + 1 = 10: all three.
  assert np.flatnonzero(keep[0]).tolist() == [50, 100, 150]
  # Row 1: edge 1 masks columns 5 and 203 (its last response token); 6 and 204 (padding) differ.
  # Left: 9 (col 6), 6, 3, 1, total 19, threshold 18.05: 9, 15, 18, 19 -> all four.
  assert np.flatnonzero(keep[1]).tolist() == [6, 50, 100, 150]


def test_localisation_empty_rows_keep_nothing(localise):
  kl = jnp.array([[0.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
  response = jnp.array([[1, 1, 1], [0, 0, 0]])
  assert not np.asarray(localise(kl, response)).any()


def _localisation_reference(kl, response, gamma, kl_clamp, edge_fraction):
  """Straightforward per-row loop: list the eligible tokens, sort, accumulate."""
  keep = np.zeros(kl.shape, bool)
  for b in range(kl.shape[0]):
    positions = [t for t in range(kl.shape[1]) if response[b, t]]
    n = len(positions)
    edge = math.floor(n * edge_fraction + 1e-9)
    eligible = positions[edge:n - edge]
    values = {t: min(max(float(kl[b, t]), 0.0), kl_clamp) for t in eligible}
    total = np.float32(sum(values.values()))
    if total <= 0:
      continue
    threshold = np.float32(gamma) * total
    running = 0.0
    for t in sorted(eligible, key=lambda t: (-values[t], t)):
      keep[b, t] = True
      running += values[t]
      if running >= threshold:
        break
  return keep


@pytest.mark.parametrize("gamma", [0.95, 0.5, 1.0])
def test_localisation_matches_loop_reference_on_random_rows(gamma):
  rng = np.random.default_rng(0)
  batch, length = 24, 64
  # KL on a 1/64 grid (with many ties and values above the clamp) so that every float32 sum is exact.
  kl = rng.integers(0, 800, (batch, length)).astype(np.float32) / 64.0
  kl[rng.random((batch, length)) < 0.2] = 0.0
  response = np.zeros((batch, length), np.int32)
  for b in range(batch):
    start = rng.integers(0, 10)
    response[b, start:start + rng.integers(0, length - start + 1)] = 1
  response[:4] = rng.random((4, length)) < 0.5               # a few non-contiguous rows
  keep = jax.jit(functools.partial(cripo.localisation_mask, edge_fraction=0.05))(kl, response, gamma=gamma)
  np.testing.assert_array_equal(np.asarray(keep), _localisation_reference(kl, response, gamma, 10.0, 0.05))


def test_localisation_rejects_unrepresentable_edge_fraction():
  with pytest.raises(ValueError, match="edge_fraction"):
    cripo.localisation_mask(jnp.zeros((1, 4)), jnp.ones((1, 4)), edge_fraction=0.5)
  with pytest.raises(ValueError, match="denominator"):
    cripo.localisation_mask(jnp.zeros((1, 4)), jnp.ones((1, 4)), edge_fraction=1 / 3001)


# --- counterfactual flips ---------------------------------------------------------------------


def test_flips_by_hand(flips):
  log_alpha = math.log(0.1)                                  # −2.3026
  # Row 0 (counterfactual, A = −0.5): col 0 is prompt (cf_mask 0); cols 1-5 as annotated.
  student = [[-1.0, -1.0, -1.0, -3.5, -3.0, -2.0]]
  teacher = [[-3.0, -3.0, -3.0, -3.0, -3.0, -4.0]]
  teacher_max = [[-0.1, -0.1, -1.0, -0.1, -0.1, -0.2]]
  # col 1: log pS − log pT = 2 > 0 and log pT − log max = −2.9 < −2.30 -> flip
  # col 2: ratio ok, but −3 − (−1) = −2.0 >= −2.30 (pT = 0.050 >= 0.1·0.368)   -> no flip
  # col 3: log pS − log pT = −0.5 (the student likes it less)                 -> no flip
  # col 4: log pS − log pT = 0 (strict)                                       -> no flip
  # col 5: 2 > 0 and −3.8 < −2.30                                            -> flip
  assert -3.0 - (-1.0) > log_alpha > -3.0 - (-0.1)
  rows = 3
  student, teacher, teacher_max = (jnp.array(x * rows) for x in (student, teacher, teacher_max))
  advantages = jnp.array([[-0.5] * 6, [-0.5] * 6, [0.4] * 6])
  # Row 1: same numbers, A < 0 but no counterfactual teacher. Row 2: a teacher but A > 0.
  cf_mask = jnp.array([[0, 1, 1, 1, 1, 1], [0] * 6, [0, 1, 1, 1, 1, 1]])
  edited, flip = flips(student, teacher, teacher_max, advantages, cf_mask)
  assert np.asarray(flip).tolist() == [[False, True, False, False, False, True], [False] * 6, [False] * 6]
  np.testing.assert_allclose(np.asarray(edited), [[-0.5, 0.1, -0.5, -0.5, -0.5, 0.1], [-0.5] * 6, [0.4] * 6])


def test_flips_match_loop_reference_on_random_tokens(flips):
  rng = np.random.default_rng(1)
  shape = (16, 48)
  teacher_max = -rng.exponential(0.5, shape).astype(np.float32)
  teacher = teacher_max - rng.exponential(2.5, shape).astype(np.float32)
  student = teacher + rng.normal(0.0, 1.0, shape).astype(np.float32)
  advantages = np.repeat(rng.normal(0.0, 1.0, (shape[0], 1)), shape[1], 1).astype(np.float32)
  cf_mask = (rng.random(shape) < 0.7).astype(np.float32)
  edited, flip = flips(student, teacher, teacher_max, advantages, cf_mask)
  expected_flip = np.zeros(shape, bool)
  expected_edit = advantages.copy()
  for b in range(shape[0]):
    for t in range(shape[1]):
      p_teacher = math.exp(float(teacher[b, t]))
      if (cf_mask[b, t] and advantages[b, t] < 0 and float(student[b, t]) > float(teacher[b, t])
          and p_teacher < 0.1 * math.exp(float(teacher_max[b, t]))):
        expected_flip[b, t] = True
        expected_edit[b, t] = 0.1
  assert 0 < expected_flip.sum() < (cf_mask * (advantages < 0)).sum()    # both thresholds bite
  np.testing.assert_array_equal(np.asarray(flip), expected_flip)
  np.testing.assert_array_equal(np.asarray(edited), expected_edit)


# --- β and diagnostics ------------------------------------------------------------------------


def test_beta_warmup():
  beta = cripo.PAPER_BETA["qwen3-1.7b"]
  steps = jnp.array([0, 24, 48, 49, 50, 199])
  # (step + 1)/50 of 0.05: 0.001, 0.025, 0.049, then 0.05.
  np.testing.assert_allclose(np.asarray(cripo.beta_schedule(steps, beta)), [0.001, 0.025, 0.049, 0.05, 0.05, 0.05],
                             rtol=1e-6)
  assert float(jax.jit(cripo.beta_schedule, static_argnums=(1, 2))(9, cripo.PAPER_BETA["qwen3-4b"], 50)) == (
      pytest.approx(0.006, rel=1e-6))                                   # 0.03 · 10/50
  assert float(cripo.beta_schedule(0, 0.05, warmup_steps=0)) == pytest.approx(0.05)
  with pytest.raises(ValueError, match="warmup_steps"):
    cripo.beta_schedule(0, 0.05, warmup_steps=-1)


def test_diagnostics_by_hand():
  uc = np.array([[1, 0, 0], [0, 0, 0], [1, 1, 0], [0, 0, 0]], bool)
  sc = np.array([[0, 1, 1], [1, 0, 0], [0, 0, 0], [0, 0, 0]], bool)
  assert cripo.group_diagnostics(uc, sc) == {
      "cripo/frac_samples_with_uc": 0.5,      # groups 0 and 2 of 4
      "cripo/frac_samples_with_sc": 0.5,      # groups 0 and 1 of 4
      "cripo/sc_per_sample": 0.75,            # (2 + 1 + 0 + 0) / 4
  }


def test_options_are_validated_before_tracing():
  for bad, key in [({"reward_normalizer": "max"}, "reward_normalizer"), ({"max_uc": -1}, "max_uc"),
                   ({"adv_eps": -1e-3}, "adv_eps")]:
    with pytest.raises(ValueError, match=key):
      cripo.CriPOGroupConfig(**bad)
  zeros = jnp.zeros((1, 4))
  with pytest.raises(ValueError, match="gamma"):
    cripo.localisation_mask(zeros, zeros, gamma=0.0)
  with pytest.raises(ValueError, match="kl_clamp"):
    cripo.localisation_mask(zeros, zeros, kl_clamp=-1.0)
  with pytest.raises(ValueError, match="alpha"):
    cripo.counterfactual_flips(zeros, zeros, zeros, zeros, zeros, alpha=0.0)


# --- teacher contexts -------------------------------------------------------------------------


def test_injection_messages():
  messages = cripo_prefix.injection_messages(
      "Why is the sky blue?", "Because of the ocean.", ["Mentions scattering.", " Mentions wavelength. "],
      system_prompt="You are a helpful assistant.")
  assert [m["role"] for m in messages] == ["system", "user"]
  assert messages[0]["content"] == "You are a helpful assistant."
  content = messages[1]["content"]
  positions = [content.index(s) for s in
               ["Why is the sky blue?", "Because of the ocean.", "1. Mentions scattering.\n2. Mentions wavelength.\n"]]
  assert positions == sorted(positions)
  assert "minimal" in content and "satisfies every criterion" in content
  assert not content.endswith("\n") and "{{" not in content


def test_counterfactual_messages():
  messages = cripo_prefix.counterfactual_messages("Q: why?", "An answer.", ["Names the cause."])
  assert [m["role"] for m in messages] == ["user"]
  content = messages[0]["content"]
  assert "Q: why?" in content and "An answer." in content and "1. Names the cause.\n" in content
  assert "modify or delete" in content and "no longer satisfies" in content


def test_teacher_context_errors(tmp_path):
  with pytest.raises(ValueError, match="criteria must be a non-empty list"):
    cripo_prefix.injection_messages("Q?", "A.", [])
  with pytest.raises(ValueError, match="criteria must be a non-empty list"):
    cripo_prefix.injection_messages("Q?", "A.", "one criterion as a string")
  with pytest.raises(ValueError, match=r"criteria\[1\] must be a non-empty string"):
    cripo_prefix.counterfactual_messages("Q?", "A.", ["ok", "  "])
  with pytest.raises(ValueError, match="question must be"):
    cripo_prefix.counterfactual_messages(None, "A.", ["ok"])
  missing_answer = tmp_path / "no_answer.jinja"
  missing_answer.write_text("{{ question }} {% for c in criteria %}{{ c }}{% endfor %}")
  with pytest.raises(ValueError, match=r"no_answer.jinja: .*uses \['criteria', 'question'\]"):
    cripo_prefix.injection_messages("Q?", "A.", ["c"], template_path=str(missing_answer))
  broken = tmp_path / "broken.jinja"
  broken.write_text("{{ question }\n")
  with pytest.raises(ValueError, match="broken.jinja:1: template syntax error"):
    cripo_prefix.injection_messages("Q?", "A.", ["c"], template_path=str(broken))
  with pytest.raises(FileNotFoundError, match="absent.jinja"):
    cripo_prefix.injection_messages("Q?", "A.", ["c"], template_path=str(tmp_path / "absent.jinja"))
