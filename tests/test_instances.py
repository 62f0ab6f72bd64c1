"""Evaluation sets are instances as the agent sees them, and training never plays one
(rised_jax.evaluate, tasks).

The reference here is not the production key: a situation is the first observation `reset`
returns and the oracle's plan from there, compared as plain values. The production key
merges at least these (tests/envs/test_envs.py), so disjoint keys mean disjoint situations.
"""
from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from rised_jax import envs, evaluate, tasks
from rised_jax.types import Group, Task, Trajectory
from tests.helpers.run_fixtures import load_config_file

CONFIGS = Path(__file__).resolve().parent.parent / "experiments" / "configs"
# Every agentic config and difficulty the repository ships, with the run's training draws
# (paper scale: 300 steps x 128 groups, 6,400 tasks per env, slow).
CONFIG_ARGS = [pytest.param("rised_qwen3_multienv.py", "rised,4b", marks=pytest.mark.slow),
               ("rised_qwen3_multienv.py", "rised,4b,local"), ("smollm2_cpu.py", "rised"),
               ("tiny_cpu.py", "rised"), ("tiny_cpu.py", "rised,easy")]
EASY_MAZE = dict(width=3, height=3, min_distance=1, max_turns=2)   # tiny_cpu.py:easy


_ENVS: dict[tuple, envs.Environment] = {}


def _env(task: Task) -> envs.Environment:
  knobs = (task.env, repr(sorted(task.difficulty.items())))
  if knobs not in _ENVS:
    _ENVS[knobs] = envs.make(task.env, **task.difficulty)
  return _ENVS[knobs]


def _game(task: Task) -> tuple:
  """The generated game itself (not its digest): `_instance()` after a reset of our own."""
  env = _env(task)
  env.reset(task.seed)
  return env._instance()


def _situation(task: Task) -> tuple[str, tuple[str, ...]]:
  """What the agent sees of the task: (first observation, the oracle's plan from there)."""
  env = _env(task)
  observation = env.reset(task.seed)
  return observation, tuple(env.oracle())


def _held_out_and_stream(config):
  difficulty = config.envs.difficulty.to_dict()
  held_out = evaluate.eval_tasks(config.envs.names, difficulty, config.eval.episodes_per_env,
                                 config.eval.seed_offset)
  stream = tasks.TaskStream(config.envs.names, difficulty, seed=config.seed,
                            eval_seed_offset=config.eval.seed_offset,
                            exclude=evaluate.instance_keys(held_out))
  return held_out, stream


@pytest.mark.parametrize("name, arg", CONFIG_ARGS)
def test_training_stream_never_plays_an_evaluation_instance(name, arg):
  """At paper scale and at every shipped config (the main job smollm2_cpu.py included: 8
  distinct held-out situations per env), zero evaluation situations or games in training;
  without the skip, the paper-scale stream shares Wordle 64/64, Countdown 46/64, Maze 34/64,
  Sokoban 32/64 games (issue 14), and skipping games only, 63/64 Maze situations (issue 21)."""
  config = load_config_file(CONFIGS / name, arg)
  held_out, stream = _held_out_and_stream(config)
  drawn = stream.next(config.train.steps * config.select.pool_groups)
  for env in config.envs.names:
    eval_situations = [_situation(t) for t in held_out if t.env == env]
    train_situations = {_situation(t) for t in drawn if t.env == env}
    assert len(set(eval_situations)) == len(eval_situations) == config.eval.episodes_per_env, env
    assert not set(eval_situations) & train_situations, env
    assert not {_game(t) for t in held_out if t.env == env} & {_game(t) for t in drawn
                                                              if t.env == env}, env
    assert all(t.seed < config.eval.seed_offset for t in drawn if t.env == env)
  if arg == "rised,4b":
    assert {env: sum(t.env == env for t in drawn) for env in config.envs.names} == {
        env: 6400 for env in config.envs.names}


def test_no_maze_evaluation_situation_is_trained_on_at_paper_scale():
  """Issue 21: Maze's view is egocentric, so layouts start alike; skipping held-out layouts
  left 63 of 64 paper-scale evaluation situations in training. The maze stream alone draws the
  maze seeds of the full stream (each env has its own seed index): its 6,400 tasks are the
  maze share of 300 steps x 128 groups over six environments."""
  config = load_config_file(CONFIGS / "rised_qwen3_multienv.py", "rised,4b")
  difficulty = config.envs.difficulty.to_dict()
  draws = config.train.steps * config.select.pool_groups // len(config.envs.names)
  held_out = evaluate.eval_tasks(["maze"], difficulty, config.eval.episodes_per_env,
                                 config.eval.seed_offset)
  situations = [_situation(t) for t in held_out]
  assert len(set(situations)) == len(held_out) == 64
  for task, (_, plan) in zip(held_out, situations):   # the plan is one: it wins
    env = envs.make("maze", **task.difficulty)
    env.reset(task.seed)
    for action in plan:
      env.step(envs.format_answer(action))
    assert env.success and env.turn == len(plan)

  def trained_on(exclude):
    stream = tasks.TaskStream(["maze"], difficulty, seed=config.seed,
                              eval_seed_offset=config.eval.seed_offset, exclude=exclude)
    trained = {_situation(t) for t in stream.next(draws)}
    return sum(s in trained for s in situations)

  assert trained_on(evaluate.instance_keys(held_out)) == 0
  # Skipping the held-out layouts instead (the digest of `_instance()`, the key before).
  layouts = {"maze": {f"maze:{_game(t)!r}" for t in held_out}}
  layout_keys = lambda name, seed, knobs: f"maze:{_game(Task(name, seed, knobs))!r}"
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(tasks.envs, "instance_key", layout_keys)
    assert trained_on(layouts) >= 48


