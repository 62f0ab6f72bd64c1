"""Valid-action mass (rised_jax.teach.action_mass) and the agentic pipeline's
teacher/valid_action_mass_ratio, against hand-worked values and a numpy softmax of the model's
full logits."""
import jax
import numpy as np
import pytest

from rised_jax.model import from_config, tiny
from rised_jax.teach import action_mass
from rised_jax.types import Task
from tests.helpers.run_fixtures import frozenlake_pipeline

MOVES = ["up", "down", "left", "right"]


def test_mass_and_ratio_by_hand():
  logits = np.log([[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]]) + 7.0   # shift-invariant
  np.testing.assert_allclose(action_mass.valid_action_mass(logits, [1, 3]), [0.6, 0.4])
  assert action_mass.mass_ratio([0.2, 0.4], [0.4, 0.4]) == pytest.approx(0.75)
  assert np.isnan(action_mass.mass_ratio([], []))
  with pytest.raises(ValueError, match="must pair up"):
    action_mass.mass_ratio([0.1], [0.1, 0.2])


def test_first_action_tokens_continue_the_reply_prefix():
  tokenizer = tiny.build_tokenizer(tiny.tokenizer_words(["frozenlake"]))
  vocab = tokenizer.hf_tokenizer.get_vocab()
  assert list(action_mass.first_action_token_ids(tokenizer, MOVES, "<answer>")) == \
      sorted(vocab[m] for m in MOVES)
  # Without a prefix every answer opens with "<": the mass then measures the answer format.
  assert list(action_mass.first_action_token_ids(tokenizer, MOVES)) == [vocab["<"]]
  with pytest.raises(ValueError, match="is not the start of the answer"):
    action_mass.first_action_token_ids(tokenizer, MOVES, "Sure")
  ids = action_mass.task_first_action_token_ids(
      tokenizer, Task("frozenlake", 3, dict(size=3, holes=1, min_distance=1, max_turns=1)),
      "<answer>")
  assert list(ids) == sorted(vocab[m] for m in MOVES)
  assert action_mass.task_first_action_token_ids(tokenizer, Task("frozenlake", 3), "Sure") is None


def _softmax(row):
  row = np.asarray(row, np.float64)
  e = np.exp(row - row.max())
  return e / e.sum()


@pytest.mark.slow
@pytest.mark.parametrize("reply_prefix", ["", "<answer>"])
def test_pipeline_ratio_matches_a_numpy_reference(reply_prefix):
  """teacher_metrics against the model's full logits at each training row's last prefix
  position (the rows the step trains on), softmaxed in numpy, over the moves' ids by hand."""
  reply = "right</answer>" if reply_prefix else "<answer>right</answer>"
  pipeline, _, tokenizer = frozenlake_pipeline(reply, reply_prefix)
  record = pipeline.roll_out(0)
  for stage in (pipeline.judge, pipeline.advantages, pipeline.select, pipeline.teach):
    record = stage(record)
  model = from_config(tiny.tiny_config(tokenizer.vocab_size), 3)
  metrics = pipeline.teacher_metrics(record, model)

  vocab = tokenizer.hf_tokenizer.get_vocab()
  valid = [vocab[m] for m in MOVES] if reply_prefix else [vocab["<"]]
  rows = pipeline.rows(record)
  group_size = len(rows) // len(record.chosen)
  student, teacher = [], []
  for k, prefix in enumerate(record.teacher_prefixes):
    if prefix is None:
      continue
    row = rows[k * group_size]
    for prompt, out in ((row.prefix_ids, student), (row.teacher_prefix_ids, teacher)):
      logits = np.asarray(model(np.asarray([prompt])))[0, -1]
      out.append(_softmax(logits)[valid].sum())
  assert teacher, "the scripted pool should give some chosen group a teacher"
  assert metrics["teacher/valid_action_mass"] == pytest.approx(np.mean(teacher), rel=1e-4)
  assert metrics["teacher/student_valid_action_mass"] == pytest.approx(np.mean(student), rel=1e-4)
  assert metrics["teacher/valid_action_mass_ratio"] == pytest.approx(
      np.mean(teacher) / np.mean(student), rel=1e-4)


def test_no_metric_without_a_teacher():
  pipeline, _, tokenizer = frozenlake_pipeline("jump")   # never valid: no success, no teacher
  record = pipeline.roll_out(0)
  for stage in (pipeline.judge, pipeline.advantages, pipeline.select, pipeline.teach):
    record = stage(record)
  assert all(p is None for p in record.teacher_prefixes)
  model = from_config(tiny.tiny_config(tokenizer.vocab_size), 0)
  assert pipeline.teacher_metrics(record, model) == {}


def _backend_compiles(fn):
  """(fn(), the number of XLA backend compiles it ran)."""
  compiles = []

  def on_duration(event, duration, **_):
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(duration)

  jax.monitoring.register_event_duration_secs_listener(on_duration)
  try:
    out = fn()
  finally:
    jax.monitoring.unregister_event_duration_listener(on_duration)
  return out, len(compiles)


@pytest.mark.slow
def test_next_token_logits_compile_once_for_any_prompts_within_the_buckets():
  """Different prompt counts and lengths inside the given rows and widths reuse one compiled
  forward (the per-step teacher metric recompiled at every new prompt width before), and each
  prompt's logits are those of the model's own forward over that prompt alone."""
  model = from_config(tiny.tiny_config(50), 5)
  rng = np.random.default_rng(0)
  first = [rng.integers(1, 50, 70).tolist(), rng.integers(1, 50, 9).tolist()]
  second = [rng.integers(1, 50, n).tolist() for n in (3, 120, 31, 64)]
  buckets = dict(rows=4, widths=(128, 256))
  logits, _ = _backend_compiles(lambda: action_mass.next_token_logits(model, first, **buckets))
  again, compiles = _backend_compiles(
      lambda: action_mass.next_token_logits(model, second, **buckets))
  assert compiles == 0
  for prompts, got in ((first, logits), (second, again)):
    assert got.shape == (len(prompts), 50)
    for prompt, row in zip(prompts, got):
      want = np.asarray(model(np.asarray([prompt])))[0, -1]
      np.testing.assert_allclose(row, want, rtol=1e-4, atol=1e-4)
  # A prompt longer than every width: the PAD_MULTIPLE bucket of its length.
  long = [rng.integers(1, 50, 300).tolist()]
  np.testing.assert_allclose(action_mass.next_token_logits(model, long, **buckets)[0],
                             np.asarray(model(np.asarray(long)))[0, -1], rtol=1e-4, atol=1e-4)
