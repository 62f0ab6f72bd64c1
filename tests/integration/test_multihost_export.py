"""Multi-host export and SGLang weight sync: 2 processes x 2 CPU devices
(tests/helpers/step_harness.py) against a one-process export of the same parameters, byte for byte."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rised_jax.model import save_pretrained
from rised_jax.model.hf_io import EXPORT_MARKER_FILE, export_manifest
from rised_jax.rollout.sglang_engine import VERSION_KEY, SGLangEngine
from tests.helpers import step_fixtures
from tests.helpers.fake_sglang_server import FakeSGLangServer
from tests.helpers.model_utils import tiny_tokenizer
from tests.helpers.ports import free_port

HARNESS = Path(__file__).resolve().parents[1] / "helpers" / "step_harness.py"
REPO = HARNESS.parents[2]
SHARD_BYTES = 50_000   # the tiny model's ~0.2 MB of float32 weights in several shards



def _digests(directory: Path) -> dict[str, str]:
  return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
  """Runs both processes once; returns (tmp dir, the server's log of loads, the outputs)."""
  tmp = tmp_path_factory.mktemp("multihost")
  (tmp / "foreign").mkdir()
  (tmp / "foreign" / "notes.txt").write_text("not an export")
  loads = []   # the files as the server found them when asked to load
  with FakeSGLangServer(vocab_size=step_fixtures.VOCAB,
                        weight_loader=lambda path: loads.append(_digests(Path(path)))) as fake:
    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    procs = [subprocess.Popen(
        [sys.executable, str(HARNESS), "--out", str(tmp / f"host{pid}.npz"), "--devices", "2",
         "--mesh", "1,2,2", "--steps", "0", "--num-processes", "2", "--process-id", str(pid),
         "--coordinator", f"127.0.0.1:{port}", "--export-dir", str(tmp / "export"),
         "--export-shard-bytes", str(SHARD_BYTES), "--sglang-url", fake.url,
         "--weight-dir", str(tmp / "weights"), "--foreign-dir", str(tmp / "foreign")],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for pid in range(2)]
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    syncs = fake.calls_to("/update_weights_from_disk")
  for proc, output in zip(procs, outputs):
    assert proc.returncode == 0, output
  return tmp, loads, syncs, outputs


def test_two_process_export_is_byte_identical_to_one_process(two_process_run, tmp_path):
  tmp, _, _, _ = two_process_run
  reference = save_pretrained(step_fixtures.tiny_model(), tiny_tokenizer(), tmp_path / "ref",
                              max_shard_bytes=SHARD_BYTES)
  expected = _digests(reference)
  assert sum(name.endswith(".safetensors") for name in expected) > 1   # sharded, with index
  assert _digests(tmp / "export") == expected


def test_weight_sync_posts_once_after_the_files_are_written(two_process_run, tmp_path):
  tmp, loads, syncs, _ = two_process_run
  # Process 0 alone asks the server, once; the server finds the complete bf16 export.
  assert syncs == [{"model_path": str(tmp / "weights" / "v1"), "load_format": "auto",
                    "flush_cache": True, "abort_all_requests": False, "weight_version": "1"}]
  reference = save_pretrained(step_fixtures.tiny_model(), tiny_tokenizer(), tmp_path / "ref",
                              dtype="bfloat16")
  # The served folder is the export, its manifest also naming the weight sync's version
  # (by which pruning knows the folders it may delete).
  def files(digests):
    return {k: v for k, v in digests.items() if k != EXPORT_MARKER_FILE}
  assert [files(load) for load in loads] == [files(_digests(reference))]
  assert export_manifest(tmp / "weights" / "v1") == {**export_manifest(reference),
                                                     VERSION_KEY: 1}
  assert sorted(os.listdir(tmp / "weights")) == ["v1"]   # no staging directory left


def test_a_refusal_on_process_0_stops_every_process(two_process_run):
  tmp, _, _, outputs = two_process_run
  assert "not empty and not a previous rised_jax export" in outputs[0]
  assert "process 1 refused the foreign directory: preparing the export directory" in outputs[1]
  assert sorted(os.listdir(tmp / "foreign")) == ["notes.txt"]


def test_a_bucket_weight_dir_is_refused():
  # SGLang reads exports from a path; a gs:// workdir needs rollout.sglang.weight_dir.
  with pytest.raises(ValueError, match=r"weight_dir='gs://b/run/weights'.*not a URL"):
    SGLangEngine("http://127.0.0.1:1", weight_dir="gs://b/run/weights")


def test_a_bucket_workdir_syncs_through_rollout_sglang_weight_dir(tmp_path):
  from types import SimpleNamespace  # pylint: disable=import-outside-toplevel
  from rised_jax import config as config_lib, trainer  # pylint: disable=import-outside-toplevel
  from rised_jax.pipelines import stages  # pylint: disable=import-outside-toplevel
  config = config_lib.default_config()
  config.rollout.engine = "sglang"
  config.workdir = "gs://bucket/run"
  model = SimpleNamespace(cfg=SimpleNamespace(vocab_size=step_fixtures.VOCAB))
  with pytest.raises(ValueError, match=r"rollout.sglang.weight_dir is empty and the workdir "
                                       r"gs://bucket/run is a bucket URL"):
    trainer._engine(stages.stage_configs(config), config.workdir, model,  # pylint: disable=protected-access
                    tiny_tokenizer())
  config.rollout.sglang.weight_dir = str(tmp_path / "weights")
  engine = trainer._engine(stages.stage_configs(config), config.workdir, model,  # pylint: disable=protected-access
                           tiny_tokenizer())
  assert engine.weight_dir == str(tmp_path / "weights")
  engine.close()
