"""Environment faults that ended whole runs (issue 23): a first observation too long for the
prompt budget, and a step reward outside the reward bound, are environment errors of their
episode: the group is dropped and counted, the run goes on, and a run with nothing left fails
loudly."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rised_jax.model import tiny
from rised_jax.rollout.agent_loop import AgentLoop, EnvironmentFailure, RolloutFaults
from rised_jax.rollout.base import EngineFaults, GenerationFailed, SamplingParams
from rised_jax.types import Task
from tests.helpers.fake_engine import FixedReplyEngine
from tests.helpers.fault_envs import faulty

WORDY = "tests.helpers.fault_envs:Wordy"
HUGE = "tests.helpers.fault_envs:HugeReward"
KNOBS = dict(size=3, holes=0, min_distance=1, max_turns=2)


@pytest.fixture(scope="module")
def tokenizer():
  return tiny.build_tokenizer(tiny.environment_words(["frozenlake"]) + ["jump"])


def loop(tokenizer, **kwargs):
  return AgentLoop(FixedReplyEngine(tokenizer, "<answer>jump</answer>"), tokenizer,
                   max_new_tokens_per_turn=8, max_total_tokens=512,
                   sampling=SamplingParams(max_new_tokens=8), **kwargs)


class FailsOnFirstCall(FixedReplyEngine):
  """Requests 1 and 4 of the first `generate` call fail (after retries, as a server reports)."""

  def generate(self, requests, **options):
    results = super().generate(requests, **options)
    if len(self.calls) == 1:
      raise GenerationFailed("2 requests failed", results=[
          None if i in (1, 4) else r for i, r in enumerate(results)])
    return results


def test_a_run_returns_its_own_counts_with_its_groups(tokenizer):
  agent = AgentLoop(FailsOnFirstCall(tokenizer, "<answer>jump</answer>"), tokenizer,
                    max_new_tokens_per_turn=8, max_total_tokens=512,
                    sampling=SamplingParams(max_new_tokens=8))
  tasks = [Task("frozenlake", seed, KNOBS) for seed in range(3)]
  # Requests 1 and 4 of turn 1 are rollout 1 of task 0 and rollout 0 of task 2: both groups go.
  first = agent.run(tasks, group_size=2)
  assert [g.task for g in first.groups] == tasks[1:2]
  assert first.faults == RolloutFaults(groups_dropped=2, engine=EngineFaults(failed_requests=2))
  assert first.faults.metrics() == {"rollout/server_retries": 0.0,
                                    "rollout/failed_requests": 2.0,
                                    "rollout/groups_dropped": 2.0}
  # The next run counts from nothing: nothing is carried on the loop from run to run.
  second = agent.run(tasks, group_size=2)
  assert [g.task for g in second.groups] == tasks and second.faults == RolloutFaults()


def test_a_first_observation_over_the_budget_drops_its_group_and_the_run_goes_on(tokenizer):
  # Before: ValueError "the prompt has ... tokens" out of AgentLoop.run, ending the run.
  agent = loop(tokenizer)
  tasks = [Task(WORDY, seed, KNOBS) for seed in range(7)]
  run = agent.run(tasks, group_size=3)
  groups = run.groups
  long = [t for t in tasks if faulty(t.seed, 3)]                  # seeds 0, 3, 6
  assert [g.task for g in groups] == [t for t in tasks if not faulty(t.seed, 3)]
  assert run.faults == RolloutFaults(groups_dropped=len(long))   # no engine fault
  # One error per group: the other rollouts would open the same way, so none is reset.
  assert [(e.task.seed, e.rollout, e.stage) for e in run.env_errors] == \
      [(t.seed, 0, "reset") for t in long]
  assert all("leaves no room under max_total_tokens=512" in e.message
             for e in run.env_errors)
  assert all(len(traj.turns) == 2 for g in groups for traj in g.trajectories)


def test_when_every_opening_is_too_long_the_run_is_a_clear_error(tokenizer):
  agent = loop(tokenizer)
  tasks = [Task(WORDY, seed, dict(KNOBS, fault_every=1)) for seed in range(2)]
  with pytest.raises(EnvironmentFailure, match=r"2 of 4 episodes ended in an environment error "
                                               r".*reset: ValueError: the prompt .* has \d+ "
                                               r"tokens.*every group of this run was dropped"
                     ) as failure:
    agent.run(tasks, group_size=2)
  # The run's counts travel with the error (a split roll-out gathers them).
  rollouts = failure.value.rollouts
  assert rollouts.groups == () and rollouts.faults.groups_dropped == 2
  assert [(e.task.seed, e.stage) for e in rollouts.env_errors] == [(0, "reset"), (1, "reset")]


BOUND = "outside the reward bound"


@pytest.mark.parametrize("reward, bound, message", [
    (1e39, 1e6, BOUND),   # before: kept, and logged as rollout/reward 6.25e37
    (2e6, 1e6, BOUND), (-50.0, 10.0, BOUND),
    (float("inf"), 1e6, "expected a finite number")])   # the protocol check, as before
def test_a_reward_outside_the_bound_drops_its_group(tokenizer, reward, bound, message):
  agent = loop(tokenizer, max_abs_reward=bound)
  tasks = [Task(HUGE, seed, dict(KNOBS, reward=reward)) for seed in range(5)]
  run = agent.run(tasks, group_size=2)
  groups = run.groups
  bad = [t for t in tasks if faulty(t.seed, 3)]                   # seeds 0, 3
  assert [g.task for g in groups] == [t for t in tasks if not faulty(t.seed, 3)]
  assert run.faults.groups_dropped == len(bad)
  assert sorted((e.task.seed, e.rollout, e.stage) for e in run.env_errors) == \
      [(t.seed, r, "step") for t in bad for r in range(2)]
  assert all(message in e.message for e in run.env_errors)
  # What is kept, and so trained on and logged, is the environment's own reward (0: invalid).
  rewards = np.array([traj.reward for g in groups for traj in g.trajectories], np.float32)
  np.testing.assert_array_equal(rewards, np.zeros(len(rewards), np.float32))


def test_a_reward_at_the_bound_is_kept(tokenizer):
  agent = loop(tokenizer, max_abs_reward=5.0)
  run = agent.run([Task(HUGE, 0, dict(KNOBS, reward=-5.0))], group_size=2)
  assert run.faults == RolloutFaults() and not run.env_errors
  assert [traj.reward for traj in run.groups[0].trajectories] == [-5.0, -5.0]


@pytest.mark.parametrize("bound", [0.0, -1.0, math.nan, math.inf, 1e39, "1e6"])
def test_the_reward_bound_must_be_a_positive_float32(tokenizer, bound):
  with pytest.raises(ValueError, match=r"max_abs_reward must be a number in \(0, float32 max\]"):
    loop(tokenizer, max_abs_reward=bound)
