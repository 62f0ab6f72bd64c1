"""GGUF import (llama.cpp's format): an HF config dict, HF-named float32 tensors, a tokenizer.

`load_gguf(path)` returns what an HF checkpoint directory would hold (config.json, the safetensors
tensors under transformers' names, the tokenizer) so that the rest of `rised_jax.model` never
sees GGUF conventions. Reading and dequantizing use the `gguf` package only (no torch); the
tokenizer is rebuilt from `tokenizer.ggml.*` with transformers' torch-free GGUF tokenizer converter.

What llama.cpp's converter (convert_hf_to_gguf.py) changes and this module undoes:
  * llama: the rows of q_proj and k_proj are permuted per head (interleaved rotary pairs instead
    of HF's rotate-half halves); `unpermute_rotary_rows` restores HF's order. Qwen2, Qwen3 and
    Gemma 3 files are written unpermuted.
  * gemma3: every `*norm.weight` is stored as 1 + w (HF's Gemma RMSNorm scales by 1 + w); 1 is
    subtracted back.
  * gemma3: the local (sliding-window) RoPE base, the 5 local : 1 global layer pattern and the
    query scaling are not stored; they are filled in from Gemma 3's published defaults (see
    `_gemma3_config`).
  * llama 3.1+: the "llama3" RoPE scaling is stored only as per-frequency divisors
    (`rope_freqs`); `llama3_rope_scaling` recovers the HF `rope_scaling` from them.
A file without an `output` tensor ties the LM head to the token embedding (`tie_word_embeddings`).
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import re
from typing import Any, Mapping

import gguf
import numpy as np
from tokenizers import pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.integrations.gguf.gguf_tokenizer_mapping import (
    GGUF_TOKENIZER_MAPPING,
    convert_gguf_tokenizer,
)

from rised_jax.model.errors import ModelFileNotFoundError, WeightFileError
from rised_jax.model.tokenizer import Tokenizer

GGUF_MAGIC = b"GGUF"
ROPE_FREQS = "rope_freqs.weight"   # llama3 RoPE divisors: read into the config, not a weight
# The llama3 RoPE band of every Llama 3.x release; GGUF files store only its effect.
LLAMA3_ROPE_BAND = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192}

# Gemma 3 facts that its GGUF files do not carry (they are hard-coded in llama.cpp too).
GEMMA3_LOCAL_ROPE_THETA = 10_000.0
GEMMA3_SLIDING_WINDOW_PATTERN = 6      # layers 6, 12, ... (1-based) are global, the rest local
GEMMA3_27B_NUM_LAYERS = 62             # the one size that scales queries by hidden / heads

# llama.cpp pre-tokenizer names whose rule is "split every digit, then GPT-2's regex"
# (llama-vocab.cpp). transformers' converter falls back to plain GPT-2 splitting for them.
_DIGIT_SPLIT_PRE_TOKENIZERS = frozenset(
    {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"})


class GGUFError(WeightFileError):
  """A GGUF file that cannot be imported; the message names the file and the problem.

  A ValueError (through WeightFileError); a missing file raises ModelFileNotFoundError instead.
  """


@dataclasses.dataclass(frozen=True)
class _Architecture:
  """How one `general.architecture` maps onto a transformers model."""

  hf_class: str
  model_type: str
  layer_modules: Mapping[str, str]   # GGUF per-layer tensor kind -> HF module under layers.{i}
  biased: tuple[str, ...] = ()       # kinds that also carry a `.bias`
  permuted_qk: bool = False          # llama.cpp permuted the q/k rows for its rotary layout
  norm_offset: float = 0.0           # subtracted from every `*norm.weight` (Gemma stores 1 + w)


_ATTENTION_AND_MLP = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_QK_NORM = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}

ARCHITECTURES: dict[str, _Architecture] = {
    "llama": _Architecture(
        "LlamaForCausalLM", "llama",
        {**_ATTENTION_AND_MLP, "ffn_norm": "post_attention_layernorm"}, permuted_qk=True),
    "qwen2": _Architecture(
        "Qwen2ForCausalLM", "qwen2",
        {**_ATTENTION_AND_MLP, "ffn_norm": "post_attention_layernorm"},
        biased=("attn_q", "attn_k", "attn_v")),
    "qwen3": _Architecture(
        "Qwen3ForCausalLM", "qwen3",
        {**_ATTENTION_AND_MLP, **_QK_NORM, "ffn_norm": "post_attention_layernorm"}),
    "gemma3": _Architecture(
        "Gemma3ForCausalLM", "gemma3_text",
        {**_ATTENTION_AND_MLP, **_QK_NORM,
         "post_attention_norm": "post_attention_layernorm",
         "ffn_norm": "pre_feedforward_layernorm",
         "post_ffw_norm": "post_feedforward_layernorm"},
        norm_offset=1.0),
}
_ARCHITECTURE_OF_CLASS = {a.hf_class: name for name, a in ARCHITECTURES.items()}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def load_gguf(path: str | os.PathLike[str]
              ) -> tuple[dict[str, Any], dict[str, np.ndarray], Tokenizer]:
  """Reads a GGUF file into (HF config dict, HF-named float32 state dict, tokenizer).

  Raises ModelFileNotFoundError for a missing file, and GGUFError (a ValueError) naming the file
  for a non-GGUF, truncated or corrupt file, an unsupported architecture or quantization type,
  or tensors that do not fit the config.
  """
  path = pathlib.Path(path)
  reader = open_gguf(path)
  metadata = read_metadata(reader)
  tensors = {t.name: t for t in reader.tensors}
  rope_freqs = dequantize(tensors[ROPE_FREQS], path) if ROPE_FREQS in tensors else None
  config = hf_config_from_metadata(
      metadata, {name: _hf_shape(t) for name, t in tensors.items()}, path, rope_freqs)
  state_dict = read_state_dict(reader, config, path)
  hf_tokenizer = hf_tokenizer_from_metadata(metadata, path)
  return config, state_dict, Tokenizer(hf_tokenizer)   # the chat template is already on it


def open_gguf(path: pathlib.Path) -> gguf.GGUFReader:
  """A reader over the file, after checking that it exists, is a GGUF and parses in full."""
  if not path.is_file():
    raise ModelFileNotFoundError(f"{path}: no such GGUF file")
  with path.open("rb") as f:
    magic = f.read(len(GGUF_MAGIC))
  if magic != GGUF_MAGIC:
    raise GGUFError(f"{path}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
  try:
    reader = gguf.GGUFReader(path)
  except Exception as e:  # the reader fails in many ways (IndexError, reshape errors) on short data
    raise GGUFError(f"{path}: cannot be read as GGUF, the file is truncated or corrupt "
                    f"({type(e).__name__}: {e})") from e
  if reader.byte_order != "I":
    raise GGUFError(f"{path}: the file's byte order differs from this machine's; only GGUF "
                    "files of the host's endianness are supported")
  return reader


def read_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
  """Every key-value pair of the header as Python values (str, int, float, bool or lists)."""
  return {key: field.contents() for key, field in reader.fields.items()}


def _hf_shape(tensor: gguf.ReaderTensor) -> tuple[int, ...]:
  # GGUF lists dimensions fastest-first; numpy (and HF) list them slowest-first.
  return tuple(int(d) for d in reversed(tensor.shape))


def _require(metadata: Mapping[str, Any], key: str, path: pathlib.Path) -> Any:
  if key not in metadata:
    raise GGUFError(f"{path}: metadata key {key!r} is missing")
  return metadata[key]


def hf_config_from_metadata(metadata: Mapping[str, Any],
                            tensor_shapes: Mapping[str, tuple[int, ...]], path: pathlib.Path,
                            rope_freqs: np.ndarray | None = None) -> dict[str, Any]:
  """The config.json an HF checkpoint of this model would have.

  `tensor_shapes` (GGUF name -> HF-order shape) supplies what the header may leave out: the
  vocabulary size (rows of `token_embd`) and whether the LM head is tied (no `output` tensor).
  `rope_freqs` is the file's `rope_freqs.weight`, if any (see `llama3_rope_scaling`).
  """
  arch_name = _require(metadata, "general.architecture", path)
  if arch_name not in ARCHITECTURES:
    raise GGUFError(f"{path}: unsupported architecture {arch_name!r} "
                    f"(general.architecture); supported: {sorted(ARCHITECTURES)}")
  arch = ARCHITECTURES[arch_name]
  key = lambda name: _require(metadata, f"{arch_name}.{name}", path)  # noqa: E731
  hidden = int(key("embedding_length"))
  num_heads = int(key("attention.head_count"))
  head_dim = int(metadata.get(f"{arch_name}.attention.key_length", hidden // num_heads))
  rotary_dims = metadata.get(f"{arch_name}.rope.dimension_count", head_dim)
  if int(rotary_dims) != head_dim:
    raise GGUFError(f"{path}: partial rotary embeddings ({arch_name}.rope.dimension_count = "
                    f"{rotary_dims}, head dim {head_dim}) are not supported")
  if "token_embd.weight" not in tensor_shapes:
    raise GGUFError(f"{path}: tensor 'token_embd.weight' is missing")

  config: dict[str, Any] = {
      "architectures": [arch.hf_class],
      "model_type": arch.model_type,
      "vocab_size": tensor_shapes["token_embd.weight"][0],
      "hidden_size": hidden,
      "intermediate_size": int(key("feed_forward_length")),
      "num_hidden_layers": int(key("block_count")),
      "num_attention_heads": num_heads,
      "num_key_value_heads": int(metadata.get(f"{arch_name}.attention.head_count_kv", num_heads)),
      "head_dim": head_dim,
      "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
      "rope_theta": float(metadata.get(f"{arch_name}.rope.freq_base", 10_000.0)),
      "rope_scaling": _rope_scaling(metadata, arch_name, path),
      "max_position_embeddings": int(key("context_length")),
      "tie_word_embeddings": "output.weight" not in tensor_shapes,
      "attention_bias": bool(arch.biased),
      **_special_token_ids(metadata, arch_name),
  }
  if rope_freqs is not None:
    if arch_name != "llama" or config["rope_scaling"] is not None:
      raise GGUFError(f"{path}: tensor {ROPE_FREQS!r} is only supported in llama files without "
                      f"{arch_name}.rope.scaling.type")
    config["rope_scaling"] = llama3_rope_scaling(rope_freqs, head_dim, config["rope_theta"], path)
  if arch_name == "gemma3":
    config.update(_gemma3_config(metadata, config, path))
  else:
    config["hidden_act"] = "silu"
  if arch_name == "qwen2":
    config["use_sliding_window"] = False   # Qwen2 GGUFs carry no sliding-window setting
  return config


def _rope_scaling(metadata: Mapping[str, Any], arch_name: str, path: pathlib.Path) -> dict | None:
  kind = metadata.get(f"{arch_name}.rope.scaling.type", "none")
  if kind == "none":
    return None
  factor = float(_require(metadata, f"{arch_name}.rope.scaling.factor", path))
  if kind == "linear":
    return {"rope_type": "linear", "factor": factor}
  if kind == "yarn":
    original = int(_require(metadata, f"{arch_name}.rope.scaling.original_context_length", path))
    return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original}
  raise GGUFError(f"{path}: unsupported {arch_name}.rope.scaling.type {kind!r} "
                  "(supported: none, linear, yarn)")


def llama3_rope_scaling(rope_freqs: np.ndarray, head_dim: int, rope_theta: float,
                        path: pathlib.Path) -> dict[str, Any]:
  """Llama 3.1-style RoPE scaling, recovered from llama.cpp's `rope_freqs` tensor.

  convert_hf_to_gguf.py stores, per rotary frequency, the divisor that the "llama3" recipe
  applies to it: 1 for short wavelengths, `factor` for long ones, a blend between the band
  edges. The factor is the largest divisor; the band edges are not stored, so Meta's values
  (LLAMA3_ROPE_BAND: the same for Llama 3.1, 3.2 and 3.3) are assumed, and every divisor is
  recomputed from them and checked.
  """
  low, high, original = (LLAMA3_ROPE_BAND[k] for k in (
      "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"))
  factor = float(rope_freqs.max())
  wavelength = 2 * np.pi * rope_theta ** (np.arange(0, head_dim, 2) / head_dim)
  smooth = (original / wavelength - low) / (high - low)
  divisors = np.where(wavelength < original / high, 1.0,
                      np.where(wavelength > original / low, factor,
                               1 / ((1 - smooth) / factor + smooth)))
  if rope_freqs.shape != divisors.shape or not np.allclose(rope_freqs, divisors, rtol=1e-4):
    raise GGUFError(f"{path}: tensor {ROPE_FREQS!r} does not follow the llama3 RoPE recipe "
                    f"(factor {factor}, {LLAMA3_ROPE_BAND}) for head_dim {head_dim}")
  return {"rope_type": "llama3", "factor": factor, **LLAMA3_ROPE_BAND}


def _special_token_ids(metadata: Mapping[str, Any], arch_name: str) -> dict[str, Any]:
  """bos/pad/eos ids; eos becomes a list when the model also ends turns with another token."""
  ids = {hf_key: int(metadata[gguf_key])
         for hf_key, gguf_key in (("bos_token_id", "tokenizer.ggml.bos_token_id"),
                                  ("pad_token_id", "tokenizer.ggml.padding_token_id"))
         if gguf_key in metadata}
  stops = [int(metadata[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
           if k in metadata]
  tokens = metadata.get("tokenizer.ggml.tokens", [])
  if arch_name == "gemma3" and "<end_of_turn>" in tokens:
    # llama.cpp also stops on Gemma's end-of-turn marker, which it finds by its text.
    stops.append(tokens.index("<end_of_turn>"))
  stops = list(dict.fromkeys(stops))
  if stops:
    ids["eos_token_id"] = stops[0] if len(stops) == 1 else stops
  return ids


def _gemma3_config(metadata: Mapping[str, Any], config: Mapping[str, Any],
                   path: pathlib.Path) -> dict[str, Any]:
  """Gemma 3 settings beyond the common ones.

  Not stored in the GGUF, so taken from Gemma 3's published configs (and llama.cpp's
  src/llama-model.cpp, which hard-codes the same): local layers use RoPE base 10000 and a
  sliding window; every 6th layer is global and uses `rope_theta` (and the file's linear RoPE
  scaling, which applies to global layers only); queries are scaled by 1/sqrt(head_dim), except
  in the 62-layer 27B model, which uses 1/sqrt(hidden_size / num_heads).
  """
  num_layers = config["num_hidden_layers"]
  if num_layers == GEMMA3_27B_NUM_LAYERS:
    query_scale = config["hidden_size"] // config["num_attention_heads"]
  else:
    query_scale = config["head_dim"]
  return {
      "hidden_activation": "gelu_pytorch_tanh",
      "sliding_window": int(_require(metadata, "gemma3.attention.sliding_window", path)),
      "sliding_window_pattern": GEMMA3_SLIDING_WINDOW_PATTERN,
      "layer_types": [
          "full_attention" if (i + 1) % GEMMA3_SLIDING_WINDOW_PATTERN == 0 else "sliding_attention"
          for i in range(num_layers)],
      "rope_local_base_freq": GEMMA3_LOCAL_ROPE_THETA,
      "query_pre_attn_scalar": query_scale,
      "attn_logit_softcapping": metadata.get("gemma3.attn_logit_softcapping"),
      "final_logit_softcapping": metadata.get("gemma3.final_logit_softcapping"),
  }


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
  """Undoes llama.cpp's q/k row permutation for `num_heads` heads of rows.

  llama.cpp stores each head's rows as interleaved rotary pairs (x0, x_half, x1, x_half+1, ...);
  HF stores the two halves one after the other. Rows are viewed as [heads, pair index, 2] and
  the last two axes swapped back.
  """
  rows = weight.shape[0]
  if rows % (2 * num_heads):
    raise ValueError(f"{rows} rows cannot be split into {num_heads} heads of rotary pairs")
  per_head = weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
  return per_head.swapaxes(1, 2).reshape(weight.shape)


def expected_hf_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
  """Every tensor an HF checkpoint of `config` holds, with its shape."""
  arch = ARCHITECTURES[_ARCHITECTURE_OF_CLASS[config["architectures"][0]]]
  hidden, head_dim = config["hidden_size"], config["head_dim"]
  q_rows = config["num_attention_heads"] * head_dim
  kv_rows = config["num_key_value_heads"] * head_dim
  module_shapes = {
      "self_attn.q_proj": (q_rows, hidden), "self_attn.k_proj": (kv_rows, hidden),
      "self_attn.v_proj": (kv_rows, hidden), "self_attn.o_proj": (hidden, q_rows),
      "self_attn.q_norm": (head_dim,), "self_attn.k_norm": (head_dim,),
      "mlp.gate_proj": (config["intermediate_size"], hidden),
      "mlp.up_proj": (config["intermediate_size"], hidden),
      "mlp.down_proj": (hidden, config["intermediate_size"]),
  }
  shapes = {"model.embed_tokens.weight": (config["vocab_size"], hidden),
            "model.norm.weight": (hidden,)}
  if not config["tie_word_embeddings"]:
    shapes["lm_head.weight"] = (config["vocab_size"], hidden)
  for i in range(config["num_hidden_layers"]):
    for kind, module in arch.layer_modules.items():
      shape = module_shapes.get(module, (hidden,))   # the rest are per-layer norms
      shapes[f"model.layers.{i}.{module}.weight"] = shape
      if kind in arch.biased:
        shapes[f"model.layers.{i}.{module}.bias"] = shape[:1]
  return shapes


def hf_tensor_name(gguf_name: str, arch_name: str) -> str | None:
  """The transformers name of a GGUF tensor, or None when it has no counterpart."""
  if gguf_name in _GLOBAL_TENSORS:
    return _GLOBAL_TENSORS[gguf_name]
  match = _LAYER_TENSOR.fullmatch(gguf_name)
  arch = ARCHITECTURES[arch_name]
  if not match or match[2] not in arch.layer_modules:
    return None
  if match[3] == "bias" and match[2] not in arch.biased:
    return None
  return f"model.layers.{match[1]}.{arch.layer_modules[match[2]]}.{match[3]}"


def dequantize(tensor: gguf.ReaderTensor, path: pathlib.Path) -> np.ndarray:
  """The tensor's values as a fresh float32 array in HF (slowest-first) order."""
  try:
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
  except NotImplementedError as e:
    raise GGUFError(f"{path}: tensor {tensor.name!r} uses quantization type "
                    f"{tensor.tensor_type.name}, which the gguf package cannot dequantize") from e
  return np.array(values, dtype=np.float32).reshape(_hf_shape(tensor))


