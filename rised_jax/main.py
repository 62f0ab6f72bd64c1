"""Command line: `rised-train` and `rised-eval`.

  rised-train --config experiments/configs/smollm2_cpu.py --workdir runs/x [--config.key=value …]
  rised-eval  --config experiments/configs/smollm2_cpu.py --workdir runs/x [--step N]

Rerunning `rised-train` with the same workdir resumes from its latest checkpoint. Multi-host
runs (TPU pods, SLURM) pass --distributed, which calls `jax.distributed.initialize()` first.
"""
from __future__ import annotations

import json
import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file (get_config)",
                                          lock_config=False)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (logs, checkpoints)")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "initialise multi-host JAX first")
_STEP = flags.DEFINE_integer("step", None, "rised-eval: checkpoint step (default: latest)")


def _prepare():
  from rised_jax import config as config_lib, parallel  # noqa: PLC0415 - after flag parsing
  if _CONFIG.value is None or _WORKDIR.value is None:
    raise app.UsageError("--config and --workdir are required")
  if not flags.FLAGS["verbosity"].present:   # orbax logs every checkpoint file at INFO
    absl_logging.set_verbosity(absl_logging.WARNING)
  if _DISTRIBUTED.value:
    parallel.init_distributed()
  config = _CONFIG.value   # get_config(arg) has applied the algorithm preset
  config_lib.validate(config)
  return config


def _train(argv):
  del argv
  from rised_jax import trainer  # noqa: PLC0415
  trainer.train(_prepare(), _WORKDIR.value)


def _eval(argv):
  del argv
  from rised_jax import trainer  # noqa: PLC0415
  results = trainer.evaluate_checkpoint(_prepare(), _WORKDIR.value, _STEP.value)
  print(json.dumps(results, indent=2, sort_keys=True))


def train_entry():
  app.run(_train, argv=sys.argv)


def eval_entry():
  app.run(_eval, argv=sys.argv)


if __name__ == "__main__":
  train_entry()
