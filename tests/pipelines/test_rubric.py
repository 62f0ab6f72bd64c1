"""The rubric pipeline (CriPO, rised_jax.pipelines.rubric): stages, presets, configs, a tiny run.

Most tests drive the stages with a scripted engine over six built-in tasks: the two training
tasks get four hand-written answers each whose checker verdicts, rewards, GRPO advantages, UC
and SC sets are worked out by hand below, so every teacher row the pipeline builds can be
checked against an independent expectation. The tokenizer is a tiny word-level one over the
tasks' words (rised_jax.model.tiny.build_tokenizer); the end-to-end run uses a tiny random
model over the same vocabulary.
"""
import dataclasses
import hashlib
import json
from pathlib import Path

import jax
import numpy as np
import pytest
import scipy.stats

from rised_jax import config as config_lib
from rised_jax import pipelines
from rised_jax import parallel, runlog, stats, tasks, trainer
from rised_jax.learn import batching, train_step
from rised_jax.model import from_config, save_pretrained, tiny
from rised_jax.pipelines import make_pipeline
from rised_jax.pipelines.criteria_prompts import visible_answer
from rised_jax.rollout.base import EngineLimits, GenerationResult
from rised_jax.rubric_tasks import BUILTIN_PATH, check
from rised_jax.rubric_tasks.split import load_task_set, split_tasks
from rised_jax.rubrics import criteria
from rised_jax.teach import cripo_prefix
from tests.helpers.fake_engine import FakeEngine
from tests.helpers.run_fixtures import load_config_file

CONFIGS = Path(__file__).resolve().parents[2] / "experiments" / "configs"
TASK_IDS = ["sky-blue", "sunset-red", "rainbow", "thunder-delay", "heart-chambers", "blood-types"]
SPLIT_SEED = 0          # holds out tasks 2-5 of TASK_IDS: sky-blue and sunset-red train
PRESETS = ("cripo", "cripo_u", "cripo_s", "grpo_rubric")
# What the scripted policy answers the in-process judge: a bare JSON list survives the word-level
# tokenizer's round trip ('[ " met " ]'), which the lenient parser reads as "met".
JUDGE_ANSWER = '["met"]'

SCRIPTS = {
    # weights 3, 2, 1, 1, -2 (scattering, wavelength, violet, length, ocean-myth); Z = 5
    "sky-blue": [
        "Sunlight is scattered by air molecules. Shorter wavelengths scatter more, so blue wins.",
        "The sky reflects the ocean. Violet is hard for our eyes to see.",
        "It is a myth that the sky reflects the ocean. Air scatters light.",
        "Violet light is weak and our eyes are less sensitive to it."],
    # weights 3, 3, 1, -2 (path, scatter-out, length, sun-colour-myth); Z = 5
    "sunset-red": [
        "Blue light is scattered away, leaving red and orange. That is why sunsets glow.",
        "Sunsets are red.",
        "The sun cools down at sunset. So it looks red.",
        "Sunsets are red."],
    "rainbow": [None],   # the task's reference answer
    "thunder-delay": ["I do not know."],
    "heart-chambers": [None],
    "blood-types": ["Blood groups depend on antigens on red blood cells. O negative is the "
                    "universal donor."],
}
# Hand-worked checker verdicts of the training answers.
VERDICTS = {
    "sky-blue": [[1, 1, 0, 1, 0], [0, 0, 1, 1, 1], [1, 0, 0, 1, 0], [0, 0, 1, 0, 0]],
    "sunset-red": [[0, 1, 1, 0], [0, 0, 0, 0], [0, 0, 1, 1], [0, 0, 0, 0]],
}
# R = [1.2, 0, 0.8, 0.2]: violet is met only by answers 1 and 3, both below the mean, so it is
# the one SC; every criterion is met by someone (the pitfall does not count), so no UC.
# R = [0.8, 0, -0.2, 0]: "path" is met by nobody (UC); y* = answer 0; no SC.
UC = {"sky-blue": [], "sunset-red": ["path"]}
SC = {"sky-blue": ["violet"], "sunset-red": []}
COUNTERFACTUAL = {"sky-blue": {1: ["violet"], 3: ["violet"]}, "sunset-red": {}}
BEST = {"sky-blue": 0, "sunset-red": 0}


