"""The CriPO mechanism suite's task family, warm-start data and pre-checks, against hand-worked cases."""
from __future__ import annotations

import fractions
import json

import jax.numpy as jnp
import numpy as np
import pytest

from rised_jax import warmstart_cripo
from rised_jax.learn import cripo
from rised_jax.model import from_config, tiny
from rised_jax.rubric_tasks import tasks as tasks_lib
from rised_jax.rubric_tasks import word_choice


@pytest.fixture(scope="module")
def tokenizer():
  return tiny.build_tokenizer(warmstart_cripo.tokenizer_words())


def _task(words):
  return tasks_lib.parse_task(word_choice.task_json(words), "test")


def test_packaged_task_file_is_the_generator_output():
  with open(word_choice.PATH, encoding="utf-8") as f:
    assert [json.loads(line) for line in f] == word_choice.generate()


def test_rubric_scores_hand_worked():
  task = _task(("plum", "cat", "red", "fish"))
  assert word_choice.listed_words(task) == ["plum", "cat", "red", "fish"]
  f = fractions.Fraction
  assert word_choice.score(task, "plum cat please") == 1
  assert word_choice.score(task, "plum") == f(3, 5)
  assert word_choice.score(task, "cat red") == f(1, 5)
  assert word_choice.score(task, "please") == f(1, 5)
  assert word_choice.score(task, "plum cat red please") == f(1, 5)   # 3 + 1 + 1 - 4
  assert word_choice.score(task, "fish") == 0


def test_trivial_scores_hand_worked():
  tasks = [_task(("plum", "cat", "red", "fish")), _task(("cat", "plum", "dog", "frog"))]
  scores = word_choice.trivial_scores(tasks)
  # Blind: "plum cat please" scores 1 on the first and (1 + 3 + 1) / 5 = 1 on the second.
  assert scores["best_blind"] == 1.0
  # Uniform over the list: singles (3 + 1 + 0 + 0) / 4 / 5 = 0.2; ordered pairs: 6 of 12 hold
  # the first word (3), 6 the second (1): (18 + 6) / 12 / 5 = 0.4; mean 0.3 per task.
  assert scores["uniform_list"] == pytest.approx(0.3)
  assert scores["rule"] == 1.0


def test_held_out_tasks_show_lists_no_training_task_or_warm_start_row_shows(tokenizer):
  train, held_out = warmstart_cripo.split(warmstart_cripo.task_set())
  assert len(held_out) == warmstart_cripo.EVAL_TASKS
  assert not {t.prompt for t in train} & {t.prompt for t in held_out}
  data = warmstart_cripo.Data(tokenizer, 0)
  assert not {"-".join(w) for w in data.lists} & {t.id for t in held_out}
  assert len(data.lists) == 12 * 11 * 10 * 9 - len(held_out)


def test_warm_start_rows_hand_checked(tokenizer):
  data = warmstart_cripo.Data(tokenizer, 1)
  unknown = tokenizer.encode("<|unk|>")[0]
  kinds = set()
  for _ in range(60):
    prompt, target = data.row()
    assert unknown not in prompt and unknown not in target
    assert target[-1] == tokenizer.eos_token_id
    text = tokenizer.decode(prompt)
    answer = tokenizer.decode(target[:-1]).split()
    listed = text.split("this list :")[1].split(".")[0].split()
    if "misses these rubric criteria" in text:
      kinds.add("injection")
      named = [part.split()[0] for part in text.split("Uses the word")[1:]]
      assert answer[-len(named):] == named                       # the missing words appended
    elif "no longer satisfies" in text:
      kinds.add("counterfactual")
      named = {part.split()[0] for part in text.split("Uses the word")[1:]}
      assert not named & set(answer) and set(answer) <= set(listed)
    else:
      kinds.add("student")
      assert 1 <= len(answer) <= 2 and set(answer) <= set(listed)
      assert len(set(answer)) == len(answer)
  assert kinds == {"student", "injection", "counterfactual"}


