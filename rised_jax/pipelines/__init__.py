"""Pipelines: the algorithm-specific stages that the trainer's loop calls.

A pipeline turns a training step's tasks into trainable rows. Each stage takes the step's
record and returns a new one (`dataclasses.replace`); no stage mutates the pool or a record.
The record is the pipeline's own frozen dataclass (`AgenticStep`, `RubricStep`); it has at
least `step` and `pool` (the rollouts, `types.Group`: rollout facts only), and a field a stage
sets is None until that stage has run (`pipelines.records`). The trainer calls, in order:

  roll_out(step)                 -> record   sample tasks, generate rollouts (+ fault counters)
  judge(record)                  -> record   tags (RISED) or criterion verdicts and rewards (CriPO)
  advantages(record)             -> record   group advantages from the rewards
  select(record)                 -> record   which groups are trained on
  teach(record)                  -> record   teacher contexts for the selected groups
  teacher_metrics(record, model) -> metrics  what the teacher contexts do to `model`, the policy
                                             before the update ({} where nothing is measured)
  rows(record)                   -> list[batching.Row]   student / teacher rows to train on
  observe(record)                -> None     memories updated after the step (guidance)
  metrics(record)                -> metrics  everything the step logs about its stages
                                             (faults, judge and teacher counters, diagnostics;
                                             `rollout/reward` always)
  log_rollouts(log, step, record)-> None     what the run log records of the pool
  evaluate()                     -> {name: results}      held-out pass rates (never with hints)
  host_state()                   -> {name: HostState}    what a checkpoint must carry

`roll_out` touches only the rollout side (task cursor, rollout loop, engine): the trainer may
run it for step t + 1 in a background thread while step t trains (`rollout.async_rollouts`), so
the stages after it must not use the engine or the rollout loop's environments.

`config.pipeline` names one of `PIPELINES`; the presets of `rised_jax.config` choose it.
"""
from __future__ import annotations

import importlib
from typing import Any, Mapping, Protocol, Sequence

from rised_jax import config as config_lib
from rised_jax.checkpoint import HostState
from rised_jax.learn.batching import Row
from rised_jax.pipelines import stages
from rised_jax.runlog import RunLog
from rised_jax.types import Group


class StepRecord(Protocol):
  """What every pipeline's per-step record has; the rest of its fields are its own."""

  step: int
  pool: Sequence[Group]


class Pipeline(Protocol):

  # The last evaluation's per-episode records (runlog's eval_episodes.jsonl); [] where the
  # pipeline keeps none.
  eval_episodes: list[dict[str, Any]]

  def roll_out(self, step: int) -> StepRecord: ...
  def judge(self, record: StepRecord) -> StepRecord: ...
  def advantages(self, record: StepRecord) -> StepRecord: ...
  def select(self, record: StepRecord) -> StepRecord: ...
  def teach(self, record: StepRecord) -> StepRecord: ...
  def teacher_metrics(self, record: StepRecord, model: Any) -> dict[str, float]: ...
  def rows(self, record: StepRecord) -> list[Row]: ...
  def observe(self, record: StepRecord) -> None: ...
  def evaluate(self) -> dict[str, dict[str, float]]: ...
  def metrics(self, record: StepRecord) -> dict[str, float]: ...
  def log_rollouts(self, log: RunLog, step: int, record: StepRecord) -> None: ...
  def host_state(self) -> Mapping[str, HostState]: ...


def _module(name: str):
  """The module of pipeline `name` (imported on demand: each pulls in its own stages)."""
  if name not in PIPELINES:
    raise ValueError(f"config.pipeline={name!r}: expected one of {tuple(PIPELINES)}")
  return importlib.import_module(f"rised_jax.pipelines.{PIPELINES[name]}")


def check_config(config: Any) -> None:
  """The checks of the stages every pipeline composes (`stages.check_common`), then the named
  pipeline's `check_config`: its keys and those of each stage it composes."""
  stages.check_common(stages.stage_configs(config))
  _module(config.pipeline).check_config(config)


def validate(config: Any, num_devices: int | None = None) -> None:
  """Validates `config` whole: the config's own checks, then the pipeline's (`check_config`).

  The one entry point (`trainer.build`, `rised-train --dry_run`); `rised_jax.config` cannot
  call the stages itself without importing the layers above it.
  """
  config_lib.validate(config, (check_config,), num_devices)


def make_pipeline(config: Any, engine: Any, tokenizer: Any) -> Pipeline:
  """The pipeline that `config.pipeline` names."""
  module = _module(config.pipeline)
  return module.PIPELINE(config, engine, tokenizer)


# config.pipeline -> module of rised_jax.pipelines (which defines PIPELINE and check_config).
PIPELINES = {"agentic": "agentic", "rubric": "rubric"}
