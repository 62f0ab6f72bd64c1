"""The typed stage configs (rised_jax/pipelines/stages.py): built once from the ConfigDict,
frozen, each refusing a bad value of its own keys by name, and the pipelines reading
only their typed pieces."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from rised_jax import config as config_lib
from rised_jax.pipelines import rubric_settings, stages

PIPELINES = Path(stages.__file__).parent


def test_the_pieces_hold_the_config_values():
  config = config_lib.default_config()
  config.rollout.top_p = 0.5
  config.select.pool_groups, config.select.batch_groups = 12, 3
  config.eval.episodes_per_env = 7
  config.envs.names = ["maze"]
  typed = stages.stage_configs(config)
  assert typed.rollout.top_p == 0.5 and typed.rollout.group_size == 4
  assert (typed.select.pool_groups, typed.select.batch_groups) == (12, 3)
  assert typed.eval.episodes_per_env == 7
  assert list(typed.envs.names) == ["maze"]
  assert typed.step.teacher_kl.beta == config.step.beta
  assert typed.train.steps == config.train.steps
  with pytest.raises(dataclasses.FrozenInstanceError):
    typed.rollout.top_p = 1.0


@pytest.mark.parametrize("key, value, message", [
    ("rollout.top_p", 2.0, "config.rollout.top_p=2.0: expected a number in (0, 1]"),
    ("select.batch_groups", 9, "config.select.batch_groups=9 exceeds config.select.pool_groups="),
    ("train.profile_steps", [3, 1],
     "config.train.profile_steps=[3, 1]: expected [] or [first, last) with integers"),
    ("train.checkpoint_every", 0, "config.train.checkpoint_every=0: expected an integer >= 1"),
])
def test_each_check_names_its_key(key, value, message):
  """Through the validation a run does (the config's checks, then the stages' typed ones)."""
  config = config_lib.default_config()
  section, name = key.split(".")
  config[section][name] = value
  with pytest.raises(ValueError) as error:
    config_lib.validate(config, (lambda c: stages.check_common(stages.stage_configs(c)),))
  assert message in str(error.value)


def _raw_config_reads(source: str) -> list[str]:
  """Attribute reads of a ConfigDict: `config.<key>` on a name `config`, and `self.config`."""
  tree = ast.parse(source)
  reads = []
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id == "config"):
      reads.append(f"line {node.lineno}: config.{node.attr}")
    if (isinstance(node, ast.Attribute) and node.attr == "config"
        and isinstance(node.value, ast.Name) and node.value.id == "self"):
      reads.append(f"line {node.lineno}: self.config")
  return reads


def test_the_hand_made_check_finds_raw_reads():
  assert _raw_config_reads("def f(config):\n  return config.rollout.top_p + self.config.x\n") == [
      "line 2: config.rollout", "line 2: self.config"]


@pytest.mark.parametrize("pipeline", ["agentic.py", "rubric.py"])
def test_the_pipelines_read_no_raw_config(pipeline):
  assert _raw_config_reads((PIPELINES / pipeline).read_text()) == []


def test_the_rubric_section_is_typed_and_checked():
  config = config_lib.default_config()
  config.rubric.judge.max_new_tokens = 0
  settings, rubric = rubric_settings.rubric_configs(config)
  assert rubric.cripo.max_uc == config.rubric.cripo.max_uc and rubric.judge.backend == "checker"
  assert dict(rubric.eval_groups) == config.rubric.eval_groups.to_dict()
  assert settings.select == stages.stage_configs(config).select
  with pytest.raises(ValueError, match=r"config\.rubric\.judge\.max_new_tokens=0: expected an "
                                       r"integer >= 1"):
    rubric.check()
