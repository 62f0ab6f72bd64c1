"""Selection: RISED's greedy objectives against numpy references and brute force, baselines,
exact resume from state_dict, and the registry's errors."""
import itertools
import json

import numpy as np
import pytest

from rised_jax.select import SELECTORS, cosine_similarity, greedy_select, make_selector
from rised_jax.rubrics.profiles import group_profile
from rised_jax.types import Group, Task
from tests.select.pools import (NUM_TAGS, beta_pool, dirichlet_pool, make_group, mean_gap,
                                mean_pairwise_cosine, prototype_pool, random_mean_gap,
                                random_pairwise_cosine, tag_profiles, unzip, untagged_fractions)


def choose(selector, pool_and_tags, batch_size, step):
  """`selector.select` on a (pool, tags) pair."""
  pool, tags = pool_and_tags
  return selector.select(pool, batch_size, step, tags)


def behaviour_of(tags):
  """The reference φ_g [K, 14] (mean tags ⊕ fraction with no tag), from tests.select.pools."""
  return np.concatenate([tag_profiles(tags), untagged_fractions(tags)[:, None]], axis=1)


def unit(v):
  return v / np.linalg.norm(v)


# --- similarity and the greedy objectives ------------------------------------------------------

def test_cosine_similarity_matches_numpy_and_handles_zero_rows():
  rng = np.random.default_rng(0)
  a = rng.random((5, 4))
  a[2] = 0
  b = rng.random((3, 4))
  expected = np.zeros((5, 3))
  for i, j in itertools.product(range(5), range(3)):
    if i != 2:
      expected[i, j] = a[i] @ b[j] / (np.linalg.norm(a[i]) * np.linalg.norm(b[j]))
  np.testing.assert_allclose(cosine_similarity(a, b), expected, atol=1e-12)


def test_mmr_lambda_zero_is_pure_alignment():
  rng = np.random.default_rng(1)
  for _ in range(20):
    pool, tags = beta_pool(rng, 20)
    phi = behaviour_of(tags)
    target = phi.mean(0)
    alignment = [unit(p) @ unit(target) for p in phi]
    chosen = make_selector("rised", objective="mmr", lam=0.0).select(pool, 6, step=3, tags=tags)
    assert chosen == list(np.argsort(alignment)[::-1][:6])


def test_mmr_redundancy_term_matches_a_direct_implementation():
  """Each pick maximises sim(φ_g, φ̄) − λ·max_{s∈S} sim(φ_g, φ_s), written with loops."""
  rng = np.random.default_rng(2)
  for lam in (0.3, 2.0):
    pool, tags = dirichlet_pool(rng, 15)
    phi = behaviour_of(tags)
    target = phi.mean(0)
    expected = []
    for _ in range(5):
      scores = {g: unit(phi[g]) @ unit(target) - lam * max(
          (unit(phi[g]) @ unit(phi[s]) for s in expected), default=0.0)
                for g in range(len(pool)) if g not in expected}
      expected.append(max(scores, key=scores.get))
    assert make_selector("rised", objective="mmr", lam=lam).select(pool, 5, 0, tags) == expected


@pytest.mark.parametrize("direction_weight,direction_target", [(2.0, 0.9), (0.0, 1.0), (1.0, 0.5)])
def test_composition_matches_a_direct_implementation(direction_weight, direction_target):
  """Each pick minimises ‖mean_{S∪g} φ − φ̄‖² + α²‖mean_{S∪g} φ/‖φ‖ − c·mean φ/‖φ‖‖², written
  with loops over the reference profiles; with one pick it is the brute-force optimum."""
  rng = np.random.default_rng(3)
  for trial in range(12):
    pool, tags = (beta_pool if trial % 2 else dirichlet_pool)(rng, int(rng.integers(2, 16)))
    phi = behaviour_of(tags)
    units = np.stack([unit(p) for p in phi])

    def cost(subset):
      return (np.sum((phi[subset].mean(0) - phi.mean(0)) ** 2) + direction_weight ** 2 * np.sum(
          (units[subset].mean(0) - direction_target * units.mean(0)) ** 2))

    expected = []
    for _ in range(min(5, len(pool))):
      costs = {g: cost(expected + [g]) for g in range(len(pool)) if g not in expected}
      expected.append(min(costs, key=costs.get))
    selector = make_selector("rised", direction_weight=direction_weight,
                             direction_target=direction_target)
    assert selector.select(pool, 5, 0, tags) == expected
    assert expected[0] == min(range(len(pool)), key=lambda g: cost([g]))


