"""Building blocks that several experiment files (experiments/configs/*.py) share.

Each experiment stays one short file: it parses its argument (config_args.parse_arg), calls a
recipe here for the settings it shares with its siblings, sets what is its own, and applies the
algorithm preset (config.apply_preset). The recipes live in the package, not beside the
experiment files, so a file loaded by path (`rised-train --config FILE`) imports nothing but
rised_jax, from any working directory.

  rised_qwen3 + rised_cpu_smoke    rised_qwen3_multienv.py, rised_babyai_scienceworld.py
  cripo_qwen3                      cripo_qwen3_1p7b.py, cripo_qwen3_4b.py
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import ml_collections

from rised_jax import config as config_lib
from rised_jax.config_args import OneOf

# size: (default checkpoint dir, learning rate, micro-batches per step)
QWEN3_SIZES = {
    "1.7b": ("checkpoints/Qwen3-1.7B", 1e-6, 8),
    "4b": ("checkpoints/Qwen3-4B", 1e-6, 16),
}
QWEN3_SIZE = OneOf("4b", "1.7b")   # the `size` key of the RISED paper-scale files
TINY_MODEL = "runs/tiny_model"     # `python -m rised_jax.model.tiny runs/tiny_model`


def rised_qwen3(algorithm: str, size: str, *, tpu: bool, envs: Sequence[str],
                max_total_tokens: int,
                difficulty: Mapping[str, Mapping[str, Any]] | None = None
                ) -> ml_collections.ConfigDict:
  """RISED at paper scale on Qwen3-`size` (a key of QWEN3_SIZES), before the preset.

  SGLang rollouts (G = 8, 256-token turns, `max_total_tokens` per episode), a Gemini judge,
  K = 4B = 128 candidate groups (selection by composition matching: the batch's tag mix within
  ~0.1x a random batch's squared distance of the pool's; docs/changes/selector.md), 300 steps; FSDP
  over one 8-GPU node, or with `tpu` over 16 chips of a pod slice. The checkpoint is
  $QWEN3_1P7B_DIR or $QWEN3_4B_DIR when set. `difficulty`: knobs per environment name.
  """
  model_dir, lr, micro = QWEN3_SIZES[size]
  c = config_lib.default_config()
  c.algorithm = algorithm
  _qwen3_with_sglang(c, os.environ.get(f"QWEN3_{size.upper().replace('.', 'P')}_DIR", model_dir))
  c.envs.names = list(envs)
  for name, knobs in (difficulty or {}).items():
    c.envs.difficulty[name] = dict(knobs)
  c.rollout.max_new_tokens_per_turn = 256
  c.rollout.max_total_tokens = max_total_tokens
  c.judge.backend = "genai"
  c.judge.options = dict(model="gemini-2.5-flash", max_concurrency=32)
  c.select.pool_groups = 128
  c.select.batch_groups = 32
  c.step.beta = 0.05
  c.step.micro_batches = micro
  c.optim.learning_rate = lr
  c.optim.warmup_steps = 10
  c.train.steps = 300
  c.train.eval_every = 25
  c.eval.episodes_per_env = 64
  c.mesh = dict(data=-1, fsdp=16 if tpu else 8, tensor=1)
  c.batching.prefix_multiple = 256
  c.batching.response_multiple = 1024
  return c


def rised_cpu_smoke(c: ml_collections.ConfigDict, *, envs: Sequence[str], max_total_tokens: int,
                    prompt_buckets: Sequence[int], groups: tuple[int, int], chunk: int,
                    micro_batches: int, steps: int,
                    difficulty: Mapping[str, Mapping[str, Any]] | None = None) -> None:
  """Shrinks a `rised_qwen3` config in place to the CPU smoke run CI plays (its `local` flag).

  The tiny model (TINY_MODEL), the in-process sampler with one new-token bucket, the rule-based
  judge, G = 2 rollouts of 4-token turns, one host's mesh, 2 held-out episodes per environment;
  `groups` is (K, B). `difficulty` replaces the paper-scale knobs.
  """
  _tiny_model_on_cpu(c)
  c.envs.names = list(envs)
  c.envs.difficulty = {name: dict(knobs) for name, knobs in (difficulty or {}).items()}
  c.rollout.group_size = 2
  c.rollout.max_new_tokens_per_turn = 4
  c.rollout.max_total_tokens = max_total_tokens
  c.rollout.prompt_buckets = list(prompt_buckets)
  c.rollout.new_token_buckets = [8]
  c.judge.backend = "rules"
  c.judge.options = {}
  c.select.pool_groups, c.select.batch_groups = groups
  c.step.chunk = chunk
  c.step.micro_batches = micro_batches
  c.mesh = dict(data=1, fsdp=-1, tensor=1)
  c.train.steps = steps
  c.eval.episodes_per_env = 2


def cripo_qwen3(algorithm: str, *, model: str, beta: float,
                local: bool) -> ml_collections.ConfigDict:
  """CriPO at paper scale (arXiv 2607.18082) on /models/`model` with distillation weight `beta`,
  preset applied: G = 8 answers of up to 4096 tokens per prompt from an SGLang server, 64
  prompts per step, lr 1e-6, 200 steps, an OpenAI-compatible Qwen3-32B judge, FSDP over every
  device. `local` shrinks it to a CPU smoke run: the tiny model, the in-process sampler and the
  offline checker, 2 steps of 2 groups of 4 answers of 16 tokens."""
  c = config_lib.default_config()
  c.algorithm = algorithm
  _qwen3_with_sglang(c, f"/models/{model}")
  c.rollout.temperature = 1.0
  c.select.batch_groups = 64
  c.rubric.max_new_tokens = 4096
  c.rubric.judge.backend = "openai"
  c.rubric.judge.options = dict(model="Qwen/Qwen3-32B", base_url="http://127.0.0.1:30001/v1",
                                max_concurrency=64, temperature=0.0)
  c.step.beta = beta
  c.step.micro_batches = 8
  c.batching.prefix_multiple = 512
  c.batching.response_multiple = 512
  c.optim.learning_rate = 1e-6
  c.train.steps = 200
  c.train.eval_every = 50
  c.mesh.fsdp = -1
  c = config_lib.apply_preset(c)
  if local:
    _tiny_model_on_cpu(c)
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
    c.train.steps = 2
    c.train.checkpoint_every = 1
  return c


def _qwen3_with_sglang(c: ml_collections.ConfigDict, source: str) -> None:
  """What both paper-scale setups share: the checkpoint at `source` in bfloat16 with remat,
  rollouts of G = 8 from the SGLang server on this host, 512-token loss chunks, a checkpoint
  every 10 steps."""
  c.model.source = source
  c.model.compute_dtype = "bfloat16"   # float32 master weights and Adam state (param_dtype)
  c.model.remat = True
  c.rollout.engine = "sglang"
  c.rollout.sglang_url = "http://127.0.0.1:30000"
  c.rollout.group_size = 8
  c.step.chunk = 512
  c.train.checkpoint_every = 10


def _tiny_model_on_cpu(c: ml_collections.ConfigDict) -> None:
  """What both CPU smoke runs share: the tiny float32 model without remat, the in-process
  sampler, 64-token batch buckets, no evaluation during training."""
  c.model.source = TINY_MODEL
  c.model.compute_dtype = "float32"
  c.model.remat = False
  c.rollout.engine = "jax"
  c.batching.prefix_multiple = 64
  c.batching.response_multiple = 64
  c.train.eval_every = 0
