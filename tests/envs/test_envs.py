"""Tests of the built-in text environments (rised_jax.envs): oracles, random baselines,
determinism, robustness to garbage replies, events in hand-built situations, and parsing."""
from __future__ import annotations

import copy
import itertools
import random
import re

import pytest

from rised_jax import envs
from rised_jax.envs import countdown, frozenlake, household, maze, parsing, sokoban, wordle
from rised_jax.types import Event

ENV_NAMES = ["countdown", "frozenlake", "household", "maze", "sokoban", "wordle"]
SEEDS = range(200)
EVENT_VALUES = {event.value for event in Event}
answer = parsing.format_answer


def play(env: envs.Environment, actions: list[str]) -> list[tuple]:
  """Steps every action (wrapped in <answer> tags) until the episode ends; returns the trace."""
  trace = []
  for action in actions:
    trace.append(env.step(answer(action)))
    if env.done:
      break
  return trace


def events_of(info: dict) -> set[str]:
  return set(info["events"])


# ---- registry and configuration ------------------------------------------------------------


def test_registry_lists_the_six_environments():
  assert envs.names() == ENV_NAMES
  for name in ENV_NAMES:
    env = envs.make(name)
    assert env.name == name
    assert "<answer>" in env.system_prompt and str(env.max_turns) in env.system_prompt


def test_make_rejects_unknown_names_and_keys_with_the_valid_ones():
  with pytest.raises(ValueError, match=r"^config\.envs\.names: unknown environment 'chess'; "
                     r"known: \[.*'countdown'.*'wordle'\]; or an entry point"):
    envs.make("chess")
  with pytest.raises(ValueError, match=r"sokoban: unknown difficulty key\(s\) \['colour'\]; "
                                       r"valid keys: \[.*'boxes'.*'width'\]"):
    envs.make("sokoban", colour="red")
  assert envs.difficulty_keys("frozenlake") == ["holes", "max_turns", "min_distance", "shaping",
                                                "size", "slip"]


@pytest.mark.parametrize("name, difficulty, message", [
    ("sokoban", {"boxes": 0}, r"sokoban: boxes must be an integer in \[1, 3\], got 0"),
    ("sokoban", {"width": "6"}, r"sokoban: width must be an integer in \[4, 10\], got '6'"),
    ("sokoban", {"max_turns": 3}, r"sokoban: min_moves must be an integer in \[1, 3\], got 4"),
    ("frozenlake", {"slip": 1.5}, r"frozenlake: slip must be a number in \[0.0, 0.9\], got 1.5"),
    ("frozenlake", {"holes": True}, r"frozenlake: holes must be an integer .*got True"),
    ("countdown", {"numbers": 9}, r"countdown: numbers must be an integer in \[2, 5\], got 9"),
    ("maze", {"max_turns": 0}, r"maze: max_turns must be an integer in \[1, 1000\], got 0"),
    ("household", {"goals": 4}, r"household: goals must be an integer in \[1, 3\], got 4"),
    ("wordle", {"word_file": "/nonexistent/words.txt"}, r"wordle: cannot read word_file"),
    ("maze", {"shaping": -1}, r"maze: shaping must be a number in \[0.0, 1.0\], got -1"),
])
def test_bad_difficulty_values_name_the_key_and_the_expected_range(name, difficulty, message):
  with pytest.raises(ValueError, match=message):
    envs.make(name, **difficulty)


def test_bad_seed_and_misuse_of_the_protocol():
  env = envs.make("maze")
  with pytest.raises(ValueError, match=r"maze: seed must be an integer, got '3'"):
    env.reset("3")
  with pytest.raises(RuntimeError, match="call reset"):
    env.step("<answer>forward</answer>")


def test_word_file_errors_name_the_file_and_line(tmp_path):
  path = tmp_path / "words.txt"
  path.write_text("# comment\ncrane\nslate\nHello\n")
  with pytest.raises(ValueError, match=r"words.txt line 4: expected a lowercase five-letter "
                                       r"word \(a-z\), got 'Hello'"):
    envs.make("wordle", word_file=str(path))
  path.write_text("crane\nslate\ncrane\n")
  with pytest.raises(ValueError, match=r"line 3: duplicate word 'crane'"):
    envs.make("wordle", word_file=str(path))


# ---- oracle, random policy, determinism ------------------------------------------------------


@pytest.mark.parametrize("name", ENV_NAMES)
def test_oracle_solves_every_seed(name):
  """The plan made at reset, played through the real parsing path, wins within max_turns."""
  env = envs.make(name)
  for seed in SEEDS:
    env.reset(seed)
    plan = env.oracle()
    assert 1 <= len(plan) <= env.max_turns, (name, seed, plan)
    trace = play(env, plan)
    assert len(trace) == len(plan), (name, seed, "ended before the plan did")
    _, reward, done, info = trace[-1]
    assert done and info["success"] and reward == 1.0, (name, seed, trace[-1])
    assert Event.SUCCESS.value in info["events"]
    assert not any(step_info["invalid"] for *_, step_info in trace), (name, seed)
    assert env.oracle() == []


