"""The controls a reviewer asks for (config.py, "Controls"), each against a hand-worked case:
selection by success rate alone, the generic-context teacher, hints without the importance
correction, the compute-matched GRPO preset, and the rollout / agent-token counters."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import numpy as np
import pytest

from rised_jax import config as config_lib, parallel, pipelines, select
from rised_jax.learn import train_step
from rised_jax.pipelines.agentic import Progress
from rised_jax.rubrics import Vocabulary
from rised_jax.teach import PositiveTeacher, positive_teacher_prefix
from rised_jax.types import Group, GroupTags, Task, Trajectory
from tests.helpers import step_fixtures

CONFIG = Path(__file__).resolve().parent.parent / "experiments" / "configs" / "tiny_cpu.py"


def load_config_file(path: Path, arg: str):
  """`get_config(arg)` of an experiment file, as `--config path:arg` calls it."""
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def _group(seed: int, successes, tags=(), vocab=None, tokens: int = 0, env: str = "maze",
           system_prompt: str = "SYS") -> tuple[Group, GroupTags]:
  """A group and the judge's tags for it (every rollout tagged `tags`; no tags without vocab)."""
  trajs = [Trajectory(Task(env, seed), list(range(tokens)), [1] * tokens, [0.0] * tokens, 0,
                      [], success=bool(s), reward=float(s)) for s in successes]
  width = 0 if vocab is None else len(vocab)
  rows = np.stack([np.zeros(width, np.float32) if vocab is None else vocab.multi_hot(tags)
                   for _ in trajs])
  return (Group(Task(env, seed), trajs, system_prompt=system_prompt),
          GroupTags(rows, np.zeros(len(trajs), bool)))


def test_success_rate_selector_matches_the_pool_rate_greedily():
  # Success rates 0, 0, 1, 1, 1/2, 1/4: pool mean 2.75/6 = 0.4583.
  pool = [_group(i, s)[0] for i, s in enumerate(
      [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])]
  selector = select.make_selector("success_rate", seed=0)
  # Pick 1: |0.5 − 0.4583| is the smallest → group 4. Pick 2: (0.5 + x)/2 nearest 0.4583 wants
  # x = 0.4167 → 0.25 (group 5). Pick 3: (0.75 + x)/3 wants x = 0.625 → 1 (groups 2, 3 tie).
  assert selector.select(pool, 2, step=0) == [4, 5]
  for step in range(6):
    chosen = selector.select(pool, 3, step=step)
    assert chosen[:2] == [4, 5] and chosen[2] in (2, 3)
  assert {selector.select(pool, 3, step=s)[2] for s in range(20)} == {2, 3}   # random tie-break
  # Tags play no part: the same pool with any tags selects the same groups.
  vocab = Vocabulary.load("agentic_v1")
  tagged = [_group(g.task.seed, g.successes, ["gave_up"] if i % 2 else ["efficient"], vocab)
            for i, g in enumerate(pool)]
  assert selector.select([g for g, _ in tagged], 2, step=0,
                         tags=[t for _, t in tagged]) == [4, 5]


def test_generic_teacher_lists_task_agnostic_advice_for_the_same_groups():
  vocab = Vocabulary.load("agentic_v1")
  winners, winner_tags = _group(0, [1, 0], ["efficient"], vocab)
  losers, loser_tags = _group(1, [0, 0], ["gave_up"], vocab, env="sokoban")   # no positives anywhere
  prefix, positives = positive_teacher_prefix("SYS", 0, [winners], [winner_tags], vocab,
                                              context="generic")
  assert prefix == ("Behaviours that succeed here:\n"
                    "- Reads the task and the latest observation carefully\n"
                    "- Chooses each action to get closer to the goal\n\nSYS")
  assert positives.tags == ("efficient",)   # the chain still decides who gets a teacher
  rubric = PositiveTeacher(vocab)
  generic = PositiveTeacher(vocab, context="generic")
  for teacher in (rubric, generic):
    (winner_prefix, loser_prefix), _ = teacher.assign([0, 1], [winners, losers],
                                                      [winner_tags, loser_tags], step=0)
    assert winner_prefix is not None and loser_prefix is None
  assert "Reaches the goal without wasted turns" not in winner_prefix
  with pytest.raises(ValueError, match="context='rubrics'"):
    PositiveTeacher(vocab, context="rubrics")


