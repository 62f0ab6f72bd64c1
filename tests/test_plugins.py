"""Plug-ins from outside the package (issue 12): an environment, a rubric vocabulary, a judge and
a selector defined in a module the package knows nothing of, named by import path, by a config
alias and by entry points; a training step on them; and the errors of every broken plug-in,
raised by validation before the model loads."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest

from rised_jax import config as config_lib
from rised_jax import envs, pipelines, plugins, rubrics, select, trainer
from rised_jax.model import tiny
from tests.helpers.run_fixtures import REPO, TINY_CONFIG as CONFIG, tiny_config

GAMES = '''
"""A game, a vocabulary, a judge and a selector that rised_jax has never heard of."""
import numpy as np

from rised_jax import plugins
from rised_jax.rubrics.judge import Judge, JudgeStats
from rised_jax.select.base import Selector
from rised_jax.types import Verdict


class Corridor:
  """Walk right to the end of a corridor of 1 + seed % max_length cells."""

  system_prompt = ("You walk along a corridor to its exit. Answer <answer>right</answer> or "
                   "<answer>left</answer>.")

  def __init__(self, *, max_length: int = 6, max_turns: int = 3):
    self.max_length, self.max_turns = max_length, max_turns

  def reset(self, seed):
    self.length, self.pos, self.turn = 1 + seed % self.max_length, 0, 0
    return self._observation()

  def _observation(self):
    return f"You are at cell {self.pos} of {self.length}. The exit is right."

  def step(self, reply):
    self.turn += 1
    action = "right" if "right" in reply else "left" if "left" in reply else None
    if action == "right":
      self.pos, events = self.pos + 1, ["progress"]
    elif action == "left":
      self.pos, events = max(0, self.pos - 1), ["regress"]
    else:
      events = ["invalid_action"]
    success = self.pos >= self.length
    truncated = not success and self.turn >= self.max_turns
    info = {"success": success, "invalid": action is None, "events": events,
            "truncated": truncated}
    return self._observation(), float(success), success or truncated, info

  def instance_key(self):
    return f"corridor:{self.length}"

  def action_space(self):
    return ["right", "left"]


VOCAB = [{"id": "walks_right", "polarity": "+", "description": "some turn moves right"},
         {"id": "never_moves", "polarity": "-", "description": "no turn moves right"}]


class ProgressJudge(Judge):
  backend = "progress"

  def judge_trajectories(self, trajectories):
    verdicts = [Verdict(tags=self.vocab.multi_hot(
        ["walks_right" if "progress" in t.events else "never_moves"])) for t in trajectories]
    return verdicts, JudgeStats(judged=len(trajectories))


class LastSelector(Selector):
  name = "last"

  def _select(self, pool, tags, batch_size, step, rng):
    return list(range(len(pool) - 1, -1, -1))[:batch_size]


class NoStep:
  system_prompt = "no step"

  def reset(self, seed):
    return ""

  def instance_key(self):
    return ""


class NeedsUrl(Corridor):
  def __init__(self, *, url: str, max_turns: int = 3):
    super().__init__(max_turns=max_turns)


NOT_A_CLASS = 3


@plugins.factory("vocabulary")
def vocab_factory():
  return list(VOCAB)


def undeclared_vocab():
  raise AssertionError("an undeclared callable was called")
'''


@pytest.fixture
def games(tmp_path, monkeypatch):
  """`byo_games` importable from tmp_path (sys.path here, PYTHONPATH for subprocesses), with
  an installed-looking distribution declaring entry points of all four groups."""
  (tmp_path / "byo_games.py").write_text(textwrap.dedent(GAMES))
  info = tmp_path / "byo_games-0.1.dist-info"
  info.mkdir()
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: byo-games\nVersion: 0.1\n")
  (info / "entry_points.txt").write_text(
      "[rised_jax.envs]\ncorridor_ep = byo_games:Corridor\n"
      "[rised_jax.vocabularies]\nbyo_vocab = byo_games:VOCAB\n"
      "[rised_jax.judges]\nbyo_judge = byo_games:ProgressJudge\n"
      "[rised_jax.selectors]\nbyo_last = byo_games:LastSelector\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setitem(os.environ, "PYTHONPATH",
                      os.pathsep.join([str(REPO), str(tmp_path), os.environ.get("PYTHONPATH", "")]))
  registry = dict(envs._REGISTRY)
  plugins.refresh()
  yield tmp_path
  envs._REGISTRY.clear()
  envs._REGISTRY.update(registry)
  envs._ENVS.clear()
  envs._KEYS.clear()
  sys.modules.pop("byo_games", None)
  plugins.refresh()


def _config(algorithm="rised", **edits):
  if "envs.names" in edits:   # the file's knobs are for its own environments
    edits = {"envs.difficulty": {}, **edits}
  return tiny_config(algorithm, None, **edits)


def test_every_kind_is_found_by_import_path_and_by_entry_point(games):
  for name in ("byo_games:Corridor", "corridor_ep"):
    env = envs.make(name, max_length=4)
    assert env.reset(6) == "You are at cell 0 of 3. The exit is right."
    assert envs.instance_key(name, 6, {"max_length": 4}) == "corridor:3"
  assert "corridor_ep" in envs.names() and envs.difficulty_keys("corridor_ep") == \
      ["max_length", "max_turns"]
  for name in ("byo_games:VOCAB", "byo_vocab"):
    assert rubrics.Vocabulary.load(name).ids == ["walks_right", "never_moves"]
  vocab = rubrics.Vocabulary.load("byo_vocab")
  for name in ("byo_games:ProgressJudge", "byo_judge"):
    assert type(rubrics.make_judge(name, vocab)).__name__ == "ProgressJudge"
  for name in ("byo_games:LastSelector", "byo_last"):
    assert select.make_selector(name, seed=0).select(_pool(5), 2, 0) == [4, 3]


def _pool(n):
  from rised_jax.types import Group, Task  # noqa: PLC0415
  return [Group(task=Task("maze", i), trajectories=[]) for i in range(n)]


@pytest.mark.parametrize("edits, message", [
    ({"envs.names": ["no_such_module:Game"]},
     r"config\.envs\.names: environment 'no_such_module:Game': importing module 'no_such_module' "
     r"failed: ModuleNotFoundError"),
    ({"envs.names": ["byo_games:Missing"]},
     r"environment 'byo_games:Missing': module 'byo_games' has no attribute 'Missing'"),
    ({"envs.names": ["byo_games:NoStep"]},
     r"environment byo_games:NoStep \(byo_games\.NoStep\) lacks \['step'\] of "
     r"rised_jax\.envs\.base\.EnvironmentProtocol"),
    ({"envs.names": ["byo_games:NOT_A_CLASS"]},
     r"environment byo_games:NOT_A_CLASS is int 3; expected a class"),
    ({"envs.names": ["needs_url"], "envs.aliases": {"needs_url": "byo_games:NeedsUrl"}},
     r"config\.envs\.names: needs_url: difficulty key\(s\) \['url'\] are required"),
    ({"envs.names": ["corridor"], "envs.aliases": {"corridor": "byo_games:Corridor"},
      "envs.difficulty": {"corridor": {"width": 3}}},
     r"corridor: unknown difficulty key\(s\) \['width'\]; valid keys: \['max_length', "
     r"'max_turns'\]"),
    ({"envs.aliases": {"maze": "byo_games:Corridor"}},
     r"config\.envs\.aliases\.maze: .*a built-in environment has this name"),
    ({"envs.names": ["not_registered"]},
     r"config\.envs\.names: unknown environment 'not_registered'; known: \[.*'corridor_ep'.*\]; "
     r"or an entry point of group 'rised_jax\.envs'"),
    ({"select.name": "byo_games:NoStep"},
     r"config\.select\.name: selector 'byo_games:NoStep' is <class 'byo_games\.NoStep'>; expected a "
     r"subclass of rised_jax\.select\.base\.Selector"),
    ({"judge.backend": "byo_games:Nope"},
     r"config\.judge\.backend: judge 'byo_games:Nope': module 'byo_games' has no attribute 'Nope'"),
    ({"judge.vocabulary": "byo_games:NOT_A_CLASS"},
     r"vocabulary 'byo_games:NOT_A_CLASS': the plug-in is int; expected a Vocabulary"),
    ({"judge.vocabulary": "no_such_module:V"},
     r"config\.judge\.vocabulary: vocabulary 'no_such_module:V': importing module "
     r"'no_such_module' failed: ModuleNotFoundError"),
])
def test_a_broken_plugin_is_named_before_the_model_loads(games, tmp_path, edits, message):
  config = _config(**{"model.source": str(tmp_path / "no_such_model"), **edits})
  with pytest.raises(ValueError, match=message):
    trainer.build(config, tmp_path / "run")   # validation runs before the (missing) model loads
  assert not (tmp_path / "run" / "config.json").exists()


def test_validation_registers_no_alias(games):
  """Checking a config resolves its aliases without registering them (a check mutates
  nothing); the pipeline registers them when it is built."""
  config = _config(**{"envs.names": ["corridor"],
                      "envs.aliases": {"corridor": "byo_games:Corridor"},
                      "envs.difficulty": {"corridor": {"max_length": 4}}})
  before = dict(envs._REGISTRY)
  pipelines.validate(config)
  assert envs._REGISTRY == before and "corridor" not in envs.names()
  with pytest.raises(ValueError, match=r"^config\.envs\.names: unknown environment 'corridor'"):
    envs.make("corridor")
  envs.register_aliases(config.envs.aliases)
  assert envs.make("corridor", max_length=4).reset(6) == \
      "You are at cell 0 of 3. The exit is right."


def test_a_subprocess_dry_run_imports_the_plugin_from_pythonpath(games, tmp_path):
  code = "import sys; from rised_jax import main; sys.argv[0] = 'rised-train'; main.train_entry()"
  run = subprocess.run(
      [sys.executable, "-c", code, f"--config={CONFIG}", f"--workdir={tmp_path / 'run'}",
       "--dry_run", f"--config.model.source={tmp_path / 'none'}",
       "--config.envs.names=byo_games:Corridor", "--config.envs.difficulty={}",
       "--config.select.name=byo_last", "--config.judge.backend=byo_judge",
       "--config.judge.vocabulary=byo_games:VOCAB"],
      cwd=tmp_path, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
      timeout=300)
  assert run.returncode == 0, run.stderr
  assert "environments byo_games:Corridor" in run.stdout
  assert "selector   byo_last" in run.stdout


def test_one_training_step_on_the_outside_environment(games, tmp_path):
  model_dir = tiny.write(tmp_path / "model", ["byo_games:Corridor"])
  # GRPO's stages (no teacher rows to compile) with the plug-in selector; short shapes.
  config = _config("grpo", **{
      "model.source": str(model_dir), "envs.names": ["corridor"],
      "rollout.max_total_tokens": 128, "rollout.prompt_buckets": [128],
      "rollout.new_token_buckets": [4],
      "envs.aliases": {"corridor": "byo_games:Corridor"},
      "envs.difficulty": {"corridor": {"max_length": 6, "max_turns": 2}},
      "judge.backend": "byo_judge", "judge.vocabulary": "byo_vocab",
      "select.name": "byo_games:LastSelector", "select.pool_groups": 4,
      "select.batch_groups": 2, "train.steps": 1, "eval.episodes_per_env": 2,
      "rollout.max_new_tokens_per_turn": 4, "rollout.reply_prefix": "<answer>",
      "rollout.stop_strings": ["</answer>"]})
  workdir = tmp_path / "run"
  trainer.train(config, workdir)

  def lines(name):
    return [json.loads(line) for line in (workdir / name).read_text().splitlines()]

  step = [m for m in lines("metrics.jsonl") if "time/rollout" in m]
  assert [m["step"] for m in step] == [1] and math.isfinite(step[0]["loss"])
  assert step[0]["rollout/env_errors"] == 0.0 and "rollout/corridor/success" in step[0]
  rollouts = lines("rollouts.jsonl")
  assert {r["env"] for r in rollouts} == {"corridor"} and len(rollouts) == 4 * 4
  # The plug-in selector chose the last two groups; the plug-in judge tagged by its own rule.
  assert sorted({r["group"] for r in rollouts if r["selected"]}) == [2, 3]
  for r in rollouts:
    moved = any("right" in a for a in r["actions"])
    assert r["tags"] == (["walks_right"] if moved else ["never_moves"])
  # Evaluation: the first two distinct corridors of the held-out seeds, keyed by the game's rule.
  offset = config.eval.seed_offset
  episodes = lines("eval_episodes.jsonl")
  assert sorted({e["instance"] for e in episodes}) == sorted(
      {f"corridor:{1 + s % 6}" for s in (offset, offset + 1)})
  assert {e["env"] for e in lines("eval.jsonl")} == {"corridor"}


def test_only_a_declared_factory_is_called(games):
  """A vocabulary name that resolves to a function is called only when its module declared it
  with `plugins.factory("vocabulary")`; `os:abort` (rc -6 during validation before) and an
  undeclared function of the plug-in module are refused without being called."""
  assert rubrics.Vocabulary.load("byo_games:vocab_factory").ids == ["walks_right", "never_moves"]
  for name in ("byo_games:undeclared_vocab", "os:abort"):
    with pytest.raises(ValueError, match=rf"vocabulary {name!r} is the callable .*not declared "
                                         r"a vocabulary factory, so it is not called"):
      rubrics.Vocabulary.load(name)
  with pytest.raises(ValueError, match=r"plugins\.factory\('vocabularies'\): expected one of"):
    plugins.factory("vocabularies")
