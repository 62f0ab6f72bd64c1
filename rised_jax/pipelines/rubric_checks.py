"""The rubric pipeline's config checks (`pipelines.validate`, so `rised-train --dry_run` too):
the task file and its split, the branches against the step's settings, the judge, the teacher
templates and the answer length against the engine's limits (the selector's and the engine's
own checks run for every pipeline: `stages.check_common`).
"""
from __future__ import annotations

import numpy as np

from rised_jax import config as config_lib
from rised_jax import rubric_tasks
from rised_jax.checks import is_int, named
from rised_jax.learn import cripo
from rised_jax.pipelines.criteria_prompts import check_answer_fits
from rised_jax.pipelines import stages
from rised_jax.rubric_tasks.split import eval_group_of, load_task_set, split_tasks
from rised_jax.rubrics import criteria as criteria_lib
from rised_jax.rubrics.engine_text import supplied_options
from rised_jax.teach import cripo_prefix


def check_normalizer(task_set: rubric_tasks.RubricTaskSet, normalizer: str) -> None:
  """Every task must have a positive reward normaliser Z (see `cripo.weighted_rewards`)."""
  for task in task_set.tasks:
    try:
      cripo.weighted_rewards(np.zeros((1, 1, len(task.criteria))), task.weights[None], None,
                             normalizer)
    except ValueError as e:
      raise ValueError(f"rubric task {task.id!r} of {task_set.name!r} "
                       f"(config.rubric.cripo.reward_normalizer): {e}") from None


def check_config(config) -> None:
  """The rubric pipeline's keys: task file, split, branches vs step settings, judge, templates,
  answer length against the engine's limits."""
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
  step = config_lib.step_config(config)
  if rc.uc_branch != step.distills:
    raise ValueError(f"config.rubric.uc_branch={rc.uc_branch} but config.step.beta={step.teacher_kl.beta}: "
                     "the injection teacher is the only distillation of the rubric pipeline, so "
                     "the UC branch needs beta > 0 and beta must be 0 without it (use the presets "
                     "cripo, cripo_u, cripo_s, grpo_rubric)")
  if rc.sc_branch != step.flips.counterfactual:
    raise ValueError(f"config.rubric.sc_branch={rc.sc_branch} but config.step.counterfactual="
                     f"{step.flips.counterfactual}: the SC branch and the step's counterfactual flips go "
                     "together (use the presets cripo, cripo_u, cripo_s, grpo_rubric)")
  group_config = config_lib.cripo_group_config(config)
  task_set = load_task_set(rc.tasks)
  split_tasks(len(task_set), rc.eval_tasks, rc.split_seed)
  check_normalizer(task_set, group_config.reward_normalizer)
  eval_group_of(rc.eval_groups.to_dict())
  for key in ("injection_template", "counterfactual_template"):
    if rc[key]:
      cripo_prefix.load_template(rc[key])
  for key, value in (("max_new_tokens", rc.max_new_tokens),
                     ("judge.max_new_tokens", rc.judge.max_new_tokens)):
    if not is_int(value) or value < 1:
      raise ValueError(f"config.rubric.{key}={value!r}: expected an integer >= 1")
  check_answer_fits(stages.stage_configs(config).rollout.limits(), rc.max_new_tokens)
  with named("config.rubric.judge"):
    criteria_lib.check_options(rc.judge.backend, rc.judge.options.to_dict(),
                               supplied=supplied_options(rc.judge.backend))
