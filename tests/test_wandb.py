"""W&B logging (train.wandb=True): an offline tiny run logs exactly TensorBoard's scalars.

The offline run's transaction log (<workdir>/wandb/offline-run-*/run-*.wandb) is read back here
with a reader of its own (the LevelDB-style log format wandb writes: a 7-byte ":W&B" header,
32 KiB blocks of records with a 7-byte header each, every record a wandb `Record` protobuf),
not through wandb's writer code; TensorBoard's events through tensorboard's own loader.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

wandb = pytest.importorskip("wandb")
from tensorboard.backend.event_processing import event_accumulator  # noqa: E402
from wandb.proto import wandb_internal_pb2  # noqa: E402

from rised_jax import runlog, trainer, wandb_log  # noqa: E402
from rised_jax.model import tiny  # noqa: E402
from tests.helpers.run_fixtures import TINY_CONFIG as CONFIG, load_config_file  # noqa: E402

_BLOCK, _HEADER = 32768, 7
_FULL, _LAST = 1, 4


def wandb_records(path: Path):
  """The `Record` protobufs of a .wandb transaction log, in order."""
  data = path.read_bytes()
  assert data[:4] == b":W&B", data[:7]
  pos, chunks = _HEADER, []
  while pos + _HEADER <= len(data):
    left = _BLOCK - pos % _BLOCK
    _, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
    if left < _HEADER or (kind == 0 and length == 0):   # the block's zero padding
      pos += left
      continue
    chunks.append(data[pos + _HEADER:pos + _HEADER + length])
    pos += _HEADER + length
    if kind in (_FULL, _LAST):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(b"".join(chunks))
      chunks = []
      yield record


def wandb_history(path: Path) -> dict[int, dict[str, float]]:
  """{step: {name: value}} of the run's history rows (wandb's own `_…` keys left out)."""
  rows: dict[int, dict[str, float]] = {}
  for record in wandb_records(path):
    if record.WhichOneof("record_type") != "history":
      continue
    items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
             for i in record.history.item}
    rows.setdefault(int(items["_step"]), {}).update(
        {k: float(v) for k, v in items.items() if not k.startswith("_")})
  return rows


def tensorboard_history(workdir: Path) -> dict[int, dict[str, float]]:
  logdir = str(workdir / runlog.TENSORBOARD_DIR)
  events = event_accumulator.EventAccumulator(logdir, purge_orphaned_data=True).Reload()
  rows: dict[int, dict[str, float]] = {}
  for tag in events.Tags()["scalars"]:
    for event in events.Scalars(tag):
      rows.setdefault(event.step, {})[tag] = event.value
  return rows


@pytest.mark.slow
def test_offline_run_logs_the_tensorboard_scalars(tmp_path, monkeypatch):
  monkeypatch.setenv("WANDB_MODE", "offline")
  # Nothing may reach the network: any attempt would go to a closed local port.
  monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
  monkeypatch.delenv("WANDB_API_KEY", raising=False)
  config = load_config_file(CONFIG, "rised")
  config.model.source = str(tiny.write(tmp_path / "model", ["frozenlake", "maze"]))
  config.train.steps = 1
  config.train.wandb = True
  workdir = tmp_path / "run"
  trainer.train(config, workdir)

  (log,) = (workdir / wandb_log.WANDB_DIR).glob("offline-run-*/run-*.wandb")
  logged = wandb_history(log)
  expected = tensorboard_history(workdir)
  assert sorted(logged) == sorted(expected) == [0, 1]
  for step, scalars in expected.items():
    assert sorted(logged[step]) == sorted(scalars), step
    names = sorted(scalars)   # TensorBoard stores float32
    np.testing.assert_allclose([logged[step][n] for n in names], [scalars[n] for n in names],
                               rtol=1e-6, err_msg=f"step {step}")
  assert {"loss", "eval/mean_pass_rate"} <= set(expected[1])


def test_wandb_refuses_a_bucket_workdir():
  with pytest.raises(ValueError, match="gs://b/run.*local workdir"):
    wandb_log.WandbScalars("gs://b/run")
