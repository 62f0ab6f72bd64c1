"""An environment that raises (issue 12): the episode is errored, its group is left out of
training and its instance out of the pass rates, both are counted, the instance is rebuilt, and
a run with nothing left fails loudly instead of printing a table."""
from __future__ import annotations

from pathlib import Path

import pytest

from rised_jax import envs, evaluate, trainer
from rised_jax.envs.frozenlake import FrozenLake
from rised_jax.model import tiny
from rised_jax.pipelines.agentic import AgenticPipeline
from rised_jax.rollout.agent_loop import AgentLoop, EnvironmentFailure
from rised_jax.rollout.base import GenerationResult, SamplingParams
from rised_jax.types import Task
from tests.helpers.fake_engine import FixedReplyEngine
from tests.helpers.run_fixtures import load_config_file

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "experiments" / "configs" / "tiny_cpu.py"
KNOBS = dict(size=3, holes=0, min_distance=1, max_turns=4)


class Crashy(FrozenLake):
  """FrozenLake whose step `crash_step` raises for seeds divisible by 3 (and whose reset raises
  for every seed while `reset_crashes` is set); counts the instances built and closed."""

  name = "crashy"
  built: list["Crashy"] = []
  reset_crashes = False

  def __init__(self, *, size: int = 3, holes: int = 0, min_distance: int = 1,
               max_turns: int | None = 4, crash_step: int = 2):
    super().__init__(size=size, holes=holes, min_distance=min_distance, max_turns=max_turns)
    self.crash_step = crash_step
    self.closed = False
    self.seed = None
    Crashy.built.append(self)

  def reset(self, seed):
    if Crashy.reset_crashes:
      raise ConnectionError("the game server went away")
    self.seed = seed
    return super().reset(seed)

  def step(self, reply):
    if self.seed % 3 == 0 and self.turn + 1 == self.crash_step:
      raise RuntimeError(f"segfault in seed {self.seed}")
    return super().step(reply)

  def close(self):
    self.closed = True


@pytest.fixture
def crashy(monkeypatch):
  monkeypatch.setitem(envs._REGISTRY, "crashy", Crashy)
  monkeypatch.setattr(Crashy, "built", [])
  monkeypatch.setattr(Crashy, "reset_crashes", False)
  yield
  envs.ENVIRONMENTS.resolved.pop("crashy", None)
  for key in [k for k in envs._ENVS if k[0] == "crashy"]:
    del envs._ENVS[key]
  envs._KEYS.clear()


@pytest.fixture(scope="module")
def tokenizer():
  return tiny.build_tokenizer(tiny.environment_words(["frozenlake"]) + ["jump"])


def _loop(tokenizer, reply):
  return AgentLoop(FixedReplyEngine(tokenizer, reply), tokenizer, max_new_tokens_per_turn=8,
                   max_total_tokens=768, sampling=SamplingParams(max_new_tokens=8))


def test_a_crash_at_step_k_drops_the_group_counts_it_and_rebuilds_the_instance(crashy, tokenizer):
  loop = _loop(tokenizer, "<answer>jump</answer>")   # invalid: every episode lasts 4 turns
  tasks = [Task("crashy", seed, dict(KNOBS, crash_step=2)) for seed in range(7)]
  run = loop.run(tasks, group_size=2)
  groups = run.groups
  crashing = [t for t in tasks if t.seed % 3 == 0]                  # seeds 0, 3, 6
  assert [g.task for g in groups] == [t for t in tasks if t.seed % 3]
  assert run.faults.groups_dropped == len(crashing)
  assert sorted((e.task.seed, e.rollout, e.stage) for e in run.env_errors) == \
      [(t.seed, r, "step") for t in crashing for r in range(2)]
  assert all("RuntimeError: segfault in seed" in e.message for e in run.env_errors)
  # The kept episodes played all 4 turns; the crashed instances were closed and discarded.
  assert all(len(traj.turns) == 4 for g in groups for traj in g.trajectories)
  closed = [env for env in Crashy.built if env.closed]
  assert len(closed) == loop.envs.rebuilt == 6
  # A second run reuses the surviving instances and builds one per discarded one.
  built = len(Crashy.built)
  again = loop.run(tasks, group_size=2)
  assert [g.task for g in again.groups] == [g.task for g in groups]
  assert len(Crashy.built) - built == 6 and len(again.env_errors) == 6


