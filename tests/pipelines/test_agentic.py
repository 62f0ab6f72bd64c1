"""RISED's stages with a scripted engine: teacher rows, groups without positives, and hints
that reach training rollouts but never evaluation prompts."""
from __future__ import annotations

import numpy as np
import pytest

from rised_jax.learn import batching
from tests.helpers.run_fixtures import frozenlake_pipeline as _pipeline


def _contains(haystack: list[int], needle: list[int]) -> bool:
  return any(haystack[i:i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


def _one_step(pipeline, step=0):
  record = pipeline.roll_out(step)
  for stage in (pipeline.judge, pipeline.advantages, pipeline.select, pipeline.teach):
    record = stage(record)
  return record, pipeline.rows(record)


def test_teacher_rows_differ_from_student_rows_only_in_the_prefix():
  # "right" wins the one-move maps whose goal is to the right: a pool with successes, so the
  # successful groups' positive tags make teachers.
  pipeline, _, _ = _pipeline("right")
  record, rows = _one_step(pipeline)
  assert any(g.successes.any() for g in record.pool)
  with_teacher = [r for r in rows if r.teacher_prefix_ids is not None]
  assert with_teacher
  batch = batching.assemble(rows, pad_id=0, with_distill=True)
  for i, row in enumerate(rows):
    assert row.teacher_prefix_ids is None or row.teacher_prefix_ids != row.prefix_ids
    # Every column after the prefix holds the same ids in the student and the teacher row;
    # the prefix columns hold each row's own (left-padded) prefix.
    n = len(row.response_ids)
    start = int(np.flatnonzero(batch["attention_mask"][i])[-1]) + 1 - n
    np.testing.assert_array_equal(batch["input_ids"][i, start:], batch["teacher_input_ids"][i, start:])
    np.testing.assert_array_equal(batch["input_ids"][i, start:start + n], row.response_ids)
    teacher_prefix = batch["teacher_input_ids"][i, :start][batch["teacher_attention_mask"][i, :start] > 0]
    expected = row.prefix_ids if row.teacher_prefix_ids is None else row.teacher_prefix_ids
    np.testing.assert_array_equal(teacher_prefix, expected)
    assert (batch["distill_mask"][i].sum() > 0) == (row.teacher_prefix_ids is not None)
  # The teacher prefix names successful behaviours; the student prefix does not.
  teacher_prefix = next(p for p in record.teacher_prefixes if p is not None)
  assert "Behaviours that succeed here" in teacher_prefix


def test_a_stage_run_before_its_inputs_exist_names_them():
  pipeline, _, _ = _pipeline("jump")
  record = pipeline.roll_out(4)
  assert (record.tags, record.chosen, record.teacher_prefixes) == (None, None, None)
  with pytest.raises(RuntimeError, match=r"AgenticStep of step 4: rows needs \['advantages', "
                                         r"'chosen', 'teacher_prefixes'\], which earlier stages "
                                         r"set \(order: roll_out, judge, advantages"):
    pipeline.rows(record)
  with pytest.raises(RuntimeError, match=r"select needs \['tags'\]"):
    pipeline.select(record)


def test_groups_without_positives_get_no_distillation():
  # "jump" is never a valid action: every rollout fails, so no positive tag comes from a
  # successful rollout anywhere, and no group gets a teacher.
  pipeline, _, _ = _pipeline("jump")
  record, rows = _one_step(pipeline)
  assert not any(g.successes.any() for g in record.pool)
  assert len(record.teacher_prefixes) == len(record.chosen)
  assert all(p is None for p in record.teacher_prefixes)
  batch = batching.assemble(rows, pad_id=0, with_distill=True)
  assert batch["distill_mask"].sum() == 0


def test_hints_reach_training_rollouts_but_never_evaluation():
  pipeline, engine, tokenizer = _pipeline("jump")
  record, _ = _one_step(pipeline)         # every rollout malformed: a frequent negative tag
  pipeline.observe(record)
  hint = pipeline.guidance.hint("frozenlake")
  assert hint, "a frequent negative tag must produce a hint"
  hint_ids = tokenizer.encode(hint)
  engine.prompts.clear()
  record = pipeline.roll_out(2)
  assert all(t.hint == hint for g in record.pool for t in g.trajectories)
  assert engine.prompts and all(_contains(p, hint_ids) for p in engine.prompts)
  engine.prompts.clear()
  pipeline.evaluate()
  assert engine.prompts and not any(_contains(p, hint_ids) for p in engine.prompts)
  # Training rows use the hint-free prompt by default (train_with_hint=False).
  record = pipeline.teach(pipeline.select(pipeline.advantages(pipeline.judge(record))))
  rows = pipeline.rows(record)
  assert not any(_contains(list(r.prefix_ids), hint_ids) for r in rows)
