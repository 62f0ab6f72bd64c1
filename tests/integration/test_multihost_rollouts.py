"""Roll-outs split across hosts (`rised_jax.rollout.hosts`): two CPU processes against the
loopback SGLang server send each request once, as one process does, and both end each step
with the one-process run's rows (tokens, advantages, behaviour log-probs) and counters, and
(agentic) the same evaluation."""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.fake_sglang_server import FakeSGLangServer
from tests.helpers.rollout_harness import pipeline_and_tokenizer
from tests.helpers.ports import free_port

HARNESS = Path(__file__).resolve().parents[1] / "helpers" / "rollout_harness.py"
REPO = HARNESS.parents[2]



def _run(pipeline: str, tmp: Path, processes: int, *extra: str):
  """(each process's output or None, return codes, logs, the /generate bodies the server got)."""
  _, tokenizer = pipeline_and_tokenizer(pipeline)
  with FakeSGLangServer(vocab_size=tokenizer.vocab_size,
                        eos_token_id=tokenizer.eos_token_id) as fake:
    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    outs = [tmp / f"{pipeline}-{processes}-{pid}.json" for pid in range(processes)]
    procs = [subprocess.Popen(
        [sys.executable, str(HARNESS), "--pipeline", pipeline, "--sglang-url", fake.url,
         "--out", str(out), "--num-processes", str(processes), "--process-id", str(pid),
         "--coordinator", f"127.0.0.1:{port}", *extra],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for pid, out in enumerate(outs)]
    logs = [proc.communicate(timeout=600)[0] for proc in procs]
    requests = fake.calls_to("/generate")
  results = [json.loads(out.read_text()) if out.exists() else None for out in outs]
  return results, [proc.returncode for proc in procs], logs, requests


def _differences(a, b, path="") -> list[str]:
  """The paths (keys and indices) where two JSON values differ, with both values."""
  if isinstance(a, dict) and isinstance(b, dict):
    return [d for k in sorted(set(a) | set(b), key=str)
            for d in (_differences(a[k], b[k], f"{path}.{k}") if k in a and k in b
                      else [f"{path}.{k}: only in {'the first' if k in a else 'the second'}"])]
  if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
    return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
  return [] if a == b else [f"{path}: {a!r} != {b!r}"[:300]]


def _request_keys(requests):
  return collections.Counter(
      (tuple(r["input_ids"]), r["sampling_params"].get("sampling_seed")) for r in requests)


@pytest.mark.parametrize("pipeline", ["agentic", "rubric"])
def test_two_processes_send_each_request_once_and_agree_with_one(pipeline, tmp_path):
  (one,), codes, logs, one_requests = _run(pipeline, tmp_path, 1)
  assert codes == [0], logs[0]
  two, codes, logs, two_requests = _run(pipeline, tmp_path, 2)
  assert codes == [0, 0], logs
  # The same requests (prompt, seed), each once, not once per host.
  assert len(two_requests) == len(one_requests)
  assert _request_keys(two_requests) == _request_keys(one_requests)
  assert max(_request_keys(one_requests).values()) == 1
  # Some chosen rollout has a non-zero advantage, so the equality below is about the values.
  assert any(row["advantage"] != 0 for step in one["steps"] for row in step["rows"])
  for process, output in enumerate(two):
    # Rows, selection and every summed counter, step by step; the evaluation's pass rates and
    # episode records (agentic).
    assert output == one, (process, _differences(one, output)[:20])


def test_a_failed_share_stops_every_process(tmp_path):
  results, codes, logs, _ = _run("agentic", tmp_path, 2, "--fail-on-process", "1")
  assert results == [None, None] and 0 not in codes
  assert "RuntimeError: injected roll-out failure" in logs[1]
  assert ("the roll-out or judge failed on process(es) [1] (first: RuntimeError: injected "
          "roll-out failure); process 0 stops too") in logs[0]
