"""The config reference (docs/config.md) covers every key of default_config(), from one source."""
import pathlib

import ml_collections
import pytest

from rised_jax import config as config_lib
from rised_jax import config_reference
from rised_jax.config_docs import DESCRIPTIONS

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "config.md"


def _flat_keys(tree: dict, prefix: str = "") -> set[str]:
  """Every dotted key of a plain nested dict, the dicts included (an independent walk)."""
  keys = set()
  for name, value in tree.items():
    keys.add(prefix + name)
    if isinstance(value, dict):
      keys |= _flat_keys(value, prefix + name + ".")
  return keys


def test_every_key_has_a_description():
  missing = config_reference.undescribed_keys()
  assert not missing, (f"add a one-line meaning for {missing} to DESCRIPTIONS in "
                       "rised_jax/config_docs.py, then run `make docs` (or `python -m "
                       "rised_jax.config_reference > docs/config.md`)")


def test_every_description_names_a_key():
  assert not config_reference.unknown_descriptions(), (
      "rised_jax/config_docs.py describes keys default_config() lacks: "
      f"{config_reference.unknown_descriptions()}")


def test_every_leaf_of_the_defaults_is_on_the_page_or_inside_a_described_dict():
  flat = _flat_keys(config_lib.default_config().to_dict())
  page = PAGE.read_text()
  for key in flat:
    described_whole = any(key.startswith(whole + ".") for whole in DESCRIPTIONS)
    if key in DESCRIPTIONS:
      assert f"| `{key}` |" in page, key
    elif not described_whole:
      # an intermediate group (e.g. `rollout.sglang`): its leaves are listed instead
      assert any(other.startswith(key + ".") for other in DESCRIPTIONS), key


def test_a_new_key_without_a_description_is_caught():
  config = config_lib.default_config()
  config.train.new_knob = 1
  config.rollout.sglang.new_cap = ml_collections.ConfigDict(dict(a=1))
  assert config_reference.undescribed_keys(config) == ["rollout.sglang.new_cap.a",
                                                      "train.new_knob"]
  with pytest.raises(ValueError, match="train.new_knob"):
    config_reference.render(config)


def test_a_row_shows_type_default_and_meaning():
  page = config_reference.render()
  assert ("| `train.steps` | int | `10` | training steps |" in page)
  assert "| `step.clamp` | float \\| None | `null` |" in page
  assert "| `guidance.options` | dict | `{\"rate\": 0.1, \"threshold\": 0.3, \"top_m\": 2}` |" in page


def test_the_checked_in_page_is_current():
  assert PAGE.read_text() == config_reference.render(), (
      "docs/config.md is stale: run `python -m rised_jax.config_reference > docs/config.md`")


def test_each_typed_section_has_a_field_for_every_key_and_no_other():
  assert config_reference.untyped_keys() == ([], [])


def test_a_key_the_typed_config_lacks_is_caught():
  config = config_lib.default_config()
  config.select.new_knob = 1
  config.rubric.judge.new_cap = 2
  assert config_reference.untyped_keys(config) == (["rubric.judge.new_cap", "select.new_knob"], [])


def test_a_typed_section_takes_its_types_from_the_fields():
  page = config_reference.render()
  assert "`rised_jax.train_settings.TrainConfig`" in page
  assert "| `train.profile_steps` | list[int] | `[]` |" in page   # field: tuple[int, ...]
  assert "| `rollout.sglang.timeout_s` | float |" in page          # a nested typed config
  assert "| `step.beta` | float |" in page                         # a term config's field