def grpo_reference(rewards):
  rewards = np.asarray(rewards, np.float64)
  if np.ptp(rewards) == 0:
    return np.zeros_like(rewards)
  return (rewards - rewards.mean()) / (rewards.std() + 1e-6)


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
  lines = {json.loads(line)["id"]: line for line in Path(BUILTIN_PATH).read_text().splitlines()}
  path = tmp_path_factory.mktemp("tasks") / "six.jsonl"
  path.write_text("\n".join(lines[i] for i in TASK_IDS) + "\n")
  return str(path)


@pytest.fixture(scope="module")
def task_set(task_file):
  return load_task_set(task_file)


@pytest.fixture(scope="module")
def scripts(task_set):
  return {t.id: [a or t.reference for a in SCRIPTS[t.id]] for t in task_set.tasks}


@pytest.fixture(scope="module")
def tokenizer(task_set, scripts):
  texts = [config_lib.default_config().rubric.system_prompt, "assistant user system", JUDGE_ANSWER]
  texts += [Path(p).read_text() for p in (cripo_prefix.INJECTION_TEMPLATE,
                                          cripo_prefix.COUNTERFACTUAL_TEMPLATE)]
  for task in task_set.tasks:
    texts += [task.prompt, task.reference or ""] + [c.text for c in task.criteria]
    texts += scripts[task.id]
  return tiny.build_tokenizer(sorted({w for t in texts for w in tiny.WORD.findall(t)}))


class ScriptedEngine(FakeEngine):
  """Answers each prompt with its task's scripted texts, in order within a call; any other
  prompt (a question to the in-process judge) with `other`."""

  def __init__(self, tokenizer, other=JUDGE_ANSWER, limits=EngineLimits()):
    super().__init__(limits)
    self.tokenizer = tokenizer
    self.scripts: dict[tuple[int, ...], list[str]] = {}
    self.other = other

  def reply(self, request, call):
    key = tuple(request.prompt_ids)
    texts = self.scripts.get(key, [self.other])
    seen = sum(tuple(r.prompt_ids) == key for r in call)
    ids = self.tokenizer.encode(texts[seen % len(texts)]) + [self.tokenizer.eos_token_id]
    return GenerationResult(ids, [-0.5 - 0.01 * k for k in range(len(ids))], "stop")


def make_config(preset, task_file, **edits):
  c = config_lib.default_config()
  c.algorithm = preset
  c.rubric.tasks = task_file
  c.rubric.eval_tasks = 4
  c.rubric.split_seed = SPLIT_SEED
  c.rubric.max_new_tokens = 32
  c.rollout.group_size = 4
  c.select.batch_groups = 2
  c.step.chunk = 32
  c = config_lib.apply_preset(c)
  for dotted, value in edits.items():
    config_lib._set(c, dotted, value)  # pylint: disable=protected-access
  pipelines.validate(c)
  return c


def make_scripted(config, tokenizer, scripts):
  engine = ScriptedEngine(tokenizer)
  pipe = make_pipeline(config, engine, tokenizer)
  engine.scripts = {tuple(ids): scripts[task.id]
                    for ids, task in zip(pipe.prompt_ids, pipe.task_set.tasks)}
  return pipe, engine


def run_stages(pipe, step=0):
  """(the step's final record, its rows, its metrics), the stages in the trainer's order."""
  record = pipe.roll_out(step)
  for stage in (pipe.judge, pipe.advantages, pipe.select, pipe.teach):
    record = stage(record)
  return record, pipe.rows(record), pipe.metrics(record)


@pytest.fixture(scope="module")
def cripo_run(task_file, tokenizer, scripts):
  pipe, engine = make_scripted(make_config("cripo", task_file), tokenizer, scripts)
  record, rows, metrics = run_stages(pipe)
  return pipe, engine, record, rows, metrics


def group_rows(record, rows):
  """{task id: (group index, group, its rows)} in pool order."""
  out, start = {}, 0
  for k, group in enumerate(record.pool):
    size = len(group.trajectories)
    out[group.task.id] = (k, group, rows[start:start + size])
    start += size
  return out