ALIGNMENT_SIZES = [(32, 8), (128, 32), (128, 64)]


@pytest.mark.parametrize("generator", [beta_pool, dirichlet_pool, prototype_pool],
                         ids=["beta", "dirichlet", "prototype_held_out"])
@pytest.mark.parametrize("num_groups,batch_size", ALIGNMENT_SIZES)
def test_default_selection_halves_a_random_subsets_distance_to_the_pool(generator, num_groups,
                                                                       batch_size):
  """Issue 21: the default objective's chosen mean tag profile is at most half as far (squared
  distance) from the pool's as a uniform random B-subset's is in expectation (exact, not
  sampled), and its batch is no more redundant (mean pairwise cosine) than a random one."""
  rng = np.random.default_rng([21, num_groups, batch_size])
  selector = make_selector("rised", seed=4)
  gaps, random_gaps, cosine_excess = [], [], []
  for step in range(12):
    pool, tags = generator(rng, num_groups)
    judged = [k for k, t in enumerate(tags) if t.judged.any()]   # the profiled pool
    if len(judged) < len(pool):   # an unjudged group is chosen last; keep it out of the measure
      pool, tags = [pool[k] for k in judged], [tags[k] for k in judged]
    phi = tag_profiles(tags)
    chosen = selector.select(pool, batch_size, step, tags)
    gaps.append(mean_gap(phi, chosen))
    random_gaps.append(random_mean_gap(phi, batch_size))
    behaviour = behaviour_of(tags)
    cosine_excess.append(mean_pairwise_cosine(behaviour, chosen)
                         - random_pairwise_cosine(behaviour))
  assert np.mean(gaps) <= 0.5 * np.mean(random_gaps)
  assert np.mean(cosine_excess) <= 0


def test_random_subset_expectations_are_exact():
  """The oracles above against the mean over every B-subset of a small pool."""
  rng = np.random.default_rng(4)
  x = rng.random((7, 5))
  x[3] = 0
  for batch_size in (1, 2, 3, 6, 7):
    subsets = list(itertools.combinations(range(7), batch_size))
    assert random_mean_gap(x, batch_size) == pytest.approx(
        np.mean([mean_gap(x, s) for s in subsets]), rel=1e-12, abs=1e-15)
    if batch_size > 1:
      assert random_pairwise_cosine(x) == pytest.approx(
          np.mean([mean_pairwise_cosine(x, s) for s in subsets]), rel=1e-12)


@pytest.mark.parametrize("objective", ["mmr", "composition"])
@pytest.mark.parametrize("num_groups,batch_size", [(32, 8), (64, 16)])
def test_selected_mean_profile_is_closer_to_the_pool_mean_than_random(objective, num_groups,
                                                                      batch_size):
  """Both objectives beat random at B = K/4 up to K = 64 (MMR does not at K = 128:
  benchmarks/selector_alignment.py)."""
  rng = np.random.default_rng(5)
  selector = make_selector("rised", objective=objective)
  ours, theirs = [], []
  for step in range(60):
    pool, tags = beta_pool(rng, num_groups)
    phi = tag_profiles(tags)
    ours.append(mean_gap(phi, selector.select(pool, batch_size, step, tags)))
    theirs.append(random_mean_gap(phi, batch_size))
  assert np.mean(ours) < 0.8 * np.mean(theirs)


def test_composition_is_never_worse_than_random_on_average():
  rng = np.random.default_rng(6)
  selector = make_selector("rised")
  for batch_size in (1, 4, 16, 24):   # pool 32; at B = K - 1 greedy is only at parity
    ours, theirs = [], []
    for step in range(20):
      pool, tags = beta_pool(rng, 32)
      phi = tag_profiles(tags)
      ours.append(mean_gap(phi, selector.select(pool, batch_size, step, tags)))
      theirs.append(random_mean_gap(phi, batch_size))
    assert np.mean(ours) <= np.mean(theirs)


