"""Command line: `rised-train` and `rised-eval`.

  rised-train --config experiments/configs/smollm2_cpu.py --workdir runs/x [--config.key=value …]
  rised-train --config experiments/configs/smollm2_cpu.py --workdir runs/x --dry_run
  rised-eval  --workdir runs/x [--step N] [--config FILE --config.key=value …]

Rerunning `rised-train` with the same workdir resumes from its latest checkpoint. Multi-host
runs (TPU pods, SLURM) pass --distributed, which calls `jax.distributed.initialize()` first.

Overrides (ml_collections config_flags, parsed once):
  --config.train.steps=3                       scalars by the key's type
  --config.envs.names=frozenlake,maze          lists comma-separated (`=` alone: empty list;
  --config.rollout.stop_strings="['1', ',']"   a Python list literal for other elements)
  --config.judge.options.model=m               new keys under any `options` (literal or string)
  --config.algorithm=grpo                      re-applies that preset, then the other overrides
`--dry_run` validates, prints the resolved config and its stages, and exits without loading a
model. `rised-eval` reads the run's saved config.json (no repeated overrides) and writes
eval_checkpoint_<step>.json into the workdir.
"""
from __future__ import annotations

import ast
import json
import sys

from absl import app, flags
from absl import logging as absl_logging
import ml_collections
from etils import epath
from ml_collections import config_flags


class CommaListParser(flags.ArgumentParser):
  """List-valued config keys: `a,b,c` (each item a Python literal, else a string), an empty
  argument for [], or a bracketed Python list literal."""

  def parse(self, argument):
    if isinstance(argument, (list, tuple)):   # the config's own value, as the flag's default
      return list(argument)
    text = argument.strip()
    if text.startswith("["):
      try:
        value = ast.literal_eval(text)
      except (SyntaxError, ValueError) as e:
        raise ValueError(f"{argument!r}: not a Python list literal ({e})") from None
      if not isinstance(value, list):
        raise ValueError(f"{argument!r}: expected a list")
      return value
    return [_literal(item.strip()) for item in text.split(",")] if text else []

  def flag_type(self):
    return "comma-separated list"


def _literal(item: str):
  try:
    return ast.literal_eval(item)
  except (SyntaxError, ValueError):
    return item


config_flags.register_flag_parser_for_type(list, CommaListParser())
_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file (get_config)",
                                          lock_config=False, accept_new_attributes=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (logs, checkpoints)")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "initialise multi-host JAX first")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "print the resolved config and its stages, exit")
_STEP = flags.DEFINE_integer("step", None, "rised-eval: checkpoint step (default: latest)")


def _config(evaluating: bool):
  """The config file's config with the command line's overrides (`--config.algorithm` re-applies
  its preset), or for `rised-eval` without --config the run's saved config.json."""
  from rised_jax import config as config_lib  # noqa: PLC0415 - after flag parsing
  if _CONFIG.value is None:
    saved = _workdir() / "config.json"
    if evaluating and saved.exists():
      return ml_collections.ConfigDict(json.loads(saved.read_text()))
    raise app.UsageError("--config is required" + (
        f" (no {saved} to evaluate from)" if evaluating else ""))
  config = _CONFIG.value   # get_config(arg) has applied the algorithm preset
  overrides = config_flags.get_override_values(flags.FLAGS["config"])
  if "algorithm" in overrides:
    config_lib.reapply_preset(config, overrides)
  return config


def _workdir() -> epath.Path:
  """--workdir as the trainer resolves it (a file:// URL is a local path, gs://… verbatim)."""
  from rised_jax import trainer  # noqa: PLC0415 - after flag parsing
  return trainer.resolve_workdir(_WORKDIR.value)


def _prepare(evaluating: bool = False):
  from rised_jax import parallel  # noqa: PLC0415
  if _WORKDIR.value is None:
    raise app.UsageError("--workdir is required")
  if not flags.FLAGS["verbosity"].present:   # orbax logs every checkpoint file at INFO
    absl_logging.set_verbosity(absl_logging.WARNING)
  config = _config(evaluating)
  if _DRY_RUN.value:
    _dry_run(config)
  if _DISTRIBUTED.value:
    parallel.init_distributed()
  return config   # validated once, by trainer.build, before the model loads


def _dry_run(config) -> None:
  from rised_jax import config as config_lib, pipelines, trainer  # noqa: PLC0415
  pipelines.validate(config)
  trainer.check_workdir(_workdir())
  print(config.to_json_best_effort(indent=2, sort_keys=True))   # what the run saves
  print(config_lib.describe(config))
  print(f"dry run: the config is valid; nothing loaded (workdir {_WORKDIR.value})")
  sys.exit(0)


def _train(argv):
  del argv
  from rised_jax import trainer  # noqa: PLC0415
  trainer.train(_prepare(), _WORKDIR.value)


def _eval(argv):
  del argv
  import jax  # noqa: PLC0415
  from rised_jax import trainer  # noqa: PLC0415
  config = _prepare(evaluating=True)
  step = _STEP.value if _STEP.value is not None else _latest_step(_WORKDIR.value)
  results = trainer.evaluate_checkpoint(config, _WORKDIR.value, step)
  text = json.dumps(results, indent=2, sort_keys=True)
  print(text)
  if jax.process_index() == 0:
    path = _free_path(_workdir() / f"eval_checkpoint_{step}.json")
    path.write_text(text + "\n")
    print(f"wrote {path}")


def _latest_step(workdir: str) -> int:
  """The newest checkpoint's step, found before any model is loaded."""
  from rised_jax import checkpoint  # noqa: PLC0415
  from rised_jax import trainer  # noqa: PLC0415
  directory = trainer.resolve_workdir(workdir) / "checkpoints"
  step = None
  if directory.exists():
    checkpointer = checkpoint.Checkpointer(directory)
    step = checkpointer.latest_step()
    checkpointer.close()
  if step is None:
    raise app.UsageError(f"no checkpoint in {directory} to evaluate")
  return step


def _free_path(path: epath.Path) -> epath.Path:
  """`path`, or `name.2.json`, `name.3.json`, … when it exists: never overwrite a result."""
  candidate, n = path, 1
  while candidate.exists():
    n += 1
    candidate = path.with_name(f"{path.stem}.{n}{path.suffix}")
  return candidate


def train_entry():
  app.run(_train, argv=sys.argv)


def eval_entry():
  app.run(_eval, argv=sys.argv)


if __name__ == "__main__":
  train_entry()
