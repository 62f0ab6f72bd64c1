"""Tiny end-to-end run for tests and smoke checks: a random 2-layer model, two easy environments.

  python -m rised_jax.model.tiny runs/tiny_model --envs frozenlake,maze
  rised-train --config experiments/configs/tiny_cpu.py:rised --workdir runs/tiny \
      --config.model.source=runs/tiny_model

Argument: the algorithm preset (rised, grpo, dapo, variance, env_curriculum, ablations).
Hardware: 1 CPU core; about a minute.
"""
from rised_jax import config as config_lib


def get_config(arg: str | None = None):
  c = config_lib.default_config()
  c.algorithm = arg or "rised"
  c.model.source = "runs/tiny_model"
  c.envs.names = ["frozenlake", "maze"]
  c.envs.difficulty.frozenlake = dict(size=3, holes=0, min_distance=2, max_turns=4)
  c.envs.difficulty.maze = dict(width=2, height=2, min_distance=1, max_turns=4)
  c.rollout.group_size = 4
  c.rollout.max_new_tokens_per_turn = 4
  c.rollout.max_total_tokens = 768
  c.select.pool_groups = 4
  c.select.batch_groups = 2
  c.step.chunk = 128
  c.optim.learning_rate = 3e-3
  c.batching.prefix_multiple = 64
  c.batching.response_multiple = 64
  c.train.steps = 3
  c.eval.episodes_per_env = 4
  return config_lib.apply_preset(c)
