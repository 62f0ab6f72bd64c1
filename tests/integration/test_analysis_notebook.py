"""Analysis of a run's logs: a synthetic workdir written through RunLog with known numbers, the
loaders and statistics against hand-computed values, the plots' data, and the notebook executed
end to end on that workdir."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rised_jax import analysis, compare, runlog, stats
from rised_jax.rubrics import profiles
from rised_jax.rubrics.vocabulary import RubricEntry, Vocabulary
from rised_jax.runlog import RunLog
from rised_jax.stats import wilson_interval
from rised_jax.types import Group, GroupTags, Task, Trajectory, Turn
from tests.helpers.run_fixtures import write_run

pytest.importorskip("matplotlib")

NOTEBOOK = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "notebooks",
                        "analyze_run.ipynb")
VOCAB = Vocabulary([RubricEntry("valid_syntax", "+", "Uses valid action syntax"),
                    RubricEntry("gave_up", "-", "Gives up early"),
                    RubricEntry("loops", "-", "Repeats an action that had no effect")])
V, G, L = "valid_syntax", "gave_up", "loops"
UNJUDGED = "unjudged"   # a rollout the judge failed on

# step -> pool of (env, seed, successes, tags per rollout (None: not judged), selected)
POOLS = {
    1: [("maze", 1, [1, 1], [[V], [V]], True),                   # all-pass
        ("maze", 2, [0, 0], [[G], [G, L]], False),               # all-fail
        ("wordle", 7, [1, 0], [[V], [L]], True)],                # mixed
    2: [("maze", 3, [1, 0], [[V], UNJUDGED], True),              # mixed
        ("wordle", 8, [0, 0], [[G], [G]], True),                 # all-fail
        ("wordle", 9, [1, 1], [[V, L], [V]], False)],            # all-pass
    3: [("maze", 4, [0, 1], [[L], [V]], True),                   # mixed
        ("wordle", 10, [1, 0], [None, None], True)],             # mixed, not judged
}
# Training scalars as the trainer names them: step -> {name: value}.
TRAINING = {1: {"loss": 0.9, "entropy": 2.0, "distill_loss": 0.30, "rollout/maze/success": 0.5,
                "select/zero_variance_groups": 1.0, "progress/rollouts": 6.0, "time/step": 1.0},
            2: {"loss": 0.7, "entropy": 1.8, "distill_loss": 0.20, "rollout/maze/success": 0.5,
                "rollout/wordle/success": 0.5, "progress/rollouts": 12.0, "time/step": 1.0},
            3: {"loss": 0.4, "entropy": 1.5, "rollout/maze/success": 0.5,
                "progress/rollouts": 16.0, "time/step": 1.0}}
# Evaluation: step -> {env: successes out of 8 episodes}.
EVALS = {0: {"maze": 2, "wordle": 1}, 2: {"maze": 4, "wordle": 2}, 3: {"maze": 6, "wordle": 3}}


def make_group(env, seed, successes, tags, selected):
  """The group and the stages' notes on it (a group is judged whole or not at all)."""
  trajs = [Trajectory(Task(env, seed), [1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.5], 1,
                      [Turn("a", "o", float(success), True, False, [])], success=bool(success),
                      reward=float(success)) for success in successes]
  judged = tags[0] is not None
  rows = (np.stack([np.zeros(len(VOCAB), np.float32) if tag == UNJUDGED else VOCAB.multi_hot(tag)
                    for tag in tags]) if judged else None)
  notes = runlog.GroupNotes(selected=selected, teacher=selected, tags=rows,
                            unjudged=tuple(tag == UNJUDGED for tag in tags))
  return Group(Task(env, seed), trajs), notes


def eval_results(step):
  results = {}
  for env, wins in EVALS[step].items():
    low, high = wilson_interval(wins, 8)
    results[env] = {"pass_rate": wins / 8, "ci_low": low, "ci_high": high, "episodes": 8}
  return results


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  path = tmp_path_factory.mktemp("run")
  with RunLog(path) as log:
    log.evaluation(0, eval_results(0))
    for step, pool in POOLS.items():
      groups, notes = zip(*[make_group(*spec) for spec in pool])
      log.rollouts(step, groups, notes, VOCAB)
      log.scalars(step, {"loss": 1.0 / step}, prefix="train")
      log.scalars(step, TRAINING[step])
      if step in EVALS:
        log.evaluation(step, eval_results(step))
    log.write_summary(eval_results(0), eval_results(3))
  return str(path)


