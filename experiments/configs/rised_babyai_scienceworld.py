"""RISED at paper scale on real suites: Qwen3-1.7B or 4B on BabyAI, ScienceWorld and TextWorld
Express (`make envs` installs the suites and Java; docs/environments.md).

  # 1. an SGLang server for rollouts (CUDA SGLang; it serves /update_weights_from_disk):
  python -m sglang.launch_server --model-path $QWEN3_DIR --port 30000
  # 2. training (one GPU node, 8 GPUs, FSDP):
  rised-train --config experiments/configs/rised_babyai_scienceworld.py:rised,4b \
      --workdir /path/to/runs/rised_suites_4b --config.model.source=$QWEN3_DIR

Argument: "ALGORITHM,SIZE[,tpu][,local]" as in rised_qwen3_multienv.py, whose settings
(rised_jax.recipes.rised_qwen3) this file shares but for the environments and the longer
episodes. `local` is the CPU smoke run CI plays: a tiny model (`python -m rised_jax.model.tiny
DIR --envs maze,babyai`), the in-process sampler, the rule-based judge, one step, on one
built-in game (maze) and two real suites (BabyAI, ScienceWorld), with two-turn budgets.
Evaluation plays ScienceWorld's dev variations and TextWorld Express's dev games (seeds from
eval.seed_offset on; see rised_jax.envs.scienceworld_env), BabyAI's held-out seeds.
Judge: Gemini through google-genai (GEMINI_API_KEY from the environment).
Hardware: 8×H100/H200 (or a v5p-64 slice) and ~16 CPU cores with 4 GB each for the suites'
JVMs: RISED_SUITE_JVMS=16 (per suite; the default 2 makes concurrent episodes take turns on a
JVM, each turn replaying the episode's commands, which is correct but slow).
"""
from rised_jax import config as config_lib
from rised_jax import config_args
from rised_jax import recipes

# ScienceWorld tasks whose gold sequences mostly fit 100 turns (docs/environments.md table: boil's reach 164).
SCIENCEWORLD_TASKS = "find-living-thing,find-plant,boil,melt,test-conductivity,power-component"
BABYAI_LEVELS = "GoToLocal,PickupLoc,PutNextLocal,OpenDoor,UnlockPickup"
DIFFICULTY = {
    "babyai": dict(level=BABYAI_LEVELS),
    "scienceworld": dict(task=SCIENCEWORLD_TASKS, simplification="easy", max_turns=100),
    "twx_coin": dict(params="numLocations=5,includeDoors=1,numDistractorItems=0"),
    "twx_cooking": dict(params="numLocations=3,numIngredients=2,numDistractorItems=2,"
                               "includeDoors=0"),
}
LOCAL_DIFFICULTY = {   # two-turn budgets
    "maze": dict(width=2, height=2, min_distance=1, max_turns=2),
    "babyai": dict(level="GoToLocal", max_turns=2),
    "scienceworld": dict(task="find-living-thing", simplification="easy", max_turns=2),
}


def get_config(arg: str | None = None):
  args = config_args.parse_arg(arg, algorithm="rised", size=recipes.QWEN3_SIZE, tpu=False,
                               local=False)
  c = recipes.rised_qwen3(args.algorithm, args.size, tpu=args.tpu, max_total_tokens=16384,
                          envs=["babyai", "scienceworld", "twx_coin", "twx_cooking", "twx_twc"],
                          difficulty=DIFFICULTY)
  if args.local:
    # One bucket of 768 prompt tokens: one sampler compile.
    recipes.rised_cpu_smoke(c, envs=list(LOCAL_DIFFICULTY), difficulty=LOCAL_DIFFICULTY,
                            max_total_tokens=768, prompt_buckets=[768], groups=(6, 3), chunk=128,
                            micro_batches=1, steps=1)
  return config_lib.apply_preset(c)