def test_profiles_with_success_rate_and_unjudged_rollouts():
  tags = np.eye(3, NUM_TAGS)
  group, group_tags = make_group("a", 0, tags, [1, 0, 1], unjudged=[False, False, True])
  np.testing.assert_allclose(group_profile(group, group_tags, with_success=True),
                             np.concatenate([tags[:2].mean(0), [2 / 3]]), rtol=1e-6)
  # A fully unjudged group has a zero profile: no NaN, and it stays eligible.
  unjudged = make_group("a", 1, None, [0, 1])
  others, other_tags = beta_pool(np.random.default_rng(7), 5)
  pool, pool_tags = [unjudged[0]] + others, [unjudged[1]] + other_tags
  np.testing.assert_array_equal(group_profile(*unjudged), np.zeros(NUM_TAGS))
  for options in ({}, {"with_success": True}, {"objective": "composition"}):
    chosen = make_selector("rised", **options).select(pool, 6, 0, pool_tags)
    assert sorted(chosen) == list(range(6))


def test_identical_and_zero_profiles_give_distinct_seeded_choices():
  tags = np.ones((4, NUM_TAGS))
  same = unzip(make_group("a", k, tags, [1, 0, 1, 0]) for k in range(10))
  zeros = unzip(make_group("a", k, None, [0, 0]) for k in range(10))
  for pool, pool_tags in (same, zeros):
    for objective in ("mmr", "composition"):
      first = make_selector("rised", objective=objective, seed=1).select(pool, 4, 0, pool_tags)
      assert len(set(first)) == 4
      assert make_selector("rised", objective=objective, seed=1).select(pool, 4, 0,
                                                                        pool_tags) == first
      # Ties are broken by a seeded random order, not by position in the pool.
      draws = {tuple(make_selector("rised", objective=objective, seed=s).select(pool, 4, 0,
                                                                                pool_tags))
               for s in range(10)}
      assert len(draws) > 1


def test_greedy_select_penalty_shifts_choices():
  phi = np.array([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0]])
  target = np.array([1.0, 0.01])   # closest in angle to φ_0, largest dot product with φ_1
  order = np.arange(3)
  assert greedy_select(phi, target, 1, "mmr", 0.0, "cosine", np.zeros(3), order) == [0]
  penalty = np.array([10.0, 0.0, 0.0])
  assert greedy_select(phi, target, 1, "mmr", 0.0, "cosine", penalty, order) == [1]
  assert greedy_select(phi, target, 1, "mmr", 0.0, "dot", np.zeros(3), order) == [1]


# --- properties every selector has ------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_every_selector_returns_distinct_valid_indices(name):
  rng = np.random.default_rng(8)
  selector = make_selector(name, seed=3)
  for step, (size, batch) in enumerate([(20, 8), (8, 8), (5, 8), (1, 3), (0, 4), (12, 0)]):
    pool, tags = beta_pool(rng, size)
    chosen = selector.select(pool, batch, step, tags)
    assert len(set(chosen)) == len(chosen) == min(size, batch)
    assert all(isinstance(i, int) and 0 <= i < size for i in chosen)


@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_every_selector_is_deterministic_given_seed_and_step(name):
  pools = [beta_pool(np.random.default_rng(9), 24) for _ in range(2)]
  a, b = make_selector(name, seed=11), make_selector(name, seed=11)
  for step in range(3):
    assert choose(a, pools[0], 8, step) == choose(b, pools[1], 8, step)


def test_select_validates_arguments():
  selector = make_selector("random")
  with pytest.raises(ValueError, match=r"batch_size=-1"):
    selector.select([], -1, 0)
  with pytest.raises(ValueError, match=r"step=1.5"):
    selector.select([], 1, 1.5)
  with pytest.raises(TypeError, match=r"pool\[0\] is str"):
    selector.select(["g"], 1, 0)


