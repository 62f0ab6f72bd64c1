"""Every RISED experiment config loads and validates for every preset; the paper-scale config's
`local` switch runs end to end on a tiny model."""
from __future__ import annotations

import ast
import importlib
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
                                         ("rised_qwen3_multienv.py", ",4b,local"),
                                         ("mechanisms_rised.py", ",teacher"),
                                         ("mechanisms_rised.py", ",guidance"),
                                         ("mechanisms_rised.py", ",suite")])
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


# Every file with the arguments the README, the Makefile, experiments/launch and the tests use,
# and the values they stand for.
DOCUMENTED = [
    ("smollm2_cpu.py", None, {"algorithm": "rised", "model.source": "smollm2-135m-instruct",
                              "envs.names": ["frozenlake", "maze", "countdown", "sokoban"]}),
    ("cripo_cpu.py", None, {"algorithm": "cripo", "pipeline": "rubric",
                            "model.source": "smollm2-135m-instruct", "train.steps": 4}),
    ("cripo_cpu.py", "grpo_rubric", {"pipeline": "rubric", "step.beta": 0.0}),
    ("mechanisms_cripo.py", None, {"algorithm": "cripo", "pipeline": "rubric",
                                   "model.source": "runs/cripo_warmstart", "train.steps": 15,
                                   "rubric.eval_tasks": 64,
                                   "rubric.cripo.reward_normalizer": "positive"}),
    ("mechanisms_cripo.py", "cripo_s", {"rubric.uc_branch": False, "step.beta": 0.0,
                                        "rubric.sc_branch": True}),
    ("tiny_cpu.py", None, {"algorithm": "rised", "model.source": "runs/tiny_model",
                           "envs.names": ["frozenlake", "maze"], "train.steps": 3}),
    ("tiny_cpu.py", "rised,easy", {"envs.names": ["maze"], "train.steps": 60,
                                   "eval.episodes_per_env": 12}),
    ("tiny_cpu.py", "grpo,setting=easy", {"algorithm": "grpo", "envs.names": ["maze"]}),
    ("tiny_cpu.py", "grpo,signpost", {"envs.names": ["signpost"],
                                      "rollout.group_size": 16, "train.steps": 100}),
    ("rised_qwen3_multienv.py", None, {
        "algorithm": "rised", "model.source": "checkpoints/Qwen3-4B", "rollout.engine": "sglang",
        "envs.names": ["sokoban", "frozenlake", "countdown", "wordle", "household", "maze"],
        "rollout.max_total_tokens": 8192, "step.micro_batches": 16, "mesh.fsdp": 8}),
    ("rised_qwen3_multienv.py", "grpo,1.7b,tpu", {
        "algorithm": "grpo", "model.source": "checkpoints/Qwen3-1.7B", "step.micro_batches": 8,
        "mesh.fsdp": 16, "select.pool_groups": 32}),
    ("rised_qwen3_multienv.py", "rised,4b,local", {
        "model.source": "runs/tiny_model", "rollout.engine": "jax", "judge.backend": "rules",
        "envs.names": ["frozenlake", "maze"], "rollout.prompt_buckets": [256, 512],
        "select.pool_groups": 8, "step.micro_batches": 2, "mesh.fsdp": -1, "train.steps": 2}),
    ("rised_babyai_scienceworld.py", "rised,4b", {
        "model.source": "checkpoints/Qwen3-4B", "rollout.max_total_tokens": 16384,
        "envs.names": ["babyai", "scienceworld", "twx_coin", "twx_cooking", "twx_twc"],
        "envs.difficulty.scienceworld.max_turns": 100, "mesh.fsdp": 8}),
    ("rised_babyai_scienceworld.py", "rised,1.7b,local", {
        "model.source": "runs/tiny_model", "envs.names": ["maze", "babyai", "scienceworld"],
        "envs.difficulty.babyai.max_turns": 2, "rollout.prompt_buckets": [768],
        "select.pool_groups": 6, "step.chunk": 128, "train.steps": 1}),
    ("cripo_qwen3_1p7b.py", "cripo", {"model.source": "/models/Qwen3-1.7B", "step.beta": 0.05,
                                      "rubric.judge.backend": "openai", "mesh.fsdp": -1}),
    ("cripo_qwen3_4b.py", "cripo", {"model.source": "/models/Qwen3-4B", "step.beta": 0.03,
                                    "pipeline": "rubric", "train.steps": 200}),
    ("cripo_qwen3_4b.py", "cripo_u,local", {"algorithm": "cripo_u", "step.beta": 0.03,
                                            "model.source": "runs/tiny_model",
                                            "rubric.judge.backend": "checker", "train.steps": 2}),
    ("compare_qwen3_0p6b_1gpu.py", None, {"algorithm": "rised",
                                          "model.source": "checkpoints/Qwen3-0.6B",
                                          "envs.names": ["frozenlake", "maze", "sokoban",
                                                         "countdown"]}),
]


@pytest.mark.parametrize("name, arg, expected", DOCUMENTED)
def test_documented_arguments_build_what_they_say(name, arg, expected, monkeypatch):
  for size in ("0P6B", "1P7B", "4B"):
    monkeypatch.delenv(f"QWEN3_{size}_DIR", raising=False)
  config = load_config_file(CONFIGS / name, arg)
  got = {}
  for dotted in expected:
    node = config
    for key in dotted.split("."):
      node = node[key]
    got[dotted] = node
  assert got == expected
  if name == "rised_babyai_scienceworld.py":   # validation builds the suites' environments
    for module in ("minigrid", "scienceworld", "textworld_express"):
      pytest.importorskip(module)
  pipelines.validate(config)


def test_qwen3_checkpoint_comes_from_the_environment(monkeypatch):
  monkeypatch.setenv("QWEN3_1P7B_DIR", "/data/qwen3-1.7b")
  config = load_config_file(CONFIGS / "rised_babyai_scienceworld.py", "rised,1.7b")
  assert config.model.source == "/data/qwen3-1.7b"


@pytest.mark.parametrize("path", sorted(p for p in CONFIGS.glob("*.py") if p.stem != "__init__"),
                         ids=lambda p: p.name)
def test_every_config_imports_only_rised_jax_and_loads_as_a_package_module(path):
  """No file loads a sibling (shared settings live in rised_jax.recipes): `rised-train --config
  FILE` works from any directory, and the package `experiments.configs` imports each file."""
  imported = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      imported.update(alias.name.split(".")[0] for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      imported.add(node.module.split(".")[0])
  assert imported <= {"os", "rised_jax"}, imported
  module = importlib.import_module(f"experiments.configs.{path.stem}")
  assert module.get_config().algorithm in {"rised", "cripo"}
