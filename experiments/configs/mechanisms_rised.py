"""The RISED mechanism suite: one-move Doors games (rised_jax.envs.doors) in which the teacher,
the guidance and the selection each have something to act on, by construction.

  python -m rised_jax.warmstart runs/doors_model --game doors --steps 3000 --batch 32 \
      --avoid-share 0.25 --prior-share 0.3 --example-rate 0.9
  python -m rised_jax.mechanisms precheck --model runs/doors_model     # before any RL
  rised-train --config experiments/configs/mechanisms_rised.py:rised,teacher --workdir runs/m
  rised-compare --config experiments/configs/mechanisms_rised.py:setting=teacher \
      --workdir runs/mech_teacher --seeds 0,1,2,3,4,5,6 --jobs 2 --presets rised,rised_no_teacher
  rised-compare --config experiments/configs/mechanisms_rised.py:setting=suite \
      --workdir runs/mech_rised --seeds 0,1,2,3,4 --jobs 2 --presets \
      rised,rised_no_teacher,grpo,rised_no_guidance,rised_no_select,grpo_matched,rised_generic_teacher
  rised-compare --config experiments/configs/mechanisms_rised.py:setting=guidance \
      --workdir runs/mech_guidance --seeds 0,1,2,3,4,5,6 --jobs 2 \
      --presets rised_no_teacher,rised_select_only
  (docs/rised.md, "Mechanism suite", has what ran and the results.)

Argument (rised_jax.config_args): "PRESET[,SETTING]". SETTING:
  teacher   (default) `doors`: 4 doors, the note in the observation names the winning one.
            The warm-started student opens the system prompt's example door 9 times in 10,
            so off the example's door a rollout rarely wins and with G = 4 most groups are
            all-failure (the pre-check measures it). Every won rollout is tagged "Opens the
            door the note names", a rule true of every instance, so the teacher (the default
            chain: the group's, else the pool's, else the memory's positives) lists it for
            all-failure groups too; the warm-started model follows that line (the
            pre-check). 30 steps with its own step (TEACHER_STEP); the learning test's
            setting (tests/integration/test_mechanisms.py).
  guidance  `trapdoors`: 4 doors and the black one, which never wins and which the system
            prompt's example opens; its negative tag reads "Opens with black", so the hint
            is "Avoid: Opens with black." (threshold 0.1: the trap must be hinted while it
            is a recurring failure, not only once most rollouts take it).
  suite     both games: learned at different rates (the example's door wins a quarter of
            `doors` and none of `trapdoors`), so which groups a batch holds matters to the
            selection; the comparison's setting, 60 steps.
Held out: 32 of the 64 (door, size, shape) instances per game (instance keys disjoint from
training; the two games hold out the same notes, so neither trains on the other's held-out
notes). The best constant policy wins the commonest door's share of them
(`python -m rised_jax.mechanisms precheck` prints it).
Hardware: 1 CPU core, 20-40 s per run on a quiet 2-core machine (docs/rised.md, "Mechanism
suite", has the measured times).
"""
from rised_jax import config as config_lib
from rised_jax import config_args, mechanisms
from rised_jax.envs import doors

SETTINGS = {"teacher": ["doors"], "guidance": ["trapdoors"], "suite": ["doors", "trapdoors"]}
# The teacher setting's own step (the learning test's; the suite keeps beta 0.2 and no
# reference KL): a reference KL of 0.1 to the warm-started weights keeps the student from
# collapsing onto the example's door before the teacher has acted, and beta 0.5 weighs the
# teacher against GRPO (docs/rised.md, "Mechanism suite", has the trials behind both).
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
  c.guidance.options = dict(rate=0.3, threshold=mechanisms.GUIDANCE_THRESHOLD, top_m=2)
  # Both measured on the first suite (2026-12-02, per-door rubrics; docs/rised.md): at beta
  # 1.0 the student went near-deterministic in 5 steps (entropy 0.17), ending its exploration;
  # with the live teacher (the policy's own weights under the teacher prompt) RL on the
  # student prompts wore away the copying within 12 steps (teacher valid-action mass
  # 0.97 -> 0.02) and the student followed it onto "/". So the warm-started weights teach.
  c.step.beta = 0.2
  c.step.teacher = "frozen"
  c.step.chunk = 128
  c.batching.prefix_multiple = 64
  c.batching.response_multiple = 64
  c.optim.learning_rate = 3e-3
  c.train.steps = 60
  if args.setting == "teacher":
    c.step.update(TEACHER_STEP)   # apply_preset zeroes beta where the teacher is off
    # At step 30 RISED holds the rule on most seed streams and GRPO alone on none
    # (docs/rised.md): a longer run measures how soon GRPO catches up, not the teacher.
    c.train.steps = 30
    c.train.eval_every = 5
  c.train.checkpoint_every = c.train.steps   # a checkpoint costs more than a step here
  c.eval.episodes_per_env = mechanisms.HELD_OUT
  c.eval.seed_offset = mechanisms.SEED_OFFSET
  return config_lib.apply_preset(c)
