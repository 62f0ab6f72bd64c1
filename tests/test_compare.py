"""rised-compare: aggregation on hand-made run directories, then the command end to end on the
tiny config (2 presets × 2 seeds), checked against the runs' own eval records."""
from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rised_jax import compare
from rised_jax.model import tiny
from tests.helpers.run_fixtures import write_run

REPO = Path(__file__).resolve().parent.parent
TINY_CONFIG = REPO / "experiments" / "configs" / "tiny_cpu.py"
T_975 = {2: 12.706204736174698, 3: 4.302652729749464}   # Student-t 0.975 quantile by n (df n−1)


RISED = {"maze": [0.5, 0.6, 0.7], "sokoban": [0.2, 0.2, 0.2]}
GRPO = {"maze": [0.4, 0.6, 0.5], "sokoban": [0.2, 0.2, 0.2]}   # ties rised on sokoban
DAPO = {"maze": [0.1, 0.1, 0.1], "sokoban": [0.3, 0.3, 0.3]}


@pytest.fixture
def fake_root(tmp_path):
  for preset, table in (("grpo", GRPO), ("rised", RISED), ("dapo", DAPO)):
    for seed in range(3):
      write_run(tmp_path, preset, seed, {env: v[seed] for env, v in table.items()},
                rollouts=8 if preset == "rised" else 4, tokens=3)
  return tmp_path


def test_average_ranks_and_marks_with_ties():
  values = {"a": 0.5, "b": 0.7, "c": 0.5, "d": 0.1}
  assert compare.average_ranks(values) == {"b": 1, "a": 2.5, "c": 2.5, "d": 4}
  assert compare.marks(values) == {"b": "first", "a": "second", "c": "second", "d": None}
  tied_top = {"a": 0.3, "b": 0.3, "c": 0.2}
  assert compare.average_ranks(tied_top) == {"a": 1.5, "b": 1.5, "c": 3}
  # A tie for first leaves no second: c is third.
  assert compare.marks(tied_top) == {"a": "first", "b": "first", "c": None}
  assert compare.marks({"a": 0.3, "b": 0.2, "c": 0.2}) == {"a": "first", "b": "second",
                                                           "c": "second"}
  # Equal up to float error is a tie: (0.1 + 0.2) vs 0.3.
  assert compare.average_ranks({"a": 0.1 + 0.2, "b": 0.3}) == {"a": 1.5, "b": 1.5}


