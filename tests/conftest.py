"""Shared test set-up. tests/ mirrors rised_jax/ (tests/learn/ tests rised_jax/learn/, and so
on; runs across the package live in tests/integration/). The helpers every test file may import
live in one package, tests/helpers/:

  fake_engine.py      FakeEngine, the one scripted engine behind the whole Engine protocol
  fake_*_server.py    loopback SGLang, Gemini (google-genai) and OpenAI-compatible servers
  run_fixtures.py     experiment config files (load_config_file), a scripted agentic
                      pipeline, hand-made run directories
  model_utils.py      tiny random decoders and reference forward passes
  step_fixtures.py    a tiny model, optimizer, step config and batches for the step tests
  step_harness.py     the train step and export on a fixed device/process layout (a subprocess)
  learning_envs.py    Signpost, the learning test's plug-in game (the alias `signpost` of
                      tiny_cpu.py: the alias, not this path, is hashed into that test's seeds)

Every folder under tests/ is a package (an __init__.py), so pytest's default import mode puts
the repo root on sys.path and names each test module by its path (tests.learn.test_losses):
`from tests.helpers import …` works under `python -m pytest tests` and `pytest FILE` alike,
and equal basenames in different folders do not clash. No test file imports another test file.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

_INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_configure():
  """One persistent JAX compilation cache for every test process (the xdist workers and the runs
  the tests start inherit it), caching every executable however fast it compiled: the tests
  compile the same tiny programs many times, and on CPU compiling is most of a short run. The
  directory is the runs' own default (`trainer.compilation_cache_dir`: $RISED_JAX_CACHE/jax), so
  it stays warm across sessions and clones on one machine. Set before any test module imports
  jax; a test that needs a cold cache sets or removes these variables itself
  (tests/integration/test_run_throughput.py). A caller's own settings win."""
  root = os.environ.get("RISED_JAX_CACHE", os.path.expanduser("~/.cache/rised_jax"))
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(root, "jax"))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


@pytest.fixture(scope="session")
def smollm2():
  """(model, tokenizer) of the packaged SmolLM2-135M-Instruct in float32, loaded once for the
  tests that play or compare it (each load is 10-25 s on 2 cores); they only read it."""
  from rised_jax.model import from_pretrained  # noqa: PLC0415 (jax only after pytest_configure)
  return from_pretrained("smollm2-135m-instruct", "float32")


def pytest_collection_modifyitems(items):
  """Tiers (`make test-fast` deselects the last three): tests under tests/integration/ are
  `integration`; tests in a module that imports subprocess (they start whole runs, servers or
  scripts) are `subprocess`; `slow` and `sglang` are set by hand."""
  for item in items:
    path = Path(str(item.fspath)).resolve()
    if _INTEGRATION in path.parents:
      item.add_marker(pytest.mark.integration)
    module = getattr(item, "module", None)
    if module is not None and "subprocess" in vars(module):
      item.add_marker(pytest.mark.subprocess)