def test_registry_errors():
  with pytest.raises(ValueError, match=r"^config\.select\.name: unknown selector 'mmr'; known: "
                     r"\['dapo', 'env_curriculum', 'random', 'rised', 'success_rate', 'uniform', "
                     r"'variance'\]; or an entry point"):
    make_selector("mmr")
  with pytest.raises(ValueError, match=r"selector 'rised' has no option\(s\) \['lambda'\]; "
                     r"accepted options: \['objective', 'lam',"):
    make_selector("rised", **{"lambda": 1.0})
  with pytest.raises(ValueError, match=r"objective='max'; expected one of \['composition', "
                     r"'mmr'\]"):
    make_selector("rised", objective="max")
  with pytest.raises(ValueError, match=r"direction_weight=-1.0; expected values >= 0"):
    make_selector("rised", direction_weight=-1.0)
  with pytest.raises(ValueError, match=r"direction_target=1.5; expected \[0, 1\]"):
    make_selector("rised", direction_target=1.5)
  with pytest.raises(ValueError, match=r"history='steps'"):
    make_selector("rised", history="steps")
  with pytest.raises(ValueError, match=r"shortfall='refill'"):
    make_selector("dapo", shortfall="refill")
  with pytest.raises(ValueError, match=r"seed=-1"):
    make_selector("random", seed=-1)


# --- memory of earlier steps and exact resume -------------------------------------------------

def test_task_history_avoids_recently_chosen_tasks_and_forgets_them():
  pool, tags = beta_pool(np.random.default_rng(10), 16)
  selector = make_selector("rised", history="task", history_weight=100.0, history_decay=0.5,
                           history_window=2)
  first = selector.select(pool, 8, step=0, tags=tags)
  second = selector.select(pool, 8, step=1, tags=tags)
  assert not set(first) & set(second)
  assert selector.state_dict()["task_steps"] == {
      **{pool[i].task.key: 0 for i in first}, **{pool[i].task.key: 1 for i in second}}
  # Step 3: step-0 choices are out of the window (age 3 > 2), step-1 choices are not.
  third = selector.select(pool, 8, step=3, tags=tags)
  assert set(third) == set(first)


@pytest.mark.parametrize("history", ["task", "profile"])
def test_history_window_boundary_age(history):
  """A choice weighs on the steps 1 … window after it, and memory keeps it exactly as long:
  at age == window it still penalises, also when that step is selected again or resumed from
  the state saved before it (the old memory had already dropped it after the first call)."""
  pool, tags = beta_pool(np.random.default_rng(10), 16)
  options = dict(history=history, history_weight=100.0, history_decay=0.5, history_window=2)
  selector = make_selector("rised", **options)
  first = selector.select(pool, 8, step=0, tags=tags)
  saved = json.loads(json.dumps(selector.state_dict()))
  at_window = selector.select(pool, 8, step=2, tags=tags)
  assert selector.select(pool, 8, step=2, tags=tags) == at_window
  resumed = make_selector("rised", **options)
  resumed.load_state_dict(saved)
  assert resumed.select(pool, 8, step=2, tags=tags) == at_window
  plain = make_selector("rised").select(pool, 8, step=2, tags=tags)
  assert at_window != plain   # the age-2 memory changed the choice
  if history == "task":
    assert not set(first) & set(at_window)
    # Step 3: the step-0 choices are 3 > 2 steps old, forgotten; the step-2 ones are not.
    assert set(selector.select(pool, 8, step=3, tags=tags)) == set(first)
    assert set(selector.state_dict()["task_steps"].values()) == {2, 3}
  else:
    assert {t for t, _ in selector.state_dict()["profiles"]} == {0, 2}
    selector.select(pool, 8, step=3, tags=tags)
    assert {t for t, _ in selector.state_dict()["profiles"]} == {2, 3}


def test_profile_history_penalises_similar_profiles():
  a = make_group("x", 0, np.tile(np.eye(1, NUM_TAGS, 0), (2, 1)), [1, 0])
  a2 = make_group("x", 1, np.tile(np.eye(1, NUM_TAGS, 0), (2, 1)), [1, 0])
  b = make_group("x", 2, np.tile(np.eye(1, NUM_TAGS, 1), (2, 1)), [1, 0])
  selector = make_selector("rised", history="profile", history_weight=5.0, lam=0.0)
  assert choose(selector, unzip([a, b]), 1, 0) in ([0], [1])
  remembered = selector.state_dict()["profiles"]
  assert len(remembered) == 1 and remembered[0][0] == 0
  picked_a = np.argmax(remembered[0][1]) == 0
  # Next step: the group resembling the remembered profile loses to the other one.
  assert choose(selector, unzip([a2, b]), 1, 1) == ([1] if picked_a else [0])