def test_aggregate_hand_worked(fake_root):
  comparison = compare.aggregate_dir(fake_root)
  table = comparison["pipelines"]["agentic"]
  assert table["reference"] == "rised" and table["seeds"] == [0, 1, 2]
  assert table["envs"] == ["maze", "sokoban"] and table["metric"] == "pass_rate"
  m = table["methods"]
  maze = m["rised"]["per_env"]["maze"]
  assert maze["values"] == [0.5, 0.6, 0.7]
  # mean 0.6, s = 0.1: 0.6 ± t · 0.1/√3.
  half = T_975[3] * 0.1 / math.sqrt(3)
  np.testing.assert_allclose([maze["mean"], maze["ci_low"], maze["ci_high"]],
                             [0.6, 0.6 - half, 0.6 + half], atol=1e-12)
  assert [m[k]["per_env"]["maze"]["rank"] for k in ("rised", "grpo", "dapo")] == [1, 2, 3]
  assert [m[k]["per_env"]["maze"]["mark"] for k in ("rised", "grpo", "dapo")] == [
      "first", "second", None]
  # sokoban: dapo 0.3 first; rised and grpo tie at 0.2 → rank 2.5 each, both second.
  assert [m[k]["per_env"]["sokoban"]["rank"] for k in ("rised", "grpo", "dapo")] == [2.5, 2.5, 1]
  assert [m[k]["per_env"]["sokoban"]["mark"] for k in ("rised", "grpo", "dapo")] == [
      "second", "second", "first"]
  assert m["rised"]["per_env"]["sokoban"]["ci_low"] == pytest.approx(0.2)   # no spread
  assert [m[k]["mean_rank"] for k in ("rised", "grpo", "dapo")] == [1.75, 2.25, 2.0]
  # Mean over envs per seed: rised [0.35, 0.4, 0.45], grpo [0.3, 0.4, 0.35], dapo 0.2.
  np.testing.assert_allclose(m["rised"]["per_env"]["mean"]["values"], [0.35, 0.4, 0.45])
  assert [m[k]["per_env"]["mean"]["rank"] for k in ("rised", "grpo", "dapo")] == [1, 2, 3]
  assert m["rised"]["rollouts"] == [8, 8, 8] and m["grpo"]["agent_tokens"] == [12, 12, 12]
  assert m["rised"]["train_seconds"] == [4.0, 4.0, 4.0]   # 2 steps × (roll-out 1 s + step 1 s)
  assert m["rised"]["update_seconds"] == [2.0, 2.0, 2.0]
  # rised − grpo on maze: differences [0.1, 0, 0.2]. Sign flips of (±0.1, ±0.2) (the 0 flips to
  # itself): only (+, +) reaches the observed mean, p = 1/4. Paired t: mean 0.1, s = 0.1,
  # t = √3 on 2 df, P(T > √3) = ½ (1 − √(3/5)). Bootstrap: resamples of {0.1, 0, 0.2}.
  paired = table["paired"]["grpo"]["maze"]
  assert paired["mean_diff"] == pytest.approx(0.1)
  assert paired["sign_flip_p"] == pytest.approx(0.25) and paired["sign_flip_min_p"] == 0.25
  t_half = T_975[3] * 0.1 / math.sqrt(3)
  assert (paired["t_ci_low"], paired["t_ci_high"]) == pytest.approx((0.1 - t_half, 0.1 + t_half))
  assert paired["t_p_greater"] == pytest.approx(0.5 * (1 - math.sqrt(3 / 5)))
  assert paired["bootstrap_ci_low"] == pytest.approx(0.0, abs=1e-12)
  assert paired["bootstrap_ci_high"] == pytest.approx(0.2)
  # sokoban: equal pass rates on every seed: all differences 0, p = 1.
  assert table["paired"]["grpo"]["sokoban"]["sign_flip_p"] == 1.0
  assert sorted(table["paired"]) == ["dapo", "grpo"]
  again = compare.aggregate([compare.load_run(p) for p in compare.find_runs(fake_root)])
  assert again["pipelines"]["agentic"]["paired"] == table["paired"]   # seeded
  # The files: strict JSON (NaN → null), the Markdown marks.
  written = json.loads((fake_root / "comparison.json").read_text())
  assert written["pipelines"]["agentic"]["methods"]["rised"]["mean_rank"] == 1.75
  text = (fake_root / "comparison.md").read_text()
  assert f"| rised | **0.600 [{0.6 - half:.3f}, {0.6 + half:.3f}]** (1) |" in text
  assert "| grpo | _0.500 [" in text and "| 2.25 |" in text
  assert "0.100, p=0.250, t [" in text and "| rised | 2 | 8 | 24 | 4 | 2 |" in text


def test_aggregate_rubric_pipeline_and_reference(tmp_path):
  for preset, scores in (("cripo", [0.6, 0.8]), ("grpo_rubric", [0.5, 0.5])):
    for seed, score in enumerate(scores):
      write_run(tmp_path, preset, seed, {"science": score, "medicine": score / 2},
                pipeline="rubric")
  table = compare.aggregate_dir(tmp_path)["pipelines"]["rubric"]
  assert table["metric"] == "score" and table["reference"] == "cripo"
  science = table["methods"]["cripo"]["per_env"]["science"]
  half = T_975[2] * np.std([0.6, 0.8], ddof=1) / math.sqrt(2)
  np.testing.assert_allclose([science["ci_low"], science["ci_high"]], [0.7 - half, 0.7 + half])
  other = compare.aggregate_dir(tmp_path, reference="grpo_rubric")["pipelines"]["rubric"]
  assert list(other["paired"]) == ["cripo"]
  assert other["paired"]["cripo"]["science"]["mean_diff"] == pytest.approx(-0.2)
  # grpo_rubric − cripo = [−0.1, −0.3] is the lowest of the 4 sign patterns: p = 1.
  assert other["paired"]["cripo"]["science"]["sign_flip_p"] == 1.0


def test_one_seed_has_no_interval_and_no_paired_tests(tmp_path):
  write_run(tmp_path, "rised", 0, {"maze": 0.5})
  write_run(tmp_path, "grpo", 0, {"maze": 0.25})
  table = compare.aggregate_dir(tmp_path)["pipelines"]["agentic"]
  assert table["paired"] == {}
  assert math.isnan(table["methods"]["rised"]["per_env"]["maze"]["ci_low"])
  assert json.loads((tmp_path / "comparison.json").read_text())["pipelines"]["agentic"][
      "methods"]["rised"]["per_env"]["maze"]["ci_low"] is None
  assert "No paired tests" in (tmp_path / "comparison.md").read_text()


