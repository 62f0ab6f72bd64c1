"""The method comparison on one accelerator: Qwen3-0.6B, four environments, every preset.

  rised-compare --config experiments/configs/compare_qwen3_0p6b_1gpu.py \
      --presets rised,grpo,grpo_matched,dapo,variance,env_curriculum,rised_no_select,\
rised_no_teacher,rised_no_guidance,rised_select_success,rised_generic_teacher,rised_hint_no_iw \
      --seeds 0,1,2 --workdir runs/compare_qwen3_0p6b --config.model.source=$QWEN3_0P6B_DIR

(`--list` instead prints the 36 commands, for a scheduler with several accelerators.)
Argument (rised_jax.config_args): the preset (rised-compare supplies it; default rised).
The in-process JAX sampler (one process holds policy and sampler, so no second server competes for
the device), the rule-based judge (offline, deterministic), bfloat16 compute over float32 master
weights, with remat. K = 4B (32 candidate groups, 8 trained on; RISED's selection matches the
pool's tag mix, docs/rised.md explains the 4); grpo_matched rolls out the same 32 groups
per step as RISED. 64 held-out episodes per environment.
Hardware: one GPU with ≥ 40 GB (H100 / H200 / A100-80GB) or a TPU v5e/v6e chip.
Expected time — NOT MEASURED: this config has not been run. A guess from the CPU runs' stage
timings (rollout dominates: 32 groups × 8 episodes × ≤ 4 turns of ≤ 48 tokens per step) is
5–15 minutes per run of 40 steps, so 3–9 hours for the 36 runs above; time one run first
(`--presets rised --seeds 0`) and read `time/*` in its metrics.jsonl.
"""
import os

from rised_jax import config as config_lib
from rised_jax import config_args


def get_config(arg: str | None = None):
  args = config_args.parse_arg(arg, algorithm="rised")
  c = config_lib.default_config()
  c.algorithm = args.algorithm
  c.model.source = os.environ.get("QWEN3_0P6B_DIR", "checkpoints/Qwen3-0.6B")
  c.model.compute_dtype = "bfloat16"   # float32 master weights and Adam state (param_dtype)
  c.model.remat = True
  c.envs.names = ["frozenlake", "maze", "sokoban", "countdown"]
  c.envs.difficulty.frozenlake = dict(size=4, holes=2, min_distance=2, max_turns=4)
  c.envs.difficulty.maze = dict(width=3, height=3, min_distance=2, max_turns=4)
  c.envs.difficulty.sokoban = dict(width=5, height=5, walls=0, min_moves=1, max_moves=2,
                                   max_turns=4)
  c.envs.difficulty.countdown = dict(numbers=3, min_steps=1, max_turns=2)
  c.rollout.engine = "jax"
  c.rollout.group_size = 8
  c.rollout.max_new_tokens_per_turn = 48
  c.rollout.max_total_tokens = 2048
  c.rollout.max_batch = 256
  c.rollout.reuse_prefix = True
  c.rollout.prompt_buckets = [512, 1024, 2048]
  c.rollout.new_token_buckets = [64]
  c.select.pool_groups = 32             # K = 4B
  c.select.batch_groups = 8
  c.step.beta = 0.05
  c.step.chunk = 512
  c.step.micro_batches = 4
  c.optim.learning_rate = 1e-6
  c.optim.warmup_steps = 5
  c.train.steps = 40
  c.train.eval_every = 10
  c.train.checkpoint_every = 10
  c.eval.episodes_per_env = 64
  c.batching.prefix_multiple = 256
  c.batching.response_multiple = 256
  return config_lib.apply_preset(c)