def assistant_start(tokenizer):
  return [tokenizer.encode("<|im_start|>")[0], tokenizer.encode("assistant")[0]]


def test_scripted_answers_get_the_hand_worked_verdicts(cripo_run, tokenizer):
  _, _, record, _, _ = cripo_run
  assert sorted(g.task.id for g in record.pool) == ["sky-blue", "sunset-red"]
  for k, group in enumerate(record.pool):
    weights = group.task.weights
    verdicts = np.asarray(VERDICTS[group.task.id], np.float32)
    rewards = verdicts @ weights / weights.sum()
    for i, (traj, expected, reward) in enumerate(zip(group.trajectories, verdicts, rewards)):
      # The judge saw the decoded answer, which the checker scores as worked out by hand.
      answer = tokenizer.decode(traj.token_ids[traj.prompt_len:], skip_special_tokens=True)
      assert traj.turns[0].action_text == answer.strip()
      np.testing.assert_array_equal(check(group.task, answer), expected)
      np.testing.assert_array_equal(record.verdicts[k][i], expected)
      assert traj.reward == pytest.approx(reward, abs=1e-6) and not record.unjudged[k][i]
    np.testing.assert_allclose(record.advantages[k], grpo_reference(rewards), atol=1e-5)
    texts = [c.id for c in group.task.criteria]
    analysis = record.analysis[k]
    assert [texts[j] for j in np.flatnonzero(analysis.uc)] == UC[group.task.id]
    assert [texts[j] for j in np.flatnonzero(analysis.sc)] == SC[group.task.id]


def test_stages_return_new_records_and_answers_keep_their_seeds(task_file, tokenizer, scripts):
  pipe, engine = make_scripted(make_config("cripo", task_file), tokenizer, scripts)
  rolled = pipe.roll_out(3)
  with pytest.raises(RuntimeError, match=r"step 3: rows needs \['advantages', 'teacher_ids'\]"):
    pipe.rows(rolled)
  judged = pipe.judge(rolled)
  # The judge replaced the trajectories: the rolled-out record still holds the unjudged ones.
  assert all(t.reward == 0 and t.turns[0].reward == 0 for g in rolled.pool for t in g.trajectories)
  assert any(t.reward != 0 for g in judged.pool for t in g.trajectories)
  assert all(t.turns[0].reward == t.reward for g in judged.pool for t in g.trajectories)
  assert rolled.verdicts is None and judged.faults == rolled.faults
  # Engine seeds: the hash of (run seed, set name, task index, {"id": task id}, rollout, turn 0),
  # the key rubric questions had when they were environment Tasks, so runs sample as before.
  index = {t.id: i for i, t in enumerate(pipe.task_set.tasks)}
  expected = []
  for group in rolled.pool:
    for rollout in range(4):
      key = repr((pipe.configs.seed * 1_000_003 + 3, "six", index[group.task.id],
                  [("id", repr(group.task.id))], rollout, 0))
      expected.append(int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little")
                      & 0x7FFFFFFF)
  assert [r.seed for r in engine.calls[0]] == expected


