"""Helpers shared by the tests: experiment config files, a scripted agentic pipeline, and
hand-made run directories (as the trainer leaves them) for the comparison and analysis tests."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from rised_jax import compare, evaluate
from rised_jax.model import tiny
from rised_jax.pipelines.agentic import AgenticPipeline
from rised_jax.rollout.base import GenerationResult
from rised_jax.tasks import TaskStream
from tests.helpers.fake_engine import FakeEngine

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "experiments" / "configs"
TINY_CONFIG = CONFIGS / "tiny_cpu.py"


def load_config_file(path: Path, arg: str):
  """`get_config(arg)` of an experiment file, as `--config path:arg` would call it."""
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def training_tasks(config):
  """(the held-out evaluation tasks, the tasks of each training step), replayed from the
  config as the trainer draws them: the oracle of the tests that count a run's faults."""
  difficulty = config.envs.difficulty.to_dict()
  held_out = evaluate.eval_tasks(config.envs.names, difficulty, config.eval.episodes_per_env,
                                 config.eval.seed_offset)
  stream = TaskStream(config.envs.names, difficulty, seed=config.seed,
                      eval_seed_offset=config.eval.seed_offset,
                      exclude=evaluate.instance_keys(held_out))
  return held_out, [stream.next(config.select.pool_groups) for _ in range(config.train.steps)]


class RecordingEngine(FakeEngine):
  """Answers every request with `reply`, and records every prompt it was given."""

  def __init__(self, tokenizer, reply: str):
    super().__init__()
    self.ids = tokenizer.encode(reply) + [tokenizer.eos_token_id]
    self.prompts: list[list[int]] = []

  def reply(self, request, call):
    self.prompts.append(list(request.prompt_ids))
    return GenerationResult(list(self.ids), [-0.25] * len(self.ids), "stop")


def tiny_config(arg: str, model_dir: Path | None, **overrides):
  """tiny_cpu.py under argument `arg`, on the model in `model_dir` (None: the file's), with
  dotted-key overrides (`**{"train.steps": 2}`)."""
  config = load_config_file(TINY_CONFIG, arg)
  if model_dir is not None:
    config.model.source = str(model_dir)
  for dotted, value in overrides.items():
    node = config
    *parents, leaf = dotted.split(".")
    for name in parents:
      node = node[name]
    node[leaf] = value
  return config


def frozenlake_pipeline(reply: str):
  """An agentic pipeline on one-move FrozenLake whose engine always answers `reply`:
  (pipeline, engine, tokenizer)."""
  config = load_config_file(TINY_CONFIG, "rised")
  config.envs.names = ["frozenlake"]
  config.envs.difficulty = {"frozenlake": dict(size=2, holes=0, min_distance=1, max_turns=1)}
  config.select.pool_groups = 4
  config.select.batch_groups = 4
  tokenizer = tiny.build_tokenizer(tiny.environment_words(["frozenlake"]))
  engine = RecordingEngine(tokenizer, reply)
  return AgenticPipeline(config, engine, tokenizer), engine, tokenizer


def write_run(root: Path, preset: str, seed: int, values: dict[str, float], *,
              pipeline: str = "agentic", steps: int = 2, rollouts: int = 8, tokens: int = 5,
              seconds: float = 1.0, finished: bool = True) -> Path:
  """A run directory as the trainer leaves it, with the given final evaluation; each step's
  metrics.jsonl record times its roll-out and its update at `seconds` each."""
  workdir = compare.run_dir(root, preset, seed)
  workdir.mkdir(parents=True)
  (workdir / "config.json").write_text(json.dumps(
      {"algorithm": preset, "seed": seed, "pipeline": pipeline, "train": {"steps": steps}}))
  metric = compare.METRICS[pipeline]
  with open(workdir / "eval.jsonl", "w") as f:
    for step, scale in ((0, 0.0), (steps, 1.0)):
      for env, value in values.items():
        f.write(json.dumps({"step": step, "env": env, metric: value * scale, "episodes": 8}) + "\n")
  with open(workdir / "rollouts.jsonl", "w") as f:
    for i in range(rollouts):
      f.write(json.dumps({"step": 1 + i % steps, "env": "maze", "agent_tokens": tokens}) + "\n")
  with open(workdir / "metrics.jsonl", "w") as f:
    for step in range(1, steps + 1):
      f.write(json.dumps({"step": step, "time/rollout": seconds, "time/step": seconds}) + "\n")
  if finished:
    (workdir / "summary.json").write_text("{}")
  return workdir
