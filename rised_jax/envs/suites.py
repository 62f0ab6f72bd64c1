"""What the adapters of real environment suites (BabyAI, ScienceWorld, TextWorld Express) share.

Each suite is an optional extra (`pip install -e .[babyai]`, …, or `make envs` for all of them
and the Java runtime the JVM-based suites need); `require` imports a suite's package and names
the extra when it is missing.

`SuiteEnvironment` is a `base.Environment` whose episode is chosen by the seed itself (the
suite's own seed, variation or level), not by a `random.Random(seed)`: `reset` records the seed
before the base class calls `_generate`, and prepends the suite's introduction (task, first
view) to the first observation.

`BackendPool` shares a few simulator processes (one JVM each) between the many environments the
agent loop creates (one per rollout, all live at once). An episode leases a backend for each
step; when another episode used that backend since, the pool restores this one first by loading
its instance and replaying its commands (suites are deterministic given instance and commands,
so the replayed state is the same state). With at most `capacity` live episodes there is no
replay; beyond it the least recently used backend is taken over, which is correct but slower.
"""
from __future__ import annotations

import atexit
import importlib
import weakref
from typing import Any, Callable, Generic, TypeVar

from rised_jax.checks import is_int
from rised_jax.envs import base

Backend = TypeVar("Backend")


class SuiteNotInstalled(ImportError):
  """A suite's optional package (or the Java runtime it needs) is missing."""


def require(module: str, extra: str, suite: str) -> Any:
  """Imports a suite's package, or raises SuiteNotInstalled naming the extra to install."""
  try:
    return importlib.import_module(module)
  except ImportError as err:
    raise SuiteNotInstalled(
        f"environment {suite!r} needs the {module!r} package ({err}); install it with "
        f"`pip install -e .[{extra}]`, or `make envs` for every suite and the Java runtime"
    ) from err


class SuiteEnvironment(base.Environment):
  """A `base.Environment` over an external suite whose seed picks the episode."""

  partial_view = True   # the agent sees its room or its egocentric view, not the world

  def reset(self, seed: int) -> str:
    if not is_int(seed) or seed < 0:
      raise ValueError(f"{self.name}: seed must be a non-negative integer, got {seed!r}")
    self._seed = int(seed)
    return super().reset(seed)

  def _first_observation(self) -> str:
    return f"{self._intro()}\n{super()._first_observation()}"

  def _intro(self) -> str:
    """The suite's own opening text (task description, first observation)."""
    return ""


class BackendPool(Generic[Backend]):
  """At most `capacity` simulator backends, leased per step to the episode that steps.

  `factory()` makes a backend; `close(backend)` ends one (at interpreter exit, or when a step
  raised inside it: a crashed simulator is never handed out again).
  """

  def __init__(self, factory: Callable[[], Backend], close: Callable[[Backend], None],
               capacity: int):
    if capacity < 1:
      raise ValueError(f"BackendPool: capacity must be >= 1, got {capacity}")
    self._factory, self._close, self.capacity = factory, close, capacity
    self._backends: list[Backend] = []
    self._owners: list[weakref.ref | None] = []   # the episode whose state each backend holds
    self._last_use: list[int] = []
    self._clock = 0
    self.restores = 0   # how many times a backend was reloaded for an episode (replays)
    atexit.register(self.close_all)

  def lease(self, episode: Any, restore: Callable[[Backend], None]) -> Backend:
    """A backend holding `episode`'s current state; `restore(backend)` rebuilds it there
    (load the instance, replay its commands) when it is not already current."""
    self._clock += 1
    for i, owner in enumerate(self._owners):
      if owner is not None and owner() is episode:
        self._last_use[i] = self._clock
        return self._backends[i]
    i = self._free_slot()
    self._owners[i] = None   # until the restore succeeds, the backend holds no one's state
    try:
      restore(self._backends[i])
    except Exception:
      self._drop(i)   # a simulator that fails to load is not trusted again
      raise
    self.restores += 1
    self._owners[i] = weakref.ref(episode)
    self._last_use[i] = self._clock
    return self._backends[i]

  def use(self, work: Callable[[Backend], Any]) -> Any:
    """`work(backend)` on an idle backend that stays idle after (reading a suite's metadata);
    whoever leases it next restores its own state."""
    i = self._free_slot()
    self._owners[i] = None
    try:
      return work(self._backends[i])
    except Exception:
      self._drop(i)
      raise

  def release(self, episode: Any) -> None:
    """Forgets that a backend holds `episode`'s state (it restarts: its next lease restores)."""
    for i, owner in enumerate(self._owners):
      if owner is not None and owner() is episode:
        self._owners[i] = None

  def discard(self, episode: Any) -> None:
    """Closes the backend that holds `episode` (its simulator raised: its state is unknown)."""
    for i, owner in enumerate(self._owners):
      if owner is not None and owner() is episode:
        self._drop(i)
        return

  def _drop(self, i: int) -> None:
    backend = self._backends.pop(i)
    del self._owners[i], self._last_use[i]
    try:
      self._close(backend)
    except Exception:  # pylint: disable=broad-except  # already broken: nothing to keep
      pass

  def close_all(self) -> None:
    for backend in self._backends:
      try:
        self._close(backend)
      except Exception:  # pylint: disable=broad-except  # exiting: a dead JVM is fine
        pass
    self._backends, self._owners, self._last_use = [], [], []

  def _free_slot(self) -> int:
    """An idle backend (its episode is over or gone), a new one, or the least recently used."""
    for i, owner in enumerate(self._owners):
      episode = None if owner is None else owner()
      if episode is None or episode.done:
        return i
    if len(self._backends) < self.capacity:
      self._backends.append(self._factory())
      self._owners.append(None)
      self._last_use.append(0)
      return len(self._backends) - 1
    return min(range(len(self._backends)), key=self._last_use.__getitem__)
