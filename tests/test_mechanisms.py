"""The mechanism suite's pre-checks (rised_jax.mechanisms): the random-batch expectation against
enumeration, the rollouts they play and tag, and that each check can fail (on a model that was
not warm-started, the teacher line changes nothing). The warm-started model's pre-check is
asserted in tests/integration/test_mechanisms.py."""
import itertools

import numpy as np
import pytest

from rised_jax import mechanisms, warmstart
from rised_jax.envs import doors
from rised_jax.model import from_config, save_pretrained, tiny
from rised_jax.rubrics import Vocabulary
from rised_jax.rubrics.rule_judge import RuleBasedJudge
from rised_jax.types import Task


def test_random_gap_is_the_mean_over_every_subset():
  rng = np.random.default_rng(0)
  for k, b in ((5, 2), (6, 3), (7, 1)):
    rows = rng.normal(size=(k, 3))
    exact = np.mean([((rows[list(s)].mean(0) - rows.mean(0)) ** 2).sum()
                     for s in itertools.combinations(range(k), b)])
    assert mechanisms.random_gap(rows, b) == pytest.approx(exact)


def test_played_groups_carry_the_judges_tags_and_outcomes():
  mechanisms.register_games()
  vocab = Vocabulary.load(mechanisms.VOCABULARY)
  task = mechanisms.held_out("trapdoors")[0]
  win = doors.winning_door(doors.Doors(**doors.SUITE_GAMES["trapdoors"]), task.seed)
  group, tags = mechanisms.judged_group(task, [win, doors.TRAP, "nonsense"], RuleBasedJudge(vocab))
  assert list(group.successes) == [1, 0, 0]
  assert [vocab.ids_of(t) for t in tags.tags] == [
      ["valid_syntax", "event.opens_named_door"], ["valid_syntax", "event.opens_with_black"],
      ["malformed_action"]]
  assert group.system_prompt.startswith("Doors: red blue green white black.")


def test_teacher_summary_hand_worked():
  # Two held-out instances, G = 4: the all-failure share is the mean of (1 - p_student)^4.
  holds = mechanisms.teacher_summary(np.array([1.0, 0.9]), np.array([0.5, 0.0]))
  assert holds["teacher_p_win"] == pytest.approx(0.95)
  assert holds["teacher_minus_student"] == pytest.approx(0.7)
  assert holds["all_failure_groups"] == pytest.approx((0.5 ** 4 + 1.0) / 2)
  assert holds["held_out"] == 2 and holds["holds"]
  # A half-trained teacher: the gap clears 0.3, the teacher's own p(win) (0.65) does not.
  half = mechanisms.teacher_summary(np.array([0.8, 0.5]), np.array([0.2, 0.1]))
  assert half["teacher_minus_student"] == pytest.approx(0.5) and not half["holds"]
  # A strong teacher over a strong student: too little to distil.
  small = mechanisms.teacher_summary(np.array([1.0, 1.0]), np.array([0.8, 0.8]))
  assert small["teacher_minus_student"] == pytest.approx(0.2) and not small["holds"]


@pytest.fixture(scope="module")
def untrained_model(tmp_path_factory):
  tokenizer = tiny.build_tokenizer(warmstart.tokenizer_words("doors"))
  model = from_config(tiny.tiny_config(tokenizer.vocab_size), 0)
  return str(save_pretrained(model, tokenizer, tmp_path_factory.mktemp("untrained")))


def test_prechecks_fail_on_a_model_that_was_not_warm_started(untrained_model):
  report = mechanisms.precheck(untrained_model)
  teacher, hint = report["teacher"], report["guidance"]
  assert abs(teacher["teacher_minus_student"]) < 0.05 and not teacher["holds"], teacher
  # A random model opens no door in particular: the trap is no recurring failure.
  assert hint["student_p_trap"] < mechanisms.GUIDANCE_THRESHOLD and not hint["holds"], hint
  assert hint["hint"] == "Avoid: Opens with black."
  constant = report["constant"]["doors"]
  held = [t.seed for t in mechanisms.held_out("doors")]
  assert constant["pass_rate"] == doors.best_constant_pass_rate(
      doors.Doors(**doors.SUITE_GAMES["doors"]), held)[0]
  assert len(mechanisms.lines(report)) == 5
