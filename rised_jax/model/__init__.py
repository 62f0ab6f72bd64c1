"""The policy model: a Flax NNX decoder (Llama, Qwen2/Qwen3, Gemma 3 text), its tokenizer,
and import/export of Hugging Face checkpoints and GGUF files.

  model, tokenizer = from_pretrained("path/to/hf_dir" | "model.gguf" | "<packaged name>")
  logits = model(input_ids, attention_mask)
  save_pretrained(model, tokenizer, "out_dir", dtype="bfloat16")   # HF layout, SGLang-loadable
"""
from __future__ import annotations

import os
from pathlib import Path

import jax.numpy as jnp
from flax import nnx

from rised_jax.model import hf_io, hub
from rised_jax.model.config import FULL_ATTENTION, SLIDING_ATTENTION, ModelConfig, RopeConfig
from rised_jax.model.decoder import LOGICAL_AXES, Decoder, KVCache
from rised_jax.model.errors import (ExportError, ModelConfigError, ModelError,
                                    ModelFileNotFoundError, TokenizerError, WeightError,
                                    WeightFileError)
from rised_jax.model.hf_io import hf_state_dict, load_state_dict, save_pretrained
from rised_jax.model.tokenizer import Tokenizer

__all__ = [
    "Decoder", "ExportError", "FULL_ATTENTION", "KVCache", "LOGICAL_AXES", "ModelConfig",
    "ModelConfigError", "ModelError", "ModelFileNotFoundError", "RopeConfig",
    "DTYPES", "SLIDING_ATTENTION", "Tokenizer", "TokenizerError", "WeightError", "WeightFileError",
    "from_config", "from_pretrained", "hf_state_dict", "load_state_dict", "save_pretrained",
]

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def _dtype(name: str, key: str):
  if name not in DTYPES:
    raise ValueError(f"{key} must be one of {sorted(DTYPES)}, got {name!r}")
  return DTYPES[name]


def from_config(cfg: ModelConfig, seed: int = 0, *, dtype: str = "float32",
                param_dtype: str | None = None, remat: bool = False,
                scan_layers: bool = False) -> Decoder:
  """A randomly initialised Decoder (normal(initializer_range) kernels, unit norms)."""
  return Decoder(cfg, dtype=_dtype(dtype, "dtype"),
                 param_dtype=_dtype(param_dtype or dtype, "param_dtype"), remat=remat,
                 scan_layers=scan_layers, rngs=nnx.Rngs(seed))


def from_pretrained(source: str | os.PathLike, dtype: str = "float32", *,
                    param_dtype: str | None = None, remat: bool = False,
                    scan_layers: bool = False) -> tuple[Decoder, Tokenizer]:
  """(model, tokenizer) from an HF directory, a .gguf file, a packaged model name or a hub id.

  Args:
    source: a directory with config.json + safetensors + tokenizer files; a path ending in
      .gguf; a name from `rised_jax.model.packaged.names()`; or a Hugging Face hub id
      (`Qwen/Qwen3-4B`, `org/name@revision`), fetched into the hub's cache (`model.hub`). A
      relative path whose first folder exists here is a missing local path, never a hub id.
    dtype: compute dtype, "float32" or "bfloat16".
    param_dtype: parameter storage dtype; defaults to `dtype`.
    remat: rematerialise layers in the backward pass.
    scan_layers: stack the layers and run them with one `lax.scan` (see `Decoder`).
  """
  kwargs = dict(dtype=_dtype(dtype, "dtype"),
                param_dtype=_dtype(param_dtype or dtype, "param_dtype"), remat=remat,
                scan_layers=scan_layers)
  path = Path(source).expanduser()
  if path.is_dir():
    return hf_io.load_hf_dir(path, **kwargs)
  if _is_hub_id(source, path):
    return hf_io.load_hf_dir(hub.snapshot(str(source)), **kwargs)
  if path.suffix != ".gguf" and not path.exists() and os.sep not in str(source):
    path = _packaged_path(str(source))
  if path.suffix != ".gguf":
    raise ModelFileNotFoundError(f"{path}: not a model directory or a .gguf file; expected an "
                                 f"HF checkpoint directory (config.json, model.safetensors, "
                                 f"tokenizer.json), a .gguf file or a packaged model name")
  if not path.is_file():
    raise ModelFileNotFoundError(f"{path}: not found; expected a GGUF model file")
  from rised_jax.model import gguf  # pylint: disable=import-outside-toplevel
  hf_config, state, tokenizer = gguf.load_gguf(path)
  cfg = ModelConfig.from_hf(hf_config, source=str(path))
  return hf_io.build_from_state(cfg, state, str(path), **kwargs), tokenizer


def _is_hub_id(source: str | os.PathLike, path: Path) -> bool:
  """Whether `source` names a hub repository rather than a (missing) local file."""
  text = os.fspath(source)
  if path.exists() or hub.parse_hub_id(text) is None:
    return False
  return not Path(text.split("/", 1)[0]).is_dir()


def _packaged_path(name: str) -> Path:
  from rised_jax.model import packaged  # pylint: disable=import-outside-toplevel
  names = list(packaged.names())
  if name not in names:
    raise ModelFileNotFoundError(f"{name!r}: no such directory or file, and not a packaged "
                                 f"model name (packaged: {names})")
  return Path(packaged.resolve(name))
