"""The one boundary between the `ml_collections` config and the stages.

`stage_configs(config)` builds every stage's typed, frozen config from its section once: the
stages never see the ConfigDict, each gets its own piece (the agent loop the rollout and
environment configs, the selector `config.select`'s, …). Each typed config lives with its stage
and owns the checks of its keys (`check()`, naming the full key: `config.rollout.top_p=2:
expected …`):

  section           typed config                            check
  config.envs       rised_jax.envs.settings.EnvsConfig        names, aliases, difficulty knobs
  config.rollout    rised_jax.rollout.settings.RolloutConfig  sampling, buckets, engine, SGLang
  config.judge      rised_jax.rubrics.settings.JudgeConfig    backend, options, vocabulary
  config.select     rised_jax.select.settings.SelectConfig    selector, options, K >= B
  config.teacher    rised_jax.teach.settings.TeacherConfig    PositiveTeacher options
  config.guidance   rised_jax.teach.settings.GuidanceConfig   GuidanceMemory options
  config.eval       rised_jax.evaluate.EvalConfig             instances, seeds, pass@k
  config.step       rised_jax.learn.train_step.StepConfig     (checked when built)
  config.train      rised_jax.train_settings.TrainConfig      steps, cadences, instruments
  config.model      rised_jax.model.settings.ModelLoadConfig  source, dtypes, remat, scan
  config.mesh       rised_jax.parallel.MeshShape              axis sizes (and the devices)
  config.batching   rised_jax.learn.batching.BatchingConfig   column multiples, width buckets

The last three are the run's own sections: `config.validate` checks them before any stage.

`check_common` (every pipeline) and `check_agentic` (the agentic pipeline's own stages) run
the checks through this boundary; `pipelines.validate` calls them, so `--dry_run` does too.
The checks that tie one section to another are here, under "Checks across sections".
"""
from __future__ import annotations

import dataclasses
from typing import Any

from rised_jax import config as config_lib
from rised_jax.envs.settings import EnvsConfig
from rised_jax.evaluate import EvalConfig
from rised_jax.learn.batching import BatchingConfig
from rised_jax.learn.train_step import StepConfig
from rised_jax.model.settings import ModelLoadConfig
from rised_jax.parallel import MeshShape
from rised_jax.rollout.settings import RolloutConfig
from rised_jax.rubrics.settings import JudgeConfig
from rised_jax.select.settings import SelectConfig
from rised_jax.teach.settings import GuidanceConfig, TeacherConfig
from rised_jax.train_settings import TrainConfig


@dataclasses.dataclass(frozen=True)
class StageConfigs:
  """Every stage's typed config, and the run-wide keys the stages take (`seed`, `advantage`)."""

  envs: EnvsConfig
  rollout: RolloutConfig
  judge: JudgeConfig
  select: SelectConfig
  teacher: TeacherConfig
  guidance: GuidanceConfig
  eval: EvalConfig
  step: StepConfig
  train: TrainConfig
  model: ModelLoadConfig
  mesh: MeshShape
  batching: BatchingConfig
  seed: int
  advantage: str


def stage_configs(config: Any) -> StageConfigs:
  """The typed pieces of `config` (no check runs here: `check_common`, `check_agentic`)."""
  return StageConfigs(
      envs=EnvsConfig.from_config(config.envs),
      rollout=RolloutConfig.from_config(config.rollout),
      judge=JudgeConfig.from_config(config.judge),
      select=SelectConfig.from_config(config.select),
      teacher=TeacherConfig.from_config(config.teacher),
      guidance=GuidanceConfig.from_config(config.guidance),
      eval=EvalConfig.from_config(config.eval),
      step=config_lib.step_config(config),
      train=TrainConfig.from_config(config.train),
      model=ModelLoadConfig.from_config(config.model), mesh=MeshShape.from_config(config.mesh),
      batching=BatchingConfig.from_config(config.batching),
      seed=config.seed, advantage=config.advantage)


def check_common(stages: StageConfigs) -> None:
  """The stages every pipeline composes (rollout, selection, evaluation sampling), then the
  checks across their sections."""
  stages.rollout.check()
  stages.select.check()
  stages.eval.check()
  check_behaviour_sampling(stages)
  check_async_rollouts(stages)


def check_agentic(stages: StageConfigs) -> None:
  """The agentic pipeline's own stages: tag judge, teacher and guidance, environments, and
  the agent loop's turns against the engine's buckets."""
  stages.judge.check()
  stages.teacher.check()
  stages.guidance.check()
  check_teacher_distills(stages)
  stages.envs.check()
  stages.rollout.check_agent_turns_fit()


# ----------------------------------------------------------------------- checks across sections

def check_behaviour_sampling(stages: StageConfigs) -> None:
  """config.rollout × config.step: the behaviour importance weight needs log-probs of the
  distribution that sampled. With a temperature other than 1 or top-p/top-k truncation the
  in-process engine reports the untempered, untruncated log-probs and SGLang the tempered ones,
  so the weight's behaviour policy would depend on the engine: refused (before the model
  loads)."""
  if not stages.step.policy_gradient.behaviour_weight:
    return
  rollout = stages.rollout
  changed = [f"config.rollout.{key}={getattr(rollout, key)!r}"
             for key, plain in (("temperature", 1.0), ("top_p", 1.0), ("top_k", 0))
             if getattr(rollout, key) != plain]
  if changed:
    raise ValueError(
        f"{', '.join(changed)} with config.step.behaviour_weight=True: the importance weight "
        "would use the engine's log-probs, untempered in-process and tempered in SGLang; "
        "expected rollout.temperature=1.0, rollout.top_p=1.0 and rollout.top_k=0, or "
        "step.behaviour_weight=False (no behaviour correction)")


def check_async_rollouts(stages: StageConfigs) -> None:
  """config.rollout × config.step: a roll-out one step stale needs the importance weight."""
  if stages.rollout.async_rollouts and not stages.step.policy_gradient.behaviour_weight:
    raise ValueError("config.rollout.async_rollouts=True with config.step.behaviour_weight="
                     "False: rollouts sampled by the previous step's policy need the truncated "
                     "importance weight against it; keep behaviour_weight=True")


def check_teacher_distills(stages: StageConfigs) -> None:
  """config.teacher × config.step (agentic): the teacher is trained on only through the
  distillation weight."""
  if stages.teacher.enabled != stages.step.distills:
    raise ValueError(
        f"config.teacher.enabled={stages.teacher.enabled} but config.step.beta="
        f"{stages.step.teacher_kl.beta}: the teacher is trained on only through the distillation weight, "
        "so expected beta > 0 with the teacher and beta = 0 without it (a config file built for "
        "a preset without the teacher has beta 0: give --config.step.beta, or name the "
        "algorithm in the config file's argument, --config FILE.py:ALGORITHM)")