def test_teacher_rows_differ_from_student_rows_only_in_the_prefix(cripo_run, tokenizer):
  _, engine, record, rows, _ = cripo_run
  requests = engine.calls[0]
  start = assistant_start(tokenizer)
  assert len(rows) == len(requests) == 8
  for k, (row, request) in enumerate(zip(rows, requests)):
    text = engine.scripts[tuple(request.prompt_ids)][k % 4]
    answer = tokenizer.encode(text) + [tokenizer.eos_token_id]   # the engine's ids, stop included
    assert list(row.prefix_ids) == list(request.prompt_ids)
    assert list(row.response_ids) == answer
    assert list(row.response_loss_mask) == [1] * len(answer)
    assert list(row.response_behaviour_logprobs) == [-0.5 - 0.01 * i for i in range(len(answer))]
    for prefix in (row.prefix_ids, row.teacher_prefix_ids, row.cf_teacher_prefix_ids):
      if prefix is not None:
        assert list(prefix[-2:]) == start    # the answer follows the assistant start
  batch = batching.assemble(rows, pad_id=tokenizer.pad_token_id, num_rows=8, prefix_multiple=64,
                            response_multiple=64, with_distill=True, with_counterfactual=True)
  p = batch["input_ids"].shape[1] - 64
  for key in ("teacher_input_ids", "cf_teacher_input_ids"):
    np.testing.assert_array_equal(batch[key][:, p:], batch["input_ids"][:, p:])
  distilled = np.flatnonzero(batch["distill_mask"].any(1))
  flipped = np.flatnonzero(batch["cf_mask"].any(1))
  for i, row in enumerate(rows):
    same_teacher = (batch["teacher_input_ids"][i] == batch["input_ids"][i]).all()
    assert same_teacher == (row.teacher_prefix_ids is None)
    assert (i in distilled) == (row.teacher_prefix_ids is not None)
    assert (i in flipped) == (row.cf_teacher_prefix_ids is not None)
  order = [g.task.id for g in record.pool]
  assert distilled.tolist() == [4 * order.index("sunset-red") + BEST["sunset-red"]]
  assert flipped.tolist() == [4 * order.index("sky-blue") + i for i in (1, 3)]


def test_uc_teacher_is_only_on_y_star_with_the_unexplored_criteria(cripo_run, tokenizer):
  pipe, _, record, rows, metrics = cripo_run
  system = pipe.rubric.system_prompt
  for task_id, (k, group, mine) in group_rows(record, rows).items():
    with_teacher = [i for i, row in enumerate(mine) if row.teacher_prefix_ids is not None]
    if not UC[task_id]:
      assert with_teacher == [] and not record.teacher_applies(k)
      continue
    best = int(np.argmax(record.advantages[k]))
    assert with_teacher == [best] == [BEST[task_id]] == [record.analysis[k].best]
    assert record.teacher_applies(k)
    texts = {c.id: c.text for c in group.task.criteria}
    answer = group.trajectories[best].turns[0].action_text
    expected = tokenizer.encode_chat(cripo_prefix.injection_messages(
        group.task.prompt, answer, [texts[j] for j in UC[task_id]], system))
    assert list(mine[best].teacher_prefix_ids) == expected
  assert metrics["cripo/injection_rows"] == 1 and metrics["cripo/frac_samples_with_uc"] == 0.5


def test_sc_teacher_only_on_negative_advantage_answers_meeting_an_sc(cripo_run, tokenizer):
  pipe, _, record, rows, metrics = cripo_run
  system = pipe.rubric.system_prompt
  for task_id, (k, group, mine) in group_rows(record, rows).items():
    texts = {c.id: c.text for c in group.task.criteria}
    with_cf = {i for i, row in enumerate(mine) if row.cf_teacher_prefix_ids is not None}
    assert with_cf == set(COUNTERFACTUAL[task_id])
    for i, ids in COUNTERFACTUAL[task_id].items():
      assert record.advantages[k][i] < 0
      expected = tokenizer.encode_chat(cripo_prefix.counterfactual_messages(
          group.task.prompt, group.trajectories[i].turns[0].action_text,
          [texts[j] for j in ids], system))
      assert list(mine[i].cf_teacher_prefix_ids) == expected
  assert metrics["cripo/counterfactual_rows"] == 2
  assert metrics["cripo/frac_samples_with_sc"] == 0.5 and metrics["cripo/sc_per_sample"] == 0.5


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_switch_the_branches(task_file, tokenizer, scripts, cripo_run, preset):
  pipe, _ = make_scripted(make_config(preset, task_file), tokenizer, scripts)
  _, rows, metrics = run_stages(pipe)
  uc, sc = preset in ("cripo", "cripo_u"), preset in ("cripo", "cripo_s")
  assert sum(r.teacher_prefix_ids is not None for r in rows) == (1 if uc else 0)
  assert sum(r.cf_teacher_prefix_ids is not None for r in rows) == (2 if sc else 0)
  step = pipe.configs.step
  assert (step.teacher_kl.beta > 0, step.teacher_kl.localize, step.flips.counterfactual) == (
      uc, uc, sc)
  # The group analysis and its diagnostics do not depend on the branches.
  _, _, _, cripo_rows, cripo_metrics = cripo_run
  for key in ("cripo/frac_samples_with_uc", "cripo/frac_samples_with_sc", "cripo/sc_per_sample",
              "rollout/reward"):
    assert metrics[key] == cripo_metrics[key]
  assert [r.advantage for r in rows] == [r.advantage for r in cripo_rows]


