"""Experiment configuration: ml_collections defaults, algorithm presets, and validation.

An experiment file (experiments/configs/*.py) has `get_config(arg)` returning the ConfigDict of
`default_config()` with its own values, then `apply_preset(config)` composes the stages of the
named algorithm. `validate(config)` checks every key and value with a clear error before
anything is loaded or compiled; the typed pieces (StepConfig, OptimizerConfig) come from it.

Algorithms are configs composing stages, not branches in the trainer:

  preset             selector          teacher  guidance  step
  rised              rised (MMR)        on       on        GRPO seq-mean-token-mean
  rised_no_select    random-from-pool   on       on
  rised_no_teacher   rised              off      on
  rised_no_guidance  rised              on       off
  grpo               uniform            off      off
  dapo               dapo filter        off      off       token-mean, ε_high 0.28
  variance           reward-variance    off      off
  env_curriculum     env-curriculum     off      off

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
from typing import Any

import ml_collections

from rised_jax.learn import cripo, train_step


def default_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.algorithm = "rised"
  c.pipeline = "agentic"                   # agentic (RISED, baselines) | rubric (CriPO)
  c.seed = 0

  c.model = ml_collections.ConfigDict()
  c.model.source = "smollm2-135m-instruct"   # HF dir, .gguf path, or packaged name
  c.model.dtype = "float32"
  c.model.remat = False

  c.envs = ml_collections.ConfigDict()
  c.envs.names = ["sokoban", "frozenlake", "countdown", "maze"]
  c.envs.difficulty = ml_collections.ConfigDict()   # per env name: {knob: value}
  c.envs.max_turns = 0                               # 0: each environment's own

  c.rollout = ml_collections.ConfigDict()
  c.rollout.engine = "jax"                 # jax | sglang
  c.rollout.sglang_url = "http://127.0.0.1:30000"
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
  c.select.options = ml_collections.ConfigDict()   # selector-specific (λ, objective, memory…)

  c.advantage = "grpo"                     # grpo | drgrpo | rloo (learn/advantages.py)

  c.teacher = ml_collections.ConfigDict()
  c.teacher.enabled = True
  c.teacher.options = ml_collections.ConfigDict()  # teach.PositiveTeacher options
  c.guidance = ml_collections.ConfigDict()
  c.guidance.enabled = True
  c.guidance.train_with_hint = False       # §2.6: False trains on the hint-free prompt + IW
  c.guidance.options = ml_collections.ConfigDict(dict(rate=0.1, threshold=0.3, top_m=2))

  c.step = ml_collections.ConfigDict(dataclasses.asdict(train_step.StepConfig(beta=0.05)))
  c.optim = ml_collections.ConfigDict(dataclasses.asdict(train_step.OptimizerConfig()))
  c.batching = ml_collections.ConfigDict(dict(prefix_multiple=64, response_multiple=128))

  c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1))

  c.train = ml_collections.ConfigDict()
  c.train.steps = 10
  c.train.eval_every = 0                   # 0: only before and after training
  c.train.checkpoint_every = 1
  c.train.keep_checkpoints = 2
  c.train.log_every = 1
  c.train.max_nonfinite_steps = 3          # consecutive skipped (non-finite) steps end the run

  c.eval = ml_collections.ConfigDict()
  c.eval.episodes_per_env = 16
  c.eval.seed_offset = 1_000_000           # held-out seeds: never used for training tasks
  c.eval.temperature = 0.0

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
             "step.aggregation": "token-mean", "step.eps_high": 0.28},
    "variance": {"select.name": "variance", "teacher.enabled": False, "guidance.enabled": False},
    "env_curriculum": {"select.name": "env_curriculum", "teacher.enabled": False,
                       "guidance.enabled": False},
}

# CriPO's stated settings (ALGORITHMS.md §3); step.beta keeps the config's value (paper: 0.05 for
# Qwen3-1.7B, 0.03 for 4B) and `teacher.enabled: False` sets it to 0 in `apply_preset`.
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


def _set(config: ml_collections.ConfigDict, dotted: str, value: Any) -> None:
  *parents, leaf = dotted.split(".")
  node = config
  for name in parents:
    node = node[name]
  node[leaf] = value


def apply_preset(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Sets the stage choices of `config.algorithm` (see the module docstring)."""
  if config.algorithm not in PRESETS:
    raise ValueError(f"config.algorithm={config.algorithm!r}: expected one of {sorted(PRESETS)}")
  for dotted, value in PRESETS[config.algorithm].items():
    _set(config, dotted, value)
  if not config.teacher.enabled:
    config.step.beta = 0.0
  if config.select.name == "uniform":   # plain GRPO trains on every group it rolls out
    config.select.pool_groups = config.select.batch_groups
  return config


