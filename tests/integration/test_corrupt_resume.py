"""A corrupt latest checkpoint (truncated host JSON, deleted orbax _METADATA): the rerun names
the file, resumes from the newest intact checkpoint and ends with the logs and parameters of
the uninterrupted run (the exact-resume property of tests/test_trainer.py)."""
from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest

from rised_jax import runlog, trainer
from rised_jax.model import tiny
from tests.helpers.run_fixtures import tiny_config

STEPS = 3


def _config(model_dir):
  return tiny_config("rised", model_dir, **{"train.steps": STEPS, "train.keep_checkpoints": 3})


def _without_wall_clock(records):
  return [{k: v for k, v in r.items()
           if k not in ("time", "wall", "sync/seconds") and not k.startswith("time/")}
          for r in records]


def _final_params(workdir, model_dir):
  run = trainer.build(_config(model_dir), workdir)
  _, state, _ = run.checkpointer.restore_latest(run.state)
  run.checkpointer.close()
  return [np.asarray(x) for x in jax.tree.leaves(state.params)]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
  root = tmp_path_factory.mktemp("corrupt")
  model_dir = tiny.write(root / "model", ["frozenlake", "maze"])
  workdir = root / "straight"
  trainer.train(_config(model_dir), workdir)
  return model_dir, workdir


@pytest.mark.parametrize("damage, file, problem", [
    ("truncate", "host/metadata", "is not valid JSON"),
    ("delete", "state/_METADATA", "is missing"),
])
def test_a_corrupt_latest_checkpoint_resumes_from_the_previous_one(straight, tmp_path, capsys,
                                                                   damage, file, problem):
  model_dir, straight_dir = straight
  workdir = tmp_path / "damaged"
  shutil.copytree(straight_dir, workdir)
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["1", "2", "3"]
  path = workdir / "checkpoints" / str(STEPS) / file
  if damage == "truncate":
    path.write_text(path.read_text()[:40])
  else:
    path.unlink()
  capsys.readouterr()
  trainer.train(_config(model_dir), workdir)
  out = capsys.readouterr().out
  assert (f"warning: checkpoint step {STEPS} in {workdir / 'checkpoints'} is corrupt: {path} "
          f"{problem}") in out, out
  assert f"resuming from the previous intact checkpoint, step {STEPS - 1}" in out
  assert f"resumed from step {STEPS - 1}" in out
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == [
      "1", "2", "3", "3.corrupt"]
  # Step 3 was logged once before (then rewound to the side files) and once by the rerun: the
  # logs read as the uninterrupted run's, line for line.
  for name in ("metrics.jsonl", "rollouts.jsonl", "eval.jsonl"):
    assert (_without_wall_clock(runlog.read_jsonl(workdir / name))
            == _without_wall_clock(runlog.read_jsonl(straight_dir / name))), name
  discarded = runlog.read_jsonl(workdir / "metrics.discarded.jsonl")
  assert discarded and {r["step"] for r in discarded} == {STEPS}
  for a, b in zip(_final_params(workdir, model_dir), _final_params(straight_dir, model_dir),
                  strict=True):
    np.testing.assert_array_equal(a, b)
