"""Tiny end-to-end runs for tests and smoke checks: a random 2-layer model on easy environments.

  python -m rised_jax.model.tiny runs/tiny_model --envs frozenlake,maze
  rised-train --config experiments/configs/tiny_cpu.py:rised --workdir runs/tiny \
      --config.model.source=runs/tiny_model

Argument (rised_jax.config_args): "ALGORITHM[,SETTING]". ALGORITHM is a preset (rised, grpo,
dapo, variance, env_curriculum, rised_no_select, rised_no_teacher, rised_no_guidance); SETTING
is smoke (default: FrozenLake and 2x2 mazes, three steps), easy or signpost. "easy" was the
learning test's first setting (the tiny model does not learn it; docs/performance.md): 3x3 mazes one step
from the exit, each action a single token. The agent's view is egocentric, so its thousands of
layouts are only 25 situations (first observation and winning plan, `envs.base`): 12 are held
out, 13 left to train on. Their winning first moves differ (forward 6, turn right 4, turn left
2), so the policy must read the observation; a blind policy (one action sequence for every
instance) wins at most 6 of the 12. RISED rolls out K = 4B candidate groups, as every RISED
config (docs/rised.md). "signpost" is the learning test's setting: the
plug-in game `signpost` (tests/helpers/learning_envs.py; one move, named by the observation in words, which
is all there is to the game; 64 of its 256 instances held out, the best constant move wins
about a third of them). "smoke" holds out 4 FrozenLake maps and 4 of the 24 situations of its
2x2 mazes.
Hardware: 1 CPU core; well under a minute (easy: about five minutes on 2 shared cores).
"""
from rised_jax import config as config_lib
from rised_jax import config_args


def get_config(arg: str | None = None):
  args = config_args.parse_arg(arg, algorithm="rised",
                               setting=config_args.OneOf("smoke", "easy", "signpost"))
  c = config_lib.default_config()
  c.algorithm = args.algorithm
  c.model.source = "runs/tiny_model"
  c.step.chunk = 128
  c.batching.prefix_multiple = 64
  c.batching.response_multiple = 64
  c.rollout.max_batch = 64
  c.rollout.prompt_buckets = [256, 512, 1024]
  c.rollout.new_token_buckets = [8, 32]
  if args.setting == "signpost":
    # One move, named by the observation in words (tests/helpers/learning_envs.py): the learning
    # test's setting. 256 instances (move, colour, shape); 64 held out.
    # G = 16: with G = 8 (150 steps) the greedy policy read only part of the sign.
    # Under a short name: the name, not the module path, is hashed into the task stream and
    # the sampling seeds, so the game's module can move without redrawing the test's seeds.
    c.envs.aliases.signpost = "tests.helpers.learning_envs:Signpost"
    c.envs.names = ["signpost"]
    c.rollout.group_size = 16
    c.rollout.max_new_tokens_per_turn = 1
    c.rollout.max_total_tokens = 384
    c.select.pool_groups = 32
    c.select.batch_groups = 8
    c.optim.learning_rate = 3e-3
    c.train.steps = 100
    c.eval.episodes_per_env = 64
  elif args.setting == "easy":
    # Mazes one step from the exit, which may lie ahead (forward), to a side (turn, forward)
    # or two cells ahead: the right first move must be read from the observation. 12 of the
    # 25 situations held out (asking for more than 25 is refused).
    c.envs.names = ["maze"]
    c.envs.difficulty.maze = dict(width=3, height=3, min_distance=1, max_turns=2)
    c.rollout.group_size = 8
    c.rollout.max_new_tokens_per_turn = 1
    c.rollout.max_total_tokens = 384
    c.select.pool_groups = 32
    c.select.batch_groups = 8
    c.optim.learning_rate = 3e-3
    c.train.steps = 60
    c.eval.episodes_per_env = 12
  else:   # smoke
    c.envs.names = ["frozenlake", "maze"]
    c.envs.difficulty.frozenlake = dict(size=3, holes=0, min_distance=2, max_turns=4)
    c.envs.difficulty.maze = dict(width=2, height=2, min_distance=1, max_turns=4)
    c.rollout.group_size = 4
    c.rollout.max_new_tokens_per_turn = 4
    c.rollout.max_total_tokens = 768
    c.select.pool_groups = 8
    c.select.batch_groups = 2
    c.optim.learning_rate = 3e-3
    c.train.steps = 3
    c.eval.episodes_per_env = 4
  return config_lib.apply_preset(c)
