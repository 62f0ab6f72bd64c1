"""RunLog: exact JSONL content, TensorBoard events read back by tensorboard's own loader,
resume semantics of rewind, the Wilson interval, the before/after summary, and enabled=False."""
import json
import math
import os
import time

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator
from tensorboard.util import tensor_util

from rised_jax import runlog
from rised_jax.rubrics.vocabulary import RubricEntry, Vocabulary
from rised_jax.runlog import RunLog, read_jsonl
from rised_jax.stats import format_pass_rate_table, wilson_interval
from rised_jax.types import Group, Task, Trajectory, Turn

VOCAB = Vocabulary([RubricEntry("valid_syntax", "+", "Uses valid action syntax"),
                    RubricEntry("gave_up", "-", "Gives up early"),
                    RubricEntry("loops", "-", "Repeats an action that had no effect")])


def lines(workdir, name):
  with open(os.path.join(workdir, name), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def tb_scalars(workdir, tag, purge=True):
  """(step, value) of `tag` as TensorBoard's two Python loaders read it (they must agree)."""
  logdir = os.path.join(workdir, runlog.TENSORBOARD_DIR)
  legacy = event_accumulator.EventAccumulator(logdir, purge_orphaned_data=purge).Reload()
  scalars = [(e.step, e.value) for e in legacy.Scalars(tag)]
  # The loader behind `tensorboard --load_fast=false`: scalars arrive as tensors.
  plugin = plugin_event_accumulator.EventAccumulator(logdir, purge_orphaned_data=purge).Reload()
  tensors = [(e.step, tensor_util.make_ndarray(e.tensor_proto).item()) for e in plugin.Tensors(tag)]
  assert tensors == scalars
  return scalars


def make_traj(env, seed, *, success, reward, num_turns, agent_tokens, truncated=False, hint=""):
  turns = [Turn(f"a{i}", f"o{i}", 0.0, i == num_turns - 1, False, []) for i in range(num_turns)]
  mask = [0, 0] + [1] * agent_tokens + [0]
  return Trajectory(Task(env, seed), list(range(len(mask))), mask, [0.0] * len(mask), 2, turns,
                    success=success, reward=reward, truncated=truncated, hint=hint)


def notes(tags=None, unjudged=(), vocab=VOCAB, **decisions):
  """GroupNotes with one tag list per rollout (None: no tag judge ran)."""
  rows = None if tags is None else np.stack([vocab.multi_hot(t) for t in tags])
  return runlog.GroupNotes(tags=rows, unjudged=tuple(unjudged), **decisions)


def one_group(traj):
  return [Group(traj.task, [traj])]


# --- scalars -------------------------------------------------------------------------------------

def test_scalars_write_exact_jsonl_lines(tmp_path):
  jnp = pytest.importorskip("jax.numpy")
  t0 = time.time()
  with RunLog(tmp_path) as log:
    log.scalars(1, {"loss": 0.5, "tokens": 12}, prefix="train")
    log.scalars(2, {"loss": np.float32(0.25), "kl": jnp.asarray(0.125), "nan": float("nan")},
                prefix="train/")
    log.scalars(3, {"lr": np.asarray(1e-6)})
  t1 = time.time()
  records = lines(tmp_path, runlog.METRICS_FILE)
  assert [sorted(r) for r in records] == [
      ["step", "time", "train/loss", "train/tokens", "wall"],
      ["step", "time", "train/kl", "train/loss", "train/nan", "wall"],
      ["lr", "step", "time", "wall"]]
  assert [r["step"] for r in records] == [1, 2, 3]
  assert records[0]["train/loss"] == 0.5 and records[0]["train/tokens"] == 12.0
  assert records[1]["train/loss"] == 0.25 and records[1]["train/kl"] == 0.125
  assert math.isnan(records[1]["train/nan"])
  assert records[2]["lr"] == 1e-6
  times = [r["time"] for r in records]
  walls = [r["wall"] for r in records]
  assert t0 <= times[0] <= times[1] <= times[2] <= t1
  assert 0 <= walls[0] <= walls[1] <= walls[2] <= t1 - t0


def test_tensorboard_reads_the_scalars_back(tmp_path):
  values = [0.5, 1.0 / 3.0, 2.75]
  with RunLog(tmp_path) as log:
    for step, value in enumerate(values, start=1):
      log.scalars(step, {"loss": value, "doubled": 2 * value}, prefix="train")
  assert tb_scalars(tmp_path, "train/loss") == [
      (s, float(np.float32(v))) for s, v in enumerate(values, start=1)]
  assert tb_scalars(tmp_path, "train/doubled") == [
      (s, float(np.float32(2 * v))) for s, v in enumerate(values, start=1)]


def test_a_later_session_without_rewind_purges_nothing(tmp_path):
  """E.g. an evaluation logged into a finished run's workdir at its last step."""
  with RunLog(tmp_path) as log:
    for step in (1, 2, 3):
      log.scalars(step, {"loss": float(step)})
  with RunLog(tmp_path) as log:
    log.scalars(3, {"eval": 0.5})
  assert tb_scalars(tmp_path, "loss") == [(1, 1.0), (2, 2.0), (3, 3.0)]
  assert tb_scalars(tmp_path, "eval") == [(3, 0.5)]


def test_event_files_sort_in_creation_order(tmp_path):
  """TensorBoard reads files in name order; many logs in one second must still sort right."""
  paths = []
  for _ in range(12):
    with RunLog(tmp_path) as log:
      log.scalars(1, {"x": 1.0})   # the event file opens at the first event
      paths.append(log.event_file)
  assert sorted(paths) == paths and len(set(paths)) == 12


def test_a_session_that_logs_nothing_leaves_no_event_file(tmp_path):
  """A rerun of a finished run opens its log only to rewrite the summary."""
  with RunLog(tmp_path) as log:
    log.scalars(1, {"x": 1.0})
  with RunLog(tmp_path) as log:
    log.write_summary(BEFORE, AFTER)
    assert log.event_file is None
  assert len(list((tmp_path / runlog.TENSORBOARD_DIR).iterdir())) == 1


def test_rewind_to_none_forgets_everything(tmp_path):
  """A run killed before its first checkpoint restarts from scratch: no line may survive."""
  with RunLog(tmp_path) as log:
    log.evaluation(0, AFTER)
    log.scalars(1, {"loss": 1.0})
  with RunLog(tmp_path) as log:
    log.rewind(None)
    log.evaluation(0, BEFORE)
  assert [r["step"] for r in runlog.read_jsonl(tmp_path / runlog.EVAL_FILE)] == [0] * len(BEFORE)
  metrics = runlog.read_jsonl(tmp_path / runlog.METRICS_FILE)
  assert [m["step"] for m in metrics] == [0] and "loss" not in metrics[0]
  assert tb_scalars(tmp_path, "eval/mean_pass_rate") == [(0, pytest.approx((0.25 + 0.5) / 2))]
  logdir = os.path.join(tmp_path, runlog.TENSORBOARD_DIR)
  accumulator = event_accumulator.EventAccumulator(logdir, purge_orphaned_data=True).Reload()
  assert accumulator.Scalars("loss") == []   # the tag may stay listed, its events are purged


# --- rollouts and evaluation ---------------------------------------------------------------------

def test_rollouts_write_one_exact_line_per_rollout(tmp_path):
  maze = Group(Task("maze", 3), [
      make_traj("maze", 3, success=True, reward=1.0, num_turns=2, agent_tokens=5,
                hint="Avoid: loops"),
      make_traj("maze", 3, success=False, reward=0.25, num_turns=4, agent_tokens=9,
                truncated=True)])
  maze_notes = notes([["valid_syntax"], []], unjudged=[False, True], selected=True, teacher=True)
  wordle = Group(Task("wordle", 11), [
      make_traj("wordle", 11, success=False, reward=0.0, num_turns=1, agent_tokens=3)])
  wordle_notes = notes([["gave_up", "loops"]])
  unjudged = Group(Task("wordle", 12), [
      make_traj("wordle", 12, success=True, reward=1.0, num_turns=3, agent_tokens=7)])
  with RunLog(tmp_path) as log:
    log.rollouts(4, [maze, wordle], [maze_notes, wordle_notes], VOCAB)
    # a second call at the same step continues the numbering
    log.rollouts(4, [unjudged], [notes(selected=True)], VOCAB)
    log.rollouts(5, [wordle], [wordle_notes], VOCAB)
  common = {"truncated": False, "unjudged": False, "selected": False, "teacher": False,
            "hint": False}
  assert lines(tmp_path, runlog.ROLLOUTS_FILE) == [
      {**common, "step": 4, "task": "maze:3", "env": "maze", "seed": 3, "group": 0, "rollout": 0, "reward": 1.0,
       "success": True, "num_turns": 2, "actions": ["a0", "a1"], "agent_tokens": 5, "tags": ["valid_syntax"],
       "selected": True, "teacher": True, "hint": True},
      {**common, "step": 4, "task": "maze:3", "env": "maze", "seed": 3, "group": 0, "rollout": 1, "reward": 0.25,
       "success": False, "truncated": True, "num_turns": 4, "actions": ["a0", "a1", "a2", "a3"], "agent_tokens": 9, "tags": [],
       "unjudged": True, "selected": True, "teacher": True},
      {**common, "step": 4, "task": "wordle:11", "env": "wordle", "seed": 11, "group": 1, "rollout": 0, "reward": 0.0,
       "success": False, "num_turns": 1, "actions": ["a0"], "agent_tokens": 3, "tags": ["gave_up", "loops"]},
      {**common, "step": 4, "task": "wordle:12", "env": "wordle", "seed": 12, "group": 2, "rollout": 0, "reward": 1.0,
       "success": True, "num_turns": 3, "actions": ["a0", "a1", "a2"], "agent_tokens": 7, "tags": None, "selected": True},
      {**common, "step": 5, "task": "wordle:11", "env": "wordle", "seed": 11, "group": 0, "rollout": 0, "reward": 0.0,
       "success": False, "num_turns": 1, "actions": ["a0"], "agent_tokens": 3, "tags": ["gave_up", "loops"]},
  ]
  logged = Vocabulary.load(tmp_path / runlog.VOCABULARY_FILE)
  assert logged.ids == VOCAB.ids and list(logged.positive_mask) == [True, False, False]


def test_rollouts_reject_bad_tags_and_a_second_vocabulary(tmp_path):
  traj = make_traj("maze", 1, success=True, reward=1.0, num_turns=1, agent_tokens=1)
  bad = runlog.GroupNotes(tags=np.ones((1, 5), np.float32))
  with RunLog(tmp_path) as log:
    with pytest.raises(ValueError, match=r"step 2, group 0 \(maze:1\), rollout 0.*shape \(5,\)"):
      log.rollouts(2, one_group(traj), [bad], VOCAB)
    with pytest.raises(ValueError, match="no vocabulary"):
      log.rollouts(2, one_group(traj), [bad], None)
    with pytest.raises(ValueError, match=r"1 rollouts but its notes cover 2 \(unjudged\)"):
      log.rollouts(2, one_group(traj), [notes([[]], unjudged=[False, False])], VOCAB)
    with pytest.raises(ValueError, match="2 notes for 1 groups"):
      log.rollouts(2, one_group(traj), [notes([[]]), notes([[]])], VOCAB)
    log.rollouts(2, one_group(traj), [notes([[]])], VOCAB)
    other = Vocabulary([RubricEntry("x", "+", "something else"), *VOCAB.entries[1:]])
    with pytest.raises(ValueError, match="another vocabulary"):
      log.rollouts(3, one_group(traj), [notes([["x"]], vocab=other)], other)


def test_evaluation_lines_and_scalars(tmp_path):
  results = {"wordle": {"pass_rate": 0.25, "ci_low": 0.1, "ci_high": 0.5, "episodes": 8},
             "maze": {"pass_rate": 0.5, "ci_low": 0.2, "ci_high": 0.8, "episodes": 4}}
  with RunLog(tmp_path) as log:
    log.evaluation(7, results)
  evals = lines(tmp_path, runlog.EVAL_FILE)
  assert [{k: v for k, v in e.items() if k != "time"} for e in evals] == [
      {"step": 7, "env": "maze", "pass_rate": 0.5, "ci_low": 0.2, "ci_high": 0.8, "episodes": 4},
      {"step": 7, "env": "wordle", "pass_rate": 0.25, "ci_low": 0.1, "ci_high": 0.5,
       "episodes": 8}]
  (metrics,) = lines(tmp_path, runlog.METRICS_FILE)
  assert {k: v for k, v in metrics.items() if k not in ("time", "wall")} == {
      "step": 7, "eval/maze/pass_rate": 0.5, "eval/wordle/pass_rate": 0.25,
      "eval/mean_pass_rate": 0.375}
  assert tb_scalars(tmp_path, "eval/mean_pass_rate") == [(7, 0.375)]


def test_evaluation_keeps_extra_numeric_results(tmp_path):
  """CriPO's evaluation adds a mean rubric score: it reaches eval.jsonl and the scalars."""
  results = {"science": {"pass_rate": 0.25, "ci_low": 0.1, "ci_high": 0.5, "episodes": 8,
                         "score": 0.625, "note": "text is not a number"}}
  with RunLog(tmp_path) as log:
    log.evaluation(3, results)
  (line,) = lines(tmp_path, runlog.EVAL_FILE)
  assert line["score"] == 0.625 and "note" not in line
  (metrics,) = lines(tmp_path, runlog.METRICS_FILE)
  assert metrics["eval/science/score"] == 0.625


# --- rewind --------------------------------------------------------------------------------------

def log_step(log, step, value):
  log.scalars(step, {"loss": value}, prefix="train")
  traj = make_traj("maze", step, success=True, reward=value, num_turns=1, agent_tokens=1)
  log.rollouts(step, one_group(traj), [notes([[]])], VOCAB)
  if step % 2 == 0:
    log.evaluation(step, {"maze": {"pass_rate": value / 100, "ci_low": 0.0, "ci_high": 1.0,
                                   "episodes": 4}})


def test_rewind_makes_a_resumed_run_read_like_an_uninterrupted_one(tmp_path):
  with RunLog(tmp_path) as log:            # the killed run: its last checkpoint was step 3
    for step in range(1, 6):
      log_step(log, step, float(step))
  last_kept_wall = [r["wall"] for r in lines(tmp_path, runlog.METRICS_FILE) if r["step"] <= 3][-1]
  with RunLog(tmp_path) as log:            # the resumed run
    log.rewind(3)
    for step in range(4, 7):
      log_step(log, step, 10.0 * step)

  def steps_values(name, key):
    return [(r["step"], r[key]) for r in lines(tmp_path, name) if key in r]

  assert steps_values(runlog.METRICS_FILE, "train/loss") == [
      (1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0), (6, 60.0)]
  assert steps_values(runlog.discarded_name(runlog.METRICS_FILE), "train/loss") == [
      (4, 4.0), (5, 5.0)]
  assert steps_values(runlog.ROLLOUTS_FILE, "reward") == [
      (1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0), (6, 60.0)]
  assert steps_values(runlog.discarded_name(runlog.ROLLOUTS_FILE), "reward") == [
      (4, 4.0), (5, 5.0)]
  assert steps_values(runlog.EVAL_FILE, "pass_rate") == [(2, 0.02), (4, 0.4), (6, 0.6)]
  assert steps_values(runlog.discarded_name(runlog.EVAL_FILE), "pass_rate") == [(4, 0.04)]
  walls = [r["wall"] for r in lines(tmp_path, runlog.METRICS_FILE)]
  assert walls == sorted(walls) and walls[-1] >= last_kept_wall
  # TensorBoard drops the killed run's steps 4-5 because of the START event at step 4 ...
  assert tb_scalars(tmp_path, "train/loss") == [
      (1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0), (6, 60.0)]
  # ... which a reader that ignores it would not.
  assert [s for s, _ in tb_scalars(tmp_path, "train/loss", purge=False)] == [1, 2, 3, 4, 5, 4, 5, 6]


def test_rewind_within_one_process_and_a_torn_last_line(tmp_path):
  with RunLog(tmp_path) as log:
    for step in (1, 2, 3):
      log.scalars(step, {"x": float(step)})
    with open(tmp_path / runlog.METRICS_FILE, "a", encoding="utf-8") as f:
      f.write('{"step": 4, "x"')         # a line cut short by a kill
    assert [r["step"] for r in read_jsonl(tmp_path / runlog.METRICS_FILE)] == [1, 2, 3]
    log.rewind(1)
    log.scalars(2, {"x": 20.0})
  assert [(r["step"], r["x"]) for r in lines(tmp_path, runlog.METRICS_FILE)] == [(1, 1.0),
                                                                                 (2, 20.0)]
  discarded = lines(tmp_path, runlog.discarded_name(runlog.METRICS_FILE))
  assert [(r["step"], r["x"]) for r in discarded[:2]] == [(2, 2.0), (3, 3.0)]
  assert discarded[2:] == [{"unparsable_line": '{"step": 4, "x"'}]
  assert tb_scalars(tmp_path, "x") == [(1, 1.0), (2, 20.0)]


def test_read_jsonl_names_a_malformed_middle_line(tmp_path):
  path = tmp_path / "m.jsonl"
  path.write_text('{"step": 1}\nnot json\n{"step": 2}\n', encoding="utf-8")
  with pytest.raises(ValueError, match=r"m.jsonl: line 2 is not valid JSON"):
    read_jsonl(path)


# --- Wilson interval -----------------------------------------------------------------------------

def test_wilson_interval_hand_worked_values():
  # 5/10: centre 0.5, half-width 1.96/1.38416 * sqrt(0.025 + 0.009604) = 0.263410.
  np.testing.assert_allclose(wilson_interval(5, 10), (0.236590, 0.763410), atol=1e-6)
  # 0/n: (0, z²/(n + z²)); n/n mirrors it.
  np.testing.assert_allclose(wilson_interval(0, 10), (0.0, 3.8416 / 13.8416), atol=1e-12)
  np.testing.assert_allclose(wilson_interval(10, 10), (1 - 3.8416 / 13.8416, 1.0), atol=1e-12)
  low, high = wilson_interval(1, 1, z=1.0)
  assert (low, high) == pytest.approx((0.5, 1.0))


def test_wilson_interval_matches_scipy():
  stats = pytest.importorskip("scipy.stats")
  z = float(stats.norm.ppf(0.975))
  for n in (1, 2, 7, 16, 50, 333):
    for k in sorted({0, 1, n // 3, n // 2, n - 1, n}):
      ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
      np.testing.assert_allclose(wilson_interval(k, n, z), (ci.low, ci.high), atol=1e-12)


@pytest.mark.parametrize("args", [(0, 0), (3, 2), (-1, 5), (1.0, 4), (True, 4), (1, 4, 0.0)])
def test_wilson_interval_rejects_bad_input(args):
  with pytest.raises(ValueError, match="wilson_interval"):
    wilson_interval(*args)


# --- summary -------------------------------------------------------------------------------------

BEFORE = {"wordle": {"pass_rate": 0.25, "ci_low": 0.0714, "ci_high": 0.5909, "episodes": 8},
          "maze": {"pass_rate": 0.5, "ci_low": 0.2152, "ci_high": 0.7848, "episodes": 8}}
AFTER = {"maze": {"pass_rate": 0.875, "ci_low": 0.5291, "ci_high": 0.9776, "episodes": 8},
         "wordle": {"pass_rate": 0.125, "ci_low": 0.0224, "ci_high": 0.4709, "episodes": 8}}
EXPECTED_TABLE = (
    "| env    | before (95 % CI)     | after (95 % CI)      | Δ      |\n"
    "|--------|----------------------|----------------------|--------|\n"
    "| maze   | 0.500 [0.215, 0.785] | 0.875 [0.529, 0.978] | +0.375 |\n"
    "| wordle | 0.250 [0.071, 0.591] | 0.125 [0.022, 0.471] | -0.125 |\n"
    "| mean   | 0.375                | 0.500                | +0.125 |")


def test_write_summary_table_json_and_markdown(tmp_path):
  with RunLog(tmp_path) as log:
    table = log.write_summary(BEFORE, AFTER)
  assert table == EXPECTED_TABLE
  with open(tmp_path / runlog.SUMMARY_FILE, encoding="utf-8") as f:
    summary = json.load(f)
  assert summary["environments"] == ["maze", "wordle"]
  assert summary["before"] == {env: BEFORE[env] for env in ("maze", "wordle")}
  assert summary["after"] == AFTER
  assert summary["delta"] == {"maze": 0.375, "wordle": -0.125}
  assert summary["mean"] == {"before": 0.375, "after": 0.5, "delta": 0.125}
  assert summary["table"] == EXPECTED_TABLE
  assert EXPECTED_TABLE in (tmp_path / runlog.RESULTS_FILE).read_text(encoding="utf-8")


@pytest.mark.parametrize("after, message", [
    ({"maze": AFTER["maze"]}, r"only before \['wordle'\]"),
    ({**AFTER, "maze": {**AFTER["maze"], "ci_high": 0.8}}, r"after\['maze'\]: pass_rate 0.875 is "
                                                          r"outside its interval"),
    ({**AFTER, "maze": {"pass_rate": 0.5}}, r"after\['maze'\] lacks key\(s\) \['ci_low'"),
    ({**AFTER, "maze": {**AFTER["maze"], "episodes": 0}}, r"\['episodes'\] = 0; expected an int"),
    ({**AFTER, "maze": {**AFTER["maze"], "pass_rate": 1.5}}, r"\['pass_rate'\] = 1.5"),
    ({}, "expected a non-empty dict"),
])
def test_summary_rejects_bad_results(tmp_path, after, message):
  with pytest.raises(ValueError, match=message):
    format_pass_rate_table(BEFORE, after)


# --- bad input, closed and disabled logs ---------------------------------------------------------

def test_bad_input_gets_clear_errors(tmp_path):
  (tmp_path / "file").write_text("x")
  with pytest.raises(ValueError, match="not a directory"):
    RunLog(tmp_path / "file")
  log = RunLog(tmp_path / "run")
  with pytest.raises(ValueError, match=r"RunLog.scalars: step=-1"):
    log.scalars(-1, {"x": 1.0})
  with pytest.raises(ValueError, match=r"value of 'train/v' is ndarray"):
    log.scalars(1, {"v": np.ones(2)}, prefix="train")
  with pytest.raises(ValueError, match=r"value of 's' is str"):
    log.scalars(1, {"s": "1.0"})
  with pytest.raises(ValueError, match="'wall' is reserved"):
    log.scalars(1, {"wall": 1.0})
  with pytest.raises(ValueError, match=r"groups\[0\] is dict"):
    log.rollouts(1, [{}], [notes()], VOCAB)
  log.close()
  with pytest.raises(RuntimeError, match="closed"):
    log.scalars(1, {"x": 1.0})
  assert not (tmp_path / "run" / runlog.METRICS_FILE).exists()


def test_disabled_log_validates_but_writes_nothing(tmp_path):
  workdir = tmp_path / "process1"
  traj = make_traj("maze", 1, success=True, reward=1.0, num_turns=1, agent_tokens=1)
  with RunLog(workdir, enabled=False) as log:
    assert log.event_file is None
    log.scalars(1, {"x": 1.0})
    log.rollouts(1, one_group(traj), [notes([[]])], VOCAB)
    log.evaluation(1, BEFORE)
    log.rewind(0)
    assert log.write_summary(BEFORE, AFTER) == EXPECTED_TABLE
    with pytest.raises(ValueError, match="step=-2"):
      log.scalars(-2, {"x": 1.0})
  assert not workdir.exists()