def test_aggregate_errors(tmp_path):
  write_run(tmp_path, "rised", 0, {"maze": 0.5})
  write_run(tmp_path, "rised", 1, {"maze": 0.5})
  write_run(tmp_path, "grpo", 0, {"maze": 0.5})
  with pytest.raises(ValueError, match=r"runs missing for \['grpo seed 1'\]"):
    compare.aggregate_dir(tmp_path)
  write_run(tmp_path, "grpo", 1, {"maze": 0.5}, finished=False)
  with pytest.raises(ValueError, match="is not finished"):
    compare.aggregate_dir(tmp_path)
  (compare.run_dir(tmp_path, "grpo", 1) / "summary.json").write_text("{}")
  with open(compare.run_dir(tmp_path, "grpo", 1) / "eval.jsonl", "a") as f:
    f.write(json.dumps({"step": 3, "env": "maze", "pass_rate": 0.1}) + "\n")
  compare.aggregate_dir(tmp_path)   # a later evaluation step is not the final one: ignored
  with open(compare.run_dir(tmp_path, "grpo", 1) / "eval.jsonl", "a") as f:
    f.write('{"step": 2, "env": "sokoban", "pass_rate": NaN}\n')
  with pytest.raises(ValueError, match=r"'sokoban' 'pass_rate' = nan; expected a finite"):
    compare.aggregate_dir(tmp_path)
  with pytest.raises(ValueError, match="no runs under"):
    compare.aggregate_dir(tmp_path / "empty")


EXPERIMENT = """
from rised_jax import config as config_lib
from rised_jax import config_args


def get_config(arg=None):
  args = config_args.parse_arg(arg, {declaration})
  c = config_lib.default_config()
  c.algorithm = args.algorithm
  return config_lib.apply_preset(c)
"""


def _experiment(tmp_path, declaration: str) -> str:
  path = tmp_path / f"exp_{abs(hash(declaration))}.py"
  path.write_text(EXPERIMENT.format(declaration=declaration))
  return str(path)


def test_config_argument_places_the_preset_by_the_files_declaration(tmp_path):
  tiny_keys = compare.declared_keys(str(TINY_CONFIG))
  assert list(tiny_keys) == ["algorithm", "setting"] and tiny_keys["algorithm"] == "rised"
  t = str(TINY_CONFIG)
  assert compare.config_argument(t, "grpo") == f"{t}:grpo"
  assert compare.config_argument(f"{t}:easy", "grpo", tiny_keys) == f"{t}:grpo,easy"
  # Issue 21.7: the argument already names the algorithm: it is replaced, not prepended to.
  assert compare.config_argument(f"{t}:rised,easy", "grpo", tiny_keys) == f"{t}:grpo,easy"
  assert compare.config_argument(f"{t}:setting=easy,algorithm=rised", "dapo", tiny_keys) == (
      f"{t}:setting=easy,algorithm=dapo")
  assert compare.config_argument(f"{t}:setting=easy,rised", "dapo", tiny_keys) == (
      f"{t}:setting=easy,dapo")
  # A bare flag is not the algorithm.
  flagged = _experiment(tmp_path, 'algorithm="cripo", local=False')
  keys = compare.declared_keys(flagged)
  assert compare.config_argument(f"{flagged}:local", "grpo_rubric", keys) == (
      f"{flagged}:grpo_rubric,local")
  assert compare.config_argument(f"{flagged}:cripo,local", "grpo_rubric", keys) == (
      f"{flagged}:grpo_rubric,local")
  # Every preset's config is built before any run: the command of point 7.
  assert compare.check_config_argument(f"{t}:rised,easy", ["rised", "grpo"]) == {
      "rised": f"{t}:rised,easy", "grpo": f"{t}:grpo,easy"}


@pytest.mark.parametrize("declaration,argument,message", [
    # Prepended, the preset becomes the size and 1.7b the algorithm.
    ('size="4b", algorithm="rised"', "1.7b", r"config\.algorithm='1\.7b'.*write the file argument"),
    ('size="4b"', "", "declares no 'algorithm' key"),
    ('algorithm="rised"', "rised,x", r"every positional key is given.*write the file argument"),
])
def test_config_argument_refusals_say_how_to_write_it(tmp_path, declaration, argument, message):
  path = _experiment(tmp_path, declaration)
  config = f"{path}:{argument}" if argument else path
  with pytest.raises(ValueError, match=message):
    compare.check_config_argument(config, ["grpo"])


