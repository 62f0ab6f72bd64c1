"""Experiment configuration: ml_collections defaults, algorithm presets, and validation.

An experiment file (experiments/configs/*.py) has `get_config(arg)` returning the ConfigDict of
`default_config()` with its own values, then `apply_preset(config)` composes the stages of the
named algorithm; a command-line `--config.algorithm=NAME` comes after that, so `main` calls
`reapply_preset`. `validate(config, stage_checks)` checks every key and value with an error
naming the key, the value and what is expected; the stage checks come from the caller
(`pipelines.validate`), so this module imports no stage. It runs once, in `trainer.build`
before the model loads (and alone under `--dry_run`). The typed pieces (StepConfig, OptimizerConfig) come from it.
The other stages' typed configs are built at one boundary, `pipelines.stages.stage_configs`.

Algorithms are configs composing stages, not branches in the trainer:

  preset             selector          teacher  guidance  step
  rised              rised (matching)   on       on        GRPO seq-mean-token-mean
  rised_no_select    random-from-pool   on       on
  rised_no_teacher   rised              off      on
  rised_no_guidance  rised              on       off
  grpo               uniform            off      off
  dapo               dapo filter        off      off       token-mean, ε_high 0.28, μ = 4
  variance           reward-variance    off      off
  env_curriculum     env-curriculum     off      off

Controls (docs/ALGORITHMS.md §2; what a reviewer asks of a RISED result):

  rised_select_success   success_rate       on       on        selection by success rate alone
  rised_generic_teacher  rised              generic  on        teacher without rubric content
  rised_hint_no_iw       rised              on       on        step.behaviour_weight=False: w_t = 1
  grpo_matched           uniform, B = K     off      off       GRPO on RISED's rollout budget
  rised_select_only      rised              off      off       RISED's selection alone: against
                                                               rised_no_teacher, guidance's effect
                                                               without a teacher

Rollouts per step: every preset rolls out select.pool_groups (K) groups of G, except grpo,
which rolls out B (its pool is its batch). grpo_matched rolls out K like RISED and trains on
all K (select.compute_matched): plain GRPO has no rule for dropping rollouts it paid for, and
a random B of the K is the `random` selector (rised_no_select without teacher and guidance).
Its step trains on K/B times more rows. Logs count the x-axis for budget plots:
progress/rollouts and progress/agent_tokens (cumulative).

The rubric pipeline (CriPO, ALGORITHMS.md §3) trains on every group of rubric tasks, GRPO on the
weighted criterion reward; its presets switch CriPO's two self-teachers:

  preset        UC branch (injection teacher, localised KL)   SC branch (counterfactual flips)
  cripo         on                                            on
  cripo_u       on                                            off
  cripo_s       off                                           on
  grpo_rubric   off                                           off   (plain rubric GRPO)
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, Sequence

import ml_collections

from rised_jax import parallel
from rised_jax.learn import batching, cripo, train_step
from rised_jax.checks import Rule, int_at_least, prefixed, typed
from rised_jax.model.settings import ModelLoadConfig
from rised_jax.train_settings import TrainConfig


def default_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.algorithm = "rised"
  c.pipeline = "agentic"                   # agentic (RISED, baselines) | rubric (CriPO)
  c.seed = 0

  c.model = ml_collections.ConfigDict()
  c.model.source = "smollm2-135m-instruct"   # HF dir, .gguf path, or packaged name
  # Master weights and Adam state (float32: a small update rounds away in bfloat16), and the
  # dtype of activations, matmuls, the sampler's and the exported weights (bfloat16 on
  # accelerators). See rised_jax/learn/precision.py.
  c.model.param_dtype = "float32"
  c.model.compute_dtype = "float32"
  c.model.remat = False
  c.model.scan_layers = False   # stacked layers under one lax.scan (compile time flat in depth)

  c.envs = ml_collections.ConfigDict()
  c.envs.names = ["sokoban", "frozenlake", "countdown", "maze"]
  c.envs.difficulty = ml_collections.ConfigDict()   # per env name: {knob: value}
  c.envs.max_turns = 0                               # 0: each environment's own
  # The reward bound: a step reward with |r| above it, or not finite in float32, is an
  # environment error (its group is dropped and counted in rollout/env_errors).
  c.envs.max_abs_reward = 1e6
  # name -> "package.module:Class": plug-ins under short names (no dots), one class
  # under several names with their own difficulty (docs/environments.md).
  c.envs.aliases = ml_collections.ConfigDict()

  c.rollout = ml_collections.ConfigDict()
  c.rollout.engine = "jax"                 # jax | sglang
  c.rollout.sglang_url = "http://127.0.0.1:30000"
  c.rollout.sglang = ml_collections.ConfigDict()
  c.rollout.sglang.timeout_s = 600.0       # deadline of one HTTP request as a whole
  c.rollout.sglang.retries = 3             # retries of a failed or invalid request
  c.rollout.sglang.max_reply_bytes = 64 << 20   # largest reply read; a larger one fails its request
  # Where weight sync exports each version for the server to load: a directory on a filesystem
  # the SGLang host reads ("" = <workdir>/weights; needed when the workdir is a bucket URL).
  c.rollout.sglang.weight_dir = ""
  # How the server gets each step's weights: "disk" (export to weight_dir, then
  # /update_weights_from_disk; any server that reads that directory) or "tensor" (the tensors
  # in /update_weights_from_tensor request bodies; a server on the same node, no disk).
  c.rollout.sglang.weight_sync = "disk"
  c.rollout.sglang.tensor_bucket_bytes = 512 << 20   # most tensor bytes in one request body
  c.rollout.group_size = 4                 # G
  c.rollout.temperature = 1.0
  c.rollout.top_p = 1.0
  c.rollout.top_k = 0
  c.rollout.max_new_tokens_per_turn = 64
  c.rollout.max_total_tokens = 1024
  c.rollout.max_batch = 64
  # Forced text at the start of every reply (context, not trained on) and texts that end a
  # reply; e.g. "<answer>" and ["</answer>"] for a model too small to keep the answer format.
  c.rollout.reply_prefix = ""
  c.rollout.stop_strings = []
  # JaxEngine shape buckets: each (batch, prompt, new-token) bucket compiles once.
  c.rollout.batch_buckets = []           # [] = powers of two up to max_batch
  # JaxEngine keeps each call's KV caches (memory: one more set of caches between calls) so the
  # next turn prefills only what the environment added.
  c.rollout.reuse_prefix = False
  # JaxEngine decode steps per call (0: one call per turn). Between calls replies holding a
  # stop string end and finished rows leave the batch when the rest fit a smaller bucket.
  c.rollout.decode_chunk = 0
  # JaxEngine's dense-layer and head operands: "compute" (the compute dtype) or "bfloat16"
  # (float32 activations rounded per matmul, float32 sums): faster on CPUs with AMX or
  # AVX512-BF16, but the sampler's log-probs are then a rounding away from the trainer's
  # (rollout/logprob_diff 0.013 instead of 0 in the main job; docs/performance.md).
  c.rollout.matmul_operands = "compute"
  # Step t + 1's roll-out runs in a background thread while step t trains (one step stale; the
  # behaviour log-probs of the policy that sampled it feed the truncated importance weight).
  c.rollout.async_rollouts = False
  c.rollout.prompt_buckets = [256, 512, 1024, 2048, 4096]
  c.rollout.new_token_buckets = [32, 128, 512]

  c.judge = ml_collections.ConfigDict()
  c.judge.backend = "rules"                # rules | genai | openai | inprocess
  c.judge.vocabulary = ""                  # a JSON file; "" = the built-in agentic_v1
  c.judge.options = ml_collections.ConfigDict()   # backend options (model, base_url, …)
  c.judge.max_new_tokens = 256             # answer length of the in-process judge

  c.select = ml_collections.ConfigDict()
  c.select.name = "rised"
  c.select.pool_groups = 8                 # K candidate groups rolled out per step
  c.select.batch_groups = 4                # B groups trained on per step
  c.select.compute_matched = False         # uniform: roll out K and train on all K (grpo_matched)
  c.select.options = ml_collections.ConfigDict()   # selector-specific (λ, objective, memory…)

  c.advantage = "grpo"                     # grpo | drgrpo | rloo (learn/advantages.py)

  c.teacher = ml_collections.ConfigDict()
  c.teacher.enabled = True
  c.teacher.options = ml_collections.ConfigDict()  # teach.PositiveTeacher options
  c.guidance = ml_collections.ConfigDict()
  c.guidance.enabled = True
  c.guidance.train_with_hint = False       # §2.6: False trains on the hint-free prompt + IW
  c.guidance.options = ml_collections.ConfigDict(dict(rate=0.1, threshold=0.3, top_m=2))

  c.step = ml_collections.ConfigDict({
      k: v for k, v in train_step.StepConfig.from_keys({"beta": 0.05}).as_keys().items()
      if k not in STEP_KEYS_IN_TRAIN})
  c.optim = ml_collections.ConfigDict(dataclasses.asdict(train_step.OptimizerConfig()))
  c.batching = ml_collections.ConfigDict(dict(prefix_multiple=64, response_multiple=128,
                                              length_buckets=[], shared_prefix=False))

  c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1))

  c.train = ml_collections.ConfigDict()
  c.train.steps = 10
  c.train.eval_every = 0                   # 0: only before and after training
  c.train.checkpoint_every = 1
  c.train.keep_checkpoints = 2
  c.train.log_every = 1
  c.train.num_iterations = 1               # PPO passes over each rollout batch (GRPO's μ)
  c.train.mini_batches = 1                 # successive updates per pass, each on 1/M of the rows
  c.train.max_nonfinite_steps = 3          # consecutive skipped (non-finite) steps end the run
  c.train.wandb = False                    # also log the scalars to W&B (offline; wandb_log.py)
  # The MFU's denominator, FLOP/s of all devices; 0: the published peak of a listed device
  # kind, else the measured matmul rate (learn/flops.py).
  c.train.peak_flops_per_s = 0.0
  # JAX's persistent compilation cache: "auto" ($JAX_COMPILATION_CACHE_DIR if set, else
  # $RISED_JAX_CACHE/jax, default ~/.cache/rised_jax/jax), a directory, or "" for none.
  c.train.compilation_cache = "auto"
  # Steps [first, last) traced by jax.profiler into <workdir>/profile; [] for none.
  c.train.profile_steps = []

  c.eval = ml_collections.ConfigDict()
  c.eval.episodes_per_env = 16
  c.eval.seed_offset = 1_000_000           # held-out seeds: never used for training tasks
  c.eval.temperature = 0.0
  c.eval.pass_at_k = 1                     # k > 1: pass@k of k sampled episodes (temperature > 0)

  # The rubric pipeline (pipelines/rubric.py); the agentic pipeline ignores these keys.
  c.rubric = ml_collections.ConfigDict()
  c.rubric.tasks = ""                      # a JSONL task file; "" = the built-in offline set
  c.rubric.eval_tasks = 32                 # held-out tasks (a seeded subset), never trained on
  c.rubric.split_seed = 0                  # the held-out subset does not depend on c.seed
  c.rubric.eval_groups = ml_collections.ConfigDict(dict(   # evaluation group -> task domains
      science=["physics", "chemistry", "biology", "earth science", "astronomy"],
      medicine=["medicine"]))
  c.rubric.system_prompt = ("You are a knowledgeable assistant. Answer the question accurately "
                            "and concisely, in the format and length it asks for.")
  c.rubric.max_new_tokens = 256            # answer length
  c.rubric.strip_thinking = True           # judge and teachers see the answer after </think>
  c.rubric.uc_branch = True                # CriPO's criterion-injection teacher (needs step.beta)
  c.rubric.sc_branch = True                # CriPO's counterfactual teacher (step.counterfactual)
  c.rubric.injection_template = ""         # "" = teach/cripo_templates/injection.jinja
  c.rubric.counterfactual_template = ""    # "" = teach/cripo_templates/counterfactual.jinja
  c.rubric.cripo = ml_collections.ConfigDict(dataclasses.asdict(cripo.CriPOGroupConfig()))
  c.rubric.judge = ml_collections.ConfigDict()
  c.rubric.judge.backend = "checker"       # checker | genai | openai | inprocess
  c.rubric.judge.options = ml_collections.ConfigDict()   # rubrics.criteria options
  c.rubric.judge.max_new_tokens = 64       # answer length of the in-process judge
  return c


PRESETS: dict[str, dict[str, Any]] = {
    "rised": {"select.name": "rised", "teacher.enabled": True, "guidance.enabled": True},
    "rised_no_select": {"select.name": "random", "teacher.enabled": True, "guidance.enabled": True},
    "rised_no_teacher": {"select.name": "rised", "teacher.enabled": False,
                         "guidance.enabled": True},
    "rised_no_guidance": {"select.name": "rised", "teacher.enabled": True,
                          "guidance.enabled": False},
    "grpo": {"select.name": "uniform", "teacher.enabled": False, "guidance.enabled": False},
    "dapo": {"select.name": "dapo", "teacher.enabled": False, "guidance.enabled": False,
             "step.aggregation": "token-mean", "step.eps_high": 0.28,
             "train.num_iterations": 4},
    "variance": {"select.name": "variance", "teacher.enabled": False, "guidance.enabled": False},
    "env_curriculum": {"select.name": "env_curriculum", "teacher.enabled": False,
                       "guidance.enabled": False},
    # Controls (module docstring).
    "rised_select_success": {"select.name": "success_rate", "teacher.enabled": True,
                             "guidance.enabled": True},
    "rised_generic_teacher": {"select.name": "rised", "teacher.enabled": True,
                              "teacher.options.context": "generic", "guidance.enabled": True},
    "rised_hint_no_iw": {"select.name": "rised", "teacher.enabled": True,
                         "guidance.enabled": True, "step.behaviour_weight": False},
    "grpo_matched": {"select.name": "uniform", "select.compute_matched": True,
                     "teacher.enabled": False, "guidance.enabled": False},
    "rised_select_only": {"select.name": "rised", "teacher.enabled": False,
                          "guidance.enabled": False},
}

# CriPO's stated settings (docs/ALGORITHMS.md §3); step.beta keeps the config's value (paper:
# 0.05 for Qwen3-1.7B, 0.03 for 4B) and `teacher.enabled: False` sets it to 0 in `apply_preset`.
_RUBRIC = {"pipeline": "rubric", "select.name": "uniform", "guidance.enabled": False,
           "advantage": "grpo"}
_UC_ON = {"rubric.uc_branch": True, "teacher.enabled": True, "step.divergence": "forward-kl",
          "step.clamp": 10.0, "step.localize": True, "step.localize_gamma": 0.95,
          "step.localize_edge_frac": 0.01, "step.distill_norm": "kept-tokens",
          "step.beta_warmup_steps": 50}
_UC_OFF = {"rubric.uc_branch": False, "teacher.enabled": False, "step.localize": False}
_SC_ON = {"rubric.sc_branch": True, "step.counterfactual": True, "step.flip_alpha": 0.1,
          "step.flip_tau": 0.1}
_SC_OFF = {"rubric.sc_branch": False, "step.counterfactual": False}
PRESETS.update({
    "cripo": {**_RUBRIC, **_UC_ON, **_SC_ON},
    "cripo_u": {**_RUBRIC, **_UC_ON, **_SC_OFF},
    "cripo_s": {**_RUBRIC, **_UC_OFF, **_SC_ON},
    "grpo_rubric": {**_RUBRIC, **_UC_OFF, **_SC_OFF},
})


def _parent(config: ml_collections.ConfigDict, dotted: str) -> tuple[Any, str]:
  """The node holding the dotted key, and the key's last part."""
  *parents, leaf = dotted.split(".")
  node = config
  for name in parents:
    node = node[name]
  return node, leaf


