"""config_args.parse_arg: the one parser of experiment files' arguments, against hand-worked
cases, its error messages included."""
from __future__ import annotations

import re

import pytest

from rised_jax import config_args
from rised_jax.config_args import OneOf
from tests.helpers.run_fixtures import CONFIGS, load_config_file

# The spec of the RISED paper-scale files.
SPEC = dict(algorithm="rised", size=OneOf("4b", "1.7b"), tpu=False, local=False)
ACCEPTED = ("accepted: algorithm='rised', size=4b|1.7b (by position or key=value); "
            "flags tpu, local (bare, or key=true|false)")


def _parse(arg, **spec):
  return dict(config_args.parse_arg(arg, **(spec or SPEC)))


@pytest.mark.parametrize("arg, expected", [
    (None, ("rised", "4b", False, False)),
    ("", ("rised", "4b", False, False)),
    ("grpo", ("grpo", "4b", False, False)),
    ("rised,4b", ("rised", "4b", False, False)),
    ("grpo,1.7b,tpu", ("grpo", "1.7b", True, False)),
    ("rised,4b,tpu,local", ("rised", "4b", True, True)),
    # A flag takes no position: 1.7b is still the size.
    ("dapo,local,1.7b", ("dapo", "1.7b", False, True)),
    # By name, in any order; a bare word fills the first positional key still unset.
    ("size=1.7b,variance", ("variance", "1.7b", False, False)),
    ("algorithm=grpo,1.7b", ("grpo", "1.7b", False, False)),
    ("rised,tpu=TRUE,local=0", ("rised", "4b", True, False)),
    ("rised,tpu=1,local=False", ("rised", "4b", True, False)),
])
def test_positions_names_and_flags(arg, expected):
  assert _parse(arg) == dict(zip(["algorithm", "size", "tpu", "local"], expected))


def test_numbers_take_the_type_of_their_default():
  got = _parse("steps=12,lr=2.5e-6,name=x=y", steps=3, lr=1e-6, name="a")
  assert got == {"steps": 12, "lr": 2.5e-6, "name": "x=y"}
  assert type(got["steps"]) is int and type(got["lr"]) is float


def test_result_is_frozen():
  args = config_args.parse_arg("grpo", **SPEC)
  assert (args.algorithm, args.size, args.tpu, args.local) == ("grpo", "4b", False, False)
  with pytest.raises(AttributeError):
    args.algorithm = "rised"


@pytest.mark.parametrize("arg, problem", [
    ("rised,5b", "size='5b': expected one of 4b, 1.7b"),
    ("cripo,4b,huge", "unknown flag 'huge' (every positional key is given)"),
    ("rised,sizes=4b", "unknown key 'sizes' in 'sizes=4b'"),
    ("rised,local=yes", "local='yes': expected true, false, 1 or 0"),
    ("rised,,4b", "an empty item"),
    ("rised,", "an empty item"),
    ("rised,algorithm=grpo", "algorithm given twice (algorithm='rised', then 'algorithm=grpo')"),
    ("rised,local,local=false", "local given twice (local=True, then 'local=false')"),
])
def test_errors_name_the_file_the_argument_the_item_and_the_keys(arg, problem):
  with pytest.raises(ValueError) as e:
    _parse(arg)
  assert str(e.value) == f"test_config_args.py: config argument {arg!r}: {problem}; {ACCEPTED}"


@pytest.mark.parametrize("arg, spec, problem", [
    ("steps=3.5", dict(steps=3), "steps='3.5': expected an integer"),
    ("lr=fast", dict(lr=1e-6), "lr='fast': expected a finite number"),
    ("lr=inf", dict(lr=1e-6), "lr='inf': expected a finite number"),
])
def test_number_errors(arg, spec, problem):
  with pytest.raises(ValueError, match=re.escape(f"config argument {arg!r}: {problem}; ")):
    _parse(arg, **spec)


def test_a_word_after_the_last_positional_key_and_a_file_without_keys():
  with pytest.raises(ValueError, match=re.escape("'steps=1,x': unknown flag 'x' (every positional "
                                                 "key is given); accepted: steps=0 (by position "
                                                 "or key=value)")):
    _parse("steps=1,x", steps=0)
  assert dict(config_args.parse_arg(None)) == {}
  with pytest.raises(ValueError, match="'x': unknown flag 'x' .*; accepted: no argument$"):
    config_args.parse_arg("x")


def test_a_default_of_another_type_is_refused():
  with pytest.raises(TypeError, match=r"key 'envs' has default \['maze'\]; expected a str, int, "
                     "float, bool or OneOf"):
    config_args.parse_arg(None, envs=["maze"])


@pytest.mark.parametrize("name, arg, problem", [
    ("rised_qwen3_multienv.py", "rised,5b", "size='5b': expected one of 4b, 1.7b"),
    ("rised_babyai_scienceworld.py", "rised,4b,gpu", "unknown flag 'gpu'"),
    ("tiny_cpu.py", "rised,hard", "setting='hard': expected one of smoke, easy, signpost"),
    ("cripo_qwen3_4b.py", "cripo,local=maybe", "local='maybe': expected true, false, 1 or 0"),
    ("smollm2_cpu.py", "rised,easy", "unknown flag 'easy'"),
])
def test_experiment_files_name_themselves_in_the_error(name, arg, problem):
  with pytest.raises(ValueError, match=re.escape(f"{name}: config argument {arg!r}: {problem}")):
    load_config_file(CONFIGS / name, arg)
