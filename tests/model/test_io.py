"""Config parsing, HF checkpoint import/export, the tokenizer wrapper and their errors.

References: transformers' own config classes and `AutoModelForCausalLM.from_pretrained`
(torch, fp32), checkpoints written by transformers' `save_pretrained`, hand-written strings.
"""
from __future__ import annotations

import copy
import json
import os
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from tests.helpers import model_utils as mu
from rised_jax import model as model_pkg
from rised_jax.model import (ExportError, ModelConfig, ModelConfigError, ModelFileNotFoundError,
                             Tokenizer, TokenizerError, WeightError, WeightFileError, from_config,
                             from_pretrained, hf_state_dict, load_state_dict, save_pretrained)
from rised_jax.model.hf_io import abstract_decoder, weight_specs
from rised_jax.model.tokenizer import END_OF_TURN_TOKENS

torch = pytest.importorskip("torch")
from transformers import AutoConfig, AutoModelForCausalLM  # pylint: disable=wrong-import-position

ATOL = 1e-4
EXPORTED = ("llama_gqa_tied", "qwen3_untied", "gemma3")
HF_CONFIG_CLASSES = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
                     "gemma3_text": "Gemma3TextConfig"}
FORWARD = nnx.jit(lambda model, ids, mask: model(ids, mask))


def _hf_load(path, **kwargs):
  return AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager",
                                              **kwargs).eval()


def _assert_same_params(a, b):
  left, right = hf_state_dict(a), hf_state_dict(b)
  assert left.keys() == right.keys()
  for name in left:
    np.testing.assert_array_equal(left[name], right[name], err_msg=name)


def _assert_matches_hf(ours, hf, seed=0):
  """Our logits on a left-padded batch equal transformers' on each unpadded row."""
  rows = mu.random_rows((10, 6), seed=seed)
  ids, mask = mu.padded_batch(rows, "left")
  logits = np.asarray(FORWARD(ours, ids, mask))
  for b, row in enumerate(rows):
    np.testing.assert_allclose(logits[b, mu.real_columns(mask, b)], mu.hf_logits(hf, row),
                               atol=ATOL, rtol=0)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
  return mu.tiny_tokenizer()


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tokenizer):
  """name -> (random model, its export directory)."""
  result = {}
  for name in EXPORTED:
    model = mu.random_decoder(ModelConfig.from_hf(mu.TINY_CONFIGS[name]), seed=11)
    out = tmp_path_factory.mktemp(name) / "export"
    assert save_pretrained(model, tokenizer, out) == out
    result[name] = (model, out)
  return result


# ---------------------------------------------------------------------------------------------
# ModelConfig.


@pytest.mark.parametrize("name", sorted(mu.TINY_CONFIGS))
def test_config_round_trips_and_transformers_agrees(name):
  raw = mu.TINY_CONFIGS[name]
  cfg = ModelConfig.from_hf(raw, source=f"{name}.json")
  assert ModelConfig.from_hf(cfg.to_hf()) == cfg
  ours_in_hf = AutoConfig.for_model(**copy.deepcopy(cfg.to_hf()))
  assert type(ours_in_hf).__name__ == HF_CONFIG_CLASSES[cfg.model_type]
  assert ModelConfig.from_hf(ours_in_hf.to_dict()) == cfg
  # transformers' reading of the raw dict (in its 5.x layout) is ours too.
  raw_in_hf = AutoConfig.for_model(**copy.deepcopy(raw))
  assert ModelConfig.from_hf(raw_in_hf.to_dict()) == cfg
  if cfg.model_type != "llama":
    assert list(raw_in_hf.layer_types) == list(cfg.layer_types)
    assert list(ours_in_hf.layer_types) == list(cfg.layer_types)


