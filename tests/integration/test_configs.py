"""Every RISED experiment config loads and validates for every preset; the paper-scale config's
`local` switch runs end to end on a tiny model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rised_jax import config as config_lib
from rised_jax import pipelines
from rised_jax import trainer
from rised_jax.model import tiny
from tests.helpers.run_fixtures import load_config_file

CONFIGS = Path(__file__).resolve().parents[2] / "experiments" / "configs"
AGENTIC_PRESETS = ["rised", "rised_no_select", "rised_no_teacher", "rised_no_guidance", "grpo",
                   "dapo", "variance", "env_curriculum"]


@pytest.mark.parametrize("preset", AGENTIC_PRESETS)
@pytest.mark.parametrize("name, extra", [("smollm2_cpu.py", ""), ("tiny_cpu.py", ""),
                                         ("tiny_cpu.py", ",easy"), ("tiny_cpu.py", ",signpost"),
                                         ("rised_qwen3_multienv.py", ",1.7b"),
                                         ("rised_qwen3_multienv.py", ",4b,tpu"),
                                         ("rised_qwen3_multienv.py", ",4b,local")])
def test_config_loads_and_validates(name, extra, preset):
  config = load_config_file(CONFIGS / name, preset + extra)
  pipelines.validate(config)
  assert config.algorithm == preset
  for dotted, value in config_lib.PRESETS[preset].items():
    node = config
    for key in dotted.split("."):
      node = node[key]
    if dotted != "step.beta":
      assert node == value, dotted
  assert (config.step.beta > 0) == bool(config.teacher.enabled)


def test_presets_compose_stages_differently():
  rised = load_config_file(CONFIGS / "smollm2_cpu.py", "rised")
  grpo = load_config_file(CONFIGS / "smollm2_cpu.py", "grpo")
  assert (rised.select.name, rised.teacher.enabled, rised.guidance.enabled) == ("rised", True, True)
  assert (grpo.select.name, grpo.teacher.enabled, grpo.guidance.enabled) == ("uniform", False, False)
  assert grpo.select.pool_groups == grpo.select.batch_groups


@pytest.mark.parametrize("key, value, message", [
    ("envs.names", ["sokoban", "chess"], "chess"),
    ("rollout.engine", "vllm", "rollout.engine"),
    ("rollout.group_size", 1, "group_size"),
    ("select.batch_groups", 99, "batch_groups"),
    ("step.aggregation", "mean", "aggregation"),
    ("optim.schedule", "step", "schedule"),
    ("advantage", "ppo", "advantage"),
])
def test_bad_values_are_named_before_anything_loads(key, value, message):
  config = load_config_file(CONFIGS / "smollm2_cpu.py", "rised")
  node = config
  *parents, leaf = key.split(".")
  for name in parents:
    node = node[name]
  node[leaf] = value
  with pytest.raises(ValueError, match=message):
    pipelines.validate(config)


def test_unknown_difficulty_knob_is_named():
  config = load_config_file(CONFIGS / "smollm2_cpu.py", "rised")
  config.envs.difficulty.maze.depth = 3
  with pytest.raises(ValueError, match="depth"):
    pipelines.validate(config)


def test_paper_scale_config_local_switch_runs(tmp_path):
  model_dir = tiny.write(tmp_path / "model", ["frozenlake", "maze"])
  config = load_config_file(CONFIGS / "rised_qwen3_multienv.py", "rised,4b,local")
  config.model.source = str(model_dir)
  summary = trainer.train(config, tmp_path / "run")
  assert set(summary["after"]) == {"frozenlake", "maze"}
  metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
  assert [m["step"] for m in metrics if "loss" in m] == [1, 2]
