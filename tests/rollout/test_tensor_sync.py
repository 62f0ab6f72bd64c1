"""Weight sync without a disk export (`weight_sync="tensor"`): the HF-named tensors in the
bodies of /update_weights_from_tensor, against the loopback server's endpoint contract. The
entries are unpickled with torch (the `ref` extra), as the server does, and must give exactly
the tensors the disk export writes. Not run against a real SGLang server here (no GPU)."""
from __future__ import annotations

import base64
import logging
import os
import pickle
import warnings

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from rised_jax.model import save_pretrained
from rised_jax.rollout import tensor_payload
from rised_jax.rollout.sglang_engine import SGLangEngine, SGLangError
from tests.helpers.fake_sglang_server import FakeSGLangServer
from tests.helpers.model_utils import tiny_tokenizer
from tests.helpers import step_fixtures

torch = pytest.importorskip("torch")


def _unpickle(data: bytes) -> dict[str, np.ndarray]:
  """The server's view of one entry: (name, torch tensor) pairs, as numpy (bf16 kept)."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")   # torch's notice that TypedStorage is deprecated
    pairs = pickle.loads(data)
  out = {}
  for name, tensor in pairs:
    assert isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu"
    if tensor.dtype == torch.bfloat16:
      out[name] = tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
      out[name] = tensor.numpy()
  return out


def test_an_entry_unpickles_to_the_same_tensors():
  rng = np.random.default_rng(0)
  named = {"model.layers.0.mlp.up_proj.weight": rng.normal(size=(3, 5)).astype(ml_dtypes.bfloat16),
           "lm_head.weight": rng.normal(size=(7,)).astype(np.float32),
           "n" * 300: rng.normal(size=(2, 1, 2)).astype(np.float16)}   # a long name
  decoded = _unpickle(base64.b64decode(tensor_payload.serialized_entry(named.items())))
  assert list(decoded) == list(named)
  for name, array in named.items():
    assert decoded[name].dtype == array.dtype and decoded[name].shape == array.shape
    np.testing.assert_array_equal(decoded[name].view(np.uint8), array.view(np.uint8))


def test_buckets_keep_the_order_and_the_byte_bound():
  arrays = {f"t{i}": np.zeros(n, np.float32) for i, n in enumerate([3, 3, 10, 1, 1])}
  # 12-byte buckets: 3+3 floats fit in none together (24 bytes); a 40-byte tensor stands alone.
  assert [[name for name, _ in b] for b in tensor_payload.buckets(arrays, 12)] == [
      ["t0"], ["t1"], ["t2"], ["t3", "t4"]]
  assert [[name for name, _ in b] for b in tensor_payload.buckets(arrays, 1 << 20)] == [
      ["t0", "t1", "t2", "t3", "t4"]]


def test_tensor_sync_sends_what_the_disk_export_writes_and_writes_nothing(tmp_path):
  model, tokenizer = step_fixtures.tiny_model(), tiny_tokenizer()
  received = []
  with FakeSGLangServer(vocab_size=step_fixtures.VOCAB,
                        tensor_loader=lambda data: received.append(_unpickle(data))) as fake:
    with SGLangEngine(fake.url, timeout_s=30.0, weight_dir=str(tmp_path / "w"),
                      tokenizer=tokenizer, export_dtype="bfloat16", weight_sync="tensor",
                      tensor_bucket_bytes=20_000) as engine:
      engine.update_weights(model, version=4)
      assert engine.weight_version == 4
      calls = fake.calls_to("/update_weights_from_tensor")
      assert engine.last_sync_bytes == sum(len(c["serialized_named_tensors"][0]) for c in calls)
    assert fake.weight_version == "4" and not fake.calls_to("/update_weights_from_disk")
  assert not (tmp_path / "w").exists()   # no export
  assert len(calls) == len(received) > 1
  # The radix cache is flushed, and the version set, once the last bucket is in.
  assert [c["flush_cache"] for c in calls] == [False] * (len(calls) - 1) + [True]
  assert ["weight_version" in c for c in calls] == [False] * (len(calls) - 1) + [True]
  served = {}
  for bucket in received:
    assert not set(bucket) & set(served)
    served.update(bucket)
  exported = load_file(save_pretrained(model, tokenizer, tmp_path / "ref",
                                       dtype="bfloat16") / "model.safetensors")
  assert sorted(served) == sorted(exported)
  for name, array in exported.items():
    assert served[name].dtype == array.dtype and served[name].shape == array.shape, name
    np.testing.assert_array_equal(served[name].view(np.uint8), array.view(np.uint8))


def test_a_server_without_the_tensor_endpoint_is_synced_from_disk(tmp_path, caplog):
  model, tokenizer = step_fixtures.tiny_model(), tiny_tokenizer()
  with FakeSGLangServer(vocab_size=step_fixtures.VOCAB, has_tensor_endpoint=False) as fake:
    with SGLangEngine(fake.url, timeout_s=30.0, weight_dir=str(tmp_path / "w"),
                      tokenizer=tokenizer, weight_sync="tensor") as engine:
      with caplog.at_level(logging.WARNING):
        engine.update_weights(model, version=1)
      engine.update_weights(model, version=2)   # straight to the export now
      assert engine.weight_sync == "disk"
      files = sorted(os.listdir(tmp_path / "w" / "v2"))
      assert engine.last_sync_bytes == sum(os.path.getsize(tmp_path / "w" / "v2" / f)
                                           for f in files)
    assert len(fake.calls_to("/update_weights_from_tensor")) == 1
    assert [c["weight_version"] for c in fake.calls_to("/update_weights_from_disk")] == ["1", "2"]
  assert "no POST /update_weights_from_tensor (HTTP 404)" in caplog.text


def test_a_refused_tensor_load_is_an_error(tmp_path):
  def refuse(_):
    raise RuntimeError("shape mismatch for lm_head.weight")
  with FakeSGLangServer(vocab_size=step_fixtures.VOCAB, tensor_loader=refuse) as fake:
    with SGLangEngine(fake.url, timeout_s=30.0, max_retries=0, weight_dir=str(tmp_path / "w"),
                      tokenizer=tiny_tokenizer(), weight_sync="tensor") as engine:
      with pytest.raises(SGLangError, match=r"did not load weights version 3 \(tensor bucket "
                                            r"1 of 1\).*shape mismatch for lm_head.weight"):
        engine.update_weights(step_fixtures.tiny_model(), version=3)
      assert engine.weight_version is None


def test_weight_sync_must_be_a_known_mode():
  with pytest.raises(ValueError, match=r"weight_sync must be one of \('disk', 'tensor'\), got "
                                       r"'nccl'"):
    SGLangEngine("http://127.0.0.1:1", weight_sync="nccl")
