"""Bad data files fail with an error that names the file and line (or the tensor), never with a
raw UnicodeDecodeError, RecursionError or ValueError, and never load silently."""
from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from rised_jax.model import from_pretrained, tiny
from rised_jax.model.errors import WeightError
from rised_jax.rubric_tasks import tasks
from rised_jax.rubrics import Vocabulary, VocabularyError

GOOD_TASK = {"id": "t1", "prompt": "Why?", "criteria": [
    {"id": "fact", "text": "Mentions a fact.", "weight": 2,
     "check": {"type": "keywords", "all_of": [["fact"]]}}]}
GOOD_VOCAB = [{"id": "polite", "polarity": "+", "description": "Is polite"}]


def _task_file(tmp_path, third_line: bytes):
  path = tmp_path / "tasks.jsonl"
  path.write_bytes(json.dumps(GOOD_TASK).encode() + b"\n\n" + third_line + b"\n")
  return path


def _task_with_weight(weight_text: str) -> bytes:
  text = json.dumps(dict(GOOD_TASK, id="t2")).replace('"weight": 2', f'"weight": {weight_text}')
  return text.encode()


# Columns are 1-based; each case's column is found in the line itself by `bytes.index`.
LATIN1 = b'{"id": "t2", "caf\xe9": 1}'
NESTED = b'{"id": "t2", "prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"
LONG_WEIGHT = _task_with_weight("9" * 5000)


@pytest.mark.parametrize("third_line, message", [
    (LATIN1, rf": line 3 column {LATIN1.index(0xe9) + 1} .*b'\\xe9' is not valid UTF-8"),
    # The task's "{" is level 1, so the 64th "[" is level 65.
    (NESTED, rf":3: column {NESTED.index(b'[') + 64}: nesting deeper than 64 levels"),
    (LONG_WEIGHT, rf":3: column {LONG_WEIGHT.index(b'9' * 10) + 1}: a number of 5000 characters"),
])
def test_task_file_errors_name_file_and_line(tmp_path, third_line, message):
  path = _task_file(tmp_path, third_line)
  with pytest.raises(tasks.RubricFormatError, match=message) as info:
    tasks.load_jsonl(path)
  assert str(info.value).startswith(str(path))


def test_a_long_but_ordinary_number_still_loads(tmp_path):
  path = _task_file(tmp_path, _task_with_weight("1." + "5" * 300))
  # Read exactly as written (the weight is the file's decimal, not its nearest float).
  weight = tasks.load_jsonl(path).tasks[1].criteria[0].weight
  assert weight == Fraction("1." + "5" * 300) and float(weight) == 1.5555555555555556


LATIN1_VOCAB = json.dumps(GOOD_VOCAB).encode().replace(b"Is polite", b"Is p\xf6lite")


@pytest.mark.parametrize("content, message", [
    (LATIN1_VOCAB, rf"line 1 column {LATIN1_VOCAB.index(0xf6) + 1} .*not valid UTF-8"),
    (b"[\n" + b"[" * 3000 + b"]" * 3000 + b"\n]", r"line 2 column 64: nesting deeper than 64"),
    (b'[{"id": "a", "polarity": "+",\n "description": ' + b"7" * 5000 + b"}]",
     r"line 2 column 17: a number of 5000 characters"),
])
def test_vocabulary_file_errors_name_file_and_line(tmp_path, content, message):
  path = tmp_path / "vocab.json"
  path.write_bytes(content)
  with pytest.raises(VocabularyError, match=message) as info:
    Vocabulary.load(str(path))
  assert str(path) in str(info.value)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_safetensors_with_a_non_finite_weight_is_rejected_by_tensor_name(tmp_path, bad):
  model_dir = tiny.write(tmp_path / "model")
  weights = model_dir / "model.safetensors"
  tensors = load_file(str(weights))
  name = "model.layers.1.mlp.down_proj.weight"
  tensors[name] = tensors[name].copy()
  tensors[name][3, 5] = bad
  save_file(tensors, str(weights), metadata={"format": "pt"})
  with pytest.raises(WeightError, match=rf"{model_dir}: tensor '{name}' has 1 non-finite "
                                        r"value\(s\) .* at index \(3, 5\)"):
    from_pretrained(model_dir)