def step_config(config: ml_collections.ConfigDict) -> train_step.StepConfig:
  return _typed(train_step.StepConfig, config.step, "config.step")


def optimizer_config(config: ml_collections.ConfigDict) -> train_step.OptimizerConfig:
  cfg = _typed(train_step.OptimizerConfig, config.optim, "config.optim")
  return dataclasses.replace(cfg, total_steps=max(cfg.total_steps, config.train.steps))


def _typed(cls, node: ml_collections.ConfigDict, where: str):
  known = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(node.keys()) - known)
  if unknown:
    raise ValueError(f"{where} has unknown keys {unknown}; known: {sorted(known)}")
  try:
    return cls(**node.to_dict())
  except (TypeError, ValueError) as e:
    raise ValueError(f"{where}: {e}") from e


def validate(config: ml_collections.ConfigDict) -> None:
  """Every check that can fail before loading or compiling anything."""
  from rised_jax import envs  # noqa: PLC0415 - keeps `config` importable without the envs

  step_config(config)
  optimizer_config(config)
  unknown = [n for n in config.envs.names if n not in envs.names()]
  if unknown or not config.envs.names:
    raise ValueError(f"config.envs.names={list(config.envs.names)}: unknown {unknown}; "
                     f"available {envs.names()}")
  for name, knobs in config.envs.difficulty.items():
    if name not in config.envs.names:
      raise ValueError(f"config.envs.difficulty.{name}: {name!r} is not in config.envs.names")
    bad = sorted(set(knobs.keys()) - set(envs.difficulty_keys(name)))
    if bad:
      raise ValueError(f"config.envs.difficulty.{name} has unknown knobs {bad}; "
                       f"{name} takes {envs.difficulty_keys(name)}")
  from rised_jax import pipelines  # noqa: PLC0415
  if config.pipeline not in pipelines.PIPELINES:
    raise ValueError(f"config.pipeline={config.pipeline!r}: expected one of {pipelines.PIPELINES}")
  if config.rollout.engine not in ("jax", "sglang"):
    raise ValueError(f"config.rollout.engine={config.rollout.engine!r}: expected 'jax' or 'sglang'")
  if not isinstance(config.rollout.reply_prefix, str):
    raise ValueError(f"config.rollout.reply_prefix={config.rollout.reply_prefix!r}: expected a "
                     "string")
  stops = config.rollout.stop_strings
  if isinstance(stops, str) or not all(isinstance(x, str) and x for x in stops):
    raise ValueError(f"config.rollout.stop_strings={stops!r}: expected a list of non-empty "
                     "strings")
  if config.rollout.group_size < 2:
    raise ValueError(f"config.rollout.group_size={config.rollout.group_size}: group advantages "
                     "need at least 2 rollouts per task")
  if config.select.batch_groups > config.select.pool_groups:
    raise ValueError(f"config.select.batch_groups={config.select.batch_groups} exceeds "
                     f"config.select.pool_groups={config.select.pool_groups}")
  limit = config.train.max_nonfinite_steps
  if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
    raise ValueError(f"config.train.max_nonfinite_steps={limit!r}: expected an int >= 1 (the "
                     "number of consecutive non-finite steps after which the run stops)")
  if config.train.steps < 0 or config.eval.episodes_per_env < 1:
    raise ValueError("config.train.steps must be >= 0 and config.eval.episodes_per_env >= 1")
  from rised_jax.learn import advantages  # noqa: PLC0415
  if config.advantage not in advantages.ADVANTAGES:
    raise ValueError(f"config.advantage={config.advantage!r}: expected one of "
                     f"{sorted(advantages.ADVANTAGES)}")
  if config.model.dtype not in ("float32", "bfloat16"):
    raise ValueError(f"config.model.dtype={config.model.dtype!r}: expected float32 or bfloat16")
  if config.pipeline == "rubric":
    _validate_rubric(config)