def test_paper_step_settings_of_the_cripo_preset(task_file):
  step = config_lib.step_config(make_config("cripo", task_file))
  distill, flips = step.teacher_kl, step.flips
  assert (distill.localize, distill.clamp, distill.distill_norm, distill.beta,
          distill.beta_warmup_steps) == (True, 10.0, "kept-tokens", 0.05, 50)
  assert (distill.localize_gamma, distill.localize_edge_frac, distill.divergence) == (
      0.95, 0.01, "forward-kl")
  assert (flips.counterfactual, flips.flip_alpha, flips.flip_tau) == (True, 0.1, 0.1)


def one_step(config, rows, vocab_size, pad_id):
  """Loss, metrics and new params of one train step from a fixed initial model."""
  step_config = config_lib.step_config(config)
  batch = batching.assemble(rows, pad_id=pad_id, num_rows=8, prefix_multiple=64,
                            response_multiple=64, with_distill=step_config.distills,
                            with_counterfactual=step_config.flips.counterfactual)
  optimizer = train_step.make_optimizer(train_step.OptimizerConfig(learning_rate=1e-4))
  mesh = parallel.make_mesh(parallel.MeshShape())
  trainable, state = train_step.create(from_config(tiny.tiny_config(vocab_size), 0), optimizer,
                                       step_config, mesh)
  state, metrics = trainable.step(state, trainable.put_batch(batch))
  return {k: float(v) for k, v in metrics.items()}, jax.tree.leaves(jax.device_get(state.params))


@pytest.mark.slow
def test_grpo_rubric_equals_cripo_with_both_branches_off(task_file, tokenizer, scripts):
  grpo_config = make_config("grpo_rubric", task_file)
  # cripo, then only what validation requires to switch both branches off; its other step
  # settings (clamp, kept-tokens normalisation, warm-up, α, τ_flip) stay.
  off_config = make_config("cripo", task_file, **{
      "rubric.uc_branch": False, "rubric.sc_branch": False, "step.beta": 0.0,
      "step.localize": False, "step.counterfactual": False})
  grpo_rows = run_stages(make_scripted(grpo_config, tokenizer, scripts)[0])[1]
  off_rows = run_stages(make_scripted(off_config, tokenizer, scripts)[0])[1]
  assert [dataclasses.asdict(r) for r in off_rows] == [dataclasses.asdict(r) for r in grpo_rows]
  assert all(r.teacher_prefix_ids is None and r.cf_teacher_prefix_ids is None for r in grpo_rows)
  vocab, pad = tokenizer.vocab_size, tokenizer.pad_token_id
  grpo_metrics, grpo_params = one_step(grpo_config, grpo_rows, vocab, pad)
  off_metrics, off_params = one_step(off_config, off_rows, vocab, pad)
  assert off_metrics["loss"] == grpo_metrics["loss"] != 0
  assert all(np.array_equal(a, b) for a, b in zip(off_params, grpo_params))
  # The full CriPO step (distillation, localisation, flips) on rows without teachers: nothing to
  # distil or flip. The loss is bit-identical; the parameters differ only by the float
  # reassociation of another compiled graph.
  full_metrics, full_params = one_step(make_config("cripo", task_file), grpo_rows, vocab, pad)
  assert full_metrics["loss"] == grpo_metrics["loss"]
  assert full_metrics["kept_frac"] == full_metrics["flip_frac"] == 0
  assert max(float(np.abs(a - b).max()) for a, b in zip(full_params, grpo_params)) < 1e-6


class FlakyChecker(criteria.CriteriaJudge):
  """The checker, except that answers mentioning "cools" get no usable verdicts."""

  backend = "flaky"

  def _judge(self, tasks, answers):
    result = criteria.CheckerJudge().judge(tasks, answers)
    result.unjudged = np.asarray(["cools" in a for a in answers])
    result.stats.unjudged_answers = int(result.unjudged.sum())
    return result


