"""The one registry (`rised_jax.plugins.Registry`, issue 26): every kind of named component
resolves each of its names, by built-in name, by import path and by entry point, and an unknown
name reads the same way for every kind — through the registry and through config validation.

The expected messages are written out by hand: a change of format must change this file."""
from __future__ import annotations

import importlib

import pytest

from rised_jax import config as config_lib
from rised_jax import envs, pipelines, plugins, rubrics, select  # noqa: F401 - define registries
from rised_jax.envs.suites import SuiteNotInstalled
from rised_jax.learn import advantages, losses  # noqa: F401 - define registries
from rised_jax.rubrics import criteria  # noqa: F401 - defines a registry

TAIL = "or an import path 'package.module:Attribute'"
# kind -> (config key, entry-point group, built-in names, the error for the name 'nope').
KINDS = {
    "environment": (
        "envs.names", "rised_jax.envs",
        ["babyai", "countdown", "frozenlake", "household", "maze", "scienceworld", "sokoban",
         "textcraft", "twx_coin", "twx_cooking", "twx_twc", "wordle"],
        "config.envs.names: unknown environment 'nope'; known: ['babyai', 'countdown', "
        "'frozenlake', 'household', 'maze', 'scienceworld', 'sokoban', 'textcraft', 'twx_coin', "
        "'twx_cooking', 'twx_twc', 'wordle']; or an entry point of group 'rised_jax.envs', "
        + TAIL),
    "vocabulary": (
        "judge.vocabulary", "rised_jax.vocabularies", ["agentic_v1"],
        "config.judge.vocabulary: unknown vocabulary 'nope'; known: ['agentic_v1']; or an entry "
        "point of group 'rised_jax.vocabularies', " + TAIL),
    "judge": (
        "judge.backend", "rised_jax.judges", ["genai", "inprocess", "openai", "rules"],
        "config.judge.backend: unknown judge 'nope'; known: ['genai', 'inprocess', 'openai', "
        "'rules']; or an entry point of group 'rised_jax.judges', " + TAIL),
    "criteria judge": (
        "rubric.judge.backend", "rised_jax.criteria_judges",
        ["checker", "genai", "inprocess", "openai"],
        "config.rubric.judge.backend: unknown criteria judge 'nope'; known: ['checker', 'genai', "
        "'inprocess', 'openai']; or an entry point of group 'rised_jax.criteria_judges', " + TAIL),
    "selector": (
        "select.name", "rised_jax.selectors",
        ["dapo", "env_curriculum", "random", "rised", "success_rate", "uniform", "variance"],
        "config.select.name: unknown selector 'nope'; known: ['dapo', 'env_curriculum', "
        "'random', 'rised', 'success_rate', 'uniform', 'variance']; or an entry point of group "
        "'rised_jax.selectors', " + TAIL),
    "advantage estimator": (
        "advantage", "rised_jax.advantages", ["drgrpo", "grpo", "rloo"],
        "config.advantage: unknown advantage estimator 'nope'; known: ['drgrpo', 'grpo', "
        "'rloo']; or an entry point of group 'rised_jax.advantages', " + TAIL),
    "loss aggregation": (
        "step.aggregation", "rised_jax.loss_aggregations",
        ["seq-mean-token-mean", "seq-mean-token-sum-norm", "token-mean"],
        "config.step.aggregation: unknown loss aggregation 'nope'; known: "
        "['seq-mean-token-mean', 'seq-mean-token-sum-norm', 'token-mean']; or an entry point of "
        "group 'rised_jax.loss_aggregations', " + TAIL),
    "KL estimator": (
        "step.ref_kl_estimator", "rised_jax.kl_estimators", ["k1", "k2", "k3"],
        "config.step.ref_kl_estimator: unknown KL estimator 'nope'; known: ['k1', 'k2', 'k3']; "
        "or an entry point of group 'rised_jax.kl_estimators', " + TAIL),
    "distillation divergence": (
        "step.divergence", "rised_jax.divergences", ["forward-kl", "jsd", "reverse-kl"],
        "config.step.divergence: unknown distillation divergence 'nope'; known: ['forward-kl', "
        "'jsd', 'reverse-kl']; or an entry point of group 'rised_jax.divergences', " + TAIL),
}


