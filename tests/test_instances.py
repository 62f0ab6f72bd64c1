"""Evaluation sets are instances, and training never plays one (rised_jax.evaluate, tasks)."""
from __future__ import annotations

from pathlib import Path

import pytest

from rised_jax import envs, evaluate, tasks
from rised_jax.types import Group, Task, Trajectory
from tests.helpers.run_fixtures import load_config_file

CONFIGS = Path(__file__).resolve().parent.parent / "experiments" / "configs"
# Every agentic config and difficulty the repository ships, with the run's training draws.
CONFIG_ARGS = [("rised_qwen3_multienv.py", "rised,4b"),
               ("rised_qwen3_multienv.py", "rised,4b,local"), ("smollm2_cpu.py", "rised"),
               ("tiny_cpu.py", "rised"), ("tiny_cpu.py", "rised,easy")]


_ENVS: dict[tuple, envs.Environment] = {}


def _game(task: Task) -> tuple:
  """The generated game itself (not its digest): `_instance()` after a reset of our own."""
  knobs = (task.env, repr(sorted(task.difficulty.items())))
  if knobs not in _ENVS:
    _ENVS[knobs] = envs.make(task.env, **task.difficulty)
  _ENVS[knobs].reset(task.seed)
  return _ENVS[knobs]._instance()


def _held_out_and_stream(config):
  difficulty = config.envs.difficulty.to_dict()
  held_out = evaluate.eval_tasks(config.envs.names, difficulty, config.eval.episodes_per_env,
                                 config.eval.seed_offset)
  stream = tasks.TaskStream(config.envs.names, difficulty, seed=config.seed,
                            eval_seed_offset=config.eval.seed_offset,
                            exclude=evaluate.instance_keys(held_out))
  return held_out, stream


@pytest.mark.slow
@pytest.mark.parametrize("name, arg", CONFIG_ARGS)
def test_training_stream_never_plays_an_evaluation_instance(name, arg):
  """At paper scale (300 steps x 128 groups: 6,400 tasks per env) and at every shipped config,
  zero evaluation instances in training; without the skip, the same stream shares Wordle 64/64,
  Countdown 46/64, Maze 34/64, Sokoban 32/64 (issue 14)."""
  config = load_config_file(CONFIGS / name, arg)
  held_out, stream = _held_out_and_stream(config)
  drawn = stream.next(config.train.steps * config.select.pool_groups)
  for env in config.envs.names:
    eval_games = [_game(t) for t in held_out if t.env == env]
    train_games = {_game(t) for t in drawn if t.env == env}
    assert len(set(eval_games)) == len(eval_games) == config.eval.episodes_per_env, env
    assert not set(eval_games) & train_games, env
    assert all(t.seed < config.eval.seed_offset for t in drawn if t.env == env)
  if arg == "rised,4b":
    assert {env: sum(t.env == env for t in drawn) for env in config.envs.names} == {
        env: 6400 for env in config.envs.names}


@pytest.mark.slow
def test_paper_scale_stream_without_the_skip_replays_evaluation_instances():
  """The failure the skip removes: seeds are disjoint, instances are not (Wordle: every
  evaluation secret is a training secret within 6,400 seeds)."""
  config = load_config_file(CONFIGS / "rised_qwen3_multienv.py", "rised,4b")
  held_out = evaluate.eval_instances("wordle", {}, 64, config.eval.seed_offset)
  plain = tasks.TaskStream(["wordle"], {}, eval_seed_offset=config.eval.seed_offset)
  secrets = {_game(t) for t in plain.next(6400)}
  assert sum(_game(t) in secrets for t in held_out) == 64


def test_evaluation_set_is_the_first_distinct_instances_and_refuses_a_tiny_space():
  small = dict(size=2, holes=0, min_distance=1, max_turns=1)   # exactly 8 games
  chosen = evaluate.eval_instances("frozenlake", small, 8, 1000)
  seen, expected = set(), []
  for seed in range(1000, 1200):
    game = _game(Task("frozenlake", seed, small))
    if game not in seen:
      seen.add(game)
      expected.append(seed)
  assert [t.seed for t in chosen] == expected[:8]
  with pytest.raises(ValueError, match=r"frozenlake .* only 8 distinct instances"):
    evaluate.eval_instances("frozenlake", small, 9, 1000)


