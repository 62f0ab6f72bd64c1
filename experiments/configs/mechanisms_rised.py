"""The RISED mechanism suite: one-move Doors games (rised_jax.envs.doors) in which the teacher,
the guidance and the selection each have something to act on, by construction.

  python -m rised_jax.warmstart runs/doors_model --game doors --steps 400 --avoid-share 0.25 \
      --prior-share 0.3
  python -m rised_jax.mechanisms precheck --model runs/doors_model     # before any RL
  rised-train --config experiments/configs/mechanisms_rised.py:rised,teacher --workdir runs/m
  rised-compare --config experiments/configs/mechanisms_rised.py:setting=suite \
      --workdir runs/mech_rised --seeds 0,1,2,3,4 --jobs 2 --presets \
      rised,rised_no_teacher,grpo,rised_no_guidance,rised_no_select,grpo_matched,rised_generic_teacher
  (docs/rised.md, "Mechanism suite", has what ran and the results.)

Argument (rised_jax.config_args): "PRESET[,SETTING]". SETTING:
  teacher   (default) `doors`: 4 doors, the note in the observation names the winning one;
            the warm-started student opens the system prompt's example door half the time
            and another at random, so off the example's door a rollout wins about 1/8 of the
            time and with G = 4 most such groups are all-failure (the pre-check measures it).
            A won rollout's positives are "Uses valid action syntax on every turn" and
            "Opens with DOOR", which names this instance's winner: the teacher reads the
            group's own positives (sources ("group",)), since another instance's door would
            be false here. The warm-started model copies that line (the pre-check).
            Its step (TEACHER_STEP) adds a reference KL of 0.1 and beta 0.5: the learning
            test's setting (tests/integration/test_mechanisms.py).
  guidance  `trapdoors`: 4 doors and the black one, which never wins and which the system
            prompt's example opens; its negative tag reads "Opens with black", so the hint
            is "Avoid: Opens with black." (threshold 0.1: the trap must be hinted while it
            is a recurring failure, not only once most rollouts take it).
  suite     both games: learned at different rates (the example's door wins a quarter of
            `doors` and none of `trapdoors`), so which groups a batch holds matters to the
            selection; the comparison's setting.
Held out: 32 of the 64 (door, size, shape) instances per game (instance keys disjoint from
training). The best constant policy wins the commonest door's share
of them (`python -m rised_jax.mechanisms precheck` prints it).
Hardware: 1 CPU core, a few minutes per run on a loaded 2-core machine (docs/rised.md,
"Mechanism suite", has the measured times).
"""
from rised_jax import config as config_lib
from rised_jax import config_args, mechanisms
from rised_jax.envs import doors

SETTINGS = {"teacher": ["doors"], "guidance": ["trapdoors"], "suite": ["doors", "trapdoors"]}
# The teacher setting's own step (the learning test's; the suite keeps beta 0.2 and no
# reference KL). Without a reference KL the student collapsed onto the example's door within
# 10-40 steps (batch entropy 1.05 -> 0.1, every group all-win or all-failure) on 4 of 5 seed
# streams, so the teacher, which fires only on a group with a win, had nothing left to act on.
# A reference KL of 0.1 keeps the student exploring; beta 0.5 then lets the teacher win the
# race against GRPO alone (seed 1: held-out 0.656 at step 40 against rised_no_teacher's 0.188
# through step 80; docs/rised.md, "Mechanism suite").
TEACHER_STEP = {"ref_kl_coef": 0.1, "beta": 0.5}


def get_config(arg: str | None = None):
  args = config_args.parse_arg(arg, algorithm="rised",
                               setting=config_args.OneOf("teacher", "guidance", "suite"))
  c = config_lib.default_config()
  c.algorithm = args.algorithm
  c.model.source = "runs/doors_model"   # python -m rised_jax.warmstart ... --game doors
  c.envs.names = SETTINGS[args.setting]
  c.envs.aliases = {name: doors.PATH for name in c.envs.names}
  c.envs.difficulty = {name: doors.SUITE_GAMES[name] for name in c.envs.names}
  c.judge.vocabulary = "rised_jax.envs.doors:VOCABULARY"
  c.rollout.reply_prefix = "<answer>"   # as in the warm-start's prompts
  c.rollout.group_size = mechanisms.GROUP_SIZE
  c.rollout.max_new_tokens_per_turn = 1
  c.rollout.max_total_tokens = 192
  c.rollout.max_batch = 256
  c.rollout.prompt_buckets = [192]
  c.rollout.new_token_buckets = [8]
  c.select.pool_groups = 32   # K = 4B, as every RISED config
  c.select.batch_groups = 8
  c.teacher.options = dict(sources=("group",))
  c.guidance.options = dict(rate=0.3, threshold=mechanisms.GUIDANCE_THRESHOLD, top_m=2)
  c.step.beta = 0.2   # at 1.0 the student went near-deterministic in 5 steps (entropy 0.17), which ended its exploration
  # The warm-started weights teach: with the live teacher (the policy's own weights under the
  # teacher prompt) RL on the student prompts wore away the copying within 12 steps (teacher
  # valid-action mass 0.97 -> 0.02) and the student followed it onto "/".
  c.step.teacher = "frozen"
  c.step.chunk = 128
  c.batching.prefix_multiple = 64
  c.batching.response_multiple = 64
  c.optim.learning_rate = 3e-3
  if args.setting == "teacher":
    c.step.update(TEACHER_STEP)   # apply_preset zeroes beta where the teacher is off
  c.train.steps = 60
  c.train.checkpoint_every = c.train.steps   # a checkpoint costs more than a step here
  c.eval.episodes_per_env = mechanisms.HELD_OUT
  c.eval.seed_offset = mechanisms.SEED_OFFSET
  return config_lib.apply_preset(c)
