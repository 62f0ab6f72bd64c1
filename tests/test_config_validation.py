"""Config errors come before anything loads, each naming the key, the value and what is expected;
`--config.algorithm` re-applies its preset."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from rised_jax import config as config_lib
from rised_jax import pipelines
from rised_jax import trainer
from tests.helpers.run_fixtures import load_config_file

CONFIGS = Path(__file__).resolve().parent.parent / "experiments" / "configs"


def _tiny(arg: str = "rised", **edits):
  config = load_config_file(CONFIGS / "tiny_cpu.py", arg)
  for dotted, value in edits.items():
    config_lib._set(config, dotted, value)
  return config


@pytest.mark.parametrize("edits, message", [
    # Each was accepted by `validate` before and failed later (or never).
    ({"select.pool_groups": 0, "select.batch_groups": 0},
     r"config\.select\.pool_groups=0: expected an integer >= 1"),
    ({"train.checkpoint_every": 0}, r"config\.train\.checkpoint_every=0: expected an integer >= 1"),
    ({"rollout.temperature": -1.0},
     r"config\.rollout\.temperature=-1\.0: expected a finite number"),
    ({"train.eval_every": -1}, r"config\.train\.eval_every=-1: expected an integer >= 0"),
    ({"train.wandb": None}, r"config\.train\.wandb=None: expected True or False"),
    ({"optim.learning_rate": math.nan}, r"config\.optim: learning_rate=nan: expected a finite"),
    ({"optim.learning_rate": math.inf}, r"config\.optim: learning_rate=inf: expected a finite"),
    ({"optim.b2": 1.0}, r"b2=1\.0.*expected b1, b2 in \[0, 1\)"),
    ({"step.eps_high": math.nan}, r"config\.step: eps_high=nan: expected a finite number"),
    ({"rollout.top_p": 0.0}, r"config\.rollout\.top_p=0\.0: expected a number in \(0, 1\]"),
    ({"rollout.prompt_buckets": []}, r"config\.rollout\.prompt_buckets=\[\]: expected a list"),
    ({"rollout.matmul_operands": "bf16"},
     r"config\.rollout\.matmul_operands='bf16': expected one of \('compute', 'bfloat16'\)"),
    # Silently ignored before: the option shapes only the in-process sampler's matmuls.
    ({"rollout.engine": "sglang", "rollout.sglang_url": "http://127.0.0.1:30000",
      "rollout.matmul_operands": "bfloat16"},
     r"config\.rollout\.matmul_operands='bfloat16': applies to the in-process sampler"),
    ({"select.name": "best"}, r"config\.select\.name: unknown selector 'best'; known: \["),
    ({"select.options": {"lambda_": 0.5}}, r"selector 'rised' has no option\(s\) \['lambda_'\]"),
    ({"judge.backend": "gpt"}, r"config\.judge\.backend: unknown judge 'gpt'; known: \["),
    ({"judge.backend": "openai"}, r"config\.judge: judge 'openai' needs option\(s\) \['model'\]"),
    ({"teacher.options": {"max_tag": 2}}, r"config\.teacher\.options: .*\['max_tag'\]"),
    ({"mesh": {"data": 0, "fsdp": -1, "tensor": 1}}, r"config\.mesh: .*positive or -1"),
    ({"mesh": {"data": -1, "fsdp": -1, "tensor": 1}}, r"config\.mesh: .*at most one axis"),
    ({"mesh": {"data": 1.5, "fsdp": -1, "tensor": 1}}, r"config\.mesh=.*expected integer"),
    ({"model.compute_dtype": "float16"},
     r"config\.model\.compute_dtype='float16': expected one of \['float32', 'bfloat16'\]"),
    ({"model.source": " "}, r"config\.model\.source=' ': expected a non-empty string"),
    ({"batching.response_multiple": 0},
     r"config\.batching\.response_multiple=0: expected an integer >= 1"),
    ({"batching.length_buckets": [512, 0]},
     r"config\.batching\.length_buckets=\[512, 0\]: expected a list of integers >= 1"),
    ({"batching.shared_prefix": True, "step.micro_batches": 3},
     r"config\.select\.batch_groups=2 is not divisible by step\.micro_batches × "
     r"train\.mini_batches = 3"),
    ({"algorithm": "bogus"}, r"config\.algorithm='bogus': expected one of"),
    ({"teacher.enabled": True, "step.beta": 0.0},
     r"config\.teacher\.enabled=True but config\.step\.beta=0\.0"),
])
def test_bad_values_are_named_before_the_model_loads(edits, message):
  with pytest.raises(ValueError, match=message):
    pipelines.validate(_tiny(**edits))


def test_a_misspelt_key_is_named_with_the_likely_one():
  config = _tiny()
  with config.unlocked():
    config.train.stpes = 3
  with pytest.raises(ValueError, match=r"config\.train\.stpes=3: unknown key; did you mean "
                                       r"'train\.steps'\?"):
    pipelines.validate(config)


def test_a_saved_config_without_a_newer_key_keeps_its_default():
  """A run's config.json written before `batching.shared_prefix` existed still validates and
  reads as the behaviour it ran with (the row layout)."""
  config = _tiny()
  with config.unlocked():
    del config.batching["shared_prefix"]
  pipelines.validate(config)
  from rised_jax.pipelines import stages  # noqa: PLC0415
  assert stages.stage_configs(config).batching.shared_prefix is False


def test_open_option_dicts_take_new_keys():
  pipelines.validate(_tiny(**{"judge.options": {"progress_min_fraction": 0.25}}))


def test_mesh_is_checked_against_the_devices_when_known():
  config = _tiny(mesh={"data": 2, "fsdp": -1, "tensor": 1})
  pipelines.validate(config)             # a dry run elsewhere: the shape itself is fine
  pipelines.validate(config, num_devices=4)
  with pytest.raises(ValueError, match=r"config\.mesh: .*does not divide the 3 devices"):
    pipelines.validate(config, num_devices=3)


def test_algorithm_override_reapplies_the_preset_and_explicit_keys_win():
  config = _tiny("rised")
  config.algorithm = "grpo"               # what config_flags does with --config.algorithm=grpo
  config_lib.reapply_preset(config, {"algorithm": "grpo"})
  assert (config.select.name, config.teacher.enabled, config.guidance.enabled,
          config.step.beta) == ("uniform", False, False, 0.0)
  assert config.select.pool_groups == config.select.batch_groups == 2
  pipelines.validate(config)

  config = _tiny("rised")
  config.algorithm, config.guidance.enabled = "rised_no_guidance", True
  config_lib.reapply_preset(config, {"algorithm": "rised_no_guidance", "guidance.enabled": True})
  assert (config.select.name, config.teacher.enabled, config.guidance.enabled) == (
      "rised", True, True)


def test_switching_to_a_selecting_preset_asks_for_the_pool_it_lost():
  config = _tiny("grpo")                  # pool_groups = batch_groups = 2, beta 0
  config.algorithm = "rised"
  with pytest.raises(ValueError,
                     match=r"--config\.algorithm=rised: .*--config\.select\.pool_groups"):
    config_lib.reapply_preset(config, {"algorithm": "rised"})
  config = _tiny("grpo")
  config.algorithm, config.select.pool_groups = "rised", 4
  config_lib.reapply_preset(config, {"algorithm": "rised", "select.pool_groups": 4})
  with pytest.raises(ValueError, match=r"teacher\.enabled=True but config\.step\.beta=0\.0.*"
                                       r"--config\.step\.beta"):
    pipelines.validate(config)


def test_build_checks_the_mesh_against_the_devices_before_loading_the_model(tmp_path):
  config = _tiny(mesh={"data": jax.device_count() + 1, "fsdp": 1, "tensor": 1})
  config.model.source = str(tmp_path / "no_such_model")   # loading it would fail differently
  with pytest.raises(ValueError, match=r"config\.mesh: .*needs \d+ devices, found"):
    trainer.build(config, tmp_path / "run")


# Issue 23, point 8: each was accepted by validation and failed only once the model had loaded
# (some naming an engine's argument instead of the key); now each is refused first, naming the
# key, the value and what is expected.
_REMOTE = {"envs.names": ["alfworld"],
           "envs.aliases": {"alfworld": "rised_jax.envs.remote:ALFWorld"}}
LATE_ERRORS = [
    ({"envs.difficulty.maze.width": -3},
     r"config\.envs\.difficulty\.maze=\{.*'width': -3.*\}: maze: width must be an integer in "
     r"\[2, 12\], got -3"),
    ({"envs.names": ["maze"], "envs.difficulty": {"maze": {"width": "3"}}},
     r"config\.envs\.difficulty\.maze=\{'width': '3'\}: maze: width must be an integer in "
     r"\[2, 12\], got '3'"),
    ({**_REMOTE, "envs.difficulty": {"alfworld": {"url": "file:///etc/passwd", "items": 3}}},
     r"config\.envs\.difficulty\.alfworld=.*alfworld: url must be an http\(s\) URL, got "
     r"'file:///etc/passwd'"),
    ({**_REMOTE, "envs.difficulty": {"alfworld": {"url": "http://envhost:36001", "items": 0}}},
     r"config\.envs\.difficulty\.alfworld=.*alfworld: items must be an integer in \[1, "
     r"1000000000\], got 0"),
    ({"eval.pass_at_k": 9},
     r"config\.eval\.pass_at_k=9 with config\.eval\.temperature=0\.0: .*needs a temperature > 0"),
    ({"rollout.prompt_buckets": [8]},
     r"config\.rollout\.prompt_buckets=\[8\]: expected a bucket >= 767, the longest prompt "
     r"config\.rollout\.max_total_tokens=768 allows"),
    ({"rollout.new_token_buckets": [2]},
     r"config\.rollout\.new_token_buckets=\[2\]: expected a bucket >= "
     r"config\.rollout\.max_new_tokens_per_turn=4"),
    ({"rollout.engine": "sglang", "rollout.sglang_url": "notaurl"},
     r"config\.rollout\.sglang_url='notaurl': expected the SGLang server's http\(s\) URL"),
    ({"rollout.engine": "sglang", "rollout.sglang.weight_sync": "nccl"},
     r"config\.rollout\.sglang\.weight_sync='nccl': expected one of \('disk', 'tensor'\)"),
    ({"rollout.sglang.tensor_bucket_bytes": 0},
     r"rollout\.sglang\.tensor_bucket_bytes.*an integer >= 1 \(bytes\)"),
    ({"judge.vocabulary": "os:abort"},
     r"vocabulary 'os:abort' is the callable <built-in function abort>, not declared a "
     r"vocabulary factory, so it is not called"),
]


@pytest.mark.parametrize("edits, message", LATE_ERRORS)
def test_inputs_that_failed_after_the_model_loaded_are_refused_by_validation(edits, message):
  config = _tiny()
  for dotted, value in edits.items():
    config_lib._set(config, dotted, value)
  with pytest.raises(ValueError, match=message) as error:
    pipelines.validate(config)
  assert "\n" not in str(error.value)


def test_a_workdir_that_is_a_file_is_refused_before_anything_loads(tmp_path):
  (tmp_path / "afile").write_text("x")
  for workdir in (tmp_path / "afile", tmp_path / "afile" / "run"):
    with pytest.raises(ValueError, match=rf"--workdir '{workdir}' (is|lies under .*afile, which "
                                         r"is) an existing file; expected a directory"):
      trainer.check_workdir(trainer.resolve_workdir(workdir))
  trainer.check_workdir(trainer.resolve_workdir(tmp_path / "new" / "run"))   # to be created
  config = _tiny()
  config.model.source = str(tmp_path / "no_such_model")   # loading it would fail differently
  with pytest.raises(ValueError, match=r"--workdir .*afile' is an existing file"):
    trainer.build(config, tmp_path / "afile")


@pytest.mark.parametrize("args, message", [
    (["--config.judge.vocabulary=os:abort"],
     "vocabulary 'os:abort' is the callable <built-in function abort>, not declared"),
    (["--config.envs.difficulty.maze.width=-3"],
     "config.envs.difficulty.maze={"),
    (["--config.rollout.prompt_buckets=8"], "config.rollout.prompt_buckets=[8]: expected"),
    (["WORKDIR_IS_A_FILE"], "is an existing file; expected a directory"),
])
def test_dry_run_refuses_them_with_the_key_on_its_last_line(tmp_path, args, message):
  """`rised-train --dry_run` in a subprocess: a clean exit code 1 (os:abort was rc -6, the
  process killed during validation), the error on the last line of stderr."""
  workdir = tmp_path / "run"
  if args == ["WORKDIR_IS_A_FILE"]:
    workdir.write_text("not a directory")
    args = []
  code = "import sys; from rised_jax import main; sys.argv[0] = 'rised-train'; main.train_entry()"
  proc = subprocess.run(
      [sys.executable, "-c", code, f"--config={CONFIGS / 'tiny_cpu.py'}",
       f"--workdir={workdir}", "--dry_run", f"--config.model.source={tmp_path / 'none'}", *args],
      cwd=tmp_path, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
      timeout=300)
  assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("ValueError: ") or last.startswith("rised_jax."), last
  assert message in last, last
  assert "dry run: the config is valid" not in proc.stdout


def test_the_compilation_cache_is_off_for_shared_prefixes_on_several_cpu_devices():
  """Hand cases of `trainer.compilation_cache_problem`: only shared prefixes on several CPU
  devices with a cache configured turn it off (a cached executable of that step deadlocks)."""
  from rised_jax.pipelines import stages  # noqa: PLC0415
  shared = stages.stage_configs(_tiny(**{"batching.shared_prefix": True}))
  rows = stages.stage_configs(_tiny())
  uncached = stages.stage_configs(_tiny(**{"batching.shared_prefix": True,
                                           "train.compilation_cache": ""}))
  assert "shared_prefix on 4 CPU devices" in trainer.compilation_cache_problem(shared, "cpu", 4)
  assert trainer.compilation_cache_problem(shared, "cpu", 1) is None
  assert trainer.compilation_cache_problem(shared, "gpu", 4) is None
  assert trainer.compilation_cache_problem(rows, "cpu", 4) is None
  assert trainer.compilation_cache_problem(uncached, "cpu", 4) is None
