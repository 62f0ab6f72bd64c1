"""End to end through the trainer: artifacts, the analysis notebook, kill-and-resume (learning:
tests/integration/test_learning.py)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rised_jax import analysis, runlog, trainer
from rised_jax.model import tiny
from tests.helpers.run_fixtures import REPO, TINY_CONFIG as CONFIG, load_config_file
from tests.helpers.run_fixtures import tiny_config as _config
NOTEBOOK = REPO / "notebooks" / "analyze_run.ipynb"
VOLATILE = ("time", "wall", "sync/seconds")   # wall-clock, beside every time/* key


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


def _cli(workdir: Path | str, model_dir: Path, steps: int) -> list[str]:
  return [sys.executable, "-m", "rised_jax.main", f"--config={CONFIG}:rised",
          f"--workdir={workdir}", f"--config.model.source={model_dir}",
          f"--config.train.steps={steps}"]


def _without_volatile(rows):
  return [{k: v for k, v in row.items() if k not in VOLATILE and not k.startswith("time/")}
          for row in rows]


def _tb_scalars(workdir: Path) -> dict[str, list[tuple[int, float]]]:
  """Every scalar as TensorBoard shows it (after its purges), wall-clock tags left out."""
  from tensorboard.backend.event_processing import event_accumulator  # noqa: PLC0415
  acc = event_accumulator.EventAccumulator(str(workdir / runlog.TENSORBOARD_DIR),
                                           purge_orphaned_data=True).Reload()
  return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
          for tag in acc.Tags()["scalars"]
          if not tag.startswith("time/") and tag not in VOLATILE}


def _final_params(workdir: Path, step: int) -> list[np.ndarray]:
  restored = ocp.StandardCheckpointer().restore(workdir / "checkpoints" / str(step) / "state")
  return [np.asarray(x) for x in jax.tree.leaves(restored["params"])]


def _kill_when(proc: subprocess.Popen, ready, what: str, poll_s: float = 0.2) -> None:
  """SIGKILLs `proc` as soon as `ready()` holds; fails if the run ends first."""
  deadline = time.time() + 600
  while time.time() < deadline and proc.poll() is None and not ready():
    time.sleep(poll_s)
  assert proc.poll() is None, f"the run ended before it could be killed {what}"
  proc.send_signal(signal.SIGKILL)
  proc.wait()


def _saving(checkpoints: Path, min_step: int) -> bool:
  """An uncommitted (temporary) checkpoint directory of a step >= min_step exists."""
  try:
    names = os.listdir(checkpoints)
  except FileNotFoundError:
    return False
  return any("tmp" in n and n.split(".")[0].isdigit() and int(n.split(".")[0]) >= min_step
             for n in names)


@pytest.mark.slow
def test_killed_run_resumes_like_an_uninterrupted_one(tiny_model, tmp_path):
  """kill -9 before the first checkpoint commits, during a save and after the final
  evaluation, then a rerun of the finished run: the four logs (JSONL line for line, without
  the wall-clock fields `time`, `wall` and `time/*`; TensorBoard scalars, without `time/*`)
  and the final parameters equal an uninterrupted run's. The uninterrupted run uses a
  relative workdir from its own cwd and is rerun with the absolute spelling."""
  # A shared compilation cache: restarts reuse the compiled step instead of recompiling.
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO),
             JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"))
  steps = 4
  straight = tmp_path / "straight"
  straight.mkdir()
  straight_proc = subprocess.Popen(_cli("workdir", tiny_model, steps), env=env, cwd=straight,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  straight = straight / "workdir"

  killed = tmp_path / "killed"
  evals = killed / "eval.jsonl"

  def launch():
    return subprocess.Popen(_cli(killed, tiny_model, steps), env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

  # 1. The "before" evaluation is logged, no checkpoint has committed.
  _kill_when(launch(), lambda: bool(runlog.read_jsonl(evals)), "after the first evaluation")
  assert not (killed / "checkpoints" / "1").exists()
  # 2. While a checkpoint of step >= 2 is being written.
  _kill_when(launch(), lambda: _saving(killed / "checkpoints", 2), "during a save",
             poll_s=0.002)
  assert _saving(killed / "checkpoints", 2)
  # 3. The final evaluation is logged (its checkpoint, written next, usually not committed).
  _kill_when(launch(), lambda: any(e["step"] == steps for e in runlog.read_jsonl(evals)),
             "after the final evaluation", poll_s=0.002)
  final_committed = (killed / "checkpoints" / str(steps)).exists()
  finish = subprocess.run(_cli(killed, tiny_model, steps), env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=900)
  assert finish.returncode == 0, finish.stderr[-3000:]
  out, _ = straight_proc.communicate(timeout=900)
  assert straight_proc.returncode == 0, out[-3000:]

  for name in ("metrics.jsonl", "rollouts.jsonl", "eval.jsonl"):
    assert (_without_volatile(runlog.read_jsonl(killed / name))
            == _without_volatile(runlog.read_jsonl(straight / name))), name
  evals_straight = runlog.read_jsonl(straight / "eval.jsonl")
  assert [e["step"] for e in evals_straight] == [0, 0, steps, steps]   # two envs, two evaluations
  assert _tb_scalars(killed) == _tb_scalars(straight)
  assert _tb_scalars(straight)["eval/mean_pass_rate"][0][0] == 0
  assert [s for s, _ in _tb_scalars(straight)["eval/mean_pass_rate"]] == [0, steps]
  for a, b in zip(_final_params(killed, steps), _final_params(straight, steps), strict=True):
    np.testing.assert_array_equal(a, b)
  # Checkpoints beyond keep (2) or half-written ones left by the kills are gone.
  assert sorted(os.listdir(killed / "checkpoints")) == [str(steps - 1), str(steps)]
  assert (f"has finished all {steps} steps" if final_committed
          else f"resumed from step {steps - 1}") in finish.stdout

  # A rerun of the finished run (absolute spelling this time) only prints its table.
  logs = {name: (straight / name).read_bytes() for name in runlog.JSONL_FILES}
  events = sorted(os.listdir(straight / runlog.TENSORBOARD_DIR))
  again = subprocess.run(_cli(straight, tiny_model, steps), env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=900)
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"has finished all {steps} steps" in again.stdout and "| mean" in again.stdout
  assert "loading model" not in again.stdout   # no model, hence no evaluation
  assert {name: (straight / name).read_bytes() for name in runlog.JSONL_FILES} == logs
  assert sorted(os.listdir(straight / runlog.TENSORBOARD_DIR)) == events


def test_a_failed_build_leaves_no_config_and_spellings_are_one_run(tiny_model, tmp_path,
                                                                   monkeypatch):
  """A wrong model.source must not lock the workdir to that config (config.json is written
  only after the model loaded), and `run` and `$PWD/run` are the same workdir."""
  monkeypatch.chdir(tmp_path)
  with pytest.raises(FileNotFoundError):
    trainer.build(_config("rised", tmp_path / "no_such_model"), "run")
  assert not (tmp_path / "run" / "config.json").exists()
  config = _config("rised", tiny_model)
  run = trainer.build(config, "run")
  run.checkpointer.close()
  assert config.workdir == str(tmp_path / "run")
  assert json.loads((tmp_path / "run" / "config.json").read_text())["model"]["source"] == str(
      tiny_model)
  run = trainer.build(_config("rised", tiny_model), tmp_path / "run")   # absolute: no refusal
  run.checkpointer.close()


def test_a_bucket_workdir_without_its_filesystem_package_is_refused_before_loading(monkeypatch):
  """gs:// without gcsfs used to fail 30 s into a run, at the first write; now resolve_workdir
  (which --dry_run and build call first) names the missing package and the extra."""
  import importlib.util  # noqa: PLC0415
  real_find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name in ("gcsfs", "s3fs") else
                      real_find_spec(name, *a))
  with pytest.raises(ValueError, match=r"gs://b/run.*gcsfs.*rised_jax\[gcs\]"):
    trainer.resolve_workdir("gs://b/run")
  with pytest.raises(ValueError, match=r"s3://b/run.*s3fs.*pip install s3fs"):
    trainer.resolve_workdir("s3://b/run")


def test_a_bucket_workdir_is_kept_verbatim_and_written_through_epath(tiny_model, tmp_path,
                                                                     monkeypatch):
  """gs://bucket/run stays a URL (it used to become ./gs:/bucket/run): with epath's backend
  faked onto a local directory (no network), config.json, the checkpoint directory and the
  logs land in the fake bucket and nothing under the cwd."""
  from etils import epath  # noqa: PLC0415

  bucket = tmp_path / "bucket"

  def local(value):
    return (str(bucket / value[len("gs://bucket/"):]) if isinstance(value, str)
            and value.startswith("gs://bucket/") else value)

  def remapped(original, *args, **kwargs):
    return original(*map(local, args), **kwargs)

  cwd = tmp_path / "cwd"
  cwd.mkdir()
  monkeypatch.chdir(cwd)
  # Orbax asks the GCS API whether the bucket has a hierarchical namespace; the fake has none.
  from orbax.checkpoint._src.path import gcs_utils  # noqa: PLC0415
  monkeypatch.setattr(gcs_utils, "is_hierarchical_namespace_enabled", lambda path: False)
  # The fake bucket is a local directory: gcsfs (the `gcs` extra) is not needed for it.
  monkeypatch.setattr(trainer, "_check_bucket_backend", lambda scheme, workdir: None)
  fns = ("copy", "exists", "glob", "isdir", "listdir", "makedirs", "mkdir", "open", "remove",
         "rename", "replace", "rmtree", "stat", "walk")
  with epath.testing.mock_epath(**{name: remapped for name in fns}):
    assert os.fspath(trainer.resolve_workdir("gs://bucket/run")) == "gs://bucket/run"
    config = _config("rised", tiny_model)
    run = trainer.build(config, "gs://bucket/run")
    assert config.workdir == "gs://bucket/run"
    run.log.scalars(1, {"loss": 0.5})
    run.log.scalars(2, {"loss": 0.25})
    run.log.close()
    assert [m["loss"] for m in runlog.read_jsonl(epath.Path("gs://bucket/run/metrics.jsonl"))
            ] == [0.5, 0.25]
  assert json.loads((bucket / "run" / "config.json").read_text())["workdir"] == "gs://bucket/run"
  assert (bucket / "run" / "checkpoints").is_dir()
  assert len(list((bucket / "run" / runlog.TENSORBOARD_DIR).iterdir())) == 1
  assert list(cwd.iterdir()) == []
