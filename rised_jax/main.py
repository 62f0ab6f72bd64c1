"""Command line: `rised-train` and `rised-eval` (usage and examples: `TRAIN_USAGE`, `EVAL_USAGE`).

Rerunning `rised-train` with the same workdir resumes from its latest checkpoint. Multi-host
runs (TPU pods, SLURM) pass --distributed, which calls `jax.distributed.initialize()` first.
Overrides are ml_collections config_flags, parsed once; `--config.algorithm=NAME` re-applies
that preset, then the other overrides. `rised-eval` reads the run's saved config.json (no
repeated overrides) and writes eval_checkpoint_<step>.json into the workdir.

`--help`, missing flags, unknown flags and (for rised-eval) a missing workdir are answered by
`check_command_line` before absl parses anything: parsing `--config` runs the config file,
which imports JAX.
"""
from __future__ import annotations

import ast
import difflib
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


TRAIN_USAGE = """\
usage: rised-train --config FILE[:ARG] --workdir DIR [--config.KEY=VALUE ...] [--dry_run]
                   [--distributed]

Trains RISED, a baseline or CriPO as the experiment file says, in DIR; rerunning the same
command resumes from DIR's last checkpoint, and a finished run only prints its table.

flags:
  --config FILE[:ARG]   experiment file (get_config(ARG)); ARG picks the preset and options,
                        e.g. smollm2_cpu.py:grpo or rised_qwen3_multienv.py:rised,4b
  --workdir DIR         run directory: logs, checkpoints, results.md (local, file:// or gs://)
  --config.KEY=VALUE    override any key of the config (docs/config.md lists them all)
  --dry_run             validate, print the resolved config and its stages, load nothing
  --distributed         call jax.distributed.initialize() first (multi-host)
  --helpfull            every flag, absl's own included

examples:
  rised-train --config experiments/configs/smollm2_cpu.py --workdir runs/smollm2_cpu
  rised-train --config experiments/configs/smollm2_cpu.py:grpo --workdir runs/grpo
  rised-train --config experiments/configs/cripo_cpu.py --workdir runs/cripo
  rised-train --config experiments/configs/smollm2_cpu.py --workdir runs/x \\
      --config.train.steps=3 --config.envs.names=frozenlake,maze --dry_run
"""

EVAL_USAGE = """\
usage: rised-eval --workdir DIR [--step N] [--config FILE[:ARG] [--config.KEY=VALUE ...]]

Evaluates a checkpoint of the run in DIR on its held-out instances (its own config.json, so no
override is repeated), prints the run's results table (before training against this
checkpoint) and writes DIR/eval_checkpoint_<step>.json, never overwriting an earlier one.

flags:
  --workdir DIR         a rised-train run directory
  --step N              the checkpoint to evaluate (default: the latest)
  --config FILE[:ARG]   evaluate under this config instead (it must match the run's)
  --helpfull            every flag, absl's own included

examples:
  rised-eval --workdir runs/smollm2_cpu
  rised-eval --workdir runs/smollm2_cpu --step 3
"""

_HELP = {"-h", "--help", "-help", "--h", "-?"}
_ABSL_SPECIAL = {"flagfile", "undefok"}


def check_command_line(argv: list[str], evaluating: bool) -> str | None:
  """What is wrong with the command line before absl parses it, or None; "help" for --help.

  Cheap on purpose (no config file is loaded): unknown flags, missing required ones, and for
  rised-eval a local workdir that does not exist or holds no config.json without --config.
  """
  args = argv[1:]
  if "--" in args:
    args = args[:args.index("--")]
  if any(arg in _HELP for arg in args):
    return "help"
  if "--helpfull" in args:
    return None
  given, i = set(), 0
  while i < len(args):
    arg, i = args[i], i + 1
    if not arg.startswith("-"):
      continue
    name, has_value, _ = arg.lstrip("-").partition("=")
    known = name in flags.FLAGS or name in _ABSL_SPECIAL or name.startswith("config.")
    negated = name.startswith("no") and name[2:] in flags.FLAGS and flags.FLAGS[name[2:]].boolean
    if not (known or negated):
      close = difflib.get_close_matches(name, [*flags.FLAGS, "config.KEY"], n=1)
      return f"unknown flag --{name}" + (f"; did you mean --{close[0]}?" if close else "")
    given.add(name[2:] if negated else name)
    takes_value = not negated and not (name in flags.FLAGS and flags.FLAGS[name].boolean)
    if takes_value and not has_value:
      i += 1   # `--flag value`
  required = ["workdir"] if evaluating else ["config", "workdir"]
  missing = [f"--{name}" for name in required if name not in given]
  if missing:
    return f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} required"
  if "config" in given:
    config_file = _flag_value(args, "config").split(":", 1)[0]
    if "://" not in config_file and not epath.Path(config_file).is_file():
      return f"the config file {config_file} does not exist"
  if evaluating:
    return _check_eval_workdir(_flag_value(args, "workdir"), "config" in given)
  return None


