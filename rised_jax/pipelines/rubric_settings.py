"""The rubric pipeline's typed config (`config.rubric`) and its checks (`pipelines.validate`, so
`rised-train --dry_run` too).

`RubricConfig.check()` owns the section's own keys: the task file and its split, the reward
normaliser against every task, the evaluation groups, the teacher templates, the answer lengths
and the criteria judge. `check_config` adds what ties the section to the others: GRPO
advantages, a selector that trains on every group, each branch with its step setting, and the
answer length against the engine's buckets (the selector's and the engine's own checks run for
every pipeline: `stages.check_common`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from rised_jax import rubric_tasks
from rised_jax.checks import Rule, check_rules, from_section, int_at_least, named, typed
from rised_jax.learn import cripo
from rised_jax.pipelines import stages
from rised_jax.pipelines.criteria_prompts import check_answer_fits
from rised_jax.rubric_tasks.split import eval_group_of, load_task_set, split_tasks
from rised_jax.rubrics import criteria as criteria_lib
from rised_jax.rubrics.engine_text import supplied_options
from rised_jax.teach import cripo_prefix

JUDGE_RULES: dict[str, Rule] = {"max_new_tokens": int_at_least(1)}
RULES: dict[str, Rule] = {"max_new_tokens": int_at_least(1)}


@dataclasses.dataclass(frozen=True)
class CriteriaJudgeConfig:
  """config.rubric.judge (docs/config.md): the criteria judge's backend, its options and the
  in-process judge's answer length."""

  backend: str
  options: Mapping[str, Any]
  max_new_tokens: int

  @classmethod
  def from_config(cls, section: Any) -> CriteriaJudgeConfig:
    return from_section(cls, section)

  def check(self) -> None:
    check_rules("config.rubric.judge", self, JUDGE_RULES)
    with named("config.rubric.judge"):
      criteria_lib.check_options(self.backend, dict(self.options),
                                 supplied=supplied_options(self.backend))


@dataclasses.dataclass(frozen=True)
class RubricConfig:
  """config.rubric (docs/config.md): the task set and its held-out split, the chat, CriPO's
  branches and templates, its group-level settings and the criteria judge."""

  tasks: str
  eval_tasks: int
  split_seed: int
  eval_groups: Mapping[str, Any]
  system_prompt: str
  max_new_tokens: int
  strip_thinking: bool
  uc_branch: bool
  sc_branch: bool
  injection_template: str
  counterfactual_template: str
  cripo: cripo.CriPOGroupConfig
  judge: CriteriaJudgeConfig

  @classmethod
  def from_config(cls, section: Any) -> RubricConfig:
    """The typed section; `cripo` is checked as it is built (`CriPOGroupConfig`)."""
    return from_section(cls, section, judge=CriteriaJudgeConfig.from_config(section.judge),
                        cripo=typed(cripo.CriPOGroupConfig, section.cripo, "config.rubric.cripo"))

  @property
  def injection_template_path(self) -> str:
    return self.injection_template or cripo_prefix.INJECTION_TEMPLATE

  @property
  def counterfactual_template_path(self) -> str:
    return self.counterfactual_template or cripo_prefix.COUNTERFACTUAL_TEMPLATE

  def check(self) -> None:
    """The section's own keys (module docstring); loads the task file and the templates."""
    check_rules("config.rubric", self, RULES)
    task_set = load_task_set(self.tasks)
    split_tasks(len(task_set), self.eval_tasks, self.split_seed)
    check_normalizer(task_set, self.cripo.reward_normalizer)
    eval_group_of(dict(self.eval_groups))
    for template in (self.injection_template, self.counterfactual_template):
      if template:
        cripo_prefix.load_template(template)
    self.judge.check()


def check_normalizer(task_set: rubric_tasks.RubricTaskSet, normalizer: str) -> None:
  """Every task must have a positive reward normaliser Z (see `cripo.weighted_rewards`)."""
  for task in task_set.tasks:
    try:
      cripo.weighted_rewards(np.zeros((1, 1, len(task.criteria))), task.weights[None], None,
                             normalizer)
    except ValueError as e:
      raise ValueError(f"rubric task {task.id!r} of {task_set.name!r} "
                       f"(config.rubric.cripo.reward_normalizer): {e}") from None


def rubric_configs(config: Any) -> tuple[stages.StageConfigs, RubricConfig]:
  """The rubric pipeline's boundary: the typed pieces of the stages it composes, and its own
  section's (no check runs here: `check_config`)."""
  return stages.stage_configs(config), RubricConfig.from_config(config.rubric)


def check_config(config: Any) -> None:
  """The rubric pipeline's check: its section's, then the checks across sections."""
  check_rubric(*rubric_configs(config))


def check_rubric(settings: stages.StageConfigs, rubric: RubricConfig) -> None:
  """config.rubric against config.advantage, config.select, config.step and the engine."""
  if settings.advantage != "grpo":
    raise ValueError(f"config.advantage={settings.advantage!r}: the rubric pipeline uses GRPO "
                     "advantages (CriPO's SC rule is defined on them); expected 'grpo'")
  select = settings.select
  if select.name != "uniform" or select.pool_groups != select.batch_groups:
    raise ValueError(f"config.select.name={select.name!r} with pool_groups={select.pool_groups}, "
                     f"batch_groups={select.batch_groups}: the rubric pipeline trains on every "
                     "group it rolls out; expected 'uniform' and pool_groups == batch_groups (the "
                     "cripo* and grpo_rubric presets set them)")
  step = settings.step
  if rubric.uc_branch != step.distills:
    raise ValueError(f"config.rubric.uc_branch={rubric.uc_branch} but config.step.beta="
                     f"{step.teacher_kl.beta}: the injection teacher is the only distillation of "
                     "the rubric pipeline, so the UC branch needs beta > 0 and beta must be 0 "
                     "without it (use the presets cripo, cripo_u, cripo_s, grpo_rubric)")
  if rubric.sc_branch != step.flips.counterfactual:
    raise ValueError(f"config.rubric.sc_branch={rubric.sc_branch} but config.step.counterfactual="
                     f"{step.flips.counterfactual}: the SC branch and the step's counterfactual "
                     "flips go together (use the presets cripo, cripo_u, cripo_s, grpo_rubric)")
  rubric.check()
  check_answer_fits(settings.rollout.limits(), rubric.max_new_tokens)