@pytest.mark.parametrize("name,options", [
    ("rised", {"history": "task"}), ("rised", {"history": "profile", "objective": "composition"}),
    ("env_curriculum", {}), ("env_curriculum", {"score": "failure_rate"}), ("dapo", {}),
    ("variance", {"mode": "proportional"}), ("uniform", {})])
def test_state_round_trip_gives_identical_next_selections(name, options):
  rng = np.random.default_rng(12)
  pools = [beta_pool(rng, 24) for _ in range(6)]
  original = make_selector(name, seed=5, **options)
  for step in range(3):
    choose(original, pools[step], 8, step)
  state = json.loads(json.dumps(original.state_dict()))   # must be plain data
  resumed = make_selector(name, seed=5, **options)
  resumed.load_state_dict(state)
  for step in range(3, 6):
    assert choose(resumed, pools[step], 8, step) == choose(original, pools[step], 8, step)
  with pytest.raises(ValueError, match="state has keys|keeps no state"):
    make_selector(name, **options).load_state_dict({"bogus": 1})


# --- baselines --------------------------------------------------------------------------------

def test_uniform_takes_the_pool_in_order():
  pool, tags = beta_pool(np.random.default_rng(13), 10)
  assert make_selector("uniform").select(pool, 4, 7, tags) == [0, 1, 2, 3]


def flat_and_varied_pool():
  """Groups whose rewards are flat or varied; baselines read rewards only (no tags)."""
  flat = unzip(make_group("a", k, None, [r] * 4) for k, r in enumerate([0, 1, 0, 1, 0]))[0]
  varied = unzip(make_group("a", 10 + k, None, [0, 1, 0, 0]) for k in range(3))[0]
  return [flat[0], varied[0], flat[1], flat[2], varied[1], flat[3], varied[2], flat[4]]


def test_dapo_drops_zero_variance_groups():
  pool = flat_and_varied_pool()
  varied = {1, 4, 6}
  assert set(make_selector("dapo").select(pool, 2, 0)) <= varied
  assert set(make_selector("dapo").select(pool, 3, 0)) == varied
  padded = make_selector("dapo", shortfall="pad").select(pool, 5, 0)
  assert set(padded[:3]) == varied and len(set(padded)) == 5
  assert set(make_selector("dapo", shortfall="truncate").select(pool, 5, 0)) == varied


def test_variance_prioritisation():
  variances = [0.0, 0.25, 0.1875, 0.0, 0.25, 0.1875]
  pool, _ = unzip(make_group("a", k, None, r) for k, r in enumerate(
      [[0, 0, 0, 0], [0, 1, 0, 1], [0, 0, 0, 1], [1, 1, 1, 1], [1, 0, 1, 0], [1, 1, 1, 0]]))
  np.testing.assert_allclose([g.rewards.var() for g in pool], variances)
  assert set(make_selector("variance").select(pool, 2, 0)) == {1, 4}
  assert set(make_selector("variance").select(pool, 4, 0)) == {1, 2, 4, 5}
  counts = np.zeros(6)
  selector = make_selector("variance", mode="proportional", floor=1e-3)
  for step in range(300):
    for i in selector.select(pool, 1, step):
      counts[i] += 1
  assert counts[[1, 4]].sum() > 20 * counts[[0, 3]].sum()


def curriculum_pool(pass_rates, groups_per_env=4, group_size=4):
  pool = []
  for env, rate in pass_rates.items():
    successes = int(round(rate * group_size))
    for k in range(groups_per_env):
      pool.append(make_group(env, k, None, [1] * successes + [0] * (group_size - successes)))
  return unzip(pool)[0]


def test_curriculum_statistics_follow_a_hand_computed_ema():
  selector = make_selector("env_curriculum", fast_rate=0.5, slow_rate=0.25, exploration=0.0)
  for step, rate in enumerate([0.0, 0.5, 1.0]):
    selector.select(curriculum_pool({"rising": rate, "flat": 0.5}), 2, step)
  fast, slow = 0.0, 0.0
  for rate in (0.5, 1.0):
    fast += 0.5 * (rate - fast)
    slow += 0.25 * (rate - slow)
  assert selector.stats["rising"] == pytest.approx({"fast": fast, "slow": slow, "updates": 3})
  assert selector.stats["flat"] == pytest.approx({"fast": 0.5, "slow": 0.5, "updates": 3})
  # Learning progress |fast − slow| is zero for the flat environment: only "rising" is drawn.
  np.testing.assert_allclose(selector.env_probabilities(["flat", "rising"]), [0.0, 1.0])
  pool = curriculum_pool({"rising": 1.0, "flat": 0.5})
  assert {pool[i].task.env for i in selector.select(pool, 4, 3)} == {"rising"}


