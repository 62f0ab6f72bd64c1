"""End to end through the trainer: artifacts, the analysis notebook, kill-and-resume (learning:
tests/test_learning.py)."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rised_jax import analysis, runlog, trainer
from rised_jax.model import tiny

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "experiments" / "configs" / "tiny_cpu.py"
NOTEBOOK = REPO / "notebooks" / "analyze_run.ipynb"
VOLATILE = ("time", "wall")


def load_config_file(path: Path, arg: str):
  """`get_config(arg)` of an experiment file, as `--config path:arg` would call it."""
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def _config(arg: str, model_dir: Path, **overrides):
  config = load_config_file(CONFIG, arg)
  config.model.source = str(model_dir)
  for dotted, value in overrides.items():
    node = config
    *parents, leaf = dotted.split(".")
    for name in parents:
      node = node[name]
    node[leaf] = value
  return config


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
  return tiny.write(tmp_path_factory.mktemp("tiny") / "model", ["frozenlake", "maze"])


@pytest.fixture(scope="module")
def tiny_run(tiny_model, tmp_path_factory) -> tuple[Path, dict]:
  workdir = tmp_path_factory.mktemp("run") / "workdir"
  summary = trainer.train(_config("rised", tiny_model), workdir)
  return workdir, summary


def test_run_writes_every_artifact(tiny_run):
  workdir, summary = tiny_run
  steps = 3
  metrics = runlog.read_jsonl(workdir / "metrics.jsonl")
  assert [m["step"] for m in metrics if "loss" in m] == [1, 2, 3]
  assert {"pg_loss", "entropy", "grad_norm", "distill_loss", "judge/judged",
          "time/rollout"} <= set(metrics[1])
  rollouts = runlog.read_jsonl(workdir / "rollouts.jsonl")
  assert len(rollouts) == steps * 8 * 4            # steps × pool groups (K = 4B) × G
  assert sum(r["selected"] for r in rollouts) == steps * 2 * 4
  evals = runlog.read_jsonl(workdir / "eval.jsonl")
  assert sorted({e["step"] for e in evals}) == [0, steps]
  assert set(summary) == {"before", "after"}
  assert set(summary["after"]) == {"frozenlake", "maze"}
  table = (workdir / "results.md").read_text()
  assert "frozenlake" in table and "maze" in table and "mean" in table
  assert list((workdir / "tensorboard").iterdir())
  assert (workdir / "checkpoints" / str(steps)).is_dir()
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["algorithm"] == "rised" and saved["select"]["name"] == "rised"


def test_notebook_runs_on_the_tiny_run(tiny_run):
  workdir, _ = tiny_run
  nb = analysis.execute_notebook(NOTEBOOK, workdir)
  assert analysis.error_outputs(nb) == []
  assert analysis.figure_outputs(nb) == 4   # + the training curves (issue 14)


def test_rerun_with_another_config_is_refused(tiny_run, tiny_model):
  workdir, _ = tiny_run
  with pytest.raises(ValueError, match="different config"):
    trainer.build(_config("grpo", tiny_model), workdir)


def _cli(workdir: Path, model_dir: Path, steps: int) -> list[str]:
  return [sys.executable, "-m", "rised_jax.main", f"--config={CONFIG}:rised",
          f"--workdir={workdir}", f"--config.model.source={model_dir}",
          f"--config.train.steps={steps}"]


def _without_volatile(rows):
  return [{k: v for k, v in row.items() if k not in VOLATILE and not k.startswith("time/")}
          for row in rows]


def test_killed_run_resumes_like_an_uninterrupted_one(tiny_model, tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  steps = 6
  straight = tmp_path / "straight"
  subprocess.run(_cli(straight, tiny_model, steps), env=env, cwd=REPO, check=True,
                 capture_output=True, timeout=900)

  killed = tmp_path / "killed"
  proc = subprocess.Popen(_cli(killed, tiny_model, steps), env=env, cwd=REPO,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 600
  metrics = killed / "metrics.jsonl"
  while time.time() < deadline and proc.poll() is None:
    if metrics.exists() and any(r.get("step", 0) >= 3 for r in runlog.read_jsonl(metrics)):
      break
    time.sleep(0.2)
  assert proc.poll() is None, "the run ended before it could be killed"
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  subprocess.run(_cli(killed, tiny_model, steps), env=env, cwd=REPO, check=True,
                 capture_output=True, timeout=900)

  for name in ("metrics.jsonl", "rollouts.jsonl", "eval.jsonl"):
    assert (_without_volatile(runlog.read_jsonl(killed / name))
            == _without_volatile(runlog.read_jsonl(straight / name))), name