def test_list_prints_absolute_commands_and_writes_nothing(tmp_path, monkeypatch, capsys):
  """Point 7's call, listed (no training): each preset replaces the file's algorithm; a
  relative --config and --workdir come out absolute; the comparison directory is not made."""
  monkeypatch.chdir(REPO)
  code = compare.main(["--config", "experiments/configs/tiny_cpu.py:rised,easy",
                       "--presets", "rised,grpo", "--seeds", "0", "--workdir",
                       os.path.relpath(tmp_path / "cmp", REPO), "--list"])
  assert code == 0
  lines = [shlex.split(line) for line in capsys.readouterr().out.splitlines()]
  configs = [next(a for a in line if a.startswith("--config=")) for line in lines]
  workdirs = [next(a for a in line if a.startswith("--workdir=")) for line in lines]
  assert configs == [f"--config={TINY_CONFIG}:rised,easy", f"--config={TINY_CONFIG}:grpo,easy"]
  assert workdirs == [f"--workdir={tmp_path / 'cmp' / p / 'seed_0'}" for p in ("rised", "grpo")]
  assert not (tmp_path / "cmp").exists()
  # A refused argument stops before anything runs or is written.
  code = compare.main(["--config", f"{TINY_CONFIG}:rised,easy,smoke", "--presets", "rised",
                       "--seeds", "0", "--workdir", str(tmp_path / "cmp")])
  assert code == 2 and "write the file argument" in capsys.readouterr().err
  assert not (tmp_path / "cmp").exists()


def test_parse_args_refusals():
  with pytest.raises(SystemExit):
    compare.parse_args(["--config", str(TINY_CONFIG), "--presets", "rised", "--seeds", "0",
                        "--workdir", "x", "--config.seed=3"])
  with pytest.raises(SystemExit):
    compare.parse_args(["--config", str(TINY_CONFIG), "--presets", "rised", "--seeds", "0,0",
                        "--workdir", "x"])
  with pytest.raises(SystemExit):
    compare.parse_args(["--presets", "rised", "--seeds", "0", "--workdir", "x"])


def test_run_all_skips_finished_runs_runs_the_rest_and_reports_failures(tmp_path, monkeypatch):
  """A stand-in trainer (a python -c that writes summary.json, or fails for seed 2)."""
  def fake_command(spec, config, overrides):
    code = ("import pathlib, sys; p = pathlib.Path(sys.argv[1]); "
            "sys.exit(3) if p.name == 'seed_2' else (p / 'summary.json').write_text('{}')")
    return [sys.executable, "-c", code, str(spec.workdir)]
  monkeypatch.setattr(compare, "run_command", fake_command)
  specs = compare.plan(tmp_path, ["rised"], [0, 1, 2])
  write_run(tmp_path, "rised", 0, {"maze": 0.5})
  (specs[0].workdir / compare.COMMAND_FILE).write_text(
      json.dumps(compare.run_arguments(specs[0], "c.py", [])))
  stamp = (specs[0].workdir / "summary.json").stat().st_mtime_ns
  failures = compare.run_all(specs, "c.py", [], jobs=2)
  assert failures == [f"rised seed 2: exit 3 (log: {specs[2].workdir / 'compare.log'})"]
  assert (specs[0].workdir / "summary.json").stat().st_mtime_ns == stamp   # skipped
  assert compare.is_finished(specs[1].workdir) and not compare.is_finished(specs[2].workdir)
  assert json.loads((specs[1].workdir / compare.COMMAND_FILE).read_text()) == [
      "--config=c.py:rised", f"--workdir={specs[1].workdir}", "--config.seed=1"]
  with pytest.raises(ValueError, match="use a new --workdir"):
    compare.run_all(specs, "c.py", ["--config.train.steps=9"])


# ----------------------------------------------------------------------------- end to end


def _cli(*args: str) -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items()   # rised-compare's own compile cache
         if k not in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")}
  env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
  return subprocess.run([sys.executable, "-m", "rised_jax.compare", *args], env=env,
                        capture_output=True, text=True, timeout=600)


def _final_eval(workdir: Path) -> dict[str, float]:
  """Read independently of rised_jax: the last-step pass rates of eval.jsonl."""
  records = [json.loads(line) for line in (workdir / "eval.jsonl").read_text().splitlines()]
  last = max(r["step"] for r in records)
  return {r["env"]: r["pass_rate"] for r in records if r["step"] == last}