def test_curriculum_failure_rate_and_exploration():
  selector = make_selector("env_curriculum", score="failure_rate", exploration=0.2)
  selector.select(curriculum_pool({"easy": 1.0, "hard": 0.25}), 1, 0)
  w = np.array([0.0, 0.75])
  np.testing.assert_allclose(selector.env_probabilities(["easy", "hard"]),
                             0.8 * w / w.sum() + 0.2 * 0.5)
  # When the weighted environments run out of groups, the others fill the batch.
  chosen = selector.select(curriculum_pool({"easy": 1.0, "hard": 0.25}, groups_per_env=2), 4, 1)
  assert sorted(chosen) == [0, 1, 2, 3]


# --- groups without a profile and cross-step overlap ------------------------------------------

ARCHETYPES = {"A": [0, 1], "B": [2, 3], "C": [1, 4], "D": [0, 5]}


def archetype_pool():
  """8 groups of a common archetype A, 4 of B, 2 of C, 1 successful D, 1 unjudged U (issue 14).
  Returns the pool, its tags and each group's archetype letter."""
  letters = ["A"] * 8 + ["B"] * 4 + ["C"] * 2 + ["D", "U"]
  pool = []
  for k, letter in enumerate(letters):
    if letter == "U":
      pool.append(make_group("x", k, None, [0, 0, 1, 0]))
      continue
    tags = np.zeros((4, NUM_TAGS))
    tags[:, ARCHETYPES[letter]] = 1
    pool.append(make_group("x", k, tags, [1, 1, 1, 1] if letter == "D" else [0, 1, 0, 0]))
  return (*unzip(pool), letters)


@pytest.mark.parametrize("options", [{}, {"lam": 0.5}, {"with_success": True},
                                     {"objective": "composition"}, {"history": "profile"}])
def test_an_unjudged_group_is_never_chosen_ahead_of_a_judged_one(options):
  """Old behaviour: U's zero profile scored 0 and MMR (λ = 2) picked A, B, U, C."""
  pool, tags, letters = archetype_pool()
  for seed in range(20):
    selector = make_selector("rised", seed=seed, **options)
    for step in range(3):
      picked = [letters[i] for i in selector.select(pool, 4, step, tags)]
      assert "U" not in picked, (seed, step, picked)
    # Only when the judged groups run out does U fill the batch, and last.
    assert [letters[i] for i in selector.select(pool, 16, 9, tags)][-1] == "U"
  default = [letters[i] for i in make_selector("rised", seed=0).select(pool, 4, 0, tags)]
  assert default[:2] == ["A", "B"]


def with_tagless(pool, tags, letters, count):
  """The archetype pool plus `count` judged groups whose judge answered `[]` for every rollout
  (letter "T")."""
  for k in range(count):
    group, group_tags = make_group("x", 100 + k, np.zeros((4, NUM_TAGS)), [0, 1, 0, 0])
    pool, tags, letters = pool + [group], tags + [group_tags], letters + ["T"]
  return pool, tags, letters


@pytest.mark.parametrize("options", [{}, {"with_success": True}, {"direction_weight": 0.0}])
def test_a_tagless_judged_group_is_not_among_the_first_picks(options):
  """Old behaviour: its zero profile scored 0 under MMR and it was the 3rd pick at B = 4, 8,
  12. Now "no behaviour observed" is a behaviour (1/16 of the profiled pool), matched at its
  share: never in the first quarter of the picks, after every archetype of larger share."""
  pool, tags, letters = with_tagless(*archetype_pool(), count=1)
  for seed in range(10):
    selector = make_selector("rised", seed=seed, **options)
    for step, batch_size in enumerate((4, 8, 12, 16)):
      picked = [letters[i] for i in selector.select(pool, batch_size, step, tags)]
      assert "T" not in picked[:4], (seed, batch_size, picked)
      assert "U" not in picked   # 17 judged groups: the unjudged one is not needed
      if "T" in picked:
        assert picked.index("T") > max(picked.index(x) for x in "ABC"), picked


