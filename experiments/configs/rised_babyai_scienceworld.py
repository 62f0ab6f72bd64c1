"""RISED at paper scale on real suites: Qwen3-1.7B or 4B on BabyAI, ScienceWorld and TextWorld
Express (`make envs` installs the suites and Java; README, "Real environment suites").

  # 1. an SGLang server for rollouts (CUDA SGLang; it serves /update_weights_from_disk):
  python -m sglang.launch_server --model-path $QWEN3_DIR --port 30000
  # 2. training (one GPU node, 8 GPUs, FSDP):
  rised-train --config experiments/configs/rised_babyai_scienceworld.py:rised,4b \
      --workdir /path/to/runs/rised_suites_4b --config.model.source=$QWEN3_DIR

Argument: "ALGORITHM,SIZE[,tpu][,local]" as in rised_qwen3_multienv.py. `local` is the CPU
smoke run CI plays: a tiny model (`python -m rised_jax.model.tiny DIR --envs
maze,babyai`), the in-process sampler, the rule-based judge, one step, on one
built-in game (maze) and two real suites (BabyAI, ScienceWorld), with two-turn budgets.
Evaluation plays ScienceWorld's dev variations and TextWorld Express's dev games (seeds from
eval.seed_offset on; see rised_jax.envs.scienceworld_env), BabyAI's held-out seeds.
Judge: Gemini through google-genai (GEMINI_API_KEY from the environment).
Hardware: 8×H100/H200 (or a v5p-64 slice) and ~16 CPU cores with 4 GB each for the suites'
JVMs: RISED_SUITE_JVMS=16 (per suite; the default 2 makes concurrent episodes take turns on a
JVM, each turn replaying the episode's commands, which is correct but slow).
"""
import os

from rised_jax import config as config_lib

SIZES = {
    # size: (default checkpoint dir, learning rate, micro-batches per step)
    "1.7b": ("checkpoints/Qwen3-1.7B", 1e-6, 8),
    "4b": ("checkpoints/Qwen3-4B", 1e-6, 16),
}
# ScienceWorld tasks whose gold sequences mostly fit 100 turns (README table: boil's reach 164).
SCIENCEWORLD_TASKS = "find-living-thing,find-plant,boil,melt,test-conductivity,power-component"
BABYAI_LEVELS = "GoToLocal,PickupLoc,PutNextLocal,OpenDoor,UnlockPickup"


def get_config(arg: str | None = None):
  algorithm, size, *flags = (arg or "rised,4b").split(",")
  if size not in SIZES:
    raise ValueError(f"size {size!r}: expected one of {sorted(SIZES)}")
  unknown = set(flags) - {"tpu", "local"}
  if unknown:
    raise ValueError(f"unknown flags {sorted(unknown)}; expected tpu and/or local")
  model_dir, lr, micro = SIZES[size]
  c = config_lib.default_config()
  c.algorithm = algorithm
  c.model.source = os.environ.get(f"QWEN3_{size.upper().replace('.', 'P')}_DIR", model_dir)
  c.model.compute_dtype = "bfloat16"   # float32 master weights and Adam state (param_dtype)
  c.model.remat = True
  c.envs.names = ["babyai", "scienceworld", "twx_coin", "twx_cooking", "twx_twc"]
  c.envs.difficulty.babyai = dict(level=BABYAI_LEVELS)
  c.envs.difficulty.scienceworld = dict(task=SCIENCEWORLD_TASKS, simplification="easy",
                                        max_turns=100)
  c.envs.difficulty.twx_coin = dict(params="numLocations=5,includeDoors=1,numDistractorItems=0")
  c.envs.difficulty.twx_cooking = dict(params="numLocations=3,numIngredients=2,"
                                              "numDistractorItems=2,includeDoors=0")
  c.rollout.engine = "sglang"
  c.rollout.sglang_url = "http://127.0.0.1:30000"
  c.rollout.group_size = 8
  c.rollout.max_new_tokens_per_turn = 256
  c.rollout.max_total_tokens = 16384
  c.judge.backend = "genai"
  c.judge.options = dict(model="gemini-2.5-flash", max_concurrency=32)
  c.select.pool_groups = 128            # K = 4B: the regime where MMR beats random subsets
  c.select.batch_groups = 32
  c.step.beta = 0.05
  c.step.chunk = 512
  c.step.micro_batches = micro
  c.optim.learning_rate = lr
  c.optim.warmup_steps = 10
  c.train.steps = 300
  c.train.eval_every = 25
  c.train.checkpoint_every = 10
  c.eval.episodes_per_env = 64
  c.mesh = dict(data=-1, fsdp=8, tensor=1) if "tpu" not in flags else dict(data=-1, fsdp=16,
                                                                          tensor=1)
  c.batching.prefix_multiple = 256
  c.batching.response_multiple = 1024
  if "local" in flags:
    c.model.source = "runs/tiny_model"
    c.model.compute_dtype = "float32"
    c.model.remat = False
    c.envs.names = ["maze", "babyai", "scienceworld"]
    c.envs.difficulty = dict(
        maze=dict(width=2, height=2, min_distance=1, max_turns=2),
        babyai=dict(level="GoToLocal", max_turns=2),
        scienceworld=dict(task="find-living-thing", simplification="easy", max_turns=2))
    c.rollout.engine = "jax"
    c.rollout.group_size = 2
    c.rollout.max_new_tokens_per_turn = 4
    c.rollout.max_total_tokens = 768
    c.rollout.prompt_buckets = [768]    # one bucket: one sampler compile
    c.rollout.new_token_buckets = [8]
    c.judge.backend = "rules"
    c.judge.options = {}
    c.select.pool_groups = 6
    c.select.batch_groups = 3
    c.step.chunk = 128
    c.step.micro_batches = 1
    c.batching.prefix_multiple = 64
    c.batching.response_multiple = 64
    c.mesh = dict(data=1, fsdp=-1, tensor=1)
    c.train.steps = 1
    c.train.eval_every = 0
    c.eval.episodes_per_env = 2
  return config_lib.apply_preset(c)
