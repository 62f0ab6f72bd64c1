"""Every run logs its throughput and reuses compiled programs across runs: two identical tiny
runs (subprocesses, a fresh compilation cache): the first compiles, the second loads the train
step from the cache; both log tokens, model FLOPs and MFU per step; profile_steps writes a
trace."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from rised_jax.model import tiny
from tests.helpers.run_fixtures import REPO, TINY_CONFIG


def _run(workdir, model_dir, cache_root, *extra):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO),
             RISED_JAX_CACHE=str(cache_root))
  # The run's own cache settings (a fresh RISED_JAX_CACHE), not the test session's.
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
  result = subprocess.run(
      [sys.executable, "-m", "rised_jax.main", f"--config={TINY_CONFIG}:grpo",
       f"--workdir={workdir}", f"--config.model.source={model_dir}", "--config.train.steps=1",
       *extra], env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return result.stdout, [r for r in rows if "loss" in r]


def test_second_identical_run_hits_the_compilation_cache(tmp_path):
  model_dir = tiny.write(tmp_path / "model", ["frozenlake"])
  cache_root = tmp_path / "cache"
  out1, first = _run(tmp_path / "a", model_dir, cache_root)
  assert list((cache_root / "jax").iterdir()), "nothing was written to the compilation cache"
  out2, second = _run(tmp_path / "b", model_dir, cache_root, "--config.train.profile_steps=0,1")
  assert first[0]["time/compile/cache_hits"] == 0
  assert second[0]["time/compile/cache_hits"] >= 1
  assert "from the compilation cache" in out2 and "from the compilation cache" not in out1
  for row in first + second:
    assert row["throughput/tokens"] >= row["throughput/trained_tokens"] > 0
    assert row["throughput/model_tflops"] > 0
    assert 0 < row["time/throughput/mfu"] < 1 and math.isfinite(row["time/throughput/tokens_per_s"])
  # The counts are the run's, not the machine's: the same in both runs.
  assert ({k: v for k, v in first[0].items() if k.startswith("throughput/")}
          == {k: v for k, v in second[0].items() if k.startswith("throughput/")})
  traces = list((tmp_path / "b" / "profile").rglob("*.xplane.pb"))
  assert traces, "profile_steps=[0, 1] wrote no trace"
