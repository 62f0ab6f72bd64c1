"""Checkpoints: the device train state (params, optimizer, step, RNG) plus host-side state.

Orbax's CheckpointManager writes asynchronously and keeps the last N steps. A checkpoint has
two items:

  state   the TrainState pytree (arrays, saved sharded; restored onto any mesh: the caller
          passes the shardings it wants, so restore onto a different mesh is a re-shard).
  host    a JSON document that the host-side stages fill in (selector memory, guidance memory,
          Python/numpy RNG state, task cursor…) so that a resumed run continues exactly.

Host state is produced and consumed through `HostState` providers: objects with
`state_dict() -> JSON-able dict` and `load_state_dict(dict)`, registered by name.

A run killed at any point leaves at most a temporary (uncommitted) directory and possibly more
than `keep` committed steps (killed between a commit and the deletion of the oldest): opening
the directory removes both. A state holding a NaN or inf is never saved.

A committed checkpoint that cannot be read (a truncated host JSON, a deleted orbax metadata
file, unreadable array data) raises `CorruptCheckpointError`, naming the step, the file and what
is wrong. `restore_latest` (what a resumed run calls) then moves it aside to `<step>.corrupt`,
says so for the caller's warning and restores the newest intact one; with none intact it
raises, so a run never restarts from nothing because its checkpoints were damaged.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, Protocol

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath

# Files of a committed step (orbax-checkpoint 0.12's layout, pinned in setup.py) that are read
# before any array: each must exist and hold a JSON object.
_JSON_FILES = ("host/metadata", "state/_METADATA")


class CorruptCheckpointError(ValueError):
  """A committed checkpoint cannot be read; the message names the step, file and problem."""


class HostState(Protocol):

  def state_dict(self) -> dict[str, Any]:
    ...

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    ...


class Checkpointer:
  """Save/restore of (train state, host state) under `directory` (local path or bucket URL)."""

  def __init__(self, directory: str | os.PathLike, *, keep: int = 3, async_save: bool = True,
               save_every: int = 1):
    if keep < 1:
      raise ValueError(f"checkpoint keep must be >= 1, got {keep}")
    self.directory = epath.Path(directory)
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, save_interval_steps=save_every,
            enable_async_checkpointing=async_save, create=True,
            cleanup_tmp_directories=True),
        item_names=("state", "host"))
    self._keep = keep
    self._closed = False
    self.prune()

  def prune(self) -> None:
    """Deletes the oldest committed steps beyond `keep` (left by a run killed mid-save)."""
    steps = sorted(self.all_steps())
    for step in steps[:max(len(steps) - self._keep, 0)]:
      self._manager.delete(step)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, train_state: Any, host: Mapping[str, HostState] | None = None,
           *, force: bool = False) -> bool:
    """Starts an (async) save; returns False when `save_every` skips this step.

    Raises ValueError, naming the leaf, when a floating-point array of `train_state` holds a
    NaN or inf: a broken state must never replace a good checkpoint.
    """
    for path, leaf in jax.tree_util.tree_leaves_with_path(train_state):
      if jnp.issubdtype(leaf.dtype, jnp.inexact) and not bool(jnp.isfinite(leaf).all()):
        raise ValueError(f"refusing to save checkpoint step {step} to {self.directory}: train "
                         f"state leaf {jax.tree_util.keystr(path)} is not finite")
    host_doc = {name: provider.state_dict() for name, provider in (host or {}).items()}
    return self._manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(train_state),
                                host=ocp.args.JsonSave(host_doc)),
        force=force)

  def check(self, step: int) -> None:
    """Raises CorruptCheckpointError when a file of `step` read before the arrays is missing or
    not a JSON object (what the restore would otherwise report as a bare JSONDecodeError or a
    "pytree structure error")."""
    for name in _JSON_FILES:
      path = self.directory / str(step) / name
      problem = None
      try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict):
          problem = f"holds {type(doc).__name__}; expected a JSON object"
      except FileNotFoundError:
        problem = "is missing"
      except (json.JSONDecodeError, UnicodeDecodeError) as error:
        problem = f"is not valid JSON ({error})"
      if problem is not None:
        raise CorruptCheckpointError(f"checkpoint step {step} in {self.directory} is corrupt: "
                                     f"{path} {problem}")

  def _restore_items(self, step: int, **items: Any) -> Any:
    """`self._manager.restore` of `items` after `check`; any failure of orbax or tensorstore
    reading a committed step is a CorruptCheckpointError naming its directory."""
    self.check(step)
    try:
      return self._manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as error:  # orbax, tensorstore: many types  # pylint: disable=broad-except
      raise CorruptCheckpointError(
          f"checkpoint step {step} in {self.directory} is corrupt: reading "
          f"{self.directory / str(step)} failed: {type(error).__name__}: {error}") from error

  def restore(self, step: int | None, target: Any,
              host: Mapping[str, HostState] | None = None) -> Any:
    """Restores step (default: latest) onto `target`'s shardings; fills the host providers.

    `target` is a pytree of arrays or `jax.ShapeDtypeStruct`s with concrete `sharding`s (the
    mesh to restore onto), e.g. the freshly initialised train state. A damaged step raises
    CorruptCheckpointError before any host provider is filled.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint to restore in {self.directory}")
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), target)
    restored = self._restore_items(step, state=ocp.args.StandardRestore(abstract),
                                   host=ocp.args.JsonRestore())
    host_doc = restored.host or {}
    for name, provider in (host or {}).items():
      if name not in host_doc:
        raise KeyError(f"checkpoint step {step} in {self.directory} has no host state {name!r}; "
                       f"it has {sorted(host_doc)}")
      provider.load_state_dict(host_doc[name])
    return restored.state

  def restore_host(self, step: int) -> dict[str, Any]:
    """The host-state document of `step` alone (no train state, so no model is needed)."""
    restored = self._restore_items(step, host=ocp.args.JsonRestore())
    return dict(restored.host or {})

  def restore_latest(self, target: Any, host: Mapping[str, HostState] | None = None
                     ) -> tuple[int | None, Any, list[str]]:
    """(step, state, set_aside) of the newest intact checkpoint, restored as `restore` does;
    (None, `target`, []) when none is committed. Each newer corrupt step is moved aside to
    `<step>.corrupt` (kept for inspection, out of the way of the step's next save), and
    `set_aside` says, per step, what was wrong and where it went (for the caller's warning).
    When every committed step is corrupt, CorruptCheckpointError lists them."""
    problems = []
    for step in sorted(self.all_steps(), reverse=True):
      try:
        return step, self.restore(step, target, host), problems
      except CorruptCheckpointError as error:
        problems.append(f"{error}; moved it to {self._set_aside(step)}")
    if problems:
      raise CorruptCheckpointError(
          f"no intact checkpoint in {self.directory}: {'; '.join(problems)}. Restore a good "
          "copy of a step there, or use a new --workdir to start afresh")
    return None, target, []

  def _set_aside(self, step: int) -> epath.Path:
    """Renames step's directory to `<step>.corrupt` (`.2`, `.3`, … when taken); the manager
    then no longer lists the step."""
    aside = self.directory / f"{step}.corrupt"
    n = 1
    while aside.exists():
      n += 1
      aside = self.directory / f"{step}.corrupt.{n}"
    if jax.process_index() == 0:
      (self.directory / str(step)).rename(aside)
    self._manager.reload()
    return aside

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and closes; a second call does nothing."""
    if self._closed:
      return
    self._closed = True
    self._manager.wait_until_finished()
    self._manager.close()