def _flag_value(args: list[str], name: str) -> str:
  """The last value given to --name (as `--name=v` or `--name v`)."""
  value = None
  for i, arg in enumerate(args):
    if arg.startswith(f"--{name}="):
      value = arg.split("=", 1)[1]
    elif arg == f"--{name}" and i + 1 < len(args):
      value = args[i + 1]
  return value


def _check_eval_workdir(workdir: str, has_config: bool) -> str | None:
  if workdir.startswith("file://"):
    workdir = workdir[len("file://"):]
  elif "://" in workdir:
    return None   # a bucket: checked when it is read
  path = epath.Path(workdir)
  if not path.exists():
    return f"the workdir {workdir} does not exist"
  if not has_config and not (path / "config.json").exists():
    return (f"no config.json in the workdir {workdir} (not a rised-train run that loaded its "
            "model?); pass --config FILE to evaluate under that config")
  return None


def _entry(program: str, usage: str, main, evaluating: bool) -> None:
  argv = [program, *sys.argv[1:]]
  problem = check_command_line(argv, evaluating)
  if problem == "help":
    print(usage, end="")
    sys.exit(0)
  if problem is not None:
    print(f"{program}: error: {problem}\n(see {program} --help)", file=sys.stderr)
    sys.exit(2)
  app.run(main, argv=argv)


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
  # Resolving checks a bucket URL's filesystem backend; a local workdir must be a directory.
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
  from rised_jax import stats, trainer  # noqa: PLC0415
  config = _prepare(evaluating=True)
  step, before = _checkpoint_to_evaluate(_WORKDIR.value, _STEP.value)
  results = trainer.evaluate_checkpoint(config, _WORKDIR.value, step)
  # Every checkpoint holds the evaluation before training, so this is the run's own table.
  print(f"held-out results: before training against checkpoint {step}")
  print(stats.format_pass_rate_table(before, results))
  if jax.process_index() == 0:
    path = _free_path(_workdir() / f"eval_checkpoint_{step}.json")
    path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path}")


def _checkpoint_to_evaluate(workdir: str, step: int | None) -> tuple[int, dict]:
  """The step to evaluate (default: the newest) and the run's "before" evaluation it holds,
  found before any model is loaded."""
  from rised_jax import checkpoint  # noqa: PLC0415
  from rised_jax import trainer  # noqa: PLC0415
  directory = trainer.resolve_workdir(workdir) / "checkpoints"
  if not directory.exists():
    raise app.UsageError(f"no checkpoint in {directory} to evaluate")
  checkpointer = checkpoint.Checkpointer(directory)
  try:
    step = checkpointer.latest_step() if step is None else step
    if step is None or step not in checkpointer.all_steps():
      raise app.UsageError(f"no checkpoint {'' if step is None else step} in {directory} to "
                           f"evaluate (there are: {sorted(checkpointer.all_steps())})")
    before = checkpointer.restore_host(step)["history"]["before"]
  finally:
    checkpointer.close()
  return step, dict(before)


def _free_path(path: epath.Path) -> epath.Path:
  """`path`, or `name.2.json`, `name.3.json`, … when it exists: never overwrite a result."""
  candidate, n = path, 1
  while candidate.exists():
    n += 1
    candidate = path.with_name(f"{path.stem}.{n}{path.suffix}")
  return candidate


def train_entry():
  _entry("rised-train", TRAIN_USAGE, _train, evaluating=False)


def eval_entry():
  _entry("rised-eval", EVAL_USAGE, _eval, evaluating=True)


if __name__ == "__main__":
  train_entry()