def _validate_rubric(config: ml_collections.ConfigDict) -> None:
  """The rubric pipeline's keys: task file, split, branches vs step settings, judge, templates."""
  from rised_jax.pipelines import rubric  # noqa: PLC0415 - keeps `config` light to import
  from rised_jax.rubrics import criteria  # noqa: PLC0415
  from rised_jax.teach import cripo_prefix  # noqa: PLC0415

  rc = config.rubric
  if config.advantage != "grpo":
    raise ValueError(f"config.advantage={config.advantage!r}: the rubric pipeline uses GRPO "
                     "advantages (CriPO's SC rule is defined on them); expected 'grpo'")
  if config.select.name != "uniform" or config.select.pool_groups != config.select.batch_groups:
    raise ValueError(f"config.select.name={config.select.name!r} with pool_groups="
                     f"{config.select.pool_groups}, batch_groups={config.select.batch_groups}: "
                     "the rubric pipeline trains on every group it rolls out; expected 'uniform' "
                     "and pool_groups == batch_groups (the cripo* and grpo_rubric presets set "
                     "them)")
  step = step_config(config)
  if rc.uc_branch != step.distills:
    raise ValueError(f"config.rubric.uc_branch={rc.uc_branch} but config.step.beta={step.beta}: "
                     "the injection teacher is the only distillation of the rubric pipeline, so "
                     "the UC branch needs beta > 0 and beta must be 0 without it (use the presets "
                     "cripo, cripo_u, cripo_s, grpo_rubric)")
  if rc.sc_branch != step.counterfactual:
    raise ValueError(f"config.rubric.sc_branch={rc.sc_branch} but config.step.counterfactual="
                     f"{step.counterfactual}: the SC branch and the step's counterfactual flips go "
                     "together (use the presets cripo, cripo_u, cripo_s, grpo_rubric)")
  _typed(cripo.CriPOGroupConfig, rc.cripo, "config.rubric.cripo")
  task_set = rubric.load_task_set(rc.tasks)
  rubric.split_tasks(len(task_set), rc.eval_tasks, rc.split_seed)
  rubric.check_normalizer(task_set, rc.cripo.reward_normalizer)
  rubric.eval_group_of(rc.eval_groups.to_dict())
  for key in ("injection_template", "counterfactual_template"):
    if rc[key]:
      cripo_prefix.load_template(rc[key])
  for key, value in (("max_new_tokens", rc.max_new_tokens),
                     ("judge.max_new_tokens", rc.judge.max_new_tokens)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"config.rubric.{key}={value!r}: expected an integer >= 1")
  if config.rollout.engine == "jax" and rc.max_new_tokens > max(config.rollout.new_token_buckets):
    raise ValueError(f"config.rubric.max_new_tokens={rc.max_new_tokens} is above the largest "
                     "config.rollout.new_token_buckets entry "
                     f"{max(config.rollout.new_token_buckets)}")
  try:
    criteria.check_options(rc.judge.backend, rc.judge.options.to_dict(),
                           supplied=("generate_text",) if rc.judge.backend == "inprocess" else ())
  except ValueError as e:
    raise ValueError(f"config.rubric.judge: {e}") from None