@pytest.mark.parametrize("name", ENV_NAMES)
def test_oracle_replans_from_any_state(name):
  """After a few random actions, a fresh oracle plan still wins (when the game is not lost)."""
  env = envs.make(name)
  rng = random.Random(7)
  solved = 0
  for seed in range(60):
    env.reset(seed)
    for _ in range(2):
      if not env.done:
        env.step(answer(rng.choice(env.action_space())))
    if env.done:
      continue
    plan = env.oracle()
    if len(plan) > env.max_turns - env.turn:
      continue  # a correct plan that no longer fits the turn budget
    play(env, plan)
    assert env.success, (name, seed, plan)
    solved += 1
  assert solved >= 15, (name, solved)


@pytest.mark.parametrize("name", ENV_NAMES)
def test_uniform_random_policy_rarely_succeeds(name):
  env = envs.make(name)
  rng = random.Random(1234)
  wins = 0
  for seed in SEEDS:
    env.reset(seed)
    while not env.done:
      _, _, _, info = env.step(answer(rng.choice(env.action_space())))
      assert events_of(info) <= EVENT_VALUES
      assert not info["invalid"] or name == "countdown"  # only countdown's space has illegal ops
    wins += env.success
  assert wins <= 0.10 * len(SEEDS), (name, wins)


@pytest.mark.parametrize("name, difficulty", [(name, {}) for name in ENV_NAMES] +
                         [("frozenlake", {"slip": 0.3})])
def test_same_seed_gives_the_same_episode(name, difficulty):
  first, second = envs.make(name, **difficulty), envs.make(name, **difficulty)
  for seed in range(20):
    assert first.reset(seed) == second.reset(seed)
    assert first.oracle() == second.oracle()
    rng_a, rng_b = random.Random(seed), random.Random(seed)
    while not first.done:
      step_a = first.step(answer(rng_a.choice(first.action_space())))
      step_b = second.step(answer(rng_b.choice(second.action_space())))
      assert step_a == step_b
      assert first.oracle() == second.oracle()
    assert second.done


@pytest.mark.parametrize("name, min_distinct", [
    ("countdown", 190), ("frozenlake", 195), ("household", 195), ("maze", 150), ("sokoban", 190),
    # 200 draws from 619 secrets: about 619 * (1 - exp(-200 / 619)) ≈ 171 distinct are expected.
    ("wordle", 150)])
def test_different_seeds_give_different_episodes(name, min_distinct):
  env = envs.make(name)
  episodes = set()
  for seed in SEEDS:
    observation = env.reset(seed)
    episodes.add((observation, tuple(env.oracle())))
  assert len(episodes) >= min_distinct, (name, len(episodes))
  first = (env.reset(0), env.oracle())
  assert first != (env.reset(1), env.oracle())


# ---- garbage replies, turn budget -----------------------------------------------------------


def garbage_replies() -> list:
  """A fixed fuzz corpus: empty, whitespace, None-like, numbers, tag soup, huge, unicode."""
  rng = random.Random(2024)
  ranges = [(0x0400, 0x04FF), (0x0590, 0x05FF), (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF),
            (0x0300, 0x036F), (0x2000, 0x206F)]
  random_unicode = []
  for _ in range(12):
    low, high = rng.choice(ranges)
    random_unicode.append("".join(chr(rng.randint(low, high)) for _ in range(rng.randint(6, 60))))
  return [
      "", " ", "\n\t\n", "None", "null", "NaN", "undefined", "0", "-1", "3.14159", "1e309",
      "12345678901234567890", "<answer></answer>", "<answer> </answer>",
      "<answer><answer></answer></answer>", "</answer><answer>", "<answer>" * 500,
      "a" * 100_000, "<answer>" + "x" * 50_000 + "</answer>", "\x00\x01\x02\x7f",
      "\u202e\u200b\ufeff", "{'action': 42}", "[1, 2, 3]", "<answer>42</answer>",
      "<Answer>???</ANSWER>", "<answer>move the thing somewhere nice</answer>",
      None, 12345, 3.5, b"\xff\xfe\xfd",
  ] + random_unicode


@pytest.mark.parametrize("name", ENV_NAMES)
def test_garbage_replies_never_raise_and_cost_a_turn(name):
  env = envs.make(name)
  for reply in garbage_replies():
    start = env.reset(5)
    observation, reward, done, info = env.step(reply)
    assert info["invalid"] and reward == 0.0 and not done and env.turn == info["turn"] == 1
    assert events_of(info) & {Event.INVALID_ACTION.value, Event.UNKNOWN_OBJECT.value}
    assert info["action"] is None and not info["success"]
    assert "Invalid action" in observation and f"Turns left: {env.max_turns - 1}." in observation
    assert len(observation) <= len(start) + 200  # the reply is quoted in short, never in full
    assert env.oracle(), "a rejected reply leaves the game winnable"


