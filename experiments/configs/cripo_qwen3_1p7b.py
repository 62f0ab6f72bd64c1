"""CriPO at paper scale on Qwen3-1.7B (arXiv 2607.18082; docs/ALGORITHMS.md §3).

Paper setup: G = 8 answers per prompt, 64 prompts per step, lr 1e-6, 200 steps, answers of up to
4096 tokens, β = 0.05 warmed up over 50 steps, training judge Qwen3-32B. Two SGLang servers
(CUDA builds, started by you; rised_jax talks to them over HTTP): the policy's rollout server,
which reloads the weights the trainer exports after every step, and the judge. One GPU node:

  experiments/launch/gpu_node_sglang.sh --model /models/Qwen3-1.7B \
      --config experiments/configs/cripo_qwen3_1p7b.py:cripo --workdir /runs/cripo_1p7b \
      --server-gpus 0,1,2,3 --server-args "--dp 4" --train-gpus 4,5,6,7 \
      -- --config.rubric.judge.options.base_url=http://JUDGE_HOST:30001/v1

starts the rollout server, waits for /health, trains, and stops it; the judge runs on another
host (`python -m sglang.launch_server --model-path /models/Qwen3-32B --port 30001 --tp 4`), or
on the same node with --judge-model DIR --judge-gpus (docs/scale.md).
Bring RaR-Medicine / RaR-Science-style data with --config.rubric.tasks=FILE.jsonl (the format is in
rised_jax/rubric_tasks/tasks.py); the default is the built-in offline set.

The settings are rised_jax.recipes.cripo_qwen3, which cripo_qwen3_4b.py shares.
Argument (rised_jax.config_args): "PRESET[,local]". PRESET is cripo (default), cripo_u, cripo_s
or grpo_rubric. "local" shrinks everything for a CPU smoke run with the in-process sampler and
the offline checker:
  python -m rised_jax.model.tiny runs/tiny_model
  rised-train --config experiments/configs/cripo_qwen3_1p7b.py:cripo,local --workdir runs/smoke

Implementation choice [C-choice: normalisation]: L_distill is the mean KL over the kept tokens
of the whole batch ("kept-tokens", the preset's setting). 512 rows of up to ~9k tokens (teacher
prefixes hold the answer) need micro-batching (8 here), so the step fixes the kept set and its
global count in a stop-gradient pre-pass (one extra student + teacher forward per step).
Hardware: one node of 8 80-GB GPUs for the trainer (FSDP over all of them) plus the two servers'
GPUs. Expected time: not measured here (no GPU node); the paper reports 11–28 % more time per
step than GRPO.
"""
from rised_jax import config_args
from rised_jax import recipes


def get_config(arg: str | None = None):
  args = config_args.parse_arg(arg, algorithm="cripo", local=False)
  return recipes.cripo_qwen3(args.algorithm, model="Qwen3-1.7B", beta=0.05, local=args.local)