def test_stream_skips_held_out_instances_warns_on_repeats_and_resumes_exactly():
  small = {"frozenlake": dict(size=2, holes=0, min_distance=1, max_turns=1)}
  held_out = evaluate.eval_tasks(["frozenlake"], small, 5, 10_000)
  exclude = evaluate.instance_keys(held_out)
  stream = tasks.TaskStream(["frozenlake"], small, seed=3, exclude=exclude)
  (message,) = tasks.repeat_warnings(stream, 20)
  assert "next 20 training tasks hold only 3 distinct instances" in message
  assert stream.cursor == 0 and set(stream.next_index.values()) == {0}   # the preview is a copy
  first = stream.next(7)
  assert {_game(t) for t in first} <= {_game(Task("frozenlake", s, small["frozenlake"]))
                                       for s in range(300)} - {_game(t) for t in held_out}
  resumed = tasks.TaskStream(["frozenlake"], small, seed=3, exclude=exclude)
  resumed.load_state_dict(stream.state_dict())
  assert resumed.next(9) == stream.next(9)
  with pytest.raises(ValueError, match="next_index"):
    resumed.load_state_dict({"cursor": 4})
  everything = evaluate.instance_keys(evaluate.eval_tasks(["frozenlake"], small, 8, 10_000))
  with pytest.raises(ValueError, match="held-out instances"):
    tasks.TaskStream(["frozenlake"], small, exclude=everything).next(1)
  large = {"frozenlake": dict(size=5, holes=3)}
  assert tasks.repeat_warnings(tasks.TaskStream(["frozenlake"], large), 50) == []


def _group(env: str, successes: list[bool]) -> Group:
  task = Task(env, len(successes))
  return Group(task, [Trajectory(task, [], [], [], 0, [], s, float(s)) for s in successes])


def test_pass_at_k_counts_instances_solved_at_least_once():
  groups = [_group("maze", [False, True, False]), _group("maze", [False, False, False]),
            _group("maze", [True, True, True]), _group("sokoban", [False, False, True])]
  results = evaluate.pass_rates(groups)
  assert results["maze"]["pass_rate"] == pytest.approx(2 / 3)
  assert results["maze"]["episodes"] == 3 and results["sokoban"]["episodes"] == 1
  assert results["sokoban"]["pass_rate"] == 1.0
  assert evaluate.check_sampling(4, 0.7) == 4
  with pytest.raises(ValueError, match="pass_at_k=4 with config.eval.temperature=0.0"):
    evaluate.check_sampling(4, 0.0)


def test_evaluation_records_replay_to_the_logged_pass_rate(tmp_path):
  """eval_episodes.jsonl: one record per held-out instance; replaying its actions on a fresh
  environment gives its success, and the successes add up to eval.jsonl's pass rate."""
  from rised_jax import runlog
  from tests.helpers.run_fixtures import frozenlake_pipeline as _pipeline
  pipeline, _, _ = _pipeline("right")
  results = pipeline.evaluate()
  records = pipeline.eval_episodes
  with runlog.RunLog(tmp_path) as log:
    log.evaluation(0, results)
    log.eval_episodes(0, records)
    log.eval_episodes(5, records)
    log.rewind(3)
  logged = runlog.read_jsonl(tmp_path / "eval_episodes.jsonl")
  assert [r["step"] for r in logged] == [0] * len(records)
  assert len(runlog.read_jsonl(tmp_path / "eval_episodes.discarded.jsonl")) == len(records)
  (row,) = runlog.read_jsonl(tmp_path / "eval.jsonl")
  assert len({r["instance"] for r in logged}) == len(logged) == row["episodes"]
  assert sum(r["success"] for r in logged) == round(row["pass_rate"] * row["episodes"])
  for record in logged:
    env = envs.make(record["env"], **pipeline.config.envs.difficulty[record["env"]])
    env.reset(record["seed"])
    assert env.instance_key() == record["instance"]
    for action in record["actions"]:
      env.step(action)
    assert env.success == record["success"] and record["turns"] == len(record["actions"])
    assert "valid_syntax" in record["tags"]
  assert 0 < sum(r["success"] for r in logged) < len(logged)
