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
on the same node with --judge-model DIR --judge-gpus (README, "Running at scale").
Bring RaR-Medicine / RaR-Science-style data with --config.rubric.tasks=FILE.jsonl (the format is in
rised_jax/rubric_tasks/tasks.py); the default is the built-in offline set.

Argument: "PRESET[,local]". PRESET is cripo (default), cripo_u, cripo_s or grpo_rubric. "local"
shrinks everything for a CPU smoke run with the in-process sampler and the offline checker:
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
from rised_jax import config as config_lib


def paper_config(arg: str | None, *, model: str, beta: float):
  """The paper's settings for `model` with distillation weight `beta`; "local" shrinks them."""
  preset, *flags = (arg or "cripo").split(",")
  unknown = sorted(set(flags) - {"local"})
  if unknown:
    raise ValueError(f"config argument {arg!r}: unknown flag(s) {unknown}; expected "
                     "'PRESET' or 'PRESET,local'")
  c = config_lib.default_config()
  c.algorithm = preset
  c.model.source = f"/models/{model}"
  c.model.compute_dtype = "bfloat16"   # float32 master weights and Adam state (param_dtype)
  c.model.remat = True
  c.rollout.engine = "sglang"
  c.rollout.sglang_url = "http://127.0.0.1:30000"
  c.rollout.group_size = 8
  c.rollout.temperature = 1.0
  c.select.batch_groups = 64
  c.rubric.max_new_tokens = 4096
  c.rubric.judge.backend = "openai"
  c.rubric.judge.options = dict(model="Qwen/Qwen3-32B", base_url="http://127.0.0.1:30001/v1",
                                max_concurrency=64, temperature=0.0)
  c.step.beta = beta
  c.step.chunk = 512
  c.step.micro_batches = 8
  c.batching.prefix_multiple = 512
  c.batching.response_multiple = 512
  c.optim.learning_rate = 1e-6
  c.train.steps = 200
  c.train.eval_every = 50
  c.train.checkpoint_every = 10
  c.mesh.fsdp = -1
  c = config_lib.apply_preset(c)
  if "local" in flags:
    c.model.source = "runs/tiny_model"
    c.model.compute_dtype = "float32"
    c.model.remat = False
    c.rollout.engine = "jax"
    c.rollout.group_size = 4
    c.rollout.max_batch = 8
    c.rollout.prompt_buckets = [256, 512]
    c.rollout.new_token_buckets = [16]
    c.select.batch_groups = 2
    c.select.pool_groups = 2
    c.rubric.max_new_tokens = 16
    c.rubric.eval_tasks = 4
    c.rubric.judge.backend = "checker"
    c.rubric.judge.options = {}
    c.step.chunk = 64
    c.batching.prefix_multiple = 64
    c.batching.response_multiple = 64
    c.train.steps = 2
    c.train.eval_every = 0
    c.train.checkpoint_every = 1
  return c


def get_config(arg: str | None = None):
  return paper_config(arg, model="Qwen3-1.7B", beta=0.05)
