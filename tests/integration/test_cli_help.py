"""The front door of every command: --help answers with usage and examples (exit 0), and bad
command lines are refused before the heavy imports (JAX) with a message naming the problem."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.relative_to(REPO) for p in [*REPO.glob("experiments/**/*.sh"),
                                               *REPO.glob("benchmarks/*.sh")])


def _entry(entry: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
  """Runs main.<entry>() and reports on stderr's last line whether JAX was imported."""
  code = ("import sys\nfrom rised_jax import main\ntry:\n  main.%s()\nfinally:\n"
          "  print('jax imported:', 'jax' in sys.modules, file=sys.stderr)" % entry)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
  return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("entry, program", [("train_entry", "rised-train"),
                                            ("eval_entry", "rised-eval")])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_shows_usage_and_examples_and_exits_0(tmp_path, entry, program, flag):
  done = _entry(entry, flag, cwd=tmp_path)
  assert done.returncode == 0, done.stderr
  assert done.stdout.startswith(f"usage: {program} ")
  assert "--workdir DIR" in done.stdout and "--config FILE[:ARG]" in done.stdout
  examples = done.stdout.split("examples:\n", 1)[1].splitlines()
  assert examples and all(line.lstrip().startswith((program, "--")) for line in examples)
  assert done.stderr.strip().endswith("jax imported: False")
  assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("entry, args, message", [
    ("train_entry", ["--workdir=w"], "rised-train: error: --config is required"),
    ("train_entry", [], "rised-train: error: --config and --workdir are required"),
    ("train_entry", ["--config", "CONFIG", "--wokdir=w"],
     "rised-train: error: unknown flag --wokdir; did you mean --workdir?"),
    ("train_entry", ["--config=no_such_file.py:grpo", "--workdir=w"],
     "rised-train: error: the config file no_such_file.py does not exist"),
    ("eval_entry", ["--workdir", "no_such_run"],
     "rised-eval: error: the workdir no_such_run does not exist"),
    ("eval_entry", ["--workdir=EMPTY"],
     "rised-eval: error: no config.json in the workdir EMPTY"),
    ("eval_entry", ["--step=1"], "rised-eval: error: --workdir is required"),
])
def test_bad_command_lines_are_refused_before_jax_is_imported(tmp_path, entry, args, message):
  config = REPO / "experiments" / "configs" / "tiny_cpu.py"
  (tmp_path / "empty_run").mkdir()
  args = [a.replace("CONFIG", str(config)).replace("EMPTY", str(tmp_path / "empty_run"))
          for a in args]
  message = message.replace("EMPTY", str(tmp_path / "empty_run"))
  done = _entry(entry, *args, cwd=tmp_path)
  assert done.returncode == 2
  assert message in done.stderr
  assert f"(see {message.split(':')[0]} --help)" in done.stderr
  assert done.stderr.strip().endswith("jax imported: False")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["empty_run"]   # nothing written


def test_boolean_flags_and_separate_values_are_not_mistaken_for_errors(tmp_path):
  """`--nodry_run`, `--dry_run` and `--config FILE` (value as the next word) pass the check and
  reach absl, which loads the config file (so JAX is imported) and runs the dry run."""
  config = REPO / "experiments" / "configs" / "tiny_cpu.py"
  done = _entry("train_entry", "--nodistributed", "--config", str(config), "--workdir",
                str(tmp_path / "run"), "--dry_run",
                f"--config.model.source={tmp_path / 'no_such_model'}", cwd=tmp_path)
  assert done.returncode == 0, done.stderr
  assert "dry run: the config is valid; nothing loaded" in done.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=str)
def test_every_shell_script_answers_help_without_side_effects(tmp_path, script):
  before = sorted(p.name for p in REPO.iterdir())
  done = subprocess.run(["bash", str(REPO / script), "--help"], cwd=tmp_path,
                        capture_output=True, text=True, timeout=60)
  assert done.returncode == 0, done.stderr
  assert done.stdout.strip() and done.stderr == ""
  if script.name != "lib.sh":   # the launch scripts' library points at them instead
    assert "Usage:" in done.stdout or "usage" in done.stdout.lower()
  assert list(tmp_path.iterdir()) == []
  assert sorted(p.name for p in REPO.iterdir()) == before