@pytest.mark.parametrize("name", ENV_NAMES)
def test_max_turns_ends_the_episode_as_failure(name):
  env = envs.make(name)
  env.reset(11)
  for turn in range(1, env.max_turns + 1):
    observation, reward, done, info = env.step(f"<answer>not an action {turn}</answer>")
    assert done == (turn == env.max_turns) and info["truncated"] == done
  assert reward == 0.0 and not info["success"] and not env.success
  assert "Out of turns" in observation
  assert env.oracle() == []
  with pytest.raises(RuntimeError, match="episode is over"):
    env.step(answer(env.action_space()[0]))


@pytest.mark.parametrize("name", ENV_NAMES)
def test_give_up_ends_the_episode(name):
  env = envs.make(name)
  env.reset(3)
  _, reward, done, info = env.step("<answer>I give up</answer>")
  assert done and reward == 0.0 and info["failed"] and not info["truncated"]
  assert info["events"] == [Event.GAVE_UP.value] and info["action"] == "give up"


@pytest.mark.parametrize("name", ENV_NAMES)
def test_action_space_round_trips_and_observations_stay_short(name):
  env = envs.make(name)
  for seed in range(10):
    observation = env.reset(seed)
    assert len(observation) < 700, observation
    for action in env.action_space():
      assert env.read_action(answer(action)) == action
      assert env.read_action(f"Let me think.\n{action.upper()}") == action  # bare-line fallback
  assert len(env.system_prompt) < 800


# ---- Sokoban ---------------------------------------------------------------------------------


def sokoban_from_rows(rows: list[str]) -> sokoban.Sokoban:
  """A Sokoban episode set to a hand-drawn map (symbols of the system prompt)."""
  env = envs.make("sokoban")
  env.reset(0)
  cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
  env.height, env.width = len(rows), len(rows[0])
  env.walls = frozenset(cell for cell, ch in cells.items() if ch == "#")
  env.targets = frozenset(cell for cell, ch in cells.items() if ch in ".*+")
  env.boxes = frozenset(cell for cell, ch in cells.items() if ch in "$*")
  env.player = next(cell for cell, ch in cells.items() if ch in "@+")
  return env


def test_sokoban_wall_bump_is_no_effect_and_its_retry_is_repeated():
  env = sokoban_from_rows(["#####",
                           "#@$.#",
                           "#####"])
  _, _, done, info = env.step("<answer>up</answer>")
  assert info["events"] == [Event.NO_EFFECT.value] and not info["invalid"] and not done
  _, _, _, info = env.step("<answer>north</answer>")
  assert info["events"] == [Event.NO_EFFECT.value, Event.REPEATED_ACTION.value]
  observation, reward, done, info = env.step("<answer>right</answer>")
  assert info["events"] == [Event.PROGRESS.value, Event.SUCCESS.value]
  assert done and reward == 1.0 and "#_@*#" in observation


def test_sokoban_push_off_target_is_regress_and_pushing_into_a_box_is_no_effect():
  env = sokoban_from_rows(["#######",
                           "#_@*$_#",
                           "#_____#",
                           "#.____#",
                           "#######"])
  _, _, _, info = env.step(answer("right"))
  assert info["events"] == [Event.NO_EFFECT.value]  # box behind box
  env = sokoban_from_rows(["#######",
                           "#_@*__#",
                           "#_____#",
                           "#######"])
  _, _, done, info = env.step(answer("right"))
  assert info["events"] == [Event.REGRESS.value] and not done
  # Walk round and push it back: down, right, right, up, left.
  assert env.oracle() == ["down", "right", "right", "up", "left"]
  trace = play(env, env.oracle())
  assert trace[-1][3]["events"] == [Event.PROGRESS.value, Event.SUCCESS.value]


def test_sokoban_dead_corner_and_wall_deadlock_are_irreversible():
  env = sokoban_from_rows(["#####",
                           "#_$@#",
                           "#.__#",
                           "#####"])
  observation, reward, done, info = env.step(answer("left"))
  assert done and reward == 0.0 and info["failed"] and not info["truncated"]
  assert info["events"] == [Event.IRREVERSIBLE_FAILURE.value] and "corner" in observation
  env = sokoban_from_rows(["#######",
                           "#_____#",
                           "#__$__#",
                           "#__@__#",
                           "#.____#",
                           "#######"])
  observation, _, done, info = env.step(answer("up"))  # against the top wall, no target there
  assert done and info["events"] == [Event.IRREVERSIBLE_FAILURE.value] and "stuck" in observation
  assert sokoban.in_dead_corner((1, 1), env.walls) and not sokoban.in_dead_corner((1, 3), env.walls)