def read_state_dict(reader: gguf.GGUFReader, config: Mapping[str, Any],
                    path: pathlib.Path) -> dict[str, np.ndarray]:
  """All tensors, dequantized to float32, under HF names and in HF layout."""
  arch_name = _ARCHITECTURE_OF_CLASS[config["architectures"][0]]
  arch = ARCHITECTURES[arch_name]
  expected = expected_hf_shapes(config)
  state_dict: dict[str, np.ndarray] = {}
  for tensor in reader.tensors:
    if tensor.name == ROPE_FREQS:
      continue
    name = hf_tensor_name(tensor.name, arch_name)
    if name is None or name not in expected:
      raise GGUFError(f"{path}: tensor {tensor.name!r} has no counterpart in a {arch.hf_class} "
                      "checkpoint")
    if _hf_shape(tensor) != expected[name]:
      raise GGUFError(f"{path}: tensor {tensor.name!r} has shape {_hf_shape(tensor)}, the config "
                      f"implies {expected[name]} for {name}")
    values = dequantize(tensor, path)
    if arch.permuted_qk and name.endswith("q_proj.weight"):
      values = unpermute_rotary_rows(values, config["num_attention_heads"])
    elif arch.permuted_qk and name.endswith("k_proj.weight"):
      values = unpermute_rotary_rows(values, config["num_key_value_heads"])
    if arch.norm_offset and name.endswith("norm.weight"):
      values -= arch.norm_offset
    state_dict[name] = values
  missing = sorted(set(expected) - set(state_dict))
  if missing:
    raise GGUFError(f"{path}: {len(missing)} tensors are missing, e.g. {missing[:3]}")
  return state_dict