def test_unusable_verdicts_leave_the_answer_out_without_loss(task_file, tokenizer, scripts):
  pipe, _ = make_scripted(make_config("cripo", task_file), tokenizer, scripts)
  pipe.judge_backend = FlakyChecker()
  record, rows, metrics = run_stages(pipe)
  k, group, mine = group_rows(record, rows)["sunset-red"]
  assert record.unjudged[k].tolist() == [False, False, True, False]
  assert not record.verdicts[k][2].any() and group.trajectories[2].reward == 0
  # GRPO over the three judged answers only (R = 0.8, 0, 0); the unjudged one gets A = 0.
  expected = np.zeros(4)
  expected[[0, 1, 3]] = grpo_reference([0.8, 0.0, 0.0])
  np.testing.assert_allclose(record.advantages[k], expected, atol=1e-5)
  assert set(mine[2].response_loss_mask) == {0} and mine[2].advantage == 0
  assert all(set(r.response_loss_mask) == {1} for i, r in enumerate(mine) if i != 2)
  assert metrics["rollout/unjudged"] == 1 / 8 and metrics["judge/unjudged_answers"] == 1
  assert metrics["judge/failed"] == 1


def test_in_process_judge_is_the_policy_through_the_engine(task_file, tokenizer, scripts):
  pipe, engine = make_scripted(make_config("cripo", task_file, **{
      "rubric.judge.backend": "inprocess"}), tokenizer, scripts)
  record, _, metrics = run_stages(pipe)
  questions = sum(len(g.task.criteria) * 4 for g in record.pool)
  assert len(engine.calls) == 2 and len(engine.calls[1]) == metrics["judge/requests"]
  assert metrics["judge/questions"] == questions
  assert metrics["judge/cache_hits"] == questions - len(engine.calls[1])   # "Sunsets are red." x2
  assert all(r.params.temperature == 0 for r in engine.calls[1])
  assert all((v == 1).all() for v in record.verdicts) and not np.concatenate(record.unjudged).any()


def test_evaluation_per_domain_on_held_out_tasks(cripo_run, task_set, scripts):
  pipe, engine, _, _, _ = cripo_run
  assert pipe.train_indices == [0, 1] and pipe.eval_indices == [2, 3, 4, 5]
  results = pipe.evaluate()
  requests = engine.calls[-1]
  assert [r.params.temperature for r in requests] == [0.0] * 4
  groups = {"science": ["rainbow", "thunder-delay"], "medicine": ["heart-chambers", "blood-types"]}
  by_id = {t.id: t for t in task_set.tasks}
  assert sorted(results) == sorted(groups)
  for name, ids in groups.items():
    verdicts = [check(by_id[i], scripts[i][0]) for i in ids]
    weights = [by_id[i].weights for i in ids]
    passed = [bool(v[w > 0].all() and not v[w < 0].any()) for v, w in zip(verdicts, weights)]
    scores = np.asarray([v @ w / w.sum() for v, w in zip(verdicts, weights)])
    half = scipy.stats.t.ppf(0.975, 1) * scores.std(ddof=1) / np.sqrt(2)
    result = results[name]
    assert result["pass_rate"] == np.mean(passed) and result["episodes"] == 2
    assert (result["ci_low"], result["ci_high"]) == stats.wilson_interval(sum(passed), 2)
    assert result["score"] == pytest.approx(scores.mean(), abs=1e-6)
    assert result["score_ci_low"] == pytest.approx(scores.mean() - half, abs=1e-5)
    assert result["score_ci_high"] == pytest.approx(scores.mean() + half, abs=1e-5)
    met = [v[w > 0].mean() for v, w in zip(verdicts, weights)]
    assert result["criteria_met"] == pytest.approx(np.mean(met), abs=1e-6)
  assert results["science"]["pass_rate"] == 0.5   # the reference passes, "I do not know" fails
  stats.check_results(results, "results")        # what the run log accepts