def test_tagless_groups_are_redundant_with_each_other_under_mmr():
  """Under MMR a tagless group is an outlier like any rare behaviour (MMR's λ = 2 seeks
  those), but no longer one that is never penalised: a second tagless group has cosine 1 with
  the first and waits until the other behaviours are taken."""
  pool, tags, letters = with_tagless(*archetype_pool(), count=2)
  for seed in range(10):
    picked = [letters[i] for i in make_selector("rised", objective="mmr", seed=seed).select(
        pool, 6, 0, tags)]
    assert picked.count("T") == 1 and set(picked) == set("ABCDT"), picked


def test_task_history_fires_on_a_repeated_instance_under_another_seed():
  """Two seeds that generate the same one-move map are the same instance: chosen at step 0,
  the instance is penalised at step 1 even though its seed is new."""
  from rised_jax import envs
  small = dict(size=2, holes=0, min_distance=1, max_turns=1)
  keys = {}
  for seed in range(100):
    keys.setdefault(envs.instance_key("frozenlake", seed, small), []).append(seed)
  (s0, s1), (t0, t1) = [seeds[:2] for seeds in list(keys.values())[:2]]
  tags = np.tile(np.eye(1, NUM_TAGS, 0), (2, 1))

  def group(seed):
    plain, group_tags = make_group("frozenlake", seed, tags, [1, 0])
    return Group(Task("frozenlake", seed, small), plain.trajectories), group_tags

  selector = make_selector("rised", history="task", history_weight=5.0, lam=0.0, seed=0)
  first = choose(selector, unzip([group(s0), group(t0)]), 1, 0)
  repeat_of_first = [group(s1), group(t1)][first[0]]
  other = [group(t1), group(s1)][first[0]]
  assert choose(selector, unzip([repeat_of_first, other]), 1, 1) == [1]
  # Without the history reading the tie goes either way, by the seeded order.
  plain = {tuple(choose(make_selector("rised", lam=0.0, seed=s), unzip([repeat_of_first, other]),
                        1, 1)) for s in range(10)}
  assert plain == {(0,), (1,)}


@pytest.mark.parametrize("name, arg", [("tiny_cpu.py", "rised"), ("tiny_cpu.py", "rised,easy"),
                                       ("smollm2_cpu.py", "rised"),
                                       ("rised_qwen3_multienv.py", "rised,4b"),
                                       ("rised_qwen3_multienv.py", "rised,1.7b,local")])
def test_rised_configs_pool_four_per_trained_group_and_match_composition(name, arg):
  import warnings
  from pathlib import Path
  from rised_jax import pipelines
  from tests.helpers.run_fixtures import load_config_file
  config = load_config_file(Path(__file__).resolve().parents[2] / "experiments" / "configs"
                            / name, arg)
  assert config.select.pool_groups >= 4 * config.select.batch_groups
  selector = make_selector(config.select.name, **config.select.options.to_dict())
  assert (selector.objective, selector.direction_weight) == ("composition", 2.0)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    pipelines.validate(config)
  config.select.pool_groups = config.select.batch_groups
  with pytest.warns(UserWarning, match="pool_groups == batch_groups .* selection does nothing"):
    pipelines.validate(config)


def test_alignment_benchmark_writes_its_table(tmp_path):
  """benchmarks/selector_alignment.py at its smallest: its JSON holds the default's ratios,
  which clear the issue-21 bar at (128, 32), and the old default's MMR, which does not."""
  from benchmarks import selector_alignment
  out = tmp_path / "alignment.json"
  selector_alignment.main(["--pools", "3", "--generators", "beta", "--out", str(out)])
  result = json.loads(out.read_text())
  row = result["results"]["beta"]["128,32"]
  assert row["default"]["gap_ratio"] <= 0.5 < row["mmr_lam2"]["gap_ratio"]
  assert row["random"]["gap"] > row["default"]["gap"]
  sweep = result["pool_size_sweep"]["beta"]["B=8"]
  assert sweep["K=1B"]["default"] == pytest.approx(sweep["K=1B"]["random"])   # K = B: the pool
