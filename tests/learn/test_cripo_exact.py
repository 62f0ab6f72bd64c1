"""CriPO's group-level decisions (SC, y*, counterfactual targets, advantages) against an exact oracle.

The oracle below is written from the paper's definitions with `fractions.Fraction` and shares no
code with `learn.cripo`: rewards are exact rationals, the mean and the signs of Σ_{i∈S_j} A_i are
decided on R_i − mean R (A_i is that times 1 / (std + eps) > 0).
"""
import json
from fractions import Fraction

import numpy as np
import pytest

from rised_jax.learn import cripo
from rised_jax.rubric_tasks import tasks

GROUPS = 12_000


def oracle(verdicts, weight_texts, normalizer):
  """SC, y*, counterfactual rollouts, their SC criteria and float advantages of one group.

  verdicts: [G][C] of 0/1; weight_texts: the weights as the decimal strings a task file holds.
  """
  weights = [Fraction(w) for w in weight_texts]
  if normalizer == "sum":
    z = sum(weights)
  elif normalizer == "abs":
    z = sum(abs(w) for w in weights)
  else:
    z = sum(w for w in weights if w > 0)
  rewards = [sum(w * r for w, r in zip(weights, row)) / z for row in verdicts]
  g = len(rewards)
  mean = sum(rewards) / g
  centred = [r - mean for r in rewards]
  sc = []
  for j, w in enumerate(weights):
    members = [i for i in range(g) if verdicts[i][j] == 1]
    total = sum(centred[i] for i in members)
    sc.append(w > 0 and bool(members) and (total < 0 or (total == 0 and 2 * len(members) < g)))
  best = max(range(g), key=lambda i: (rewards[i], -i))
  cf = [centred[i] < 0 and any(sc[j] and verdicts[i][j] for j in range(len(weights)))
        for i in range(g)]
  cf_criteria = [[cf[i] and sc[j] and verdicts[i][j] == 1 for j in range(len(weights))]
                 for i in range(g)]
  variance = sum(c * c for c in centred) / g
  advantages = [float(c) / (float(variance) ** 0.5 + 1e-6) for c in centred]
  return sc, best, cf, cf_criteria, advantages


def random_group(rng):
  """A RaR-like group: G odd or even, 1–15 criteria, integer, zero, pitfall or decimal weights,
  verdict rates from rare to common, and duplicated answers (reward ties)."""
  g = int(rng.choice([2, 3, 4, 5, 6, 7, 8, 9, 16]))
  c = int(rng.integers(1, 16))
  kind = rng.random()
  if kind < 0.5:
    weights = [str(int(w)) for w in rng.integers(-3, 6, c)]            # pitfalls and zeros
  elif kind < 0.8:
    weights = [str(int(w)) for w in rng.integers(1, 6, c)]
  else:
    weights = [f"{w:.1f}" for w in rng.integers(-10, 31, c) / 10]      # 0.1 + 0.2 = 0.3 cases
  rate = rng.uniform(0.05, 0.95)
  verdicts = (rng.random((g, c)) < rate).astype(int)
  for i in range(1, g):                                                  # ties between answers
    if rng.random() < 0.25:
      verdicts[i] = verdicts[rng.integers(0, i)]
  if rng.random() < 0.1:
    verdicts[:, rng.integers(0, c)] = 1                                  # met by everyone
  return verdicts, weights


def normalizer_for(weight_texts):
  total = sum(Fraction(w) for w in weight_texts)
  if total > 0:
    return "sum"
  return "positive" if any(Fraction(w) > 0 for w in weight_texts) else None


def test_hand_example_from_the_issue():
  # R = (0.6, 0.6, 0.7); criterion 0 is met by all three rollouts, so Σ A = 0 exactly and
  # |S| = 3 ≥ G/2: not SC. float32 advantages gave Σ A = −2.6e-6 and SC = {0, 1, 2, 6}.
  weights = np.array([[4, 4, 2, -3, 5, 4, 4]], np.float32)
  verdicts = np.array([[[1, 1, 0, 0, 0, 0, 1], [1, 1, 1, 1, 1, 0, 0], [1, 1, 0, 1, 1, 1, 0]]])
  analysis = cripo.analyse_groups(verdicts, weights, None, cripo.CriPOGroupConfig())
  assert np.flatnonzero(analysis.sc_mask[0]).tolist() == [2, 6]
  assert analysis.cf_rollouts.tolist() == [[True, True, False]]
  assert analysis.best.tolist() == [2]


