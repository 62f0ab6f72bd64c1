"""The training loop's typed config (`config.train`, built at `pipelines.stages`) and its check:
the step count, the evaluation, checkpoint and log cadence, the non-finite stop, and the
run's instruments (W&B mirror, MFU denominator, compilation cache, profiler window).

`num_iterations` and `mini_batches` are the step's schedule: they live here because they are
set under `config.train`, and `config.step_config` hands them to `StepConfig`, which checks
them.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from rised_jax.checks import Rule, check_rules, from_section, int_at_least, is_int, number_at_least


def _is_window(value: Any) -> bool:
  return isinstance(value, (list, tuple)) and (len(value) == 0 or (
      len(value) == 2 and all(is_int(x) and x >= 0 for x in value) and value[0] < value[1]))


RULES: dict[str, Rule] = {
    "steps": int_at_least(0),
    "eval_every": int_at_least(0, "an integer >= 0 (0: only before and after training)"),
    "checkpoint_every": int_at_least(1),
    "keep_checkpoints": int_at_least(1),
    "log_every": int_at_least(1),
    "max_nonfinite_steps": int_at_least(1, "an integer >= 1 (consecutive non-finite steps after "
                                           "which the run stops)"),
    "wandb": ((lambda v: isinstance(v, bool)), "True or False"),
    "peak_flops_per_s": number_at_least(0, "a finite number of FLOP/s >= 0 (0: the devices' "
                                           "published or measured peak)"),
    "compilation_cache": ((lambda v: isinstance(v, str)),
                          "a string: 'auto', a directory, or '' for no cache"),
    "profile_steps": (_is_window, "[] or [first, last) with integers 0 <= first < last"),
}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """config.train (docs/config.md): what the trainer's loop runs and keeps."""

  steps: int
  eval_every: int
  checkpoint_every: int
  keep_checkpoints: int
  log_every: int
  num_iterations: int
  mini_batches: int
  max_nonfinite_steps: int
  wandb: bool
  peak_flops_per_s: float
  compilation_cache: str
  profile_steps: tuple[int, ...]

  @classmethod
  def from_config(cls, section: Any) -> TrainConfig:
    return from_section(cls, section)

  def check(self) -> None:
    check_rules("config.train", self, RULES)

  def checkpoints_at(self, done: int) -> bool:
    """Whether the state after `done` steps is saved: every `checkpoint_every`, and the last."""
    return done % self.checkpoint_every == 0 or done == self.steps

  def evaluates_at(self, done: int) -> bool:
    """Whether held-out evaluation runs after `done` steps: every `eval_every` (if set), and
    after the last."""
    return done == self.steps or bool(self.eval_every and done % self.eval_every == 0)
