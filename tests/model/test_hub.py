"""Models by hub id: resolved through huggingface_hub's cache, offline, against a cache laid out
by hand as the hub documents it (blobs/, snapshots/<commit>/, refs/<revision>)."""
from __future__ import annotations

import hashlib
import os

import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import model_utils as mu
from rised_jax import model as model_pkg
from rised_jax.model import ModelConfig, ModelFileNotFoundError, from_config, save_pretrained
from rised_jax.model import hub

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(root, repo_id: str, checkpoint_dir, revision: str = "main"):
  """A hub cache holding `checkpoint_dir`'s files as repo `repo_id` at `revision`."""
  repo = root / f"models--{repo_id.replace('/', '--')}"
  (repo / "refs").mkdir(parents=True)
  (repo / "refs" / revision).write_text(COMMIT)
  snapshot = repo / "snapshots" / COMMIT
  snapshot.mkdir(parents=True)
  (repo / "blobs").mkdir()
  for file in sorted(checkpoint_dir.iterdir()):
    data = file.read_bytes()
    blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
    blob.write_bytes(data)
    os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)
  return root


@pytest.fixture(name="offline_cache")
def _offline_cache(tmp_path, monkeypatch):
  cache = tmp_path / "hub"
  cache.mkdir()
  monkeypatch.setenv("HF_HUB_CACHE", str(cache))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  import huggingface_hub.constants as constants  # noqa: PLC0415
  # The library reads these once at import; point the already-imported module at the test's.
  monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
  return cache


def test_parse_hub_id():
  assert hub.parse_hub_id("Qwen/Qwen3-4B") == ("Qwen/Qwen3-4B", None)
  assert hub.parse_hub_id("org/my.model_v2@refs/pr/3") == ("org/my.model_v2", "refs/pr/3")
  for not_an_id in ("smollm2-135m-instruct", "/abs/dir", "./rel/dir", "~/x/y", "a/b/c",
                    "org/name.", "org/-x", "org/a..b", "model.gguf", ""):
    assert hub.parse_hub_id(not_an_id) is None, not_an_id


def test_hub_id_loads_the_cached_checkpoint_offline(tmp_path, offline_cache, monkeypatch):
  cfg = ModelConfig.from_hf(mu.tiny_config("qwen3_untied"))
  model = from_config(cfg, seed=3)
  checkpoint = save_pretrained(model, mu.tiny_tokenizer(), tmp_path / "export")
  _hub_cache(offline_cache, "acme/tiny-qwen3", checkpoint)
  monkeypatch.chdir(tmp_path)   # no local folder named "acme"
  loaded, tokenizer = model_pkg.from_pretrained("acme/tiny-qwen3")
  ids = jnp.asarray([[5, 9, 17, 2, 40]])
  mask = jnp.ones_like(ids)
  np.testing.assert_array_equal(np.asarray(loaded(ids, mask)), np.asarray(model(ids, mask)))
  assert tokenizer.encode("hello world") == mu.tiny_tokenizer().encode("hello world")


def test_uncached_hub_id_offline_names_the_id(tmp_path, offline_cache, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ModelFileNotFoundError, match="'acme/absent'.*could not be resolved"):
    model_pkg.from_pretrained("acme/absent")


def test_missing_relative_path_is_not_sent_to_the_hub(tmp_path, monkeypatch):
  (tmp_path / "runs").mkdir()
  monkeypatch.chdir(tmp_path)

  def no_hub(*args, **kwargs):
    raise AssertionError("a missing local path was looked up on the hub")

  monkeypatch.setattr(hub, "snapshot", no_hub)
  with pytest.raises(ModelFileNotFoundError, match="runs/tiny_maze"):
    model_pkg.from_pretrained("runs/tiny_maze")
