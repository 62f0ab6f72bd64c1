"""The rollout and evaluation progress bar: it counts turns, not finished episodes.

In batched multi-turn play every live episode plays one turn per engine call, and most
episodes of a batch end on the same last turns, so a bar of finished episodes sits at 0 until
the end and then jumps. This bar advances by the turns played after each call; its total is
the turns budgeted (each episode's turn budget), and an episode that ends early takes its
unplayed turns off the total, so the bar ends exactly full, the rate is turns played per
second and the ETA an upper bound that tightens. Its postfix shows finished episodes and the
generated tokens per second. Without a known budget for every episode the total is left open
(count and rate only).
"""
from __future__ import annotations

import time
from typing import Sequence

import tqdm


class TurnProgress:
  """The counts behind the bar (pure bookkeeping, no output).

  Args:
    budgets: per episode, the most turns it may play, or None when unknown.
  """

  def __init__(self, budgets: Sequence[int | None]):
    self.budgets = list(budgets)
    self.total = None if any(b is None for b in self.budgets) else sum(self.budgets)
    self.turns = 0                     # turns played so far, all episodes
    self.finished = 0                  # episodes ended
    self.tokens = 0                    # tokens generated
    self._turns = [0] * len(self.budgets)
    self._done = [False] * len(self.budgets)

  def update(self, episode: int, turns: int, done: bool) -> None:
    """Episode `episode` has now played `turns` turns and is (or is not) finished."""
    if self._done[episode]:
      raise ValueError(f"TurnProgress.update: episode {episode} had already finished")
    if turns < self._turns[episode]:
      raise ValueError(f"TurnProgress.update: episode {episode} went from "
                       f"{self._turns[episode]} to {turns} turns")
    self.turns += turns - self._turns[episode]
    self._turns[episode] = turns
    if done:
      self._done[episode] = True
      self.finished += 1
      if self.total is not None:   # its unplayed turns will never come
        self.total -= max(self.budgets[episode] - turns, 0)


class TurnBar:
  """A tqdm bar over `TurnProgress` (a context manager; `disable` for processes other than 0)."""

  def __init__(self, desc: str, budgets: Sequence[int | None], *, disable: bool = False,
               file=None):
    self.progress = TurnProgress(budgets)
    self._start = time.perf_counter()
    self._bar = tqdm.tqdm(total=self.progress.total, desc=desc, unit="turn", leave=False,
                          disable=disable, file=file)

  def __enter__(self) -> "TurnBar":
    return self

  def __exit__(self, *exc) -> None:
    self._bar.close()

  @property
  def n(self) -> int:
    return self._bar.n

  @property
  def total(self) -> int | None:
    return self._bar.total

  def played(self, episodes: Sequence[tuple[int, int, bool]], tokens: int) -> None:
    """After one engine call: (episode index, its turns so far, finished) for every episode
    that was in the call, and the tokens the call generated."""
    before = self.progress.turns
    for episode, turns, done in episodes:
      self.progress.update(episode, turns, done)
    self.progress.tokens += int(tokens)
    self._bar.total = self.progress.total
    seconds = max(time.perf_counter() - self._start, 1e-9)
    self._bar.set_postfix_str(f"episodes {self.progress.finished}/{len(self.progress.budgets)}, "
                              f"{self.progress.tokens / seconds:.1f} tokens/s", refresh=False)
    self._bar.update(self.progress.turns - before)
    self._bar.refresh()   # one call per turn: cheap, and the postfix is never a call behind