def test_sokoban_solver_is_shortest_on_hand_worked_rooms():
  walls = frozenset((r, c) for r in range(5) for c in range(6) if r in (0, 4) or c in (0, 5))
  target = frozenset({(1, 2)})
  assert sokoban.solve(walls, target, (3, 2), frozenset({(2, 2)})) == ["up"]
  assert sokoban.solve(walls, target, (3, 1), frozenset({(2, 2)})) == ["right", "up"]
  # A box on the top wall moves only along it: walk to (1,4) (3 moves), push left twice.
  plan = sokoban.solve(walls, frozenset({(1, 1)}), (3, 3), frozenset({(1, 3)}))
  assert len(plan) == 5 and plan[-2:] == ["left", "left"]
  # A box in a corner off target cannot be solved.
  assert sokoban.solve(walls, frozenset({(2, 2)}), (3, 3), frozenset({(1, 1)})) is None


def test_sokoban_generator_pulls_boxes_off_targets():
  env = envs.make("sokoban", boxes=2, width=7, height=7, walls=2, min_moves=6, max_moves=14,
                  max_turns=30)
  for seed in range(10):
    env.reset(seed)
    assert len(env.boxes) == len(env.targets) == 2 and not env.boxes <= env.targets
    assert len(env.walls) == 2 * 7 + 2 * 5 + 2
    assert 6 <= len(env.oracle()) <= 14
    play(env, env.oracle())
    assert env.success


# ---- FrozenLake ------------------------------------------------------------------------------


def frozenlake_map(size: int, holes: set, start: tuple, goal: tuple) -> frozenlake.FrozenLake:
  env = envs.make("frozenlake")
  env.reset(0)
  env.size, env.holes, env.start, env.goal, env.player = size, frozenset(holes), start, goal, start
  env.dist = frozenlake.distances_to(goal, size, env.holes)
  return env


def test_frozenlake_hole_is_irreversible_and_moves_report_progress():
  # S F F
  # F H F
  # F F G
  env = frozenlake_map(3, {(1, 1)}, (0, 0), (2, 2))
  assert env.dist == {(2, 2): 0, (1, 2): 1, (2, 1): 1, (0, 2): 2, (2, 0): 2, (0, 1): 3,
                      (1, 0): 3, (0, 0): 4}
  _, _, _, info = env.step(answer("left"))
  assert info["events"] == [Event.NO_EFFECT.value]
  _, _, _, info = env.step(answer("down"))
  assert info["events"] == [Event.PROGRESS.value] and env.player == (1, 0)
  _, _, _, info = env.step(answer("up"))
  assert info["events"] == [Event.REGRESS.value]
  env.step(answer("down"))
  observation, reward, done, info = env.step(answer("right"))
  assert done and reward == 0.0 and info["failed"] and "hole" in observation
  assert info["events"] == [Event.IRREVERSIBLE_FAILURE.value]


def test_frozenlake_oracle_is_a_shortest_path():
  env = envs.make("frozenlake")
  for seed in range(50):
    env.reset(seed)
    # Independent shortest distance: Bellman-Ford style relaxation over the grid.
    inf = 10**9
    dist = {(r, c): inf for r in range(env.size) for c in range(env.size)}
    dist[env.goal] = 0
    for _ in range(env.size * env.size):
      for (r, c) in dist:
        if (r, c) in env.holes or (r, c) == env.goal:
          continue
        near = [dist[n] for n in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)) if n in dist]
        dist[(r, c)] = min(dist[(r, c)], 1 + min(near))
    assert len(env.oracle()) == dist[env.start] >= env.min_distance


def test_frozenlake_with_slip_replans_each_step():
  env = envs.make("frozenlake", slip=0.3)
  wins = slips = 0
  for seed in SEEDS:
    env.reset(seed)
    while not env.done:
      plan = env.oracle()
      # The plan is right from the current state: it wins on a copy without slip (and without
      # a turn limit, since slips may have used up the turns it needs).
      steady = copy.deepcopy(env)
      steady.slip, steady.max_turns = 0.0, 1000
      play(steady, plan)
      assert steady.success
      observation, _, _, _ = env.step(answer(plan[0]))
      slips += "slip" in observation
    wins += env.success
  assert slips > 50 and 0.3 * len(SEEDS) < wins < len(SEEDS), (slips, wins)


# ---- Countdown -------------------------------------------------------------------------------