def test_pipeline_trains_only_on_groups_without_errors_and_logs_the_count(crashy, tokenizer):
  config = load_config_file(CONFIG, "rised")
  config.envs.names = ["crashy"]
  config.envs.difficulty = {"crashy": dict(KNOBS, crash_step=1)}
  config.select.pool_groups = 6
  config.select.batch_groups = 6
  pipeline = AgenticPipeline(config, FixedReplyEngine(tokenizer, "<answer>right</answer>"), tokenizer)
  tasks = pipeline.tasks.next(6)
  pipeline.tasks.cursor, pipeline.tasks.next_index = 0, {"crashy": 0}
  record = pipeline.roll_out(0)
  expected = [t for t in tasks if t.seed % 3]
  assert [g.task for g in record.pool] == expected
  record = pipeline.teach(pipeline.select(pipeline.advantages(pipeline.judge(record))))
  rows = pipeline.rows(record)
  metrics = pipeline.metrics(record)
  selected = [record.pool[i] for i in record.chosen]
  group_size = config.rollout.group_size
  assert metrics["rollout/env_errors"] == group_size * (len(tasks) - len(expected))
  assert metrics["rollout/groups_dropped"] == len(tasks) - len(expected)
  assert len(rows) == group_size * len(expected)
  assert all(g.task.seed % 3 for g in selected)


def _solved_by_right(task) -> bool:
  """The reference: plain FrozenLake (no crash) played with "right" until it ends."""
  env = FrozenLake(**{k: v for k, v in task.difficulty.items() if k != "crash_step"})
  env.reset(task.seed)
  done, info = False, {}
  while not done:
    _, _, done, info = env.step("<answer>right</answer>")
  return info["success"]


def test_evaluation_excludes_errored_instances_and_reports_them(crashy, tokenizer):
  loop = _loop(tokenizer, "<answer>right</answer>")
  difficulty = {"crashy": dict(KNOBS, crash_step=1)}
  results, groups = evaluate.evaluate(loop, ["crashy"], difficulty, episodes=9, seed_offset=100)
  tasks = evaluate.eval_tasks(["crashy"], difficulty, 9, 100)
  kept = [t for t in tasks if t.seed % 3]
  solved = [_solved_by_right(t) for t in kept]
  assert 0 < sum(solved) < len(kept)          # the reference is not degenerate
  assert results["crashy"]["episodes"] == len(kept)
  assert results["crashy"]["env_errors"] == len(tasks) - len(kept)
  assert results["crashy"]["pass_rate"] == pytest.approx(sum(solved) / len(kept))
  assert [g.task for g in groups] == kept


def test_when_every_episode_errors_the_run_raises(crashy, tokenizer):
  loop = _loop(tokenizer, "<answer>right</answer>")
  tasks = [Task("crashy", seed, KNOBS) for seed in range(3)]
  Crashy.reset_crashes = True
  with pytest.raises(EnvironmentFailure, match=r"6 of 6 episodes ended in an environment error "
                                               r"\(first: task crashy:0 rollout 0, reset: "
                                               r"ConnectionError: the game server went away\)"
                     ) as failure:
    loop.run(tasks, group_size=2)
  assert failure.value.rollouts.faults.groups_dropped == 3
  # Evaluation: an environment with no evaluated instance has no pass rate.
  Crashy.reset_crashes = False
  with pytest.raises(EnvironmentFailure, match=r"none of the 3 instances of crashy could be "
                                               r"evaluated: 3 episodes raised"):
    evaluate.add_env_errors({}, tasks, failure.value.rollouts.env_errors[:3])


class AlwaysCrashes(FrozenLake):
  """Its instances are known without a reset (`instance_key_for`); every reset raises."""

  name = "always_crashes"

  def __init__(self, *, size: int = 2, holes: int = 0, min_distance: int = 1,
               max_turns: int | None = 1):
    super().__init__(size=size, holes=holes, min_distance=min_distance, max_turns=max_turns)

  def instance_key_for(self, seed):
    return f"always_crashes:{seed}"

  def reset(self, seed):
    raise RuntimeError("this game always crashes")


def test_a_training_run_on_an_always_crashing_env_raises_without_a_table(monkeypatch, tmp_path):
  monkeypatch.setitem(envs._REGISTRY, "always_crashes", AlwaysCrashes)
  monkeypatch.setattr(envs.ENVIRONMENTS, "resolved", {})
  config = load_config_file(CONFIG, "grpo")
  config.model.source = str(tiny.write(tmp_path / "model", ["frozenlake"]))
  config.envs.names = ["always_crashes"]
  config.envs.difficulty = {}
  config.eval.episodes_per_env = 2
  config.train.steps = 1
  with pytest.raises(EnvironmentFailure, match="RuntimeError: this game always crashes"):
    trainer.train(config, tmp_path / "run")   # main lets it through: a non-zero exit
  assert not (tmp_path / "run" / "results.md").exists()
  assert not (tmp_path / "run" / "summary.json").exists()