def hf_tokenizer_from_metadata(metadata: Mapping[str, Any],
                               path: pathlib.Path) -> PreTrainedTokenizerFast:
  """The tokenizer described by `tokenizer.ggml.*`, built without torch.

  The vocabulary, merges, token types and special tokens go through transformers' GGUF
  tokenizer converter. Files whose llama.cpp pre-tokenizer splits digits one by one (SmolLM2's
  "smollm", StarCoder's, ...) get that rule back, which the converter does not restore.
  """
  arch_name = _require(metadata, "general.architecture", path)
  tokenizer_dict = {name: metadata[f"tokenizer.{key}"]
                    for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
                    if f"tokenizer.{key}" in metadata}
  if "tokens" not in tokenizer_dict:
    raise GGUFError(f"{path}: metadata key 'tokenizer.ggml.tokens' is missing")
  try:
    backend, _ = convert_gguf_tokenizer(arch_name, tokenizer_dict)
  except ValueError as e:
    raise GGUFError(f"{path}: cannot build its tokenizer: {e}") from e
  if tokenizer_dict.get("pre_tokenizer_type") in _DIGIT_SPLIT_PRE_TOKENIZERS:
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])

  tokens = tokenizer_dict["tokens"]
  special = {f"{role}_token": tokens[int(metadata[f"tokenizer.ggml.{key}"])]
             for role, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"),
                               ("unk", "unknown_token_id"), ("pad", "padding_token_id"))
             if f"tokenizer.ggml.{key}" in metadata}
  # llama.cpp adds BOS to sentencepiece vocabularies unless the file says otherwise.
  add_bos = metadata.get("tokenizer.ggml.add_bos_token",
                         tokenizer_dict.get("tokenizer_type") == "llama")
  return PreTrainedTokenizerFast(
      tokenizer_object=backend,
      add_bos_token=bool(add_bos),
      add_eos_token=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
      chat_template=metadata.get("tokenizer.chat_template"),
      **special)