def test_rised_compare_end_to_end_tiny(tmp_path):
  model = tiny.write(tmp_path / "model", ["frozenlake", "maze"])
  root = tmp_path / "cmp"
  args = ["--config", str(TINY_CONFIG), "--presets", "rised,grpo", "--seeds", "0,1",
          "--workdir", str(root), f"--config.model.source={model}", "--config.train.steps=1"]
  listed = _cli(*args, "--list")
  assert listed.returncode == 0, listed.stderr
  commands = [shlex.split(line) for line in listed.stdout.splitlines()]
  cache = [f"JAX_COMPILATION_CACHE_DIR={root / 'jax_cache'}",
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0"]
  assert commands == [
      ["env", *cache, sys.executable, "-m", "rised_jax.main", f"--config={TINY_CONFIG}:{p}",
       f"--workdir={root / p / f'seed_{s}'}", f"--config.seed={s}",
       f"--config.model.source={model}", "--config.train.steps=1"]
      for p in ("rised", "grpo") for s in (0, 1)]

  done = _cli(*args)
  assert done.returncode == 0, done.stderr[-3000:]

  table = json.loads((root / "comparison.json").read_text())["pipelines"]["agentic"]
  assert table["seeds"] == [0, 1] and list(table["methods"]) == ["rised", "grpo"]
  evals = {(p, s): _final_eval(root / p / f"seed_{s}") for p in ("rised", "grpo") for s in (0, 1)}
  assert table["envs"] == sorted(evals["rised", 0])
  means = {}
  for preset in ("rised", "grpo"):
    for env in [*table["envs"], "mean"]:
      values = [evals[preset, s][env] if env != "mean"
                else float(np.mean(list(evals[preset, s].values()))) for s in (0, 1)]
      cell = table["methods"][preset]["per_env"][env]
      assert cell["values"] == pytest.approx(values)
      mean, sd = sum(values) / 2, abs(values[0] - values[1]) / math.sqrt(2)
      half = T_975[2] * sd / math.sqrt(2)
      assert (cell["mean"], cell["ci_low"], cell["ci_high"]) == pytest.approx(
          (mean, mean - half, mean + half), abs=1e-12)
      means[preset, env] = mean
  for env in table["envs"]:
    best = max(means[p, env] for p in ("rised", "grpo"))
    for preset in ("rised", "grpo"):
      assert (table["methods"][preset]["per_env"][env]["mark"] == "first") == (
          round(means[preset, env], 12) == round(best, 12))
  # Rollouts: one step of K groups × G; rised K = 8, grpo K = B = 2; G = 4 (tiny_cpu.py).
  assert table["methods"]["rised"]["rollouts"] == [32, 32]
  assert table["methods"]["grpo"]["rollouts"] == [8, 8]
  assert set(table["paired"]) == {"grpo"}
  # The logged x-axis counters agree with the rollouts.jsonl budget.
  for (preset, seed), _ in evals.items():
    lines = (root / preset / f"seed_{seed}" / "metrics.jsonl").read_text().splitlines()
    progress = [json.loads(line) for line in lines if "progress/rollouts" in line][-1]
    assert progress["progress/rollouts"] == table["methods"][preset]["rollouts"][seed]
    assert progress["progress/agent_tokens"] == table["methods"][preset]["agent_tokens"][seed]
    # Train seconds: every timed stage (time/<stage>; not the time/throughput/* rates or the
    # time/compile/* counts) of the step records but evaluation (no async roll-outs).
    timed = [json.loads(line) for line in lines if '"time/step"' in line]
    loop = sum(v for r in timed for k, v in r.items()
               if k.split("/")[0] == "time" and len(k.split("/")) == 2 and k != "time/eval")
    assert table["methods"][preset]["train_seconds"][seed] == pytest.approx(loop)
    assert table["methods"][preset]["update_seconds"][seed] == pytest.approx(
        sum(r["time/step"] for r in timed))
  text = (root / "comparison.md").read_text()
  assert text in done.stdout and "| rised |" in text
  if os.path.exists(root / "comparison.png"):
    assert (root / "comparison.png").stat().st_size > 1000

  # Resumable: a second invocation skips every finished run and rewrites the same table.
  stamps = {p: p.stat().st_mtime_ns for p in root.glob("*/seed_*/summary.json")}
  again = _cli(*args)
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.count("finished, skipped") == 4
  assert {p: p.stat().st_mtime_ns for p in root.glob("*/seed_*/summary.json")} == stamps
  assert json.loads((root / "comparison.json").read_text())["pipelines"]["agentic"] == table
  assert _cli(*args, "--list").stdout == ""   # nothing left to run
  # A changed override does not reuse the finished runs.
  changed = _cli(*args[:-2], "--config.train.steps=2")
  assert changed.returncode != 0 and "use a new --workdir" in changed.stderr
  aggregated = _cli("--aggregate", str(root))
  assert aggregated.returncode == 0 and text in aggregated.stdout


def test_steps_to_reach_hand_worked():
  history = {0: 0.1, 5: 0.3, 10: 0.5, 15: 0.45}
  assert compare.steps_to_reach(history, 0.3) == 5           # equal counts as reached
  assert compare.steps_to_reach(history, 0.31) == 10
  assert compare.steps_to_reach(history, 0.05) == 0
  assert compare.steps_to_reach(history, 0.51) is None
  assert compare.steps_to_reach({10: 0.1 + 0.2, 0: 0.0}, 0.3) == 10   # float error: a tie
  assert compare.steps_summary([5, None, 10, None, 20]) == {
      "values": [5, None, 10, None, 20], "reached": 3, "median": 20.0}   # 5, 10, 20, inf, inf
  assert compare.steps_summary([5, None, None])["median"] is None      # median seed never gets there


def test_steps_to_target_ratio_of_medians_hand_worked():
  # grpo_rubric's finals 0.5 and 0.5: the target is 0.5; it gets there at steps 10 and 5.
  grpo = [{0: 0.2, 5: 0.3, 10: 0.5}, {0: 0.2, 5: 0.5, 10: 0.5}]
  reach = compare.steps_to_target(
      {"cripo": [{0: 0.2, 5: 0.5, 10: 0.7}, {0: 0.2, 5: 0.6, 10: 0.55}], "grpo_rubric": grpo},
      "grpo_rubric", [0.5, 0.5])
  assert reach["target"] == 0.5
  assert reach["methods"]["grpo_rubric"] == {"values": [10, 5], "reached": 2, "median": 7.5,
                                             "speedup": 1.0}
  assert reach["methods"]["cripo"] == {"values": [5, 5], "reached": 2, "median": 5.0,
                                       "speedup": 1.5}
  # A target method whose median seed never gets there (finals 0.4, 0.6: target 0.5 reached by
  # seed 1 only): no ratio for anyone.
  slow = compare.steps_to_target({"cripo": [{0: 0.5}, {0: 0.5}],
                                  "grpo_rubric": [{0: 0.2, 5: 0.4}, {0: 0.2, 5: 0.6}]},
                                 "grpo_rubric", [0.4, 0.6])
  assert slow["methods"]["grpo_rubric"]["values"] == [None, 5]
  assert slow["methods"]["grpo_rubric"]["median"] is None
  assert slow["methods"]["cripo"]["median"] == 0 and slow["methods"]["cripo"]["speedup"] is None


def test_comparison_reports_steps_to_grpo_rubric_final_score(tmp_path):
  # write_run evaluates at step 0 (all zero) and at the final step 2 (the values).
  for preset, scores in (("cripo", [0.6, 0.8]), ("grpo_rubric", [0.5, 0.7])):
    for seed, score in enumerate(scores):
      write_run(tmp_path, preset, seed, {"science": score}, pipeline="rubric")
  table = compare.aggregate_dir(tmp_path)["pipelines"]["rubric"]
  reach = table["steps_to_target"]
  assert reach["method"] == "grpo_rubric" and reach["target"] == pytest.approx(0.6)
  assert reach["methods"]["cripo"]["values"] == [2, 2]
  assert reach["methods"]["grpo_rubric"]["values"] == [None, 2]
  text = (tmp_path / "comparison.md").read_text()
  assert "Steps to reach grpo_rubric's final `mean` (0.600" in text
  assert "| cripo | 2 | 2 | 2/2 | 2 | n/a |" in text
  assert "| grpo_rubric | - | 2 | 1/2 | - | n/a |" in text


def test_train_seconds_sums_stage_timers_only():
  # time/throughput/* (rates) and time/compile/* (counts) are not seconds of a stage.
  records = [{"step": 1, "time/rollout": 1.0, "time/step": 2.0, "time/eval": 5.0,
              "time/throughput/tokens_per_s": 700.0, "time/compile/cache_hits": 3.0},
             {"step": 2, "time/rollout": 0.5, "time/step": 1.0, "rollout/policy_lag": 1.0}]
  assert compare.train_seconds(records, 2, "metrics.jsonl") == (1.0 + 2.0 + 1.0, 3.0)
