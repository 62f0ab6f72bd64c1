"""Tiny runs through faults that used to end them (issue 23): an SGLang server whose every
10th training reply is empty, and a plug-in environment that opens with 3,000 words on every
third seed. Each run finishes, and its metrics count exactly the injected faults (the oracle
replays the task stream)."""
from __future__ import annotations

import itertools
import json
import math
import threading
from pathlib import Path

from rised_jax import trainer
from rised_jax.model import tiny
from tests.helpers.fake_sglang_server import FakeSGLangServer
from tests.helpers.fault_envs import faulty
from tests.helpers.run_fixtures import load_config_file, training_tasks

CONFIG = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "tiny_cpu.py"
WORDY = "wordy"   # an alias of the plug-in, as a user's config names one


def step_lines(workdir: Path) -> list[dict]:
  lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [line for line in lines if "time/rollout" in line]   # the steps' (not eval) lines


def base_config(model_dir: Path, env: str, difficulty: dict):
  config = load_config_file(CONFIG, "rised")
  config.model.source = str(model_dir)
  config.envs.aliases = {"wordy": "tests.helpers.fault_envs:Wordy"}
  config.envs.names = [env]
  config.envs.difficulty = {env: difficulty}
  config.select.pool_groups = 4
  config.select.batch_groups = 4
  config.train.steps = 2
  config.eval.episodes_per_env = 3
  return config


def test_a_run_whose_server_sends_an_empty_reply_every_10th_request_finishes(tmp_path):
  # Before: the empty reply passed validation and raised in the agent loop, ending the run.
  model_dir = tiny.write(tmp_path / "model", ["frozenlake"])
  tokenizer = tiny.build_tokenizer(tiny.environment_words(["frozenlake"]))
  count, lock = itertools.count(1), threading.Lock()
  injected = []

  def every_10th_training_request(body) -> bool:
    if body["sampling_params"]["temperature"] == 0:   # evaluation (greedy) is left alone
      return False
    with lock:
      hit = next(count) % 10 == 0
      injected.append(hit)
    return hit

  with FakeSGLangServer(vocab_size=tokenizer.vocab_size) as server:
    server.poison("empty", every_10th_training_request)
    config = base_config(model_dir, "frozenlake",
                         dict(size=3, holes=0, min_distance=2, max_turns=4))
    config.rollout.engine = "sglang"
    config.rollout.sglang_url = server.url
    workdir = tmp_path / "run"
    trainer.train(config, workdir)
  lines = step_lines(workdir)
  assert [line["step"] for line in lines] == [1, 2]
  assert all(math.isfinite(v) for line in lines for v in line.values() if isinstance(v, float))
  # Each empty reply was asked again once (the next is sound): counted, no group lost.
  assert sum(injected) >= 2
  assert sum(line["rollout/server_retries"] for line in lines) == sum(injected)
  assert sum(line["rollout/groups_dropped"] for line in lines) == 0


def test_a_run_whose_environment_opens_with_3000_words_on_every_third_seed_finishes(tmp_path):
  # Before: the prompt-length check raised outside the environment-error path.
  model_dir = tiny.write(tmp_path / "model", ["frozenlake"])
  config = base_config(model_dir, WORDY, dict(size=3, holes=0, min_distance=2, max_turns=4,
                                              fault_every=3, words=3000))
  workdir = tmp_path / "run"
  trainer.train(config, workdir)
  lines = step_lines(workdir)
  held_out, steps = training_tasks(config)
  assert [line["step"] for line in lines] == [1, 2]
  long = [sum(faulty(task.seed, 3) for task in tasks) for tasks in steps]
  assert sum(long) > 0 and all(n < config.select.pool_groups for n in long)
  # One error per group: its first rollout's reset (the others are not started).
  assert [line["rollout/env_errors"] for line in lines] == long
  assert [line["rollout/groups_dropped"] for line in lines] == long
  # Evaluation leaves the long instances out and counts them.
  evals = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()
           if f"eval/{WORDY}/env_errors" in line]
  assert evals, "no evaluation line"
  assert evals[-1][f"eval/{WORDY}/env_errors"] == sum(faulty(t.seed, 3) for t in held_out)