def test_config_fields_of_the_gemma3_config():
  cfg = ModelConfig.from_hf(mu.TINY_CONFIGS["gemma3"])
  assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.sliding_window) == (4, 2, 16, 4)
  assert cfg.layer_window(0) == 4 and cfg.layer_window(1) is None
  assert cfg.layer_rope(0).theta == 10_000.0 and cfg.layer_rope(0).kind == "default"
  assert cfg.layer_rope(1).theta == 1e6 and (cfg.layer_rope(1).kind, cfg.layer_rope(1).factor) \
      == ("linear", 2.0)
  assert cfg.attn_scale == 24 ** -0.5 and cfg.embed_scale == 32 ** 0.5
  assert cfg.final_logit_softcap == 3.0 and cfg.tie_word_embeddings
  assert cfg.qk_norm and cfg.sandwich_norms and cfg.norm_plus_one and not cfg.qkv_bias


def test_gemma3_layer_pattern_from_legacy_keys():
  base = {k: v for k, v in mu.TINY_CONFIGS["gemma3"].items() if k != "layer_types"}
  five_to_one = ModelConfig.from_hf(dict(base, num_hidden_layers=7))
  assert five_to_one.layer_types == ("sliding_attention",) * 5 + ("full_attention",
                                                                    "sliding_attention")
  every_third = ModelConfig.from_hf(dict(base, num_hidden_layers=6, sliding_window_pattern=3))
  hf = AutoConfig.for_model(**dict(copy.deepcopy(base), num_hidden_layers=6,
                                   sliding_window_pattern=3))
  assert every_third.layer_types == tuple(hf.layer_types) == (
      "sliding_attention", "sliding_attention", "full_attention") * 2
  assert ModelConfig.from_hf(hf.to_dict()) == every_third


def test_qwen_sliding_layers_follow_max_window_layers():
  cfg = ModelConfig.from_hf(mu.TINY_CONFIGS["qwen2_sliding"])
  assert cfg.layer_types == ("full_attention", "sliding_attention", "sliding_attention")
  assert cfg.sliding_window == 5
  off = ModelConfig.from_hf(mu.tiny_config("qwen2_sliding", use_sliding_window=False))
  assert set(off.layer_types) == {"full_attention"} and off.sliding_window is None


def _config_with(name, **changes):
  config = mu.tiny_config(name)
  for key, value in changes.items():
    if value is _DELETE:
      del config[key]
    else:
      config[key] = value
  return config


_DELETE = object()
CONFIG_ERRORS = [
    ("llama_mha", dict(model_type="mistral"), "'model_type'"),
    ("gemma3", dict(model_type="gemma3"), "gemma3_text"),
    ("llama_mha", dict(hidden_size=_DELETE), "'hidden_size' is missing"),
    ("llama_mha", dict(num_attention_heads="4"), "'num_attention_heads'"),
    ("llama_mha", dict(num_key_value_heads=3), "'num_key_value_heads'"),
    ("llama_mha", dict(architectures=["LlamaForSequenceClassification"]), "'architectures'"),
    ("llama_mha", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
     "'rope_scaling.rope_type'"),
    ("llama_mha", dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    ("llama_mha", dict(hidden_act="relu"), "'hidden_act'"),
    ("llama_mqa_bias", dict(rope_parameters={"rope_type": "llama3", "factor": 8.0}),
     "'rope_parameters.low_freq_factor' is missing"),
    ("gemma3", dict(layer_types=["full_attention"]), "'layer_types'"),
    ("gemma3", dict(sliding_window=None), "'sliding_window'"),
    ("gemma3", dict(use_bidirectional_attention=True), "'use_bidirectional_attention'"),
]


@pytest.mark.parametrize("name,changes,expected", CONFIG_ERRORS,
                         ids=[e[2].strip("'") for e in CONFIG_ERRORS])
def test_config_errors_name_the_file_and_key(name, changes, expected):
  with pytest.raises(ModelConfigError) as error:
    ModelConfig.from_hf(_config_with(name, **changes), source="ckpt/config.json")
  assert "ckpt/config.json" in str(error.value) and expected in str(error.value)


def test_gemma3_attention_softcap_is_applied_with_a_warning():
  with pytest.warns(UserWarning, match="attn_logit_softcapping"):
    cfg = ModelConfig.from_hf(mu.tiny_config("gemma3", attn_logit_softcapping=50.0))
  assert cfg.attn_logit_softcap == 50.0


# ---------------------------------------------------------------------------------------------
# Export and import.


@pytest.mark.parametrize("name", EXPORTED)
def test_export_is_reproduced_by_transformers(exported, name):
  model, out = exported[name]
  files = set(os.listdir(out))
  assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
          "tokenizer_config.json"} <= files
  tensors = load_file(str(out / "model.safetensors"))
  assert ("lm_head.weight" in tensors) == (not model.cfg.tie_word_embeddings)
  assert tensors["model.embed_tokens.weight"].dtype == np.float32
  config = json.loads((out / "config.json").read_text())
  assert config["architectures"] == [model.cfg.architecture] and config["dtype"] == "float32"
  generation = json.loads((out / "generation_config.json").read_text())
  tokenizer = Tokenizer.from_dir(out)
  assert generation["eos_token_id"] == list(tokenizer.stop_token_ids)
  _assert_matches_hf(model, _hf_load(out, dtype=torch.float32))