def test_visible_answer_and_engine_limits(task_file, tokenizer):
  assert visible_answer("<think>\nplan</think>\n\nAir scatters.", True) == "Air scatters."
  assert visible_answer("  <think>still thinking", True) == ""
  assert visible_answer("<think>x</think> y ", False) == "<think>x</think> y"

  def bucketed(prompt_bucket):
    return ScriptedEngine(tokenizer, limits=EngineLimits.of_buckets((prompt_bucket,), (64,)))

  with pytest.raises(ValueError, match=r"rubric task '.*': its prompt has \d+ tokens, more than "
                                       r"the engine's largest prompt bucket 16"):
    make_pipeline(make_config("cripo", task_file), bucketed(16), tokenizer)
  with pytest.raises(ValueError, match=r"max_new_tokens=100 is above the engine's largest "
                                       r"new-token bucket 64"):
    make_pipeline(make_config("cripo", task_file, **{"rubric.max_new_tokens": 100}),
                  bucketed(512), tokenizer)


def test_task_stream_split_and_resume():
  train, held_out = split_tasks(128, 32, split_seed=3)
  assert len(held_out) == 32 and sorted(train + held_out) == list(range(128))
  assert split_tasks(128, 32, split_seed=3) == (train, held_out)
  stream = tasks.ShuffledStream(train[:5], seed=7)
  first = stream.next(3) + stream.next(4) + stream.next(3)
  assert sorted(first[:5]) == sorted(train[:5]) == sorted(first[5:10])
  assert first[:5] != first[5:10]                 # a new order each epoch
  resumed = tasks.ShuffledStream(train[:5], seed=7)
  resumed.load_state_dict(json.loads(json.dumps(stream.state_dict())))
  assert resumed.next(6) == stream.next(6)
  with pytest.raises(ValueError, match="eval_tasks=128"):
    split_tasks(128, 128, 0)


@pytest.mark.parametrize("name, beta", [("cripo_qwen3_1p7b", 0.05), ("cripo_qwen3_4b", 0.03)])
def test_paper_configs_validate_without_the_model(name, beta):
  path = CONFIGS / f"{name}.py"
  for preset in PRESETS:
    c = load_config_file(path, preset)
    pipelines.validate(c)
    assert (c.rollout.group_size, c.select.batch_groups, c.select.pool_groups) == (8, 64, 64)
    assert (c.optim.learning_rate, c.train.steps, c.rubric.max_new_tokens) == (1e-6, 200, 4096)
    assert c.step.beta == (beta if preset in ("cripo", "cripo_u") else 0.0)
    if preset in ("cripo", "cripo_u"):
      # The paper's normaliser under micro-batching: the kept set comes from the pre-pass.
      step = config_lib.step_config(c)
      assert (step.teacher_kl.distill_norm, step.micro_batches, step.kept_pre_pass) == (
          "kept-tokens", 8, True)
    assert c.rollout.engine == "sglang" and c.rubric.judge.backend == "openai"
    assert c.rubric.judge.options.model == "Qwen/Qwen3-32B"
    assert not Path(c.model.source).exists()
    local = load_config_file(path, f"{preset},local")
    pipelines.validate(local)
    assert (local.rollout.engine, local.rubric.judge.backend) == ("jax", "checker")
    assert local.select.batch_groups * local.rollout.group_size <= 8 and local.train.steps <= 2
  with pytest.raises(ValueError, match="unknown flag"):
    load_config_file(path, "cripo,huge")


def test_cpu_config_validates():
  for preset in PRESETS:
    c = load_config_file(CONFIGS / "cripo_cpu.py", preset)
    pipelines.validate(c)
    assert c.pipeline == "rubric" and c.model.source == "smollm2-135m-instruct"
    if preset in ("cripo", "cripo_u"):
      assert (c.step.distill_norm, c.step.micro_batches) == ("kept-tokens", 1)