@pytest.fixture(scope="module")
def run(workdir):
  return analysis.load_run(workdir)


def test_load_run(run, workdir):
  assert [m["step"] for m in run.metrics if "train/loss" in m] == [1, 2, 3]
  assert len(run.rollouts) == 16 and len(run.evals) == 6
  assert [e["id"] for e in run.vocabulary] == VOCAB.ids
  assert run.summary["mean"]["after"] == (6 / 8 + 3 / 8) / 2
  assert "16 rollouts" in run.describe() and "['maze', 'wordle']" in run.describe()


def test_load_run_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="is not a directory"):
    analysis.load_run(tmp_path / "missing")
  with pytest.raises(FileNotFoundError, match="holds none of the run logs"):
    analysis.load_run(tmp_path)


def test_pass_rate_curves(run):
  curves = analysis.pass_rate_curves(run)
  assert list(curves) == ["maze", "wordle"]
  np.testing.assert_array_equal(curves["maze"].steps, [0, 2, 3])
  np.testing.assert_array_equal(curves["maze"].pass_rate, [2 / 8, 4 / 8, 6 / 8])
  np.testing.assert_array_equal(curves["wordle"].pass_rate, [1 / 8, 2 / 8, 3 / 8])
  np.testing.assert_array_equal(curves["wordle"].episodes, [8, 8, 8])
  np.testing.assert_allclose(curves["maze"].ci_low[0], 0.0714777, atol=1e-7)   # Wilson 2/8
  np.testing.assert_allclose(curves["maze"].ci_high[0], 0.5907301, atol=1e-7)
  steps, mean = analysis.mean_pass_rate_curve(curves)
  np.testing.assert_array_equal(steps, [0, 2, 3])
  np.testing.assert_allclose(mean, [3 / 16, 6 / 16, 9 / 16])


def test_tag_frequencies_hand_computed(run):
  nan = np.nan
  freqs = analysis.tag_frequencies(run)
  assert freqs["maze"].tags == [V, G, L]
  np.testing.assert_array_equal(freqs["maze"].steps, [1, 2, 3])
  np.testing.assert_array_equal(freqs["maze"].frequency,
                                [[2 / 4, 2 / 4, 1 / 4], [1, 0, 0], [1 / 2, 0, 1 / 2]])
  np.testing.assert_array_equal(freqs["maze"].tagged, [4, 1, 2])
  np.testing.assert_array_equal(freqs["maze"].rollouts, [4, 2, 2])
  np.testing.assert_array_equal(freqs["wordle"].frequency,
                                [[1 / 2, 0, 1 / 2], [2 / 4, 2 / 4, 1 / 4], [nan, nan, nan]])
  np.testing.assert_array_equal(freqs["wordle"].tagged, [2, 4, 0])
  selected = analysis.tag_frequencies(run, selected_only=True)
  np.testing.assert_array_equal(selected["maze"].frequency,
                                [[1, 0, 0], [1, 0, 0], [1 / 2, 0, 1 / 2]])
  np.testing.assert_array_equal(selected["wordle"].frequency,
                                [[1 / 2, 0, 1 / 2], [0, 1, 0], [nan, nan, nan]])


def test_tag_frequencies_agree_with_the_profile_module(run):
  """Per step, the JSONL path equals rubrics.profiles.tag_frequencies over the Groups."""
  freqs = analysis.tag_frequencies(run)
  for step, pool in POOLS.items():
    groups, notes = zip(*[make_group(*spec) for spec in pool])
    # A group no tag judge saw counts as wholly unjudged.
    tags = [GroupTags(np.zeros((len(g.trajectories), len(VOCAB)), np.float32), np.ones(
        len(g.trajectories), bool)) if n.tags is None else GroupTags(n.tags, np.asarray(n.unjudged))
            for g, n in zip(groups, notes)]
    expected = profiles.tag_frequencies(groups, tags, VOCAB)
    for env, by_tag in expected.items():
      row = freqs[env].frequency[list(freqs[env].steps).index(step)]
      np.testing.assert_allclose(row, [by_tag[t] for t in VOCAB.ids], atol=1e-12)