def _set(config: ml_collections.ConfigDict, dotted: str, value: Any) -> None:
  node, leaf = _parent(config, dotted)
  node[leaf] = value


def _get(config: ml_collections.ConfigDict, dotted: str) -> Any:
  node, leaf = _parent(config, dotted)
  return node[leaf]


def apply_preset(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Sets the stage choices of `config.algorithm` (see the module docstring)."""
  if config.algorithm not in PRESETS:
    raise ValueError(f"config.algorithm={config.algorithm!r}: expected one of {sorted(PRESETS)}")
  for dotted, value in PRESETS[config.algorithm].items():
    _set(config, dotted, value)
  if not config.teacher.enabled:
    config.step.beta = 0.0
  if config.select.name == "uniform":   # plain GRPO trains on every group it rolls out
    if config.select.compute_matched:    # ... of RISED's pool size K
      config.select.batch_groups = config.select.pool_groups
    else:
      config.select.pool_groups = config.select.batch_groups
  return config


def reapply_preset(config: ml_collections.ConfigDict,
                   overrides: dict[str, Any]) -> ml_collections.ConfigDict:
  """The command line's `--config.algorithm=NAME`: the config file applied its own preset before
  the overrides, so apply NAME's preset now, then the other overrides again (an explicit
  override of a preset key wins).

  A preset without selection rolled out only `batch_groups` groups, so its `pool_groups` is no
  candidate pool for a selecting one: that switch needs `--config.select.pool_groups` (or the
  algorithm in the config file's argument). A teacher switched on without a distillation weight
  is `validate`'s error.
  """
  was_uniform = config.select.pool_groups == config.select.batch_groups
  apply_preset(config)
  for dotted, value in overrides.items():
    if dotted != "algorithm":
      _set(config, dotted, value)
  if (was_uniform and config.select.name != "uniform" and config.pipeline == "agentic"
      and "select.pool_groups" not in overrides):
    raise ValueError(
        f"--config.algorithm={config.algorithm}: the config file's preset rolled out "
        f"select.pool_groups = select.batch_groups = {config.select.batch_groups} groups, so "
        f"selector {config.select.name!r} would have no pool to choose from; give "
        "--config.select.pool_groups=K, or name the algorithm in the config file's argument "
        "(--config FILE.py:ALGORITHM)")
  return config


def describe(config: ml_collections.ConfigDict) -> str:
  """The stages a (validated) config composes, one line each, for `--dry_run`."""
  def on(flag: bool, options: dict[str, Any]) -> str:
    return ("on " + str(options) if options else "on") if flag else "off"

  def fields(obj) -> str:
    return " ".join(f"{f.name}={getattr(obj, f.name)}" for f in dataclasses.fields(obj))

  def keys(settings: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in settings.items())

  rubric = config.pipeline == "rubric"
  lines = [
      f"algorithm  {config.algorithm}",
      f"pipeline   {config.pipeline}: " + (
          f"rubric tasks {config.rubric.tasks or '(built-in)'}" if rubric
          else f"environments {', '.join(config.envs.names)}")
      + f"; G={config.rollout.group_size} rollouts per task, engine {config.rollout.engine}",
      f"selector   {config.select.name}: K={config.select.pool_groups} groups rolled out, "
      f"B={config.select.batch_groups} trained on; options {config.select.options.to_dict()}",
  ]
  if rubric:
    lines += [f"teacher    UC branch (criterion injection) {on(config.rubric.uc_branch, {})}",
              f"           SC branch (counterfactual flips) {on(config.rubric.sc_branch, {})}",
              f"judge      {config.rubric.judge.backend} {config.rubric.judge.options.to_dict()}"]
  else:
    lines += [f"teacher    {on(config.teacher.enabled, config.teacher.options.to_dict())}",
              f"guidance   {on(config.guidance.enabled, config.guidance.options.to_dict())}",
              f"judge      {config.judge.backend} {config.judge.options.to_dict()}, vocabulary "
              f"{config.judge.vocabulary or 'agentic_v1'}"]
  lines += [f"advantage  {config.advantage}",
            f"step       {keys(step_config(config).as_keys())}",
            f"optimizer  {fields(optimizer_config(config))}",
            f"mesh       {config.mesh.to_dict()} (checked against the devices at start-up)"]
  return "\n".join(lines)


# StepConfig fields set under config.train: how many updates a rollout batch gets is a training
# schedule choice, not a loss setting.
STEP_KEYS_IN_TRAIN = ("num_iterations", "mini_batches")


def step_config(config: ml_collections.ConfigDict) -> train_step.StepConfig:
  """`config.step` keys (and the schedule's under `config.train`) as the typed step config
  (`train_step.StepConfig.from_keys`: each key goes to the config that owns it)."""
  try:
    cfg = train_step.StepConfig.from_keys(config.step.to_dict())
  except (TypeError, ValueError) as e:
    raise ValueError(prefixed("config.step", str(e))) from e
  schedule = {k: config.train[k] for k in STEP_KEYS_IN_TRAIN}
  try:
    return dataclasses.replace(cfg, **schedule)
  except (TypeError, ValueError) as e:
    raise ValueError(f"config.train ({schedule}): {e}") from e


def optimizer_config(config: ml_collections.ConfigDict) -> train_step.OptimizerConfig:
  cfg = typed(train_step.OptimizerConfig, config.optim, "config.optim")
  return dataclasses.replace(cfg, total_steps=max(cfg.total_steps, config.train.steps))


StageCheck = Callable[[ml_collections.ConfigDict], None]


def validate(config: ml_collections.ConfigDict, stage_checks: Sequence[StageCheck],
             num_devices: int | None = None) -> None:
  """Every check that can fail before loading or compiling anything.

  The config's own checks (keys, the run-wide keys' values, the typed model, mesh, batching,
  step and optimiser sections) come first, then each of `stage_checks`: each stage's typed
  config owns the checks of its section, and this module imports no stage;
  `pipelines.validate` passes them (`pipelines.stages`).
  `num_devices` (known once JAX is initialised) also checks that the mesh fits the devices;
  without it only the mesh's own shape is checked (a dry run on another machine).
  """
  from rised_jax.learn import advantages  # noqa: PLC0415 - keeps `config` light to import

  _check_replaced_keys(config)
  _check_known_keys(config, default_config())
  _check_values(config)
  ModelLoadConfig.from_config(config.model).check()
  parallel.MeshShape.from_config(config.mesh).check(num_devices)
  batching_config = batching.BatchingConfig.from_config(config.batching)
  batching_config.check()
  step = step_config(config)
  splits, what = step.micro_batches * step.mini_batches, "step.micro_batches × train.mini_batches"
  if num_devices is not None:   # each data shard holds whole groups
    data, fsdp, _ = parallel.MeshShape.from_config(config.mesh).resolve(num_devices)
    splits, what = splits * data * fsdp, f"{what} × mesh data × fsdp"
  if batching_config.shared_prefix and config.select.batch_groups % splits:
    raise ValueError(
        f"config.batching.shared_prefix=True splits a batch by group, but "
        f"config.select.batch_groups={config.select.batch_groups} is not divisible by "
        f"{what} = {splits}: set batch_groups to a multiple of it, or shared_prefix=False")
  optimizer_config(config)
  advantages.ADVANTAGES.lookup(config.advantage)
  for check in stage_checks:
    check(config)


# ----------------------------------------------------------------------------- value checks
# Each error names the key, the value and what is expected.


def _check_replaced_keys(config: ml_collections.ConfigDict) -> None:
  """`model.dtype` set both the master-weight and the compute dtype; it is refused by name (a
  silent alias would keep bfloat16 master weights, whose updates round away)."""
  if "model" in config and "dtype" in config.model:
    raise ValueError(
        f"config.model.dtype={config.model.dtype!r}: this key was replaced by "
        "config.model.compute_dtype (activations, matmuls, the sampler's and the exported "
        "weights) and config.model.param_dtype (master weights and Adam state, default "
        "float32); for a bfloat16 run set model.compute_dtype='bfloat16' and keep "
        "model.param_dtype='float32'")


# Subtrees whose keys are free-form (checked by the stage that reads them).
_FREE_FORM = ("envs.difficulty", "envs.aliases", "rubric.eval_groups")
_SET_BY_TRAINER = ("workdir",)


def _check_known_keys(config: ml_collections.ConfigDict, reference: ml_collections.ConfigDict,
                      prefix: str = "") -> None:
  """No key that `default_config` lacks (a typo on the command line would be ignored)."""
  for key in config.keys():
    dotted = prefix + key
    if key not in reference:
      if dotted in _SET_BY_TRAINER:
        continue
      close = difflib.get_close_matches(key, list(reference.keys()), n=1)
      hint = f"; did you mean {prefix + close[0]!r}?" if close else ""
      raise ValueError(f"config.{dotted}={config[key]!r}: unknown key{hint} (known keys of "
                       f"config{'.' + prefix[:-1] if prefix else ''}: {sorted(reference.keys())})")
    sub, ref = config[key], reference[key]
    if (isinstance(sub, ml_collections.ConfigDict) and isinstance(ref, ml_collections.ConfigDict)
        and key != "options" and dotted not in _FREE_FORM):
      _check_known_keys(sub, ref, dotted + ".")


# key: (predicate, what is expected). The keys of the run as a whole; each stage's typed config
# holds the rules of its own section (`pipelines.stages`).
VALUE_RULES: dict[str, Rule] = {
    "seed": int_at_least(0),
}


def _check_values(config: ml_collections.ConfigDict) -> None:
  for key, (ok, expected) in VALUE_RULES.items():
    value = _get(config, key)
    if not ok(value):
      raise ValueError(f"config.{key}={value!r}: expected {expected}")
  TrainConfig.from_config(config.train).check()
  if config.algorithm not in PRESETS:
    raise ValueError(f"config.algorithm={config.algorithm!r}: expected one of {sorted(PRESETS)}")
