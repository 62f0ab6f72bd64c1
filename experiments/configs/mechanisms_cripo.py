"""CriPO's mechanism suite on CPU: both self-teachers have something to act on, by construction.

  python -m rised_jax.warmstart_cripo runs/cripo_warmstart      (once: warm-start + pre-checks)
  rised-compare --config experiments/configs/mechanisms_cripo.py \
      --presets cripo,cripo_u,cripo_s,grpo_rubric --seeds 0,1,2,3,4 --jobs 2 \
      --workdir benchmarks/results/mechanisms/cripo

Tasks: the packaged word_choice family (rised_jax.rubric_tasks.word_choice; 400 distinct
ordered lists of four words, 64 held out: every held-out task shows a list no training task
shows). Rubric: +3 names the first listed word, +1 the second, +1 says "please" (outside every
list), -4 uses more than three words; reward normaliser "positive" (Z = 5), so
"<first> <second> please" scores 1. The model is the tiny one after `rised_jax.warmstart_cripo`
(trained to answer one or two random listed words, never "please"; measured, it spreads its
first word over the whole pool and samples "please" now and then; the pre-checks it prints say
how far it reads each teacher context: both hold after its default 5000 steps). Unexplored
criteria: "please" (on the first suite's 800-step model no group of any run's first step had
a rollout saying it), the first word where no rollout names it; suppressed: the second word in
groups where first-word answers dominate. Reference scores on the held-out tasks (word_choice.trivial_scores):
best prompt-blind answer 0.378, the warm-started behaviour (uniform over the list) 0.300, the
rule 1.0. docs/cripo.md "Mechanism suite" has the measured comparison.

Argument (rised_jax.config_args): the preset, cripo (default), cripo_u, cripo_s or grpo_rubric.
Hardware: 1 CPU core per run, about a minute (docs/cripo.md).
"""
from rised_jax import config as config_lib
from rised_jax import config_args
from rised_jax import warmstart_cripo
from rised_jax.rubric_tasks import word_choice


def get_config(arg: str | None = None):
  args = config_args.parse_arg(arg, algorithm="cripo")
  c = config_lib.default_config()
  c.algorithm = args.algorithm
  c.model.source = "runs/cripo_warmstart"
  c.rubric.tasks = word_choice.PATH
  c.rubric.eval_tasks = warmstart_cripo.EVAL_TASKS
  c.rubric.split_seed = warmstart_cripo.SPLIT_SEED
  c.rubric.eval_groups = {"words": [word_choice.DOMAIN]}
  c.rubric.system_prompt = ""          # the warm-start's chats have none
  c.rubric.max_new_tokens = 4
  c.rubric.cripo.reward_normalizer = word_choice.NORMALIZER
  c.rollout.group_size = 8
  c.rollout.max_batch = 64
  c.rollout.prompt_buckets = [64]
  c.rollout.new_token_buckets = [4]
  c.select.pool_groups = 8
  c.select.batch_groups = 8
  # One prefix bucket holds every student and teacher prefix (a teacher prefix is about 100
  # tiny-tokenizer tokens), so the step compiles once.
  c.batching.prefix_multiple = 128
  c.batching.response_multiple = 8
  c.step.chunk = 128
  c.step.beta = 0.5
  c.optim.learning_rate = 3e-3
  c.train.steps = 15
  c.train.eval_every = 5
  c.train.checkpoint_every = 5
  c = config_lib.apply_preset(c)
  c.step.beta_warmup_steps = 5       # the paper's 50 of 200 steps, scaled to this run
  return c