def test_selection_stats_hand_computed(run):
  stats = analysis.selection_stats(run)
  assert stats == {
      "maze": analysis.SelectionStats(candidates=4, selected=3, pool_all_pass=1, pool_all_fail=1,
                                      pool_mixed=2, selected_all_pass=1, selected_all_fail=0,
                                      selected_mixed=2),
      "wordle": analysis.SelectionStats(candidates=4, selected=3, pool_all_pass=1,
                                        pool_all_fail=1, pool_mixed=2, selected_all_pass=0,
                                        selected_all_fail=1, selected_mixed=2)}
  assert stats["maze"].share_selected == 0.75 and stats["wordle"].selected_zero_variance == 1
  table = analysis.format_selection_table(stats).splitlines()
  assert table[2].split("|")[1:-1] == [" maze   ", " 4      ", " 3        ", " 0.750 ",
                                       " 1                 ", " 0                 ",
                                       " 2              ", " 2          "]
  assert [c.strip() for c in table[-1].split("|")[1:-1]] == [
      "all", "8", "6", "0.750", "1", "1", "4", "4"]


def test_selection_stats_rejects_an_inconsistent_group(tmp_path):
  record = {"step": 1, "group": 0, "env": "maze", "seed": 1, "selected": True, "success": True,
            "tags": None, "unjudged": False}
  with open(tmp_path / runlog.ROLLOUTS_FILE, "w", encoding="utf-8") as f:
    f.write(json.dumps(record) + "\n" + json.dumps({**record, "seed": 2}) + "\n")
  with pytest.raises(ValueError, match=r"record 1 \(step 1, group 0\) has env 'maze', seed 2"):
    analysis.selection_stats(analysis.load_run(tmp_path))
  with open(tmp_path / runlog.ROLLOUTS_FILE, "w", encoding="utf-8") as f:
    f.write(json.dumps({"step": 1}) + "\n")
  with pytest.raises(ValueError, match=r"record 0 lacks key\(s\) \['group'"):
    analysis.selection_stats(analysis.load_run(tmp_path))


def test_before_after_from_summary_and_from_eval(run):
  expected = stats.format_pass_rate_table(eval_results(0), eval_results(3))
  assert analysis.before_after_table(run) == expected
  # Mean before (2/8 + 1/8) / 2 = 0.1875, after (6/8 + 3/8) / 2 = 0.5625 (ties round to even).
  assert expected.splitlines()[2:] == [
      "| maze   | 0.250 [0.071, 0.591] | 0.750 [0.409, 0.929] | +0.500 |",
      "| wordle | 0.125 [0.022, 0.471] | 0.375 [0.137, 0.694] | +0.250 |",
      "| mean   | 0.188                | 0.562                | +0.375 |"]
  without_summary = analysis.Run(**{**vars(run), "summary": None})
  assert analysis.before_after_table(without_summary) == expected
  one_eval = analysis.Run(**{**vars(without_summary),
                             "evals": [e for e in run.evals if e["step"] == 0]})
  assert analysis.before_after_table(one_eval).startswith("no before/after table")