@pytest.mark.parametrize("edits, message", [
    ({"step.beta": 0.0, "step.localize": False}, r"uc_branch=True but config.step.beta=0.0"),
    ({"step.counterfactual": False}, r"sc_branch=True but config.step.counterfactual=False"),
    ({"rubric.uc_branch": False}, r"uc_branch=False but config.step.beta=0.05"),
    ({"advantage": "rloo"}, r"config.advantage='rloo'"),
    ({"select.name": "rised"}, r"trains on every group"),
    ({"rubric.eval_tasks": 6}, r"eval_tasks=6"),
    ({"rubric.judge.backend": "rules"},
     r"^config\.rubric\.judge\.backend: unknown criteria judge 'rules'; known: \['checker', "),
    ({"rubric.judge.backend": "openai"}, r"needs option\(s\) \['model'\]"),
    ({"rubric.tasks": "/nonexistent/tasks.jsonl"}, r"/nonexistent/tasks.jsonl"),
    ({"rubric.max_new_tokens": 1000}, r"max_new_tokens=1000 is above"),
    ({"rubric.cripo.reward_normalizer": "max"}, r"reward_normalizer='max'"),
    ({"rubric.eval_groups.medicine": ["medicine", "physics"]}, r"'physics' is in both"),
    ({"rubric.injection_template": "/nonexistent/inject.jinja"}, r"/nonexistent/inject.jinja"),
])
def test_validation_names_the_bad_key(task_file, edits, message):
  with pytest.raises((ValueError, FileNotFoundError), match=message):
    make_config("cripo", task_file, **edits)


@pytest.mark.slow
def test_end_to_end_tiny_run(tmp_path, task_set, tokenizer):
  """The `cripo,local` smoke config through `trainer.train`, on a tiny random model."""
  model_dir = tmp_path / "tiny_model"
  save_pretrained(from_config(tiny.tiny_config(tokenizer.vocab_size), 0), tokenizer, model_dir)
  c = load_config_file(CONFIGS / "cripo_qwen3_1p7b.py", "cripo,local")
  c.model.source = str(model_dir)
  summary = trainer.train(c, tmp_path / "run")
  records = runlog.read_jsonl(tmp_path / "run" / runlog.METRICS_FILE)
  steps = [r for r in records if "loss" in r]
  assert [r["step"] for r in steps] == [1, 2]
  for r in steps:
    for key in ("cripo/frac_samples_with_uc", "cripo/frac_samples_with_sc", "kept_frac"):
      assert 0 <= r[key] <= 1, key
    assert r["cripo/sc_per_sample"] >= 0 and 0 <= r["flip_frac"] <= 1
    # The fractions are the counts over their own denominators (injection / counterfactual rows).
    assert 0 <= r["kept_tokens"] <= r["distill_tokens"] and 0 <= r["flipped_tokens"] <= r["cf_tokens"]
    assert r["kept_frac"] == pytest.approx(r["kept_tokens"] / max(r["distill_tokens"], 1))
    assert r["flip_frac"] == pytest.approx(r["flipped_tokens"] / max(r["cf_tokens"], 1))
    assert (r["cf_tokens"] > 0) == (r["cripo/counterfactual_rows"] > 0)
    assert np.isfinite(r["loss"]) and r["judge/answers"] == 8
    # One injection row per group with UC (unless y* is an empty answer).
    with_uc = round(r["cripo/frac_samples_with_uc"] * 2)
    assert with_uc - r["cripo/skipped_empty_answers"] <= r["cripo/injection_rows"] <= with_uc
    assert (r["distill_tokens"] > 0) == (r["cripo/injection_rows"] > 0)
  rollouts = runlog.read_jsonl(tmp_path / "run" / runlog.ROLLOUTS_FILE)
  # Every line is an answer to a training task of the set, named by its key (no environment).
  task_set = load_task_set(c.rubric.tasks)
  train, _ = split_tasks(len(task_set), c.rubric.eval_tasks, c.rubric.split_seed)
  assert task_set.name == "rubric_science_medicine"
  assert len(rollouts) == 16 and {r["task"] for r in rollouts} <= {
      task_set.tasks[i].key for i in train}
  assert not any("env" in r or "seed" in r for r in rollouts)
  assert sum(r["teacher"] for r in rollouts) == 4 * sum(r["cripo/injection_rows"] for r in steps)
  assert set(summary["before"]) == set(summary["after"]) <= {"science", "medicine", "other"}
  assert sum(r["episodes"] + r["unjudged"] for r in summary["after"].values()) == 4
