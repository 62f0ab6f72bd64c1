"""RISED at paper scale: Qwen3-1.7B or 4B on all six built-in environments.

  # one 8-GPU node: CUDA SGLang rollouts on GPUs 0-3 (4 data-parallel copies), training
  # (FSDP) on 4-7, weights synced through /update_weights_from_disk every step:
  experiments/launch/gpu_node_sglang.sh --model $QWEN3_DIR --workdir /path/to/runs/rised_4b \
      --config experiments/configs/rised_qwen3_multienv.py:rised,4b \
      --server-gpus 0,1,2,3 --server-args "--dp 4" --train-gpus 4,5,6,7 -- --config.mesh.fsdp=4
  # a TPU pod slice: the same `rised-train --distributed` on every host, a gs:// workdir,
  # rollouts on a CUDA SGLang server that reads the shared --weight-dir:
  experiments/launch/tpu_pod.sh --tpu NAME --zone ZONE --workdir gs://BUCKET/rised_4b \
      --config experiments/configs/rised_qwen3_multienv.py:rised,4b,tpu \
      --sglang-url http://SGLANG_HOST:30000 --weight-dir /mnt/shared/rised_4b_weights
(docs/scale.md explains the flags.)

Argument (rised_jax.config_args): "ALGORITHM,SIZE[,tpu][,local]", default "rised,4b": ALGORITHM
a preset of rised_jax.config (rised, grpo, dapo, variance, env_curriculum, ablations); SIZE 4b
or 1.7b; tpu selects the pod mesh (data × fsdp over all chips) instead of one GPU node; local
shrinks everything to a CPU smoke run (a tiny model from `python -m rised_jax.model.tiny DIR`,
the in-process sampler, the rule-based judge, two steps) so CI can exercise the exact config
path. The shared paper-scale settings are rised_jax.recipes.rised_qwen3.
Judge: Gemini through google-genai (GEMINI_API_KEY from the environment); set
`--config.judge.backend=openai --config.judge.options.base_url=http://HOST:PORT/v1
--config.judge.options.model=Qwen3-32B` for an SGLang-served judge.
Hardware: 8×H100/H200 (or a v5p-64 slice); about 1 day for 300 steps with 4B.
"""
from rised_jax import config as config_lib
from rised_jax import config_args
from rised_jax import recipes


def get_config(arg: str | None = None):
  args = config_args.parse_arg(arg, algorithm="rised", size=recipes.QWEN3_SIZE, tpu=False,
                               local=False)
  c = recipes.rised_qwen3(
      args.algorithm, args.size, tpu=args.tpu, max_total_tokens=8192,
      envs=["sokoban", "frozenlake", "countdown", "wordle", "household", "maze"])
  if args.local:
    recipes.rised_cpu_smoke(c, envs=["frozenlake", "maze"], max_total_tokens=512,
                            prompt_buckets=[256, 512], groups=(8, 2), chunk=64, micro_batches=2,
                            steps=2)
  return config_lib.apply_preset(c)
