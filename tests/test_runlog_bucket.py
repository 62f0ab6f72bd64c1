"""Run logs in a bucket: appends become shard objects written at `flush` (checkpoint time), so a
run writes every logged byte once instead of rewriting each file per line (O(N²)), and every
reader sees the shards as the file. The bucket is fsspec's in-memory filesystem standing in
for gcsfs behind epath's gs:// backend: like GCS it cannot append, and it counts writes."""
from __future__ import annotations

import pytest
from etils import epath
from etils.epath import backend as epath_backend
from fsspec.implementations.memory import MemoryFileSystem

from rised_jax import analysis, runlog
from tests.helpers.run_fixtures import frozenlake_pipeline

WORKDIR = "gs://bucket/run"
STEPS, CHECKPOINT_EVERY = 30, 10


class CountingBucket(MemoryFileSystem):
  """An object store in memory: whole-object writes only (no append), each one recorded."""

  store: dict = {}
  pseudo_dirs = [""]
  protocol = ("gs", "gcs")

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.written: list = []   # (path, the object's file) per write

  def _open(self, path, mode="rb", **kwargs):
    if "a" in mode:
      raise NotImplementedError("append is not supported by object stores")
    f = super()._open(path, mode=mode, **kwargs)
    if "w" in mode or "x" in mode:
      self.written.append((self._strip_protocol(path), f))
    return f

  def bytes_written(self, contains: str = "") -> int:
    return sum(f.size for path, f in self.written if contains in path)

  def writes(self, contains: str) -> int:
    return sum(contains in path for path, _ in self.written)


@pytest.fixture
def bucket(monkeypatch):
  fs = CountingBucket()
  fs.store.clear()
  fs.pseudo_dirs[:] = [""]
  monkeypatch.setattr(epath_backend.fsspec_backend, "_get_filesystem", lambda name: fs)
  return fs


def _log_steps(log: runlog.RunLog, first: int, last: int, groups, notes, vocab) -> None:
  for step in range(first, last + 1):
    log.scalars(step, {"loss": step / 4, "rollout/reward": step / 100})
    log.rollouts(step, groups, notes, vocab)
    if step % CHECKPOINT_EVERY == 0:
      log.flush()   # what the trainer does before each checkpoint


@pytest.fixture(scope="module")
def pool():
  pipeline, _, _ = frozenlake_pipeline("right")
  record = pipeline.judge(pipeline.roll_out(0))
  notes = [runlog.GroupNotes(selected=k == 0, tags=t.tags, unjudged=tuple(t.unjudged))
           for k, t in enumerate(record.tags)]
  return record.pool, notes, pipeline.vocab


def test_a_bucket_log_writes_each_byte_once_and_reads_back_whole(bucket, pool):
  groups, notes, vocab = pool
  log = runlog.RunLog(WORKDIR)
  _log_steps(log, 1, STEPS - 5, groups, notes, vocab)
  # Steps 21..25 are buffered: the bucket has the two checkpoints' shards only.
  assert [r["step"] for r in runlog.read_jsonl(f"{WORKDIR}/metrics.jsonl")] == list(range(1, 21))
  _log_steps(log, STEPS - 4, STEPS, groups, notes, vocab)
  log.close()
  metrics = runlog.read_jsonl(f"{WORKDIR}/metrics.jsonl")
  assert [(m["step"], m["loss"], m["rollout/reward"]) for m in metrics] == [
      (s, s / 4, s / 100) for s in range(1, STEPS + 1)]
  rollouts = runlog.read_jsonl(f"{WORKDIR}/rollouts.jsonl")
  per_step = sum(len(g.trajectories) for g in groups)
  assert [r["step"] for r in rollouts] == [s for s in range(1, STEPS + 1) for _ in range(per_step)]
  # One object per file per checkpoint (3), and no byte written twice: rewriting the object per
  # line would have written about STEPS / 2 times the final size.
  assert bucket.writes("metrics.jsonl") == bucket.writes("rollouts.jsonl") == 3
  stored = sum(f.size for path, f in bucket.store.items() if ".jsonl" in path)
  assert bucket.bytes_written(".jsonl") == stored
  # TensorBoard: one event file per flush, each written once.
  events = [p for p in bucket.store if "/tensorboard/" in p]
  assert len(events) == bucket.writes("/tensorboard/") == 3


def test_rewind_in_a_bucket_keeps_the_checkpointed_steps(bucket, pool):
  groups, notes, vocab = pool
  with runlog.RunLog(WORKDIR) as log:
    _log_steps(log, 1, 15, groups, notes, vocab)   # killed after step 15: 11..15 buffered
    log.flush()                                    # (here they reached the bucket anyway)
  with runlog.RunLog(WORKDIR) as resumed:
    resumed.rewind(10)
    assert runlog.shard_paths(f"{WORKDIR}/metrics.jsonl") == []   # folded into the file
    _log_steps(resumed, 11, 12, groups, notes, vocab)
  assert [m["step"] for m in runlog.read_jsonl(f"{WORKDIR}/metrics.jsonl")] == list(range(1, 13))
  assert [m["step"] for m in runlog.read_jsonl(f"{WORKDIR}/metrics.discarded.jsonl")] == list(
      range(11, 16))


def test_a_local_copy_of_a_bucket_run_reads_its_shards(bucket, pool, tmp_path):
  groups, notes, vocab = pool
  with runlog.RunLog(WORKDIR) as log:
    _log_steps(log, 1, 20, groups, notes, vocab)
  for path, f in bucket.store.items():   # gsutil cp -r gs://bucket/run <tmp>
    local = tmp_path / path.split("bucket/", 1)[1]
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_bytes(f.getvalue())
  assert not (tmp_path / "run" / "metrics.jsonl").exists()   # shards only
  run = analysis.load_run(tmp_path / "run")
  assert [m["step"] for m in run.metrics] == list(range(1, 21))
  assert len(run.rollouts) == 20 * sum(len(g.trajectories) for g in groups)


def test_a_local_log_is_still_appended_line_by_line(tmp_path, pool):
  groups, notes, vocab = pool
  with runlog.RunLog(tmp_path) as log:
    log.scalars(1, {"loss": 1.0})
    # Visible at once, before any flush: a killed local run keeps every line.
    assert [m["loss"] for m in runlog.read_jsonl(tmp_path / "metrics.jsonl")] == [1.0]
  assert not epath.Path(tmp_path / "metrics.jsonl.parts").exists()