def reference_min_operations(numbers: list[int], target: int) -> int | None:
  """Level-by-level enumeration of every reachable multiset (independent of the game's search)."""
  level = {tuple(sorted(numbers))}
  for depth in range(len(numbers)):
    if any(target in state for state in level):
      return depth
    following = set()
    for state in level:
      for i, j in itertools.permutations(range(len(state)), 2):
        a, b = state[i], state[j]
        rest = [n for k, n in enumerate(state) if k not in (i, j)]
        for result in (a + b, a * b, a - b, a // b if a % b == 0 else 0):
          if result > 0:
            following.add(tuple(sorted(rest + [result])))
    level = following
  return None


def test_countdown_search_matches_an_independent_enumeration():
  rng = random.Random(3)
  for _ in range(150):
    numbers = [rng.randint(1, 12) for _ in range(rng.randint(2, 4))]
    target = rng.randint(1, 80)
    expected = reference_min_operations(numbers, target)
    assert countdown.min_operations(tuple(sorted(numbers)), target) == expected
    plan = countdown.shortest_plan(tuple(numbers), target)
    if expected is None:
      assert plan is None
      continue
    assert len(plan) == expected
    pool = list(numbers)
    for a, op, b in plan:  # the plan is legal and ends on the target
      pool.remove(a)
      pool.remove(b)
      pool.append(countdown.apply_operator(a, op, b))
    assert target in pool


def test_countdown_events_on_a_hand_worked_instance():
  env = envs.make("countdown")
  env.reset(0)
  env.numbers, env.target = [2, 3, 5, 7], 25   # (2 + 3) * 5 = 25: two operations
  _, _, _, info = env.step(answer("9 + 9"))
  assert info["invalid"] and info["events"] == [Event.UNKNOWN_OBJECT.value]
  _, _, _, info = env.step(answer("5 * 5"))    # only one 5
  assert info["events"] == [Event.UNKNOWN_OBJECT.value]
  _, _, _, info = env.step(answer("5 / 2"))
  assert info["invalid"] and info["events"] == [Event.INVALID_ACTION.value]
  observation, _, _, info = env.step(answer("3 - 5"))
  assert info["events"] == [Event.INVALID_ACTION.value] and "a > b" in observation
  observation, _, _, info = env.step("I add them: <answer>2 + 3 = 5</answer>")
  assert info["events"] == [Event.PROGRESS.value] and "Numbers: 5, 7, 5." in observation
  observation, reward, done, info = env.step(answer("5 × 5"))
  assert done and reward == 1.0 and info["events"] == [Event.PROGRESS.value, Event.SUCCESS.value]
  env.reset(0)
  env.numbers, env.target = [2, 3, 5], 25
  observation, reward, done, info = env.step(answer("2 * 3"))   # 6 and 5 never make 25
  assert done and info["failed"] and info["events"] == [Event.IRREVERSIBLE_FAILURE.value]
  env.reset(0)
  env.numbers, env.target = [2, 3, 5, 4], 20   # 5 * 4 in one step
  _, _, done, info = env.step(answer("2 + 3"))  # 5, 5, 4: still one step (5 * 4)
  assert not done and info["events"] == []
  env.numbers, env.target = [2, 4, 5], 40       # 2 * 4 * 5: two steps
  _, _, done, info = env.step(answer("4 / 2"))  # 2, 5: 40 unreachable
  assert done and info["failed"]


def test_countdown_parses_common_notations():
  env = envs.make("countdown")
  env.reset(0)
  for reply, expected in [("3 × 4", "3 * 4"), ("3x4", "3 * 4"), ("3 times 4 = 12", "3 * 4"),
                          ("(8 ÷ 2)", "8 / 2"), ("8 divided by 2", "8 / 2"),
                          ("9 − 4", "9 - 4"), ("2 plus 2", "2 + 2"), ("**6*7**", "6 * 7")]:
    assert env.read_action(answer(reply)) == expected, reply
  for reply in ["3 + ", "+ 4", "3 + 4 + 5", "three plus four", "-3 + 4", "3 % 4"]:
    assert env.read_action(answer(reply)) is None, reply


# ---- Wordle ----------------------------------------------------------------------------------


@pytest.mark.parametrize("guess, secret, feedback", [
    ("crane", "crane", "GGGGG"),
    ("apple", "paper", "YYG-Y"),   # p at 2 green; a, the other p and e elsewhere
    ("speed", "abide", "--Y-Y"),   # only one e in the secret: the second e is '-'
    ("eerie", "there", "Y-Y-G"),   # last e green, one more e yellow, the middle e '-'
    ("lllll", "hello", "--GG-"),
])
def test_wordle_feedback_with_repeated_letters(guess, secret, feedback):
  assert wordle.score(guess, secret) == feedback


def test_wordle_word_list_is_valid_and_large():
  words = wordle.load_words()
  assert len(words) == len(set(words)) >= 500
  assert all(len(word) == 5 and word.isascii() and word.isalpha() for word in words)


def test_wordle_solver_wins_every_word_within_max_turns():
  words = wordle.load_words()
  solver = wordle.solver_for(words)
  max_turns = envs.make("wordle").max_turns
  for secret in words:
    guesses = solver.play(secret)
    assert guesses[-1] == secret and len(guesses) <= max_turns, (secret, guesses)
    for i, guess in enumerate(guesses):  # every guess agrees with all earlier feedback
      assert all(wordle.score(earlier, guess) == wordle.score(earlier, secret)
                 for earlier in guesses[:i])
    guesses.append("spoil")   # the memoised play hands out a copy: a caller cannot alter it
    assert solver.play(secret)[-1] == secret


def test_wordle_events_feedback_use_and_repeats():
  env = envs.make("wordle")
  env.reset(0)
  env.secret = "crane"
  observation, _, _, info = env.step(answer("slate"))
  assert info["events"] == [] and "slate: - - G - G" in observation
  assert "not in the word: l, s, t" in observation
  assert "stage" in env.words
  _, _, _, info = env.step(answer("stage"))   # slate vs stage is G-GYG, not --G-G: contradicts
  assert info["events"] == [Event.IGNORED_FEEDBACK.value]
  _, _, _, info = env.step(answer("xyzzy"))
  assert info["invalid"] and info["events"] == [Event.INVALID_ACTION.value]
  _, _, _, info = env.step(answer("slate"))
  assert info["events"] == [Event.REPEATED_ACTION.value, Event.IGNORED_FEEDBACK.value]
  _, reward, done, info = env.step("C R A N E")   # bare line, spaced letters
  assert done and reward == 1.0
  assert info["events"] == [Event.USED_FEEDBACK.value, Event.SUCCESS.value]


def test_wordle_oracle_from_a_state_after_bad_guesses():
  env = envs.make("wordle")
  env.reset(0)
  env.secret = "grape"
  play(env, ["slate", "stage"])
  plan = env.oracle()
  assert plan[-1] == "grape"
  for guess in plan:
    assert all(wordle.score(g, guess) == f for g, f in env.history)


# ---- Household -------------------------------------------------------------------------------


def test_household_walkthrough_events_and_planner():
  env = envs.make("household", max_turns=30)
  env.reset(0)
  env.world = household.World(
      rooms={"kitchen": ("fridge", "counter", "cabinet"), "bedroom": ("bed", "dresser", "desk")},
      location={"apple": "fridge", "book": "bed", "mug": "counter"}, opened=set(), room="bedroom")
  env.goals = [("apple", "desk")]
  assert env.oracle() == ["go to kitchen", "open fridge", "take apple", "go to bedroom",
                          "put apple on desk"]
  expected = [
      ("take banana", [Event.UNKNOWN_OBJECT.value], True),
      ("take apple", [Event.UNKNOWN_OBJECT.value], True),        # in the kitchen's fridge
      ("open fridge", [Event.UNKNOWN_OBJECT.value], True),       # not in this room
      ("open the dresser", [], False),
      ("open dresser", [Event.NO_EFFECT.value, Event.REPEATED_ACTION.value], False),
      ("take book", [Event.REGRESS.value], False),                # must now set it down first
      ("take mug", [Event.UNKNOWN_OBJECT.value], True),
      ("put book on bed", [Event.PROGRESS.value], False),
      ("go to kitchen", [Event.PROGRESS.value], False),
      ("take apple", [Event.UNKNOWN_OBJECT.value], True),        # hidden in the closed fridge
      ("open fridge", [Event.PROGRESS.value], False),
      ("put apple in fridge", [Event.NO_EFFECT.value], False),   # visible but not held
      ("pick up the apple", [Event.PROGRESS.value], False),
      ("take apple", [Event.NO_EFFECT.value, Event.REPEATED_ACTION.value], False),
      ("put pear in fridge", [Event.UNKNOWN_OBJECT.value], True),
      ("go to bedroom", [Event.PROGRESS.value], False),
  ]
  for command, events, invalid in expected:
    observation, _, done, info = env.step(answer(command))
    assert (info["events"], info["invalid"], done) == (events, invalid, False), command
  assert "Commands: look, inventory, go to kitchen, close dresser, put apple on bed, " \
         "put apple in dresser, put apple on desk." in observation
  observation, reward, done, info = env.step(answer("place apple onto the desk"))
  assert done and reward == 1.0 and info["action"] == "put apple on desk"


def test_household_admissible_commands_all_execute():
  env = envs.make("household", objects=6, goals=2)
  rng = random.Random(5)
  for seed in range(30):
    observation = env.reset(seed)
    while not env.done:
      commands = env.action_space()
      assert f"Commands: {', '.join(commands)}." in observation
      observation, _, _, info = env.step(answer(rng.choice(commands)))
      assert not info["invalid"] and Event.UNKNOWN_OBJECT.value not in info["events"]


def test_household_hides_the_contents_of_closed_receptacles():
  env = envs.make("household")
  env.reset(0)
  env.world = household.World(rooms={"kitchen": ("fridge", "counter")},
                              location={"apple": "fridge", "mug": "counter"}, opened=set(),
                              room="kitchen")
  env.goals = [("mug", "fridge")]
  observation, _, _, _ = env.step(answer("look"))
  assert "fridge (closed)" in observation and "apple" not in observation
  assert env.oracle() == ["take mug", "open fridge", "put mug in fridge"]
  env.step(answer("take mug"))
  observation, _, _, info = env.step(answer("put mug in fridge"))
  assert info["events"] == [Event.NO_EFFECT.value] and "The fridge is closed." in observation
  observation, _, _, _ = env.step(answer("open fridge"))
  assert "Inside: apple" in observation and "fridge (open: apple)" in observation
  assert env.oracle() == ["put mug in fridge"]
  _, reward, done, _ = env.step(answer("put the mug into the fridge"))
  assert done and reward == 1.0


# ---- Maze ------------------------------------------------------------------------------------


def test_maze_carves_perfect_mazes():
  for seed, (width, height) in enumerate([(3, 3), (4, 4), (5, 3), (2, 6)]):
    passages = maze.carve(width, height, random.Random(seed))
    edges = {frozenset({cell, (cell[0] + maze.HEADINGS[h][0], cell[1] + maze.HEADINGS[h][1])})
             for cell, headings in passages.items() for h in headings}
    assert len(edges) == width * height - 1           # a tree: cells - 1 passages …
    reached, frontier = {(0, 0)}, [(0, 0)]
    while frontier:
      cell = frontier.pop()
      for edge in edges:
        if cell in edge:
          (other,) = edge - {cell}
          if other not in reached:
            reached.add(other)
            frontier.append(other)
    assert len(reached) == width * height             # … that connects every cell


def test_maze_egocentric_view_and_events_in_a_corridor():
  env = envs.make("maze")
  env.reset(0)
  # A 1x3 corridor; start at the west end facing north, exit at the east end.
  env.passages = {(0, 0): {1}, (0, 1): {1, 3}, (0, 2): {3}}
  env.goal, env.state = (0, 2), ((0, 0), 0)
  assert env.oracle() == ["turn right", "forward", "forward"]
  _, _, _, info = env.step(answer("forward"))
  assert info["events"] == [Event.NO_EFFECT.value]
  observation, _, _, info = env.step(answer("turn left"))   # now facing west: 4 actions away
  assert info["events"] == [Event.REGRESS.value]
  assert "Ahead: wall. Left: wall. Right: wall. Behind: open. The exit is 2 behind" in observation
  _, _, _, info = env.step(answer("rotate right"))
  assert info["events"] == [Event.PROGRESS.value]
  observation, _, _, info = env.step(answer("right"))
  assert info["events"] == [Event.PROGRESS.value]
  assert "Ahead: open. Left: wall. Right: wall. Behind: wall. The exit is 2 ahead" in observation
  observation, _, _, _ = env.step(answer("go forward"))
  assert "Ahead: open. Left: wall. Right: wall. Behind: open. The exit is 1 ahead" in observation
  _, reward, done, info = env.step(answer("forward"))
  assert done and reward == 1.0 and info["events"] == [Event.PROGRESS.value, Event.SUCCESS.value]


def test_maze_goal_offset_is_egocentric():
  env = envs.make("maze")
  env.reset(0)
  env.passages = {(r, c): set() for r in range(3) for c in range(3)}
  env.goal = (0, 2)
  for heading, text in [(0, "2 ahead and 2 to your right"), (1, "2 ahead and 2 to your left"),
                        (2, "2 behind and 2 to your left"), (3, "2 behind and 2 to your right")]:
    env.state = ((2, 0), heading)
    observation, _, _, _ = env.step(answer("forward"))  # walled in: the view comes back as is
    assert f"The exit is {text} (as the crow flies)." in observation, heading


# ---- shaping and parsing ---------------------------------------------------------------------


def test_shaped_reward_counts_progress_and_regress():
  env = envs.make("frozenlake", shaping=0.1)
  env.reset(0)
  plan = env.oracle()
  _, reward, _, info = env.step(answer(plan[0]))
  assert info["events"] == [Event.PROGRESS.value] and reward == pytest.approx(0.1)
  trace = play(env, env.oracle())
  assert trace[-1][1] == pytest.approx(1.1)


@pytest.mark.parametrize("reply, expected", [
    ("<answer>up</answer> no wait <answer>left</answer>", "left"),   # last pair wins
    ("< ANSWER > Up </Answer >", " Up "),
    ("<answer><answer>down</answer></answer>", "down"),             # innermost pair
    ("<answer>up</answer> and then <answer>right", "right"),       # truncated last answer
    ("reasoning </answer> only", ""),
    ("plain text, no tags", None),
])
def test_extract_answer(reply, expected):
  assert parsing.extract_answer(reply) == expected


@pytest.mark.parametrize("reply, expected", [
    ("<answer>LEFT</answer>", "left"),
    ("<answer> Move North. </answer>", "up"),
    ("**Action:** `RIGHT`", "right"),
    ("I should go around the box.\nFinal answer: down", "down"),
    ("Thinking...\nup\n\n", "up"),
    ("up\n<answer>left</answer>", "left"),     # an answer beats any bare line
    ("<answer>jump</answer>\nup", None),       # … even when the answer is not an action
    ("<answer>W</answer>", "left"),
    ("<answer>go south</answer>", "down"),
    ("<answer>northward</answer>", "up"),
    ("ＵＰ", "up"),                             # full-width letters, NFKC
    ("up and then left", None),
])
def test_direction_replies(reply, expected):
  env = envs.make("sokoban")
  env.reset(0)
  assert env.read_action(reply) == expected


def test_normalize_and_shown():
  assert parsing.normalize("  **Action: `UP`.** ") == "up"
  assert parsing.normalize("My guess is: 'Crane'!") == "crane"
  assert parsing.normalize("let's go   to the\tkitchen") == "go to the kitchen"
  assert parsing.shown("<answer>" + "x" * 100 + "</answer>") == "x" * 37 + "..."
  assert parsing.shown("bad\x00reply\nlast line") == "last line"
  assert parsing.candidates(None) == [] and parsing.candidates("") == []


# ---- instance identity -----------------------------------------------------------------------


def _game(env: envs.Environment) -> tuple:
  """What makes an episode this game, read from the environment's attributes right after
  reset (written independently of the environments' `_instance`)."""
  if isinstance(env, frozenlake.FrozenLake):
    return (env.start, env.goal, frozenset(env.holes))
  if isinstance(env, maze.Maze):
    return (frozenset((c, frozenset(h)) for c, h in env.passages.items()), env.goal, env.state)
  if isinstance(env, sokoban.Sokoban):
    return (frozenset(env.walls), frozenset(env.targets), env.player, frozenset(env.boxes))
  if isinstance(env, countdown.Countdown):
    return (tuple(sorted(env.numbers)), env.target)
  if isinstance(env, wordle.Wordle):
    return env.secret
  return (frozenset((room, frozenset(r)) for room, r in env.world.rooms.items()),
          frozenset(env.world.location.items()), env.world.room, frozenset(env.goals))


SMALL_DIFFICULTY = {"frozenlake": dict(size=2, holes=0, min_distance=1, max_turns=1),
                    "maze": dict(width=2, height=2, min_distance=1, max_turns=3),
                    "sokoban": dict(width=5, height=5, walls=0, min_moves=1, max_moves=1),
                    "countdown": dict(numbers=3, min_steps=1, max_turns=2),
                    "wordle": {}, "household": dict(rooms=1, receptacles=2, objects=1)}


def _within(fine: dict, coarse: dict) -> bool:
  """Every class of the partition `fine` (value -> seeds) lies inside one class of `coarse`."""
  class_of = {seed: value for value, seeds in coarse.items() for seed in seeds}
  return all(len({class_of[seed] for seed in seeds}) == 1 for seeds in fine.values())


# Where the first observation shows the whole game, the key is the game's; elsewhere games
# the agent cannot tell apart at the start and that one plan wins share a key (envs.base).
FULL_VIEW = ("countdown", "frozenlake", "sokoban", "wordle")   # Wordle: the plan ends on the secret
KEY_DIFFICULTY = {**SMALL_DIFFICULTY, "household": dict(rooms=2, receptacles=2, objects=4)}


@pytest.mark.parametrize("name", ENV_NAMES)
def test_instance_key_groups_the_seeds_the_agent_cannot_tell_apart(name):
  """Small difficulties make many seeds collide. Three partitions of 300 seeds: by key, by
  game (`_game`), by what the agent sees (the first observation and the oracle's plan). The
  key must merge seeds of one game (whatever its listing order) and seeds that look and play
  alike, and nothing more: same key, same observation up to listing order and same plan."""
  difficulty = KEY_DIFFICULTY[name]
  env = envs.make(name, **difficulty)
  by_key, by_game, by_view, by_sorted_view = {}, {}, {}, {}
  for seed in range(300):
    observation = env.reset(seed)
    key, plan = env.instance_key(), tuple(env.oracle())
    by_key.setdefault(key, set()).add(seed)
    by_game.setdefault(_game(env), set()).add(seed)
    by_view.setdefault((observation, plan), set()).add(seed)
    pieces = tuple(sorted(re.split(r"[;,.:\n]\s*", observation)))
    by_sorted_view.setdefault((pieces, tuple(sorted(plan))), set()).add(seed)
    play(env, env.oracle()[:1])      # playing does not change which game it is
    assert env.instance_key() == key == envs.instance_key(name, seed, difficulty)
  assert _within(by_game, by_key) and _within(by_view, by_key)
  assert _within(by_key, by_sorted_view)
  if name in FULL_VIEW:
    assert len(by_key) == len(by_game)
  else:   # twins: different games the agent sees as one
    assert len(by_key) < len(by_game)
  assert 1 < len(by_key) < 300   # collisions happen: the partitions are not trivial


def test_frozenlake_instance_space_of_the_smallest_maps():
  """2x2, no holes, goal next to the start: 4 starts x 2 neighbours = 8 games."""
  keys = {envs.instance_key("frozenlake", s, SMALL_DIFFICULTY["frozenlake"]) for s in range(500)}
  assert len(keys) == 8