def test_injection_precheck_matches_a_hand_computed_softmax(tokenizer):
  model = from_config(tiny.tiny_config(tokenizer.vocab_size), 3)
  task = _task(("plum", "cat", "red", "fish"))
  check = warmstart_cripo.injection_precheck(model, tokenizer, [task])
  response = tokenizer.encode("red") + [tokenizer.eos_token_id]
  ids = [tokenizer.encode(w)[0] for w in ("plum", "cat", "please")]

  def mass(prefix):
    full = np.asarray([prefix + response])
    logits = np.asarray(model(jnp.asarray(full), jnp.ones_like(jnp.asarray(full))), np.float64)[0]
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    rows = p[len(prefix) - 1:len(prefix) + 1]
    return rows[:, ids].sum(-1).mean(), rows

  positive = [c for c in task.criteria if c.weight > 0]
  teacher, pt = mass(warmstart_cripo.injection_prefix(tokenizer, task, ["red"], positive))
  student, ps = mass(warmstart_cripo.student_prefix(tokenizer, task))
  assert check["teacher_p_criterion_words"] == pytest.approx(teacher, rel=1e-4)
  assert check["student_p_criterion_words"] == pytest.approx(student, rel=1e-4)
  assert check["teacher_student_kl"] == pytest.approx(
      (pt * (np.log(pt) - np.log(ps))).sum(-1).mean(), rel=1e-3)
  assert check["holds"] == (teacher > student)


def test_counterfactual_precheck_counts_the_flips_of_its_rows(tokenizer):
  model = from_config(tiny.tiny_config(tokenizer.vocab_size), 0)
  tasks = warmstart_cripo.split(warmstart_cripo.task_set())[0][:6]
  check = warmstart_cripo.counterfactual_precheck(model, tokenizer, tasks, group_size=8, seed=0)
  # alpha -> 0 flips none of the same rows (the same samples: the same seed).
  none = warmstart_cripo.counterfactual_precheck(model, tokenizer, tasks, group_size=8, seed=0,
                                                 alpha=1e-30)
  assert none["flipped_tokens"] == 0 and not none["holds"]
  assert none["counterfactual_tokens"] == check["counterfactual_tokens"]
  assert 0 <= check["flipped_tokens"] <= check["counterfactual_tokens"]
  assert check["holds"] == (check["flipped_tokens"] > 0)


def test_counterfactual_flips_hand_worked():
  # The rule the pre-check applies (learn.cripo): A < 0, p_S > p_T, p_T < alpha * max p_T.
  log = np.log
  _, flips = cripo.counterfactual_flips(
      jnp.asarray([[log(0.5), log(0.5), log(0.01)]]), jnp.asarray([[log(0.01), log(0.4), log(0.001)]]),
      jnp.asarray([[log(0.9), log(0.5), log(0.9)]]), jnp.asarray([[-1.0, -1.0, -1.0]]),
      jnp.ones((1, 3)), alpha=0.1)
  assert np.asarray(flips).tolist() == [[True, False, True]]


def test_branch_activity_hand_worked():
  def record(**kw):
    return {"step": 1, "loss": 0.1, **kw}

  both = [record(kept_tokens=4.0, distill_loss=2.0, flipped_tokens=1.0, cf_tokens=4.0,
                 flip_frac=0.25),
          record(kept_tokens=3.0, distill_loss=3.0, flipped_tokens=0.0, cf_tokens=0.0,
                 flip_frac=0.0),
          record(kept_tokens=2.0, distill_loss=1.0), record(kept_tokens=5.0, distill_loss=0.5)]
  activity = warmstart_cripo.branch_activity([{"step": 0}, *both])
  assert activity == {"steps": 4, "flipped_tokens": 1.0, "kept_tokens": 14.0,
                      "mean_flip_frac": 0.25, "kl_first_half": 2.5, "kl_second_half": 0.75,
                      "holds": True}
  rising = [dict(r) for r in both]
  rising[3]["distill_loss"] = 9.0
  assert not warmstart_cripo.branch_activity(rising)["holds"]   # (1 + 9) / 2 > 2.5
  no_flips = [{k: v for k, v in r.items() if k != "flipped_tokens"} for r in both]
  assert not warmstart_cripo.branch_activity(no_flips)["holds"]
  # grpo_rubric (both branches off) logs neither kept nor flipped tokens.
  off = [record(), record()]
  assert not warmstart_cripo.branch_activity(off)["holds"]