@pytest.fixture
def no_entry_points(monkeypatch):
  """This test's registries see only the built-ins: no installed plug-in, and none of the
  environment aliases an earlier test in this process registered by building its pipeline
  (`envs.register_aliases`; they come back after the test)."""
  for alias in [name for name in envs._REGISTRY if name not in envs._BUILTIN_NAMES]:
    monkeypatch.delitem(envs._REGISTRY, alias)
    monkeypatch.delitem(envs.ENVIRONMENTS.resolved, alias, raising=False)
  plugins.refresh()
  for group in plugins.GROUPS.values():
    assert not plugins.entry_points(group), f"a plug-in of {group} is installed"


def test_every_kind_has_one_registry_with_its_key_and_group():
  assert sorted(plugins.REGISTRIES) == sorted(KINDS)
  for kind, (key, group, _, _) in KINDS.items():
    registry = plugins.REGISTRIES[kind]
    assert (registry.key, registry.group) == (key, group), kind


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_built_in_name_resolves_by_name_and_by_import_path(kind, no_entry_points):
  registry = plugins.REGISTRIES[kind]
  assert registry.names() == KINDS[kind][2]
  for name in registry.names():
    value = registry.builtins[name]
    try:
      found = registry.lookup(name)
    except SuiteNotInstalled:   # a real suite whose extra this machine lacks
      assert name in envs.SUITES
      continue
    if isinstance(value, str):   # a suite, named by its import path
      module, _, attribute = value.partition(":")
      assert found is getattr(importlib.import_module(module), attribute)
    else:
      assert found is value
      path = f"{value.__module__}:{value.__qualname__}"
      assert registry.lookup(path) is value, path


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_resolves_an_entry_point(kind, tmp_path, monkeypatch, no_entry_points):
  """An installed-looking distribution declares, in every group, a name for the kind's first
  built-in (by its import path)."""
  registry = plugins.REGISTRIES[kind]
  name = registry.names()[0]
  value = registry.builtins[name]
  path = value if isinstance(value, str) else f"{value.__module__}:{value.__qualname__}"
  info = tmp_path / "more_parts-0.1.dist-info"
  info.mkdir()
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: more-parts\nVersion: 0.1\n")
  (info / "entry_points.txt").write_text(f"[{registry.group}]\nfrom_entry_point = {path}\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  plugins.refresh()
  try:
    assert "from_entry_point" in registry.names()
    try:
      assert registry.lookup("from_entry_point") is registry.lookup(name)
    except SuiteNotInstalled:
      assert name in envs.SUITES
  finally:
    monkeypatch.undo()
    plugins.refresh()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_an_unknown_name_reads_the_same_for_every_kind(kind, no_entry_points):
  with pytest.raises(plugins.PluginError) as error:
    plugins.REGISTRIES[kind].lookup("nope")
  assert str(error.value) == KINDS[kind][3]


@pytest.mark.parametrize("algorithm, key, value, kind", [
    ("rised", "envs.names", ["nope"], "environment"),
    ("rised", "judge.vocabulary", "nope", "vocabulary"),
    ("rised", "judge.backend", "nope", "judge"),
    ("cripo", "rubric.judge.backend", "nope", "criteria judge"),
    ("rised", "select.name", "nope", "selector"),
    ("rised", "advantage", "nope", "advantage estimator"),
    ("rised", "step.aggregation", "nope", "loss aggregation"),
    ("rised", "step.ref_kl_estimator", "nope", "KL estimator"),
    ("rised", "step.divergence", "nope", "distillation divergence"),
])
def test_config_validation_gives_the_same_error(algorithm, key, value, kind, no_entry_points):
  config = config_lib.default_config()
  config.algorithm = algorithm
  config_lib.apply_preset(config)
  node = config
  *parents, leaf = key.split(".")
  for part in parents:
    node = node[part]
  node[leaf] = value
  with pytest.raises(ValueError) as error:
    pipelines.validate(config)
  expected = KINDS[kind][3]
  if kind == "vocabulary":   # a vocabulary may also be a file
    expected += "; or a JSON file path (no such file)"
  if kind == "distillation divergence":   # the chunked loss's own surrogate
    expected += "; or 'sampled-token' (the surrogate at the sampled token)"
  assert str(error.value) == expected


def test_a_non_function_is_refused_for_a_function_kind():
  with pytest.raises(plugins.PluginError, match=r"^config\.advantage: advantage estimator "
                     r"'os:abort' is <built-in function abort>; expected a Python function$"):
    advantages.ADVANTAGES.lookup("os:abort")