def test_tiny_easy_holds_out_12_of_its_25_situations():
  """tiny_cpu.py:easy's docstring: 3x3 mazes one step from the exit are 25 situations; 12
  held out, whose winning first moves are forward 6, turn right 4, turn left 2, so a blind
  policy (one action sequence for all) wins 6 of the 12. 26 are refused."""
  config = load_config_file(CONFIGS / "tiny_cpu.py", "rised,easy")
  assert config.envs.difficulty.maze.to_dict() == EASY_MAZE
  every = {_situation(Task("maze", seed, EASY_MAZE)) for seed in range(20_000)}
  assert len(every) == 25
  held_out = evaluate.eval_tasks(["maze"], {"maze": EASY_MAZE}, config.eval.episodes_per_env,
                                 config.eval.seed_offset)
  plans = [_situation(t)[1] for t in held_out]
  assert len(held_out) == 12 and len(set(map(_situation, held_out))) == 12
  assert sorted(plan[0] for plan in plans) == ["forward"] * 6 + ["turn left"] * 2 + [
      "turn right"] * 4

  def wins(sequence):
    won = 0
    for task in held_out:
      env = envs.make("maze", **EASY_MAZE)
      env.reset(task.seed)
      for action in sequence:
        if not env.done:
          env.step(envs.format_answer(action))
      won += env.success
    return won

  moves = ("forward", "turn left", "turn right")
  assert max(wins(s) for s in itertools.product(moves, repeat=2)) == 6
  with pytest.raises(ValueError, match=r"maze .* only 25 distinct instances"):
    evaluate.eval_instances("maze", EASY_MAZE, 26, config.eval.seed_offset)


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


def _group(env: str, successes: list[bool], seed: int, difficulty=None) -> Group:
  task = Task(env, seed, dict(difficulty or {}))
  return Group(task, [Trajectory(task, [], [], [], 0, [], s, float(s)) for s in successes])


def test_pass_at_k_counts_instances_solved_at_least_once():
  groups = [_group("maze", [False, True, False], 1), _group("maze", [False, False, False], 2),
            _group("maze", [True, True, True], 3), _group("sokoban", [False, False, True], 1)]
  assert len({_situation(g.task) for g in groups[:3]}) == 3
  results = evaluate.pass_rates(groups)
  assert results["maze"]["pass_rate"] == pytest.approx(2 / 3)
  assert results["maze"]["episodes"] == results["maze"]["tasks"] == 3
  assert results["sokoban"]["episodes"] == 1 and results["sokoban"]["pass_rate"] == 1.0
  assert evaluate.check_sampling(4, 0.7) == 4
  with pytest.raises(ValueError, match="pass_at_k=4 with config.eval.temperature=0.0"):
    evaluate.check_sampling(4, 0.0)


def _wilson(wins: int, n: int, z: float = 1.96) -> tuple[float, float]:
  """The Wilson score interval by its formula."""
  p = wins / n
  centre, spread = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
  return (centre - spread) / (1 + z * z / n), (centre + spread) / (1 + z * z / n)


def test_pass_rates_count_each_situation_once():
  """Tasks that repeat a situation under other seeds (two layouts of one situation of the
  easy maze) are one observation of the interval: solved only if both are."""
  first = evaluate.eval_instances("maze", EASY_MAZE, 3, 0)
  twin = next(seed for seed in range(1, 5000)
              if _situation(Task("maze", seed, EASY_MAZE)) == _situation(first[0])
              and _game(Task("maze", seed, EASY_MAZE)) != _game(first[0]))
  groups = [_group("maze", [True], first[0].seed, EASY_MAZE),
            _group("maze", [False], twin, EASY_MAZE),
            _group("maze", [True], first[1].seed, EASY_MAZE),
            _group("maze", [False], first[2].seed, EASY_MAZE)]
  result = evaluate.pass_rates(groups)["maze"]
  assert result["episodes"] == 3 and result["tasks"] == 4
  assert result["pass_rate"] == pytest.approx(1 / 3)
  assert (result["ci_low"], result["ci_high"]) == pytest.approx(_wilson(1, 3))


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
    env = envs.make(record["env"], **pipeline.configs.envs.difficulty[record["env"]])
    env.reset(record["seed"])
    assert env.instance_key() == record["instance"]
    for action in record["actions"]:
      env.step(action)
    assert env.success == record["success"] and record["turns"] == len(record["actions"])
    assert "valid_syntax" in record["tags"]
  assert 0 < sum(r["success"] for r in logged) < len(logged)
