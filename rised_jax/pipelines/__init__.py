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
  host_state()                   -> {name: HostState}    what a checkpoint must carry

`config.pipeline` names one of `PIPELINES`; the presets of `rised_jax.config` choose it.
"""
from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence

from rised_jax.checkpoint import HostState
from rised_jax.learn.batching import Row
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
  def host_state(self) -> Mapping[str, HostState]: ...


def make_pipeline(config: Any, engine: Any, tokenizer: Any) -> Pipeline:
  """The pipeline that `config.pipeline` names."""
  if config.pipeline == "agentic":
    from rised_jax.pipelines.agentic import AgenticPipeline  # noqa: PLC0415
    return AgenticPipeline(config, engine, tokenizer)
  if config.pipeline == "rubric":
    from rised_jax.pipelines.rubric import RubricPipeline  # noqa: PLC0415
    return RubricPipeline(config, engine, tokenizer)
  raise ValueError(f"config.pipeline={config.pipeline!r}: expected one of {PIPELINES}")


PIPELINES = ("agentic", "rubric")
