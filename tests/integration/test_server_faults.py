"""Impossible SGLang replies in a training step (issue 9): the real SGLangEngine against the
loopback fake, inside the RISED and CriPO pipelines. A request whose replies stay impossible
after its retries drops its whole group, the step's metrics count it, and nothing of it
reaches the trained batch."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.fake_sglang_server import FakeSGLangServer
from rised_jax import config as config_lib
from rised_jax import pipelines
from rised_jax import trainer
from rised_jax.learn import batching
from rised_jax.model import tiny
from rised_jax.pipelines import make_pipeline
from rised_jax.rollout.agent_loop import sampling_seed
from rised_jax.rollout.sglang_engine import SGLangEngine
from tests.helpers.run_fixtures import load_config_file, training_tasks

CONFIG = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "tiny_cpu.py"
FAULTS = ["bad_token", "nan_logprob", "positive_logprob", "too_many", "short_logprobs"]


@pytest.fixture(scope="module")
def tokenizer():
  return tiny.build_tokenizer(tiny.environment_words(["frozenlake"]))


@pytest.fixture(scope="module")
def server(tokenizer):
  with FakeSGLangServer(vocab_size=tokenizer.vocab_size) as fake:
    yield fake


def engine_for(server, tokenizer) -> SGLangEngine:
  # One request at a time: request 0 meets both faulty replies (its attempt and its retry).
  return SGLangEngine(server.url, vocab_size=tokenizer.vocab_size, max_concurrency=1,
                      max_retries=1, backoff_s=0.001)


def agentic_config():
  config = load_config_file(CONFIG, "rised")
  config.envs.names = ["frozenlake"]
  config.envs.difficulty = {"frozenlake": dict(size=2, holes=0, min_distance=1, max_turns=1)}
  config.select.pool_groups = 4
  config.select.batch_groups = 4
  return config


def rubric_config():
  c = config_lib.default_config()
  c.algorithm = "cripo"
  c.rubric.max_new_tokens = 8
  c.rollout.group_size = 4
  c.select.batch_groups = 3
  c = config_lib.apply_preset(c)
  pipelines.validate(c)
  return c


def one_step(pipe):
  """(the step's pool, rows, metrics): the stages in the trainer's order, on step 0."""
  record = pipe.roll_out(0)
  for stage in (pipe.judge, pipe.advantages, pipe.select, pipe.teach):
    record = stage(record)
  return record.pool, pipe.rows(record), pipe.metrics(record)


def check_batch(rows, vocab_size, pad_id, num_rows):
  batch = batching.assemble(rows, pad_id=pad_id, num_rows=num_rows)
  assert batch["input_ids"].min() >= 0 and batch["input_ids"].max() < vocab_size
  logprobs = batch["behaviour_logprobs"][batch["loss_mask"] > 0]
  assert logprobs.size and np.isfinite(logprobs).all() and (logprobs <= 0).all()


@pytest.mark.parametrize("fault", FAULTS)
def test_agentic_step_drops_the_group_of_a_failed_request(server, tokenizer, fault):
  server.reset()
  config = agentic_config()
  with engine_for(server, tokenizer) as engine:
    pipe = make_pipeline(config, engine, tokenizer)
    tasks = copy.deepcopy(pipe.tasks).next(4)          # the step's tasks, before any drop
    server.inject("/generate", fault, times=2)
    pool, rows, metrics = one_step(pipe)
  group_size = config.rollout.group_size
  assert [g.task for g in pool] == tasks[1:]          # the first task's group is gone, whole
  assert metrics["rollout/groups_dropped"] == 1.0
  # The two faults: a retry, then the retried request's last attempt (max_retries=1).
  assert metrics["rollout/server_retries"] == 1.0 and metrics["rollout/failed_requests"] == 1.0
  assert metrics["judge/failed"] == 0.0               # the rule judge tags every rollout
  assert len(rows) == 3 * group_size
  assert len(server.calls_to("/generate")) == 4 * group_size + 1   # + the one retry
  check_batch(rows, tokenizer.vocab_size, tokenizer.pad_token_id, 4 * group_size)


@pytest.mark.parametrize("fault", ["bad_token", "too_many"])
def test_rubric_step_drops_the_group_of_a_failed_request(server, tokenizer, fault):
  server.reset()
  config = rubric_config()
  with engine_for(server, tokenizer) as engine:
    pipe = make_pipeline(config, engine, tokenizer)
    first = pipe.tasks.next(3)
    pipe.tasks.cursor = 0
    server.inject("/generate", fault, times=2)
    pool, rows, metrics = one_step(pipe)
  assert [g.task for g in pool] == [pipe.task_set.tasks[i] for i in first[1:]]
  assert metrics["rollout/groups_dropped"] == 1.0
  # The two faults: a retry, then the retried request's last attempt (max_retries=1).
  assert metrics["rollout/server_retries"] == 1.0 and metrics["rollout/failed_requests"] == 1.0
  assert metrics["judge/failed"] == 0.0               # the offline checker judges everything
  assert len(rows) == 2 * config.rollout.group_size
  check_batch(rows, tokenizer.vocab_size, tokenizer.pad_token_id, 3 * config.rollout.group_size)


def test_a_step_whose_groups_all_fail_is_an_error(server, tokenizer):
  server.reset()
  config = agentic_config()
  with SGLangEngine(server.url, vocab_size=tokenizer.vocab_size, max_retries=0,
                    backoff_s=0.001) as engine:
    pipe = make_pipeline(config, engine, tokenizer)
    server.inject("/generate", "bad_token", times=4 * config.rollout.group_size)
    with pytest.raises(RuntimeError, match="step 0: every one of the 4 rollout groups was "
                                           "dropped"):
      pipe.roll_out(0)


def test_sglang_keys_are_validated():
  config = config_lib.default_config()
  assert (config.rollout.sglang.timeout_s, config.rollout.sglang.retries) == (600.0, 3)
  for key, value, expected in [("timeout_s", 0.0, "a finite number of seconds > 0"),
                               ("timeout_s", float("inf"), "a finite number of seconds > 0"),
                               ("timeout_s", float("nan"), "a finite number of seconds > 0"),
                               ("retries", -1, "an integer >= 0")]:
    bad = config_lib.default_config()
    bad.rollout.sglang[key] = value
    with pytest.raises(ValueError, match=rf"config.rollout.sglang.{key}=.*expected {expected}"):
      pipelines.validate(bad)


def poisoned(body) -> bool:
  """The training requests (sampled, not greedy) whose seed is a multiple of 7."""
  sampling = body["sampling_params"]
  return sampling["temperature"] > 0 and sampling["sampling_seed"] % 7 == 0


def test_a_run_on_a_faulty_server_drops_and_counts_and_stays_finite(server, tokenizer, tmp_path):
  # Before issue 9 the client took the 10**6 token id, and the first step's loss was NaN.
  server.reset()
  server.poison("bad_token", poisoned)
  model_dir = tiny.write(tmp_path / "model", ["frozenlake"])
  config = agentic_config()
  config.model.source = str(model_dir)
  config.rollout.engine = "sglang"
  config.rollout.sglang_url = server.url
  config.rollout.sglang.retries = 1
  config.train.steps = 2
  config.eval.episodes_per_env = 2
  workdir = tmp_path / "run"
  trainer.train(config, workdir)
  lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  lines = [line for line in lines if "time/rollout" in line]   # the steps' (not eval) lines
  assert [line["step"] for line in lines] == [1, 2]
  # The oracle: which groups have a poisoned request, from the tasks and seeds of each step.
  _, steps = training_tasks(config)
  for step, (line, tasks) in enumerate(zip(lines, steps, strict=True)):
    seeds = [[sampling_seed(config.seed * 1_000_003 + step, task, rollout, 0)
              for rollout in range(config.rollout.group_size)]
             for task in tasks]
    bad = [sum(seed % 7 == 0 for seed in group) for group in seeds]
    assert all(math.isfinite(v) for v in line.values() if isinstance(v, float))
    assert line["rollout/groups_dropped"] == sum(b > 0 for b in bad)
    assert line["rollout/server_retries"] == sum(bad)   # one retry per poisoned request
    assert line["judge/failed"] == 0
  assert sum(line["rollout/groups_dropped"] for line in lines) > 0
  # Each step's sync exported version step + 1 (both kept): sync/bytes are its files.
  for step, line in enumerate(lines):
    export = workdir / "weights" / f"v{step + 1}"
    assert line["sync/bytes"] == sum(p.stat().st_size for p in export.iterdir())
    assert line["sync/seconds"] > 0


def test_a_run_syncs_weights_by_tensor_and_writes_none(server, tmp_path):
  server.reset()
  model_dir = tiny.write(tmp_path / "model", ["frozenlake"])
  config = agentic_config()
  config.model.source = str(model_dir)
  config.rollout.engine = "sglang"
  config.rollout.sglang_url = server.url
  config.rollout.sglang.weight_sync = "tensor"
  config.train.steps = 2
  config.eval.episodes_per_env = 2
  workdir = tmp_path / "run"
  trainer.train(config, workdir)
  lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  lines = [line for line in lines if "time/rollout" in line]
  posts = server.calls_to("/update_weights_from_tensor")
  # The whole tiny model fits one bucket: one request per step, versions 1 and 2.
  assert [p["weight_version"] for p in posts] == ["1", "2"]
  assert [line["sync/bytes"] for line in lines] == [
      float(len(p["serialized_named_tensors"][0])) for p in posts]
  assert not server.calls_to("/update_weights_from_disk")
  assert not (workdir / "weights").exists()
  # The fake's log-probs follow its own rule, not the policy: the check sees a wrong sampler.
  # Step 2's rows are sampled under a guidance hint, so it compares none and logs no mean.
  assert [line["rollout/logprob_diff_tokens"] > 0 for line in lines] == [True, False]
  assert lines[0]["rollout/logprob_diff"] > 0.1
  assert "rollout/logprob_diff" not in lines[1]