def test_rollout_at_the_mean_is_never_negative():
  # R = (0.1 + 0.2, 0.3, 0.2, 0.4) with decimal weights: rollout 0 and 1 sit exactly at the mean.
  weights = np.array([[0.1, 0.2, 0.3, 0.2, 0.2]], np.float32)
  verdicts = np.array([[[1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]])
  analysis = cripo.analyse_groups(verdicts, weights, None, cripo.CriPOGroupConfig())
  assert analysis.advantages[0, 0] == 0.0 and analysis.advantages[0, 1] == 0.0
  assert not analysis.cf_rollouts[0, :2].any()
  # Criteria 0, 1 (rollout 0 only) and 2 (rollout 1 only): Σ A = 0 and |S| = 1 < 2: SC by the tie rule.
  assert analysis.sc_mask[0].tolist() == [True, True, True, False, False]


@pytest.mark.slow
def test_exact_oracle_on_random_groups():
  rng = np.random.default_rng(20260718)
  mismatches = {"sc": 0, "best": 0, "cf": 0, "cf_criteria": 0, "advantages": 0}
  checked = 0
  while checked < GROUPS:
    verdicts, weight_texts = random_group(rng)
    normalizer = normalizer_for(weight_texts)
    if normalizer is None:
      continue
    sc, best, cf, cf_criteria, advantages = oracle(verdicts.tolist(), weight_texts, normalizer)
    weights = np.array([float(w) for w in weight_texts], np.float32)[None]
    analysis = cripo.analyse_groups(verdicts[None], weights, None,
                                    cripo.CriPOGroupConfig(reward_normalizer=normalizer))
    mismatches["sc"] += analysis.sc_mask[0].tolist() != sc
    mismatches["best"] += int(analysis.best[0]) != best
    mismatches["cf"] += analysis.cf_rollouts[0].tolist() != cf
    mismatches["cf_criteria"] += analysis.cf_criteria[0].tolist() != cf_criteria
    mismatches["advantages"] += not np.allclose(analysis.advantages[0], advantages, rtol=1e-5,
                                                atol=1e-6)
    checked += 1
  assert mismatches == dict.fromkeys(mismatches, 0), mismatches


def test_padded_groups_of_different_sizes_match_the_oracle():
  rng = np.random.default_rng(7)
  groups = []
  while len(groups) < 200:
    verdicts, weight_texts = random_group(rng)
    if verdicts.shape[0] == 6 and normalizer_for(weight_texts) == "sum":
      groups.append((verdicts, weight_texts))
  verdicts, weights, mask = cripo.pad_criteria(
      [v for v, _ in groups], [np.array([float(w) for w in t], np.float32) for _, t in groups])
  analysis = cripo.analyse_groups(verdicts, weights, mask, cripo.CriPOGroupConfig())
  for k, (v, texts) in enumerate(groups):
    sc, best, cf, _, _ = oracle(v.tolist(), texts, "sum")
    assert analysis.sc_mask[k, :len(texts)].tolist() == sc and not analysis.sc_mask[k, len(texts):].any()
    assert (int(analysis.best[k]), analysis.cf_rollouts[k].tolist()) == (best, cf)


@pytest.mark.parametrize("normalizer", ["sum", "abs", "positive"])
def test_exact_centred_rewards_are_an_integer_multiple_of_the_deviation(normalizer):
  weights = np.array([[0.5, 1.5, -0.25]], np.float32)
  verdicts = np.array([[[1, 0, 0], [1, 1, 1], [0, 0, 1]]])
  centred = cripo.exact_centred_rewards(verdicts, weights)
  # L = 4: W = (2, 6, −1); s = (2, 7, −1), Σ s = 8; D = 3 s − 8.
  assert centred.tolist() == [[-2, 13, -11]]
  advantages, _ = cripo.exact_advantages(verdicts, weights, normalizer=normalizer)
  # A = (s − mean s) / (std s + eps·L·Z), L·Z = ΣW = 7, Σ|W| = 9 or Σ positive W = 8.
  deviation = np.array([-2, 13, -11]) / 3.0
  scale = {"sum": 7.0, "abs": 9.0, "positive": 8.0}[normalizer]
  np.testing.assert_allclose(advantages[0], deviation / (deviation.std() + 1e-6 * scale), rtol=1e-6)


# ----------------------------------------------------------------------------- ratio weights


def _task_line(weight_values, task_id: str = "t") -> str:
  """One task JSONL line whose criteria carry the given JSON weight values."""
  criteria = [{"id": f"c{j}", "text": f"criterion {j}", "weight": w,
               "check": {"type": "words", "min": 1}} for j, w in enumerate(weight_values)]
  return json.dumps({"id": task_id, "prompt": "p", "criteria": criteria})


def normalised_group(rng, as_ratio_strings: bool):
  """An integer rubric divided by its sum, as a task file holds it: each weight the float k/Σ
  (json writes its shortest text) or the ratio string "k/Σ". Returns (verdicts, the JSON
  weight values, their texts in the file)."""
  while True:
    verdicts, integer_texts = random_group(rng)
    integers = [int(Fraction(t) * 10) for t in integer_texts]   # the decimal rubrics too
    total = sum(integers)
    if total > 0 and all(integers):
      break
  if as_ratio_strings:
    values = [f"{k}/{total}" for k in integers]
    return verdicts, values, values
  values = [k / total for k in integers]
  return verdicts, values, [json.dumps(v) for v in values]


@pytest.mark.parametrize("as_ratio_strings", [False, True])
def test_normalised_ratio_weights_match_the_oracle(tmp_path, as_ratio_strings):
  """Issue 21.8: with float32 weights k/Σ, SC, y*, the counterfactual rollouts and the sign of
  A disagreed with the oracle in 17-38 of these 1,500 groups; read exactly from the file, in
  none."""
  rng = np.random.default_rng(21 + as_ratio_strings)
  groups = [normalised_group(rng, as_ratio_strings) for _ in range(1500)]
  path = tmp_path / "tasks.jsonl"
  path.write_text("".join(_task_line(values, f"t{k}") + "\n"
                          for k, (_, values, _) in enumerate(groups)))
  loaded = tasks.load_jsonl(path).tasks
  mismatches = {"sc": 0, "best": 0, "cf": 0, "sign": 0, "advantages": 0, "weights": 0}
  for (verdicts, _, texts), task in zip(groups, loaded, strict=True):
    mismatches["weights"] += [c.weight for c in task.criteria] != [Fraction(t) for t in texts]
    sc, best, cf, _, advantages = oracle(verdicts.tolist(), texts, "sum")
    analysis = cripo.analyse_groups(verdicts[None], task.weights[None], None,
                                    cripo.CriPOGroupConfig())
    mismatches["sc"] += analysis.sc_mask[0].tolist() != sc
    mismatches["best"] += int(analysis.best[0]) != best
    mismatches["cf"] += analysis.cf_rollouts[0].tolist() != cf
    mismatches["sign"] += np.sign(analysis.advantages[0]).tolist() != np.sign(advantages).tolist()
    mismatches["advantages"] += not np.allclose(analysis.advantages[0], advantages, rtol=1e-5,
                                                atol=1e-6)
  assert mismatches == dict.fromkeys(mismatches, 0), mismatches


def test_a_rollout_at_the_mean_gets_exactly_zero_with_normalised_weights():
  # The integer rubric (1, 2, 3, 12) over its sum 18, written as ratios. Rollouts 0 and 2
  # meet criteria 0-2 (R = 6/18), rollout 1 criterion 3 (R = 12/18), rollout 3 none: the mean
  # is 6/18, so rollouts 0 and 2 sit exactly at it. (The decimal texts of k/18 do not add up
  # exactly, 1/18 + 2/18 + 3/18 ≠ 12/18 / 2 in 17 digits: there A is the tiny exact value.)
  line = _task_line([f"{k}/18" for k in (1, 2, 3, 12)])
  task = tasks.parse_task_json(line, "line")
  assert [c.weight for c in task.criteria] == [Fraction(k, 18) for k in (1, 2, 3, 12)]
  verdicts = np.array([[[1, 1, 1, 0], [0, 0, 0, 1], [1, 1, 1, 0], [0, 0, 0, 0]]])
  analysis = cripo.analyse_groups(verdicts, task.weights[None], None, cripo.CriPOGroupConfig())
  assert analysis.advantages[0, 0] == 0.0 and analysis.advantages[0, 2] == 0.0
  assert analysis.centred[0].tolist() == [0, 24, 0, -24]   # D = G·s − Σ s with W = (1, 2, 3, 12)
  assert analysis.advantages[0, 1] > 0 > analysis.advantages[0, 3]
  # A positive criterion met only by rollouts at the mean: Σ A = 0 and |S| = 2 = G/2, not SC.
  assert not analysis.sc_mask[0].any()


@pytest.mark.parametrize("weight,message", [
    ('"1/0"', "divides by zero"), ('"one third"', "not a ratio of integers"),
    ('"0/5"', "non-zero"), ("1e-400", "non-zero"), ("1e400", "non-zero"), ("true", "non-zero")])
def test_bad_weights_are_named(weight, message):
  line = _task_line([1]).replace('"weight": 1', f'"weight": {weight}')
  with pytest.raises(tasks.RubricFormatError, match=rf"line\.criteria\[0\]\.weight: .*{message}"):
    tasks.parse_task_json(line, "line")