@pytest.mark.slow
def test_behaviour_weight_off_drops_the_importance_correction():
  """At the first step ρ = 1, so the seq-mean-token-mean loss is −mean over rows of the mean
  advantage of its loss tokens; behaviour log-probs of −10⁴ cap every w_t at C = 2."""
  mesh = parallel.make_mesh(parallel.MeshShape(1, 1, 1), devices=jax.devices()[:1])
  batch = step_fixtures.batch(0)
  batch["behaviour_logprobs"] = np.where(batch["loss_mask"] > 0, -1e4, 0.0).astype(np.float32)
  mask, adv = batch["loss_mask"], batch["advantages"]
  rows = mask.sum(-1) > 0
  plain = -np.mean((adv * mask).sum(-1)[rows] / mask.sum(-1)[rows])
  losses = {}
  for weight in (True, False):
    config = step_fixtures.step_config(beta=0.0, behaviour_weight=weight)
    trainable, state = train_step.create(step_fixtures.tiny_model(), step_fixtures.optimizer(),
                                         config, mesh)
    _, metrics = trainable.step(state, trainable.put_batch(batch))
    losses[weight] = float(metrics["loss"])
  np.testing.assert_allclose(losses[False], plain, rtol=1e-5)
  np.testing.assert_allclose(losses[True], 2 * plain, rtol=1e-5)


@pytest.mark.parametrize("preset,pool,batch", [("grpo", 2, 2), ("grpo_matched", 8, 8),
                                               ("rised", 8, 2), ("rised_hint_no_iw", 8, 2)])
def test_presets_rollouts_per_step(preset, pool, batch):
  # tiny_cpu.py: K = 8, B = 2.
  config = load_config_file(CONFIG, preset)
  assert (config.select.pool_groups, config.select.batch_groups) == (pool, batch)
  pipelines.validate(config)


def test_control_presets_set_their_stage():
  def step(preset):
    return config_lib.step_config(load_config_file(CONFIG, preset)).policy_gradient
  assert step("rised_hint_no_iw").behaviour_weight is False
  assert step("rised").behaviour_weight is True
  assert load_config_file(CONFIG, "rised_generic_teacher").teacher.options.context == "generic"
  assert load_config_file(CONFIG, "rised_select_success").select.name == "success_rate"
  matched = load_config_file(CONFIG, "grpo_matched")
  assert matched.teacher.enabled is False and matched.step.beta == 0.0


def test_progress_counts_rollouts_and_agent_tokens_cumulatively():
  progress = Progress()
  assert progress.add([_group(0, [1, 0], tokens=3)[0], _group(1, [0, 0, 1], tokens=5)[0]]) == {
      "progress/rollouts": 5.0, "progress/agent_tokens": 2 * 3 + 3 * 5.0}
  resumed = Progress()
  resumed.load_state_dict(progress.state_dict())
  assert resumed.add([_group(2, [1], tokens=7)[0]]) == {"progress/rollouts": 6.0,
                                                      "progress/agent_tokens": 28.0}
  with pytest.raises(ValueError, match="progress: state has keys"):
    resumed.load_state_dict({"rollouts": 1})


COMPARE_CONFIG = CONFIG.parent / "compare_qwen3_0p6b_1gpu.py"


@pytest.mark.parametrize("preset", [p for p, v in config_lib.PRESETS.items()
                                    if v.get("pipeline", "agentic") == "agentic"])
def test_one_accelerator_comparison_config(preset):
  from rised_jax import envs  # noqa: PLC0415
  config = load_config_file(COMPARE_CONFIG, preset)
  pipelines.validate(config)
  # K = 4B for the selectors; grpo rolls out its batch, grpo_matched RISED's pool.
  expected = {"grpo": (8, 8), "grpo_matched": (32, 32)}.get(preset, (32, 8))
  assert (config.select.pool_groups, config.select.batch_groups) == expected
  for name, difficulty in config.envs.difficulty.items():
    assert envs.make(name, **difficulty).reset(1)
