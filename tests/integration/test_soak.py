"""The fault soak (benchmarks/soak_faults.py, issue 23) at a few steps: a tiny run against the
loopback SGLang fake that faults a fixed share of the training requests with a random mix of
kinds finishes, and its step counters add up to exactly the faults the server injected. The
200-step figures (and the memory) are in docs/performance.md."""
from __future__ import annotations

import pytest

from benchmarks import soak_faults


@pytest.mark.slow
def test_a_short_soak_finishes_and_counts_every_injected_fault(tmp_path):
  result = soak_faults.soak(steps=3, rate=0.2, seed=1, workdir=tmp_path)
  assert result["finished"]
  assert result["injected_total"] >= 20 and len(result["injected"]) >= 8
  counted = result["counted"]
  assert result["injected_total"] == counted["server_retries"] + counted["failed_requests"]
  # The faults that fail a request at once (http400, a reply past the cap) fail one each; a
  # retried kind fails its request only when it also meets the last attempt.
  assert counted["failed_requests"] >= result["injected"].get("http400", 0) + \
      result["injected"].get("huge", 0)
  assert counted["groups_dropped"] <= counted["failed_requests"]   # one or more per group
