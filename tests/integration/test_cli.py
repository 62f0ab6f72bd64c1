"""The real command line (absl + ml_collections config_flags): overrides, --dry_run, rised-eval.

Dry runs point `model.source` at a path that does not exist, so a run that loaded a model would
fail: exit 0 shows that nothing was loaded.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rised_jax import stats, trainer
from tests.helpers import model_utils
from tests.helpers.run_fixtures import load_config_file

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "experiments" / "configs" / "tiny_cpu.py"


def _cli(entry: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
  code = f"import sys; from rised_jax import main; sys.argv[0] = {entry!r}; main.{entry}()"
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
             JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=300)


def _dry_run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
  return _cli("train_entry", f"--config={TINY}", f"--workdir={tmp_path / 'run'}", "--dry_run",
              f"--config.model.source={tmp_path / 'no_such_model'}", *overrides, cwd=tmp_path)


def _printed_config(stdout: str) -> dict:
  """The JSON config that --dry_run prints first (up to the first closing brace at column 0)."""
  lines = stdout.splitlines()
  return json.loads("\n".join(lines[:lines.index("}") + 1]))


def test_dry_run_of_an_algorithm_override_shows_the_grpo_stages(tmp_path):
  done = _dry_run(tmp_path, "--config.algorithm=grpo")
  assert done.returncode == 0, done.stderr
  config = _printed_config(done.stdout)
  assert (config["algorithm"], config["select"]["name"], config["teacher"]["enabled"],
          config["guidance"]["enabled"], config["step"]["beta"]) == (
              "grpo", "uniform", False, False, 0.0)
  stages = done.stdout.splitlines()
  assert "selector   uniform: K=2 groups rolled out, B=2 trained on; options {}" in stages
  assert {"teacher    off", "guidance   off"} <= set(stages)
  assert not (tmp_path / "run").exists()   # a dry run writes nothing


def test_lists_and_new_options_override_from_the_command_line(tmp_path):
  done = _dry_run(tmp_path, "--config.envs.names=frozenlake", "--config.envs.difficulty={}",
                  "--config.rollout.prompt_buckets=256,1024", "--config.rollout.batch_buckets=",
                  "--config.rollout.stop_strings=</answer>,STOP",
                  "--config.judge.options.progress_min_fraction=0.25",
                  "--config.select.options.objective=mmr")
  assert done.returncode == 0, done.stderr
  config = _printed_config(done.stdout)
  assert config["envs"]["names"] == ["frozenlake"]
  assert config["rollout"]["prompt_buckets"] == [256, 1024]
  assert config["rollout"]["batch_buckets"] == []
  assert config["rollout"]["stop_strings"] == ["</answer>", "STOP"]
  assert config["judge"]["options"] == {"progress_min_fraction": 0.25}
  assert config["select"]["options"] == {"objective": "mmr"}


@pytest.mark.parametrize("override, message", [
    ("--config.algorithm=bogus", "config.algorithm='bogus': expected one of"),
    ("--config.select.pool_groups=0", "config.select.pool_groups=0: expected an integer >= 1"),
    ("--config.train.stpes=3", "config.train.stpes=3: unknown key; did you mean 'train.steps'?"),
])
def test_bad_overrides_fail_before_anything_loads(tmp_path, override, message):
  done = _dry_run(tmp_path, override)
  assert done.returncode != 0
  assert message in done.stderr


def test_rised_eval_reads_the_saved_config_and_writes_into_the_workdir(tmp_path):
  # One-move FrozenLake (2x2: 8 instances) on the tiny model that mostly names a move, so
  # the one step has wins to learn from and the pass rates compared below are not all zero.
  model_dir = model_utils.write_mover(tmp_path / "model")
  config = load_config_file(TINY, "grpo,easy")
  config.model.source = str(model_dir)
  config.envs.names = ["frozenlake"]
  config.envs.difficulty = {"frozenlake": dict(size=2, holes=0, min_distance=1, max_turns=1)}
  config.train.steps = 1
  config.eval.episodes_per_env = 6
  workdir = tmp_path / "run"
  summary = trainer.train(config, workdir)

  # Only --workdir: the config (with its model path) comes from the run's config.json.
  done = _cli("eval_entry", f"--workdir={workdir}", cwd=tmp_path)
  assert done.returncode == 0, done.stderr
  written = workdir / "eval_checkpoint_1.json"
  results = json.loads(written.read_text())
  # Greedy evaluation of the same checkpoint on the same held-out seeds: the training run's
  # "after" numbers.
  assert results == summary["after"]
  assert 0 < results["frozenlake"]["pass_rate"] < 1
  # It prints the run's own before/after table, not the JSON.
  assert stats.format_pass_rate_table(summary["before"], summary["after"]) in done.stdout
  assert '"ci_high"' not in done.stdout
  # A second evaluation never overwrites the first file.
  written.write_text("mine\n")
  again = _cli("eval_entry", f"--workdir={workdir}", "--step=1", cwd=tmp_path)
  assert again.returncode == 0, again.stderr
  assert written.read_text() == "mine\n"
  assert json.loads((workdir / "eval_checkpoint_1.2.json").read_text()) == results
