"""The rollout/eval progress bar counts turns: it moves after every engine call of a batched
multi-turn run, its total shrinks by the turns an early-ending episode never plays, and it ends
exactly full."""
import io
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest

from rised_jax.model import tiny
from rised_jax.rollout import agent_loop, progress
from rised_jax.rollout.base import GenerationResult, SamplingParams
from rised_jax.types import Task
from tests.helpers.fake_engine import FakeEngine


def test_counts_by_hand():
  """Budgets 3, 3, 2. Call 1: all play, episode 2 ends after 1 turn (1 unplayed turn comes
  off the total). Call 2: episode 1 ends at 2 of 3. Call 3: episode 0 plays its third."""
  counts = progress.TurnProgress([3, 3, 2])
  assert (counts.turns, counts.total, counts.finished) == (0, 8, 0)
  for episode, turns, done in [(0, 1, False), (1, 1, False), (2, 1, True)]:
    counts.update(episode, turns, done)
  assert (counts.turns, counts.total, counts.finished) == (3, 7, 1)
  for episode, turns, done in [(0, 2, False), (1, 2, True)]:
    counts.update(episode, turns, done)
  assert (counts.turns, counts.total, counts.finished) == (5, 6, 2)
  counts.update(0, 3, True)
  assert (counts.turns, counts.total, counts.finished) == (6, 6, 3)


def test_a_failed_request_ends_its_episode_with_no_turn_and_an_unknown_budget_leaves_no_total():
  counts = progress.TurnProgress([4, None])
  assert counts.total is None
  counts.update(1, 0, True)   # its request failed before any turn
  assert (counts.turns, counts.total, counts.finished) == (0, None, 1)
  known = progress.TurnProgress([4, 2])
  known.update(0, 0, True)
  assert known.total == 2
  with pytest.raises(ValueError, match="already finished"):
    known.update(0, 1, True)
  with pytest.raises(ValueError, match="went from 1 to 0"):
    known.update(1, 1, False)
    known.update(1, 0, False)


def test_the_bar_shows_turns_episodes_and_tokens():
  out = io.StringIO()
  with progress.TurnBar("eval", [2, 2], file=out) as bar:
    bar.played([(0, 1, False), (1, 1, True)], tokens=10)
    assert (bar.n, bar.total) == (1 + 1, 3)
    bar.played([(0, 2, True)], tokens=5)
    assert (bar.n, bar.total) == (3, 3)
  text = out.getvalue()
  assert "eval" in text and "turn" in text and "episodes 2/2" in text and "tokens/s" in text


class WrongMoves(FakeEngine):
  """Every reply is the same 4-token move that maze refuses, so each episode plays exactly the
  loop's turn budget."""

  def __init__(self, tokenizer):
    super().__init__()
    self.ids = tokenizer.encode("<answer> left </answer>") + [tokenizer.eos_token_id]

  def reply(self, request, call):
    return GenerationResult(list(self.ids), [-0.5] * len(self.ids), "stop")


def test_the_agent_loop_bar_moves_before_the_last_turn(monkeypatch):
  seen = []

  class RecordingBar(progress.TurnBar):
    def played(self, episodes, tokens):
      super().played(episodes, tokens)
      seen.append((self.n, self.total, self.progress.finished, self.progress.tokens))

  monkeypatch.setattr(agent_loop, "TurnBar", RecordingBar)
  tokenizer = tiny.build_tokenizer(tiny.environment_words(["maze"]))
  engine = WrongMoves(tokenizer)
  loop = agent_loop.AgentLoop(engine, tokenizer, max_turns=3, max_new_tokens_per_turn=8,
                              max_total_tokens=1024, sampling=SamplingParams(max_new_tokens=8))
  groups = loop.run([Task("maze", 0), Task("maze", 1)], group_size=2, seed=0).groups
  assert all(len(t.turns) == 3 for g in groups for t in g.trajectories)
  reply = len(engine.ids)
  # 4 episodes × 3 turns: the bar advances by 4 turns per call, 12 budgeted from the start.
  assert seen == [(4, 12, 0, 4 * reply), (8, 12, 0, 8 * reply), (12, 12, 4, 12 * reply)]
  assert len(engine.calls) == 3
