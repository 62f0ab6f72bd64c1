"""Learning: RISED training must make the policy read the observation.

The setting (`tiny_cpu.py:rised,easy`) has held-out instances that need different winning
moves, so a policy that ignores the observation — at best one fixed sequence of actions,
whatever the instance — wins only the share of instances that sequence solves. That share is
computed exactly here by playing every action sequence on every evaluation instance; the
trained policy must beat it with the lower end of its 95 % Wilson interval.
"""
from __future__ import annotations

import itertools

import pytest

from rised_jax import envs, evaluate, trainer
from rised_jax.model import tiny
from tests.run_fixtures import TINY_CONFIG as CONFIG, load_config_file


def best_blind_pass_rate(tasks) -> tuple[float, tuple[str, ...]]:
  """The best pass rate of an open-loop policy (one action sequence for every instance) on
  `tasks`: every sequence of max_turns actions from the action space, played on each task."""
  def solves(task, sequence):
    env = envs.make(task.env, **task.difficulty)
    env.reset(task.seed)
    for action in sequence:
      env.step(envs.format_answer(action))
      if env.done:
        break
    return env.success

  probe = envs.make(tasks[0].env, **tasks[0].difficulty)
  probe.reset(tasks[0].seed)
  sequences = itertools.product(probe.action_space(), repeat=probe.max_turns)
  return max((sum(solves(t, seq) for t in tasks) / len(tasks), seq) for seq in sequences)


def test_blind_baseline_on_hand_checked_instances():
  """One-move 2x2 FrozenLake has 8 games, two per winning move: a blind move wins 2 of 8."""
  small = dict(size=2, holes=0, min_distance=1, max_turns=1)
  tasks = evaluate.eval_instances("frozenlake", small, 8, 0)
  rate, _ = best_blind_pass_rate(tasks)
  assert rate == 2 / 8


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "measured: the tiny random model learns the best blind policy, not to read the "
    "observation: after 60 RISED steps (287 s on 2 shared cores) it answers forward, forward "
    "on every held-out maze, 93/256 = 0.363 [0.307, 0.424], exactly the blind optimum 0.363 "
    "(grpo too, seeds 0 and 1: README, Comparing methods); also at 150 steps with G = 16 and "
    "lr 1e-3 (stopped at step 46: training success 0.35); and on one-move 3x3 FrozenLake "
    "with 2 holes (128 held-out instances, blind optimum 'up' 39/128 = 0.305) it ends on one "
    "constant move after 40 steps at lr 3e-3, 60 at lr 1e-2 (G = 8 and G = 16) and 100 at "
    "lr 3e-3 (seeds 0, 1): 24-31/128 held-out wins, every reply the same move"))
def test_training_beats_every_policy_that_ignores_the_observation(tmp_path):
  config = load_config_file(CONFIG, "rised,easy")
  (env_name,) = config.envs.names
  model_dir = tiny.write(tmp_path / "model", [env_name])
  config.model.source = str(model_dir)
  held_out = evaluate.eval_tasks(config.envs.names, config.envs.difficulty.to_dict(),
                                 config.eval.episodes_per_env, config.eval.seed_offset)
  blind, _ = best_blind_pass_rate(held_out)
  summary = trainer.train(config, tmp_path / "run")
  after = summary["after"][env_name]
  assert after["episodes"] == len(held_out)
  assert after["ci_low"] > blind, (after, blind)
