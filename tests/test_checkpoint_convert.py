"""Scanned ↔ unrolled checkpoint conversion: a tiny unrolled run converted to the scanned
layout restores into a scanned run's train state with every layer's arrays in its row, and
converting back gives the original arrays bit for bit."""
from __future__ import annotations

import json

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rised_jax import checkpoint_convert, trainer
from rised_jax.model import tiny
from tests.helpers.run_fixtures import tiny_config


def _raw_state(workdir, step):
  return ocp.StandardCheckpointer().restore(workdir / "checkpoints" / str(step) / "state")


def _leaves(tree):
  return jax.tree_util.tree_leaves_with_path(tree)


def test_convert_tree_hand_built():
  layers = {"0": {"q": np.array([[1., 2.]]), "norm": {"scale": np.array([1.])}},
            "1": {"q": np.array([[3., 4.]]), "norm": {"scale": np.array([2.])}}}
  # Adam's moments sit inside optax's chained state, saved as lists.
  unrolled = {"params": {"embed": np.ones(3), "layers": layers},
              "opt_state": [{"count": np.array(1)}, [{"mu": {"layers": layers}}]]}
  scanned, count = checkpoint_convert.convert_tree(unrolled, "scanned")
  assert count == 2
  np.testing.assert_array_equal(scanned["opt_state"][1][0]["mu"]["layers"]["q"],
                                [[[1., 2.]], [[3., 4.]]])
  np.testing.assert_array_equal(scanned["params"]["layers"]["q"], [[[1., 2.]], [[3., 4.]]])
  np.testing.assert_array_equal(scanned["params"]["layers"]["norm"]["scale"], [[1.], [2.]])
  back, count = checkpoint_convert.convert_tree(scanned, "unrolled")
  assert count == 2 and set(back["params"]["layers"]) == {"0", "1"}
  for (path_a, a), (path_b, b) in zip(_leaves(back), _leaves(unrolled), strict=True):
    assert path_a == path_b
    np.testing.assert_array_equal(a, b)
  assert checkpoint_convert.convert_tree(scanned, "scanned")[1] == 0   # already scanned


@pytest.mark.slow
def test_unrolled_run_resumes_scanned_and_converts_back_exactly(tmp_path, monkeypatch):
  model = tiny.write(tmp_path / "model", ["frozenlake", "maze"])
  monkeypatch.setenv("RISED_JAX_CACHE", str(tmp_path / "cache"))

  def config(scan: bool):
    return tiny_config("grpo", model, **{"train.steps": 1, "model.scan_layers": scan,
                                         "eval.episodes_per_env": 1})

  unrolled, scanned, back = tmp_path / "unrolled", tmp_path / "scanned", tmp_path / "back"
  trainer.train(config(False), unrolled)
  assert checkpoint_convert.convert_workdir(str(unrolled), str(scanned), "scanned") == [1]
  assert json.loads((scanned / "config.json").read_text())["model"]["scan_layers"] is True
  assert (scanned / "metrics.jsonl").read_bytes() == (unrolled / "metrics.jsonl").read_bytes()

  # The scanned config accepts the converted workdir and restores its checkpoint.
  run = trainer.build(config(True), scanned)
  restored = run.checkpointer.restore(1, run.state, run.host_state())
  run.checkpointer.close()
  original = _raw_state(unrolled, 1)
  layers = original["params"]["layers"]
  q_proj = np.stack([np.asarray(layers[str(i)]["attn"]["q_proj"]["value"]) for i in range(len(layers))])
  np.testing.assert_array_equal(np.asarray(restored.params["layers"]["attn"]["q_proj"][...]),
                                q_proj)
  adam_mu = [leaf for path, leaf in _leaves(restored.opt_state)
             if "q_proj" in jax.tree_util.keystr(path)]
  assert adam_mu and all(np.asarray(m).shape == q_proj.shape for m in adam_mu)

  checkpoint_convert.convert_workdir(str(scanned), str(back), "unrolled")
  for (path_a, a), (path_b, b) in zip(_leaves(_raw_state(back, 1)), _leaves(original),
                                      strict=True):
    assert path_a == path_b
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_refusals(tmp_path):
  with pytest.raises(FileNotFoundError, match="not a run directory"):
    checkpoint_convert.convert_workdir(str(tmp_path), str(tmp_path / "x"), "scanned")
  (tmp_path / "config.json").write_text(json.dumps({"model": {"scan_layers": True}}))
  with pytest.raises(ValueError, match="already True"):
    checkpoint_convert.convert_workdir(str(tmp_path), str(tmp_path / "x"), "scanned")
  with pytest.raises(FileExistsError, match="new directory"):
    checkpoint_convert.convert_workdir(str(tmp_path), str(tmp_path), "unrolled")