@pytest.mark.parametrize("name", EXPORTED)
def test_export_round_trips_exactly(exported, tokenizer, name):
  model, out = exported[name]
  loaded, loaded_tokenizer = from_pretrained(out)
  assert loaded.cfg == model.cfg
  _assert_same_params(loaded, model)
  text = "push the box; hello world 42"
  assert loaded_tokenizer.encode(text) == tokenizer.encode(text)
  assert loaded_tokenizer.chat_template == tokenizer.chat_template
  assert loaded_tokenizer.stop_token_ids == tokenizer.stop_token_ids
  assert loaded_tokenizer.vocab_size == tokenizer.vocab_size


@pytest.mark.parametrize("name", ["qwen3_untied", "gemma3"])
def test_checkpoint_written_by_transformers_loads(tmp_path, tokenizer, name):
  hf = mu.hf_model(mu.TINY_CONFIGS[name], seed=12)
  hf.save_pretrained(str(tmp_path), max_shard_size="40KB")
  tokenizer.save(tmp_path)
  assert (tmp_path / "model.safetensors.index.json").is_file()   # transformers sharded it
  ours, _ = from_pretrained(tmp_path)
  _assert_matches_hf(ours, hf, seed=1)


def test_sharded_export_reloads_and_a_later_export_removes_stale_shards(exported, tokenizer,
                                                                        tmp_path):
  model, _ = exported["qwen3_untied"]
  out = tmp_path / "sharded"
  save_pretrained(model, tokenizer, out, max_shard_bytes=30_000)
  index = json.loads((out / "model.safetensors.index.json").read_text())
  shards = sorted(set(index["weight_map"].values()))
  assert len(shards) > 2 and not (out / "model.safetensors").exists()
  assert set(index["weight_map"]) == set(hf_state_dict(model))
  for shard in shards:
    size = sum(t.nbytes for t in load_file(str(out / shard)).values())
    assert size <= 30_000 or len(load_file(str(out / shard))) == 1
  _assert_same_params(from_pretrained(out)[0], model)
  _assert_matches_hf(model, _hf_load(out, dtype=torch.float32))
  # Exporting again (unsharded) into the same directory replaces the shards.
  save_pretrained(model, tokenizer, out)
  files = set(os.listdir(out))
  assert "model.safetensors" in files and not files & set(shards)
  assert "model.safetensors.index.json" not in files
  _assert_same_params(from_pretrained(out)[0], model)


