"""Shared test set-up. The helpers every test file may import live in their own modules:

  tests/fake_engine.py    FakeEngine, the one scripted engine behind the whole Engine protocol
  tests/run_fixtures.py   experiment config files (load_config_file), a scripted agentic
                          pipeline, hand-made run directories
  tests/model_utils.py    tiny random decoders and reference forward passes
  tests/step_fixtures.py  a tiny model, optimizer, step config and batches for the step tests

No test file imports another test file.
"""
from __future__ import annotations

import sys
from pathlib import Path

# `from tests.… import …` and `import model_utils` both work under plain `pytest` too.
_TESTS = Path(__file__).resolve().parent
for _path in (str(_TESTS.parent), str(_TESTS)):
  if _path not in sys.path:
    sys.path.insert(0, _path)