def test_plots_draw_the_computed_numbers(run):
  curves = analysis.pass_rate_curves(run)
  axes = analysis.plot_pass_rates(curves).axes
  # One panel per environment, then the mean: each band has an axis of its own.
  assert [[line.get_label() for line in ax.get_lines()] for ax in axes[:3]] == [
      ["maze"], ["wordle"], ["mean"]]
  for ax in axes[:3]:   # whole-number step ticks, even over 3 steps
    assert all(float(v).is_integer() for v in ax.xaxis.get_major_locator().tick_values(0, 3))
  drawn = {line.get_label(): (line.get_xdata(), line.get_ydata())
           for ax in axes for line in ax.get_lines()}
  np.testing.assert_array_equal(drawn["wordle"][1], [1 / 8, 2 / 8, 3 / 8])
  np.testing.assert_allclose(drawn["mean"][1], [3 / 16, 6 / 16, 9 / 16])

  freqs = analysis.tag_frequencies(run)
  heat = analysis.plot_tag_heatmaps(freqs, run.vocabulary)
  images = [a.images[0] for a in heat.axes if a.images]
  assert len(images) == 2
  wordle = images[1].get_array()
  np.testing.assert_array_equal(wordle.mask, np.isnan(freqs["wordle"].frequency.T))
  np.testing.assert_array_equal(wordle.filled(-1), np.nan_to_num(freqs["wordle"].frequency.T,
                                                                 nan=-1))
  labels = heat.axes[0].get_yticklabels()
  assert [t.get_text() for t in labels] == [V, G, L]
  assert [t.get_color() for t in labels] == ["#2e7d32", "#c62828", "#c62828"]

  share_ax, kind_ax = analysis.plot_selection(analysis.selection_stats(run)).axes
  assert [p.get_height() for p in share_ax.patches] == [0.75, 0.75]
  # Bars per kind (all-pass, all-fail, mixed), each for (maze, wordle): pool then selected.
  heights = [p.get_height() for p in kind_ax.patches]
  np.testing.assert_allclose(heights, [1 / 4, 1 / 4, 1 / 4, 1 / 4, 2 / 4, 2 / 4,      # pool
                                       1 / 3, 0, 0, 1 / 3, 2 / 3, 2 / 3])             # selected


def test_plots_of_an_empty_run_say_so():
  empty = analysis.Run("w", [], [], [], None, None)
  for fig, message in [
      (analysis.plot_pass_rates(analysis.pass_rate_curves(empty)), "no evaluation logged"),
      (analysis.plot_tag_heatmaps(analysis.tag_frequencies(empty)), "no tagged rollouts logged"),
      (analysis.plot_selection(analysis.selection_stats(empty)), "no rollouts logged")]:
    assert [t.get_text() for t in fig.axes[0].texts] == [message]


def test_notebook_is_stored_without_outputs():
  nbformat = pytest.importorskip("nbformat")
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  code = [c for c in notebook.cells if c.cell_type == "code"]
  assert all(not c.outputs and c.execution_count is None for c in code)
  assert "RISED_WORKDIR" in code[0].source and "WORKDIR =" in code[0].source


def test_notebook_executes_on_the_run(workdir):
  pytest.importorskip("nbclient")
  pytest.importorskip("ipykernel")
  notebook = analysis.execute_notebook(NOTEBOOK, workdir)
  assert analysis.error_outputs(notebook) == []
  # pass rates, tag heatmaps, selection, training curves; no comparison without RISED_COMPARISON
  assert analysis.figure_outputs(notebook) == 4
  text = "\n".join(output.get("text", "") + output.get("data", {}).get("text/markdown", "")
                   for cell in notebook.cells if cell.cell_type == "code"
                   for output in cell.outputs)
  assert os.path.abspath(workdir) in text and "16 rollouts" in text
  assert analysis.before_after_table(analysis.load_run(workdir)) in text
  assert "| all " in text   # the selection table
  assert "entropy: entropy" in text and "no comparison: set RISED_COMPARISON" in text


def _comparison_dir(tmp_path):
  """A rised-compare directory over hand-made runs: rised beats grpo on maze."""
  for preset, rates in (("rised", [0.5, 0.75]), ("grpo", [0.25, 0.5])):
    for seed, rate in enumerate(rates):
      write_run(tmp_path, preset, seed, {"maze": rate, "wordle": rate / 2})
  compare.aggregate_dir(tmp_path)
  return tmp_path


def test_notebook_shows_a_comparison(workdir, tmp_path, monkeypatch):
  pytest.importorskip("nbclient")
  pytest.importorskip("ipykernel")
  monkeypatch.setenv("RISED_COMPARISON", str(_comparison_dir(tmp_path)))
  notebook = analysis.execute_notebook(NOTEBOOK, workdir)
  assert analysis.error_outputs(notebook) == []
  assert analysis.figure_outputs(notebook) == 5
  text = "\n".join(output.get("data", {}).get("text/markdown", "")
                   for cell in notebook.cells if cell.cell_type == "code"
                   for output in cell.outputs)
  assert "| rised | **0.625 [" in text


