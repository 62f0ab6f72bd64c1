"""How predictable is success from the rule judge's tags? One table per run, per environment.

  python experiments/tag_predictability.py [--episodes 500] [--seed 0]

Episodes at each environment's default difficulty, played by an oracle+random mix so that
successes and failures both occur: episode i plays, each turn, the oracle's next action with
probability p_i = (i mod 5) / 4 and a uniformly random action of `action_space()` otherwise.
Every episode is judged by `RuleBasedJudge`; the table gives the success rate, the base rate
max(p, 1 - p), the accuracy of the best rule on the whole tag vector
(`rule_judge.success_predictability`, an in-sample upper bound), the accuracy of the best
one-tag threshold rule (`best_single_tag_accuracy`) and the share of the outcome's entropy the
tag vector explains (`success_information`, I(V; S) / H(S)). Seconds on one core.
"""
from __future__ import annotations

import argparse
import random

import numpy as np

from rised_jax import envs, rubrics
from rised_jax.rubrics import rule_judge
from rised_jax.types import Task, Trajectory, Turn


def mixed_episode(name: str, seed: int, p_oracle: float, rng: random.Random) -> Trajectory:
  env = envs.make(name)
  env.reset(seed)
  turns, info, done = [], {}, False
  while not done:
    action = env.oracle()[0] if rng.random() < p_oracle else rng.choice(env.action_space())
    observation, reward, done, info = env.step(envs.format_answer(action))
    turns.append(Turn(action, observation, reward, done, info["invalid"], info["events"]))
  return Trajectory(Task(name, seed), [], [], [], 0, turns, success=bool(info["success"]),
                    reward=float(info["success"]), truncated=bool(info["truncated"]))


def predictability(judge: rubrics.Judge, episodes: int, seed: int = 0) -> dict[str, dict]:
  """{env: {success_rate, base_rate, success_from_tags, best_single_tag, information}} over
  `episodes` mixed episodes."""
  table = {}
  for name in envs.names():
    rng = random.Random(seed)
    trajectories = [mixed_episode(name, seed * 1_000_003 + i, (i % 5) / 4, rng)
                    for i in range(episodes)]
    tags = np.stack([judge.verdict(t).tags for t in trajectories])
    successes = np.asarray([t.success for t in trajectories])
    accuracy, base = rule_judge.success_predictability(tags, successes)
    table[name] = {"success_rate": float(successes.mean()), "base_rate": base,
                   "success_from_tags": accuracy,
                   "best_single_tag": rule_judge.best_single_tag_accuracy(tags, successes),
                   "information": rule_judge.success_information(tags, successes)}
  return table


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--episodes", type=int, default=500)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  judge = rubrics.RuleBasedJudge(rubrics.Vocabulary.load("agentic_v1"))
  print("| env | success rate | base rate | success from tags | best single tag | I(V;S)/H(S) |\n"
        "|---|---|---|---|---|---|")
  for name, row in predictability(judge, args.episodes, args.seed).items():
    print(f"| {name} | {row['success_rate']:.3f} | {row['base_rate']:.3f} | "
          f"{row['success_from_tags']:.3f} | {row['best_single_tag']:.3f} | "
          f"{row['information']:.3f} |")


if __name__ == "__main__":
  main()