def test_bfloat16_export_loads(exported, tokenizer, tmp_path):
  model, _ = exported["gemma3"]
  out = tmp_path / "bf16"
  save_pretrained(model, tokenizer, out, dtype="bfloat16")
  tensors = load_file(str(out / "model.safetensors"))
  assert all(t.dtype == ml_dtypes.bfloat16 for t in tensors.values())
  assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
  loaded, _ = from_pretrained(out)
  expected = hf_state_dict(model, np.dtype(ml_dtypes.bfloat16))
  for name, array in hf_state_dict(loaded).items():
    assert array.dtype == np.float32
    np.testing.assert_array_equal(array, expected[name].astype(np.float32), err_msg=name)
  hf = _hf_load(out)
  assert hf.dtype == torch.bfloat16
  torch.testing.assert_close(hf.state_dict()["model.layers.0.self_attn.q_proj.weight"],
                             torch.from_numpy(expected["model.layers.0.self_attn.q_proj.weight"]
                                              .astype(np.float32)).to(torch.bfloat16))
  loaded_bf16, _ = from_pretrained(out, dtype="bfloat16")
  assert loaded_bf16.embed[...].dtype == jnp.bfloat16


def test_export_refuses_a_directory_it_did_not_write(exported, tokenizer, tmp_path):
  model, _ = exported["llama_gqa_tied"]
  (tmp_path / "notes.txt").write_text("keep me")
  with pytest.raises(ExportError) as error:
    save_pretrained(model, tokenizer, tmp_path)
  assert str(tmp_path) in str(error.value) and "notes.txt" in str(error.value)
  assert sorted(os.listdir(tmp_path)) == ["notes.txt"]
  with pytest.raises(ExportError, match="not a directory"):
    save_pretrained(model, tokenizer, tmp_path / "notes.txt")
  with pytest.raises(ValueError, match="float16"):
    save_pretrained(model, tokenizer, tmp_path / "new", dtype="float16")


@pytest.mark.parametrize("name", sorted(mu.TINY_CONFIGS))
def test_weight_specs_cover_every_parameter_once(name):
  cfg = ModelConfig.from_hf(mu.TINY_CONFIGS[name])
  model = abstract_decoder(cfg)
  params = {tuple(getattr(k, "key", getattr(k, "idx", None)) for k in path)
            for path, _ in jax.tree_util.tree_leaves_with_path(
                nnx.state(model, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable))}
  specs = weight_specs(cfg)
  assert sorted(s.path for s in specs) == sorted(params)
  assert len({s.hf_name for s in specs}) == len(specs)


def test_load_state_dict_into_an_initialised_model(exported):
  model, _ = exported["gemma3"]
  target = from_config(model.cfg, seed=5)
  load_state_dict(target, hf_state_dict(model))
  _assert_same_params(target, model)


# ---------------------------------------------------------------------------------------------
# Import errors: each names the file (and the tensor or key) at fault.


@pytest.fixture
def checkpoint(exported, tmp_path):
  """A fresh copy of the tied llama export to break."""
  target = tmp_path / "ckpt"
  shutil.copytree(exported["llama_gqa_tied"][1], target)
  return target


def _rewrite_tensors(path, change):
  tensors = load_file(str(path))
  change(tensors)
  save_file(tensors, str(path), metadata={"format": "pt"})


def test_missing_config(checkpoint):
  (checkpoint / "config.json").unlink()
  with pytest.raises(ModelFileNotFoundError, match=str(checkpoint / "config.json")):
    from_pretrained(checkpoint)


def test_unsupported_model_type_names_the_config_file(checkpoint):
  path = checkpoint / "config.json"
  path.write_text(json.dumps(dict(json.loads(path.read_text()), model_type="mamba")))
  with pytest.raises(ModelConfigError) as error:
    from_pretrained(checkpoint)
  assert str(path) in str(error.value) and "'model_type'" in str(error.value)


def test_invalid_json_config(checkpoint):
  (checkpoint / "config.json").write_text("{not json")
  with pytest.raises(ModelConfigError, match="not valid JSON"):
    from_pretrained(checkpoint)


def test_shape_mismatch_names_tensor_and_shapes(checkpoint):
  name = "model.layers.1.mlp.up_proj.weight"
  _rewrite_tensors(checkpoint / "model.safetensors",
                   lambda t: t.__setitem__(name, np.zeros((47, 32), np.float32)))
  with pytest.raises(WeightError) as error:
    from_pretrained(checkpoint)
  message = str(error.value)
  assert name in message and "(47, 32)" in message and "(48, 32)" in message
  assert str(checkpoint) in message