def test_metric_curves_and_training_panels(run):
  curves = analysis.metric_curves(run)
  np.testing.assert_array_equal(curves["loss"].steps, [1, 2, 3])
  np.testing.assert_array_equal(curves["loss"].values, [0.9, 0.7, 0.4])
  np.testing.assert_array_equal(curves["distill_loss"].steps, [1, 2])
  np.testing.assert_array_equal(curves["rollout/wordle/success"].steps, [2])
  # eval/* scalars are curves too (logged at the evaluation steps 0, 2, 3).
  np.testing.assert_array_equal(curves["eval/maze/pass_rate"].values, [2 / 8, 4 / 8, 6 / 8])
  assert "step" not in curves and "wall" not in curves
  assert analysis.training_panels(curves) == [
      ("loss", ["loss"]), ("KL to the teacher (distillation)", ["distill_loss"]),
      ("entropy", ["entropy"]),
      ("rollout success rate", ["rollout/maze/success", "rollout/wordle/success"]),
      ("skipped / dropped (count per step)", ["select/zero_variance_groups"])]
  fig = analysis.plot_training_curves(curves)
  drawn = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
           for ax in fig.axes for line in ax.get_lines()}
  assert drawn["loss"] == ([1, 2, 3], [0.9, 0.7, 0.4])
  assert drawn["rollout/wordle/success"] == ([2], [0.5])
  by_rollouts = analysis.plot_training_curves(curves, x="progress/rollouts")
  drawn = {line.get_label(): list(line.get_xdata()) for ax in by_rollouts.axes
           for line in ax.get_lines()}
  assert drawn["entropy"] == [6.0, 12.0, 16.0]
  with pytest.raises(ValueError, match="'progress/agent_tokens' was not logged"):
    analysis.plot_training_curves(curves, x="progress/agent_tokens")
  empty = analysis.plot_training_curves({})
  assert [t.get_text() for t in empty.axes[0].texts] == ["no training metrics logged"]


def test_plot_comparison_draws_the_table(tmp_path):
  comparison = analysis.load_comparison(_comparison_dir(tmp_path))
  ax = analysis.plot_comparison(comparison).axes[0]
  # Bars in method order (rised, grpo), each over maze, wordle, mean.
  heights = [p.get_height() for p in ax.patches]
  np.testing.assert_allclose(heights, [0.625, 0.3125, 0.46875, 0.375, 0.1875, 0.28125])
  dots = sorted(y for line in ax.get_lines() if line.get_marker() == "o"
                for y in line.get_ydata())
  assert dots == sorted([0.5, 0.75, 0.25, 0.375, 0.375, 0.5625,
                         0.25, 0.5, 0.125, 0.25, 0.1875, 0.375])
  with pytest.raises(FileNotFoundError, match="comparison.json does not exist"):
    analysis.load_comparison(tmp_path / "missing")


def test_execute_notebook_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="no notebook at"):
    analysis.execute_notebook(tmp_path / "missing.ipynb", tmp_path)
  with pytest.raises(FileNotFoundError, match="is not a directory"):
    analysis.execute_notebook(NOTEBOOK, tmp_path / "missing")


def test_readme_nbconvert_command_executes_the_notebook(workdir, tmp_path):
  """The README's command: `jupyter nbconvert --to notebook --execute …` with RISED_WORKDIR."""
  pytest.importorskip("nbconvert")
  nbformat = pytest.importorskip("nbformat")
  out = tmp_path / "executed.ipynb"
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = {**os.environ, "RISED_WORKDIR": os.path.abspath(workdir),
         "PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)}
  subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                  NOTEBOOK, "--output", str(out)], env=env, check=True, capture_output=True,
                 timeout=600)
  notebook = nbformat.read(out, as_version=4)
  assert analysis.error_outputs(notebook) == [] and analysis.figure_outputs(notebook) == 4
