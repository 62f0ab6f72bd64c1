"""Optional Weights & Biases logging beside TensorBoard (`train.wandb=True`, the `wandb` extra).

`RunLog.scalars` hands every scalar it writes to TensorBoard, under the same name and step, to a
`WandbScalars` as well, so the two dashboards show the same curves. The run is created in
`<workdir>/wandb` and, unless WANDB_MODE says otherwise, OFFLINE: nothing leaves the machine
(`wandb sync <workdir>/wandb/offline-run-…` uploads it later; WANDB_MODE=online logs live).
Each training session (a resume included) is one W&B run, grouped by the workdir's name:
W&B wants steps to increase within a run, and a resumed session starts again from its
checkpoint's step (TensorBoard handles that with its START event instead).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

WANDB_DIR = "wandb"   # under the workdir: wandb's own choice of name
PROJECT = "rised_jax"


class WandbScalars:
  """One W&B run that receives a RunLog's scalars."""

  def __init__(self, workdir: str | os.PathLike[str], config: Mapping[str, Any] | None = None):
    try:
      import wandb  # noqa: PLC0415  (an optional dependency)
    except ImportError as e:
      raise ImportError("train.wandb=True needs the wandb package: pip install -e '.[wandb]'"
                        ) from e
    if "://" in os.fspath(workdir):
      raise ValueError(f"train.wandb=True: workdir {os.fspath(workdir)!r} is a bucket URL; W&B "
                       "writes its offline run to a local directory: use a local workdir")
    directory = Path(workdir)   # wandb writes into <directory>/wandb
    directory.mkdir(parents=True, exist_ok=True)
    mode = os.environ.get("WANDB_MODE", "offline")
    self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), dir=directory,
                           mode=mode, group=Path(workdir).name, config=dict(config or {}),
                           settings=wandb.Settings(console="off", silent=True))
    self.dir = Path(self._run.dir).parent   # <workdir>/wandb/<offline-run-…> of this session

  def log(self, step: int, scalars: Mapping[str, float]) -> None:
    self._run.log(dict(scalars), step=step)

  def close(self) -> None:
    self._run.finish()