def test_truncated_safetensors_names_the_file(checkpoint):
  path = checkpoint / "model.safetensors"
  data = path.read_bytes()
  path.write_bytes(data[:len(data) // 2])
  with pytest.raises(WeightFileError, match=str(path)):
    from_pretrained(checkpoint)


def test_missing_and_unexpected_tensors_are_named(checkpoint):
  def change(tensors):
    del tensors["model.layers.0.self_attn.k_proj.weight"]
    tensors["model.layers.9.extra.weight"] = np.zeros(3, np.float32)
  _rewrite_tensors(checkpoint / "model.safetensors", change)
  with pytest.raises(WeightError) as error:
    from_pretrained(checkpoint)
  message = str(error.value)
  assert "model.layers.0.self_attn.k_proj.weight" in message and "1 missing" in message
  assert "model.layers.9.extra.weight" in message and "1 unexpected" in message


def test_integer_tensor_is_refused(checkpoint):
  name = "model.norm.weight"
  _rewrite_tensors(checkpoint / "model.safetensors",
                   lambda t: t.__setitem__(name, np.ones(32, np.int32)))
  with pytest.raises(WeightError, match=f"{name}.*int32"):
    from_pretrained(checkpoint)


def test_missing_weights_and_shards(checkpoint):
  (checkpoint / "model.safetensors").rename(checkpoint / "model-00001-of-00002.safetensors")
  with pytest.raises(ModelFileNotFoundError, match="model.safetensors"):
    from_pretrained(checkpoint)
  names = load_file(str(checkpoint / "model-00001-of-00002.safetensors"))
  weight_map = {n: "model-00001-of-00002.safetensors" for n in names}
  weight_map["model.norm.weight"] = "model-00002-of-00002.safetensors"
  (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
  with pytest.raises(ModelFileNotFoundError, match="model-00002-of-00002.safetensors"):
    from_pretrained(checkpoint)


def test_missing_tokenizer(checkpoint):
  (checkpoint / "tokenizer.json").unlink()
  with pytest.raises(ModelFileNotFoundError, match=str(checkpoint / "tokenizer.json")):
    from_pretrained(checkpoint)


def test_from_pretrained_source_errors(tmp_path):
  with pytest.raises(ModelFileNotFoundError, match="/no/such/dir"):
    from_pretrained("/no/such/dir")
  with pytest.raises(ModelFileNotFoundError, match="missing.gguf"):
    from_pretrained(tmp_path / "missing.gguf")
  with pytest.raises(ModelFileNotFoundError, match="smollm2-135m-instruct"):
    from_pretrained("no-such-packaged-model")
  (tmp_path / "weights.bin").write_bytes(b"")
  with pytest.raises(ModelFileNotFoundError, match="weights.bin"):
    from_pretrained(tmp_path / "weights.bin")
  with pytest.raises(ValueError, match="float16"):
    from_pretrained(tmp_path, dtype="float16")


def test_gguf_and_packaged_sources_go_through_the_gguf_loader(exported, tokenizer, tmp_path,
                                                              monkeypatch):
  from rised_jax.model import gguf, packaged  # pylint: disable=import-outside-toplevel
  model, _ = exported["qwen3_untied"]
  gguf_path = tmp_path / "tiny.gguf"
  gguf_path.write_bytes(b"GGUF")
  calls = []

  def fake_load_gguf(path):
    calls.append(path)
    return model.cfg.to_hf(), hf_state_dict(model), tokenizer

  monkeypatch.setattr(gguf, "load_gguf", fake_load_gguf)
  loaded, loaded_tokenizer = from_pretrained(gguf_path)
  assert calls == [gguf_path] and loaded_tokenizer is tokenizer
  assert loaded.cfg == model.cfg and loaded.cfg.source == str(gguf_path)
  _assert_same_params(loaded, model)
  monkeypatch.setattr(packaged, "names", lambda: ["tiny-packaged"])
  monkeypatch.setattr(packaged, "resolve", lambda name: gguf_path)
  loaded, _ = from_pretrained("tiny-packaged", dtype="bfloat16", param_dtype="float32")
  assert calls == [gguf_path, gguf_path] and loaded.dtype == jnp.bfloat16
  assert loaded.embed[...].dtype == jnp.float32


# ---------------------------------------------------------------------------------------------
# Tokenizer.

MESSAGES = [{"role": "system", "content": "You move boxes."},
            {"role": "user", "content": "push the box left"}]
RENDERED = ("<|im_start|>system\nYou move boxes.<|im_end|>\n"
            "<|im_start|>user\npush the box left<|im_end|>\n")


def test_render_and_encode_chat(tokenizer):
  assert tokenizer.render_chat(MESSAGES) == RENDERED + "<|im_start|>assistant\n"
  assert tokenizer.render_chat(MESSAGES, add_generation_prompt=False) == RENDERED
  ids = tokenizer.encode_chat(MESSAGES)
  assert ids == tokenizer.encode(RENDERED + "<|im_start|>assistant\n")
  vocab = tokenizer.hf_tokenizer.get_vocab()
  assert ids[0] == vocab["<|im_start|>"] and ids.count(vocab["<|im_end|>"]) == 2
  assert tokenizer.decode(ids) == RENDERED + "<|im_start|>assistant\n"
  assert tokenizer.decode(ids, skip_special_tokens=True) == (
      "system\nYou move boxes.\nuser\npush the box left\nassistant\n")


def test_encode_adds_no_special_tokens(tokenizer):
  ids = tokenizer.encode("hello world")
  assert tokenizer.decode(ids) == "hello world"
  assert tokenizer.bos_token_id not in ids and tokenizer.eos_token_id not in ids
  text = "0123456789 ~{}é"
  assert tokenizer.decode(tokenizer.encode(text)) == text   # byte-level: anything encodes


def test_special_ids(tokenizer):
  vocab = tokenizer.hf_tokenizer.get_vocab()
  assert tokenizer.eos_token_id == vocab["<|im_end|>"]
  assert tokenizer.pad_token_id == tokenizer.eos_token_id   # no pad token: falls back to EOS
  assert tokenizer.stop_token_ids == (vocab["<|im_end|>"], vocab["<|endoftext|>"])
  assert "<|endoftext|>" in END_OF_TURN_TOKENS
  assert tokenizer.vocab_size == 300


def test_tokenizer_save_and_reload(tokenizer, tmp_path):
  names = tokenizer.save(tmp_path)
  assert "tokenizer.json" in names and all((tmp_path / n).is_file() for n in names)
  config = json.loads((tmp_path / "tokenizer_config.json").read_text())
  assert config["tokenizer_class"] == "PreTrainedTokenizerFast"   # readable by transformers 4.x
  loaded = Tokenizer.from_dir(tmp_path)
  assert loaded.render_chat(MESSAGES) == tokenizer.render_chat(MESSAGES)
  assert loaded.encode_chat(MESSAGES) == tokenizer.encode_chat(MESSAGES)
  assert loaded.stop_token_ids == tokenizer.stop_token_ids


def test_tokenizer_errors(tmp_path):
  no_template = mu.tiny_tokenizer(with_template=False)
  with pytest.raises(TokenizerError, match="chat template"):
    no_template.render_chat(MESSAGES)
  templated = Tokenizer(no_template.hf_tokenizer, chat_template=mu.CHATML_TEMPLATE)
  assert templated.render_chat(MESSAGES, add_generation_prompt=False) == RENDERED
  with pytest.raises(TokenizerError, match=r"messages\[1\]"):
    templated.render_chat([MESSAGES[0], {"content": "no role"}])
  with pytest.raises(TokenizerError, match="fast tokenizer"):
    Tokenizer(object())
  with pytest.raises(ModelFileNotFoundError, match="tokenizer.json"):
    Tokenizer.from_dir(tmp_path)


def test_public_api_exports():
  for name in model_pkg.__all__:
    assert hasattr(model_pkg, name), name
