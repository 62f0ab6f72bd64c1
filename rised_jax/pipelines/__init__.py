"""Pipelines: the algorithm-specific stages that the trainer's loop calls.

A pipeline turns a training step's tasks into trainable rows. The trainer calls, in order:

  roll_out(step)                 -> pool: list[Group]    sample tasks, generate rollouts
  judge(pool)                    -> metrics              tags (RISED) or criterion verdicts (CriPO)
  advantages(pool)               -> None                 group advantages from the rewards
  select(pool, step)             -> selected groups      which groups are trained on
  teach(selected, pool, step)    -> metrics              teacher contexts for the selected groups
  rows(selected)                 -> list[batching.Row]   student / teacher rows to train on
  observe(pool)                  -> None                 memories updated after the step (guidance)
  evaluate()                     -> {name: results}      held-out pass rates (never with hints)
  metrics(pool, selected)        -> metrics              per-step diagnostics
  log_rollouts(log, step, pool)  -> None                 what the run log records of the pool
  host_state()                   -> {name: HostState}    what a checkpoint must carry

`config.pipeline` names one of `PIPELINES`; the presets of `rised_jax.config` choose it.
"""
from __future__ import annotations

import importlib
from typing import Any, Mapping, Protocol, Sequence

from rised_jax import config as config_lib
from rised_jax.checkpoint import HostState
from rised_jax.learn.batching import Row
from rised_jax.runlog import RunLog
from rised_jax.types import Group


class Pipeline(Protocol):

  # The last evaluation's per-episode records (runlog's eval_episodes.jsonl); [] where the
  # pipeline keeps none.
  eval_episodes: list[dict[str, Any]]

  def roll_out(self, step: int) -> list[Group]: ...
  def judge(self, pool: list[Group]) -> dict[str, float]: ...
  def advantages(self, pool: list[Group]) -> None: ...
  def select(self, pool: list[Group], step: int) -> list[Group]: ...
  def teach(self, selected: Sequence[Group], pool: Sequence[Group],
            step: int) -> dict[str, float]: ...
  def rows(self, selected: Sequence[Group]) -> list[Row]: ...
  def observe(self, pool: Sequence[Group]) -> None: ...
  def evaluate(self) -> dict[str, dict[str, float]]: ...
  def metrics(self, pool: Sequence[Group], selected: Sequence[Group]) -> dict[str, float]: ...
  def log_rollouts(self, log: RunLog, step: int, pool: Sequence[Group]) -> None: ...
  def host_state(self) -> Mapping[str, HostState]: ...


def _module(name: str):
  """The module of pipeline `name` (imported on demand: each pulls in its own stages)."""
  if name not in PIPELINES:
    raise ValueError(f"config.pipeline={name!r}: expected one of {tuple(PIPELINES)}")
  return importlib.import_module(f"rised_jax.pipelines.{PIPELINES[name]}")


def check_config(config: Any) -> None:
  """The named pipeline's `check_config`: its keys and those of each stage it composes."""
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
