"""CriPO at paper scale on Qwen3-4B: the settings of cripo_qwen3_1p7b.py (rised_jax.recipes.
cripo_qwen3) with β = 0.03.

  experiments/launch/gpu_node_sglang.sh --model /models/Qwen3-4B \
      --config experiments/configs/cripo_qwen3_4b.py:cripo --workdir /runs/cripo_4b \
      --server-gpus 0,1,2,3 --server-args "--dp 4" --train-gpus 4,5,6,7 \
      -- --config.rubric.judge.options.base_url=http://JUDGE_HOST:30001/v1

Argument: "PRESET[,local]" as in cripo_qwen3_1p7b.py (whose docstring has the details).
Hardware: one node of 8 80-GB GPUs for the trainer plus the two servers' GPUs; time not measured.
"""
from rised_jax import config_args
from rised_jax import recipes


def get_config(arg: str | None = None):
  args = config_args.parse_arg(arg, algorithm="cripo", local=False)
  return recipes.cripo_qwen3(args.algorithm, model="Qwen3-4B", beta=0.03, local=args.local)
