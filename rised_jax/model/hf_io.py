"""Hugging Face checkpoint directories <-> `Decoder`, torch-free.

Import: config.json, model.safetensors or a sharded model.safetensors.index.json, tokenizer
files. Tensors are read one at a time from the safetensors files and written straight into
an abstract (shape-only) model, so a checkpoint is never held twice in host memory.

Export (`save_pretrained`): config.json, model*.safetensors (+ index when sharded), tokenizer
files and generation_config.json under HF parameter names, in the standard layout that
transformers' `AutoModelForCausalLM.from_pretrained` and an SGLang server load; lm_head is
omitted when the embeddings are tied. An export directory holds a marker file listing what
this package wrote; a non-empty directory without it is never written to. On several
processes (multi-host) the tensors are gathered to process 0, which alone writes.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from rised_jax import parallel
from rised_jax.model.config import ModelConfig
from rised_jax.model.decoder import Decoder
from rised_jax.model.errors import (ExportError, ModelConfigError, ModelFileNotFoundError,
                                    WeightError, WeightFileError)
from rised_jax.model.tokenizer import Tokenizer

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
EXPORT_MARKER_FILE = "rised_jax_export.json"
EXPORT_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
# Buffers some exporters write that carry no parameters.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


# ---------------------------------------------------------------------------------------------
# HF parameter names and layouts.


@dataclasses.dataclass(frozen=True)
class _Weight:
  """One HF tensor and where it lives in the `Decoder`.

  layout: how the HF array maps onto ours —
    same       identical
    transpose  HF [out, in] -> ours [in, out]
    in_heads   HF [N*hd, D] -> ours [D, N, hd]   (q/k/v projections)
    out_heads  HF [D, H*hd] -> ours [H, hd, D]   (o projection)
    heads      HF [N*hd]    -> ours [N, hd]      (q/k/v biases)
  """

  hf_name: str
  path: tuple[str | int, ...]
  hf_shape: tuple[int, ...]
  layout: str


def _to_ours(layout: str, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  if layout == "same":
    return array
  if layout == "heads":
    return array.reshape(shape)
  if layout in ("transpose", "in_heads", "out_heads"):
    return array.T.reshape(shape)
  raise AssertionError(layout)


def _to_hf(layout: str, array: np.ndarray, hf_shape: tuple[int, ...]) -> np.ndarray:
  if layout == "transpose":
    return array.T
  if layout in ("in_heads", "out_heads"):
    return array.reshape(hf_shape[::-1]).T
  return array.reshape(hf_shape)


def weight_specs(cfg: ModelConfig) -> list[_Weight]:
  """Every HF tensor of `cfg`'s checkpoint, in checkpoint order."""
  d, v, f = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
  q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
  specs = [_Weight("model.embed_tokens.weight", ("embed",), (v, d), "same")]
  for i in range(cfg.num_layers):
    hf = f"model.layers.{i}."
    ours: tuple[str | int, ...] = ("layers", i)
    layer = [(f"{hf}input_layernorm.weight", ours + ("pre_attn_norm", "scale"), (d,), "same")]
    for name, dim in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
      layer.append((f"{hf}self_attn.{name}_proj.weight", ours + ("attn", f"{name}_proj"),
                    (dim, d), "in_heads"))
      if cfg.qkv_bias:
        layer.append((f"{hf}self_attn.{name}_proj.bias", ours + ("attn", f"{name}_bias"),
                      (dim,), "heads"))
    layer.append((f"{hf}self_attn.o_proj.weight", ours + ("attn", "o_proj"), (d, q_dim),
                  "out_heads"))
    if cfg.o_bias:
      layer.append((f"{hf}self_attn.o_proj.bias", ours + ("attn", "o_bias"), (d,), "same"))
    if cfg.qk_norm:
      for name in ("q_norm", "k_norm"):
        layer.append((f"{hf}self_attn.{name}.weight", ours + ("attn", name, "scale"),
                      (cfg.head_dim,), "same"))
    if cfg.sandwich_norms:
      layer += [
          (f"{hf}post_attention_layernorm.weight", ours + ("post_attn_norm", "scale"), (d,),
           "same"),
          (f"{hf}pre_feedforward_layernorm.weight", ours + ("pre_mlp_norm", "scale"), (d,),
           "same"),
          (f"{hf}post_feedforward_layernorm.weight", ours + ("post_mlp_norm", "scale"), (d,),
           "same"),
      ]
    else:
      layer.append((f"{hf}post_attention_layernorm.weight", ours + ("pre_mlp_norm", "scale"),
                    (d,), "same"))
    for name, shape in (("gate", (f, d)), ("up", (f, d)), ("down", (d, f))):
      layer.append((f"{hf}mlp.{name}_proj.weight", ours + ("mlp", f"{name}_proj"), shape,
                    "transpose"))
      if cfg.mlp_bias:
        layer.append((f"{hf}mlp.{name}_proj.bias", ours + ("mlp", f"{name}_bias"),
                      (shape[0],), "same"))
    specs += [_Weight(*entry) for entry in layer]
  specs.append(_Weight("model.norm.weight", ("final_norm", "scale"), (d,), "same"))
  if not cfg.tie_word_embeddings:
    specs.append(_Weight("lm_head.weight", ("lm_head",), (v, d), "transpose"))
  return specs


def _param_at(model: Decoder, path: tuple[str | int, ...]) -> tuple[nnx.Param, int | None]:
  """The parameter holding the tensor at `path` and, when the decoder stacks its layers
  (`scan_layers`: path ("layers", i, ...) lives at row i of a [L, ...] parameter), the row."""
  row = None
  if model.scan_layers and path[0] == "layers":
    path, row = (path[0],) + path[2:], path[1]
  node: Any = model
  for key in path:
    node = node[key] if isinstance(key, int) else getattr(node, key)
  return node, row


def _stacked_order(specs: list[_Weight]) -> list[_Weight]:
  """The specs with each stacked parameter's layers consecutive (a per-layer path's layer
  index moved last), so that only one parameter's host stack is ever being filled."""
  def key(spec: _Weight):
    is_layer = spec.path[0] == "layers"
    return (is_layer, spec.path[2:] if is_layer else (), spec.path[1] if is_layer else 0)
  return sorted(specs, key=key)


# ---------------------------------------------------------------------------------------------
# State dicts.


def load_state_dict(model: Decoder, state: Mapping[str, np.ndarray],
                    source: str = "state dict") -> None:
  """Copies HF-named tensors into `model`'s parameters (cast to their dtype).

  Names and shapes are checked before anything is copied: WeightError names the missing and
  unexpected tensors, or a tensor whose shape differs from the config's (with both shapes);
  a tensor with a NaN or inf value is rejected by name (GGUF files load through here too).
  """
  cfg = model.cfg
  specs = weight_specs(cfg)
  expected = {s.hf_name for s in specs}
  ignorable = {n for n in state if n.endswith(_IGNORED_SUFFIXES)}
  if cfg.tie_word_embeddings:
    ignorable.add("lm_head.weight")  # some tied checkpoints store the shared matrix twice
  missing = sorted(expected - set(state))
  unexpected = sorted(set(state) - expected - ignorable)
  if missing or unexpected:
    parts = []
    if missing:
      parts.append(f"{len(missing)} missing tensor(s): {_some(missing)}")
    if unexpected:
      parts.append(f"{len(unexpected)} unexpected tensor(s): {_some(unexpected)}")
    raise WeightError(f"{source}: does not match the {cfg.architecture} config "
                      f"({cfg.source}): " + "; ".join(parts))
  shapes = _shapes(state)
  for spec in specs:
    found = tuple(shapes[spec.hf_name])
    if found != spec.hf_shape:
      raise WeightError(f"{source}: tensor '{spec.hf_name}' has shape {found}, the config "
                        f"({cfg.source}) expects {spec.hf_shape}")
  stacked = model.scan_layers
  stack = None   # the host [L, ...] array of the stacked parameter being filled
  for spec in (_stacked_order(specs) if stacked else specs):
    array = state[spec.hf_name]
    if not jnp.issubdtype(array.dtype, jnp.floating):
      raise WeightError(f"{source}: tensor '{spec.hf_name}' has dtype {array.dtype}, expected "
                        f"a floating-point type")
    array = np.asarray(array)
    finite = np.isfinite(array)
    if not finite.all():   # a NaN weight would make every loss NaN, silently from step 1
      bad = int(array.size - np.count_nonzero(finite))
      first = tuple(int(i) for i in np.unravel_index(np.argmin(finite), array.shape))
      raise WeightError(f"{source}: tensor '{spec.hf_name}' has {bad} non-finite value(s) "
                        f"(NaN or inf) of {array.size}, e.g. at index {first}; expected "
                        "finite weights")
    param, row = _param_at(model, spec.path)
    if row is None:
      value = _to_ours(spec.layout, array, tuple(param.shape))
      param.set_value(jnp.asarray(value, dtype=param.dtype))
      continue
    if row == 0:
      stack = np.empty(param.shape, param.dtype)
    stack[row] = _to_ours(spec.layout, array, tuple(param.shape[1:]))
    if row == cfg.num_layers - 1:
      param.set_value(jnp.asarray(stack))


def hf_tensors(model: Decoder, dtype: np.dtype | None) -> Iterator[tuple[str, np.ndarray]]:
  """(HF name, host array) per tensor in checkpoint order. A parameter sharded over several
  processes' devices is gathered, one parameter at a time (a layer-stacked one once, kept for
  all its rows): every process must consume this."""
  fetched: dict[int, np.ndarray] = {}
  for spec in weight_specs(model.cfg):
    param, row = _param_at(model, spec.path)
    if row is None:
      host = parallel.to_host(param[...])
    else:
      if id(param) not in fetched:
        fetched[id(param)] = parallel.to_host(param[...])
      host = fetched[id(param)][row]
    array = _to_hf(spec.layout, host, spec.hf_shape)
    yield spec.hf_name, np.ascontiguousarray(array if dtype is None else array.astype(dtype))


def hf_state_dict(model: Decoder, dtype: np.dtype | None = None) -> dict[str, np.ndarray]:
  """The model's parameters as HF-named host arrays (optionally cast to `dtype`); on several
  processes every one must call it (the arrays are gathered)."""
  return dict(hf_tensors(model, dtype))


def _some(names: list[str], limit: int = 8) -> str:
  shown = ", ".join(names[:limit])
  return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def _shapes(state: Mapping[str, np.ndarray]) -> Mapping[str, tuple[int, ...]]:
  if isinstance(state, SafetensorsReader):
    return state.shapes
  return {name: np.shape(array) for name, array in state.items()}


class SafetensorsReader(Mapping):
  """Lazy name -> tensor mapping over model.safetensors or a sharded index.

  Every file's header is validated on opening (a truncated file fails here, named); tensors
  are read on access.
  """

  def __init__(self, model_dir: str | os.PathLike):
    model_dir = Path(model_dir)
    single, index = model_dir / WEIGHTS_FILE, model_dir / WEIGHTS_INDEX_FILE
    if index.is_file():
      weight_map = _read_json(index, WeightFileError).get("weight_map")
      if not isinstance(weight_map, dict) or not weight_map:
        raise WeightFileError(f"{index}: key 'weight_map' must map tensor names to shard "
                              f"files, got {weight_map!r}")
      files = sorted(set(weight_map.values()))
    elif single.is_file():
      weight_map, files = None, [WEIGHTS_FILE]
    else:
      found = sorted(p.name for p in model_dir.glob("*.bin"))
      hint = (f" (found {found}: PyTorch pickles are not read, convert them to safetensors)"
              if found else "")
      raise ModelFileNotFoundError(f"{single}: not found; expected {WEIGHTS_FILE} or "
                                   f"{WEIGHTS_INDEX_FILE} in {model_dir}{hint}")
    self._handles = {}
    self._file_of: dict[str, str] = {}
    self.shapes: dict[str, tuple[int, ...]] = {}
    for name in files:
      path = model_dir / name
      if not path.is_file():
        raise ModelFileNotFoundError(f"{path}: not found; {WEIGHTS_INDEX_FILE} lists it as a "
                                     f"weight shard")
      try:
        handle = safe_open(str(path), framework="numpy")
        for key in handle.keys():
          self.shapes[key] = tuple(handle.get_slice(key).get_shape())
          self._file_of[key] = name
      except SafetensorError as e:
        raise WeightFileError(f"{path}: not a readable safetensors file, it may be truncated "
                              f"or corrupt ({e})") from e
      self._handles[name] = handle
    if weight_map is not None:
      wrong = sorted(k for k, file in weight_map.items() if self._file_of.get(k) != file)
      if wrong:
        raise WeightFileError(f"{index}: {len(wrong)} tensor(s) are not in the shard the index "
                              f"names: {_some(wrong)}")
    self.model_dir = model_dir

  def __getitem__(self, name: str) -> np.ndarray:
    file = self._file_of[name]
    try:
      return self._handles[file].get_tensor(name)
    except SafetensorError as e:
      raise WeightFileError(f"{self.model_dir / file}: cannot read tensor '{name}' ({e})") from e

  def __iter__(self) -> Iterator[str]:
    return iter(self._file_of)

  def __len__(self) -> int:
    return len(self._file_of)


# ---------------------------------------------------------------------------------------------
# Import.


def _read_json(path: Path, error: type[Exception]) -> dict[str, Any]:
  try:
    data = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise error(f"{path}: not valid JSON ({e})") from e
  if not isinstance(data, dict):
    raise error(f"{path}: expected a JSON object, got {type(data).__name__}")
  return data


def read_config(model_dir: str | os.PathLike) -> ModelConfig:
  path = Path(model_dir) / CONFIG_FILE
  if not path.is_file():
    raise ModelFileNotFoundError(f"{path}: not found; expected the HF model config "
                                 f"({CONFIG_FILE}) in {model_dir}")
  return ModelConfig.from_hf(_read_json(path, ModelConfigError), source=str(path))


def abstract_decoder(cfg: ModelConfig, *, dtype=jnp.float32, param_dtype=jnp.float32,
                     remat: bool = False, scan_layers: bool = False) -> Decoder:
  """A Decoder whose parameters are shapes only, to be filled by `load_state_dict`."""
  return nnx.eval_shape(lambda: Decoder(cfg, dtype=dtype, param_dtype=param_dtype,
                                        remat=remat, scan_layers=scan_layers,
                                        rngs=nnx.Rngs(0)))


def build_from_state(cfg: ModelConfig, state: Mapping[str, np.ndarray], source: str, *,
                     dtype=jnp.float32, param_dtype=jnp.float32, remat: bool = False,
                     scan_layers: bool = False) -> Decoder:
  """A Decoder for `cfg` holding the HF-named tensors of `state`."""
  model = abstract_decoder(cfg, dtype=dtype, param_dtype=param_dtype, remat=remat,
                           scan_layers=scan_layers)
  load_state_dict(model, state, source=source)
  unset = [jax.tree_util.keystr(path) for path, leaf in
           jax.tree_util.tree_leaves_with_path(nnx.state(model))
           if not isinstance(leaf, jax.Array)]
  if unset:
    raise AssertionError(f"parameters without an HF tensor mapping: {unset}")
  return model


def load_hf_dir(model_dir: str | os.PathLike, *, dtype=jnp.float32, param_dtype=jnp.float32,
                remat: bool = False, scan_layers: bool = False) -> tuple[Decoder, Tokenizer]:
  """(model, tokenizer) from an HF checkpoint directory; config and files checked first."""
  model_dir = Path(model_dir)
  cfg = read_config(model_dir)
  weights = SafetensorsReader(model_dir)
  tokenizer = Tokenizer.from_dir(model_dir)
  model = build_from_state(cfg, weights, str(model_dir), dtype=dtype, param_dtype=param_dtype,
                           remat=remat, scan_layers=scan_layers)
  return model, tokenizer


# ---------------------------------------------------------------------------------------------
# Export.


def _shard(state: dict[str, np.ndarray], max_shard_bytes: int) -> list[dict[str, np.ndarray]]:
  """Consecutive groups of tensors of at most max_shard_bytes (a bigger tensor stands alone)."""
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name, array in state.items():
    if shards[-1] and size + array.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = array
    size += array.nbytes
  return shards


def _prepare_export_dir(out_dir: Path) -> set[str]:
  """Creates out_dir or checks it is empty or a previous export; returns the files it lists."""
  if out_dir.exists() and not out_dir.is_dir():
    raise ExportError(f"{out_dir}: exists and is not a directory")
  out_dir.mkdir(parents=True, exist_ok=True)
  entries = sorted(os.listdir(out_dir))
  if not entries:
    return set()
  marker = out_dir / EXPORT_MARKER_FILE
  if not marker.is_file():
    raise ExportError(f"{out_dir}: not empty and not a previous rised_jax export (no "
                      f"{EXPORT_MARKER_FILE}); refusing to overwrite {_some(entries)}")
  files = _read_json(marker, ExportError).get("files")
  if not isinstance(files, list) or not all(
      isinstance(f, str) and f == Path(f).name for f in files):
    raise ExportError(f"{marker}: key 'files' must list plain file names, got {files!r}")
  return set(files)


def _write_marker(out_dir: Path, files: set[str], dtype: str,
                  note: Mapping[str, Any] | None) -> None:
  _write_json(out_dir / EXPORT_MARKER_FILE,
              {**(note or {}), "files": sorted(files), "dtype": dtype})


def export_manifest(directory: str | os.PathLike) -> dict[str, Any] | None:
  """The `EXPORT_MARKER_FILE` manifest of a directory `save_pretrained` wrote (the files it
  lists, the dtype and the caller's `note`), or None where there is none or it is unreadable."""
  try:
    manifest = json.loads((Path(directory) / EXPORT_MARKER_FILE).read_text())
  except (OSError, ValueError):
    return None
  return manifest if isinstance(manifest, dict) else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
  os.replace(tmp, path)


def save_pretrained(model: Decoder, tokenizer: Tokenizer | None, out_dir: str | os.PathLike,
                    dtype: str = "float32", max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                    note: Mapping[str, Any] | None = None) -> Path:
  """Writes an HF checkpoint directory; returns its path.

  Args:
    tokenizer: written alongside when given (generation_config.json then takes its stop
      tokens as EOS).
    dtype: "float32" or "bfloat16" for the safetensors files.
    max_shard_bytes: above this the weights are split into model-0000i-of-0000n.safetensors
      with a model.safetensors.index.json.
    note: JSON keys added to the export's manifest (`EXPORT_MARKER_FILE`, `export_manifest`),
      e.g. weight sync's version, by which it knows the directories it may prune.

  Each file is written under a temporary name and renamed into place; files of a previous
  export that this one no longer has (e.g. other shards) are removed.

  Multi-host: every process calls this with the same arguments. Each tensor is gathered from
  the processes that hold its shards (one tensor at a time), and process 0 alone touches
  `out_dir` and holds the whole state dict, so the files are byte for byte those of a
  one-process export. A failure on process 0 (a foreign directory, a full disk) is raised on
  every process.
  """
  if dtype not in EXPORT_DTYPES:
    raise ValueError(f"dtype must be one of {sorted(EXPORT_DTYPES)}, got {dtype!r}")
  if max_shard_bytes < 1:
    raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
  out_dir = Path(out_dir)
  previous = parallel.on_coordinator(lambda: _prepare_export_dir(out_dir),
                                     f"preparing the export directory {out_dir}", ExportError)
  state = {}
  for name, array in hf_tensors(model, EXPORT_DTYPES[dtype]):
    if parallel.is_coordinator():   # the others only take part in the gathers
      state[name] = array
  parallel.on_coordinator(
      lambda: _write_export(model.cfg, tokenizer, out_dir, state, previous, dtype,
                            max_shard_bytes, note), f"writing the export {out_dir}", ExportError)
  return out_dir


def _write_export(cfg: ModelConfig, tokenizer: Tokenizer | None, out_dir: Path,
                  state: dict[str, np.ndarray], previous: set[str], dtype: str,
                  max_shard_bytes: int, note: Mapping[str, Any] | None) -> None:
  """The files of `save_pretrained` from the HF-named host tensors."""
  shards = _shard(state, max_shard_bytes)
  if len(shards) == 1:
    shard_names = [WEIGHTS_FILE]
  else:
    shard_names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                   for i in range(len(shards))]
  files = set(shard_names) | {CONFIG_FILE, GENERATION_CONFIG_FILE}
  if len(shards) > 1:
    files.add(WEIGHTS_INDEX_FILE)
  # Listed before anything is written, so an interrupted export is still recognised as ours.
  def mark(listed: set[str]) -> None:
    _write_marker(out_dir, listed, dtype, note)

  mark(previous | files)

  for name, shard in zip(shard_names, shards):
    tmp = out_dir / (name + ".tmp")
    save_file(shard, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out_dir / name)
  if len(shards) > 1:
    _write_json(out_dir / WEIGHTS_INDEX_FILE, {
        "metadata": {"total_size": sum(a.nbytes for a in state.values())},
        "weight_map": {n: f for f, s in zip(shard_names, shards) for n in s},
    })
  # "dtype" is what transformers 5.x reads, "torch_dtype" what 4.x reads.
  _write_json(out_dir / CONFIG_FILE, {**cfg.to_hf(), "dtype": dtype, "torch_dtype": dtype})
  eos = list(tokenizer.stop_token_ids) if tokenizer is not None else cfg.eos_token_id
  _write_json(out_dir / GENERATION_CONFIG_FILE, {
      "bos_token_id": tokenizer.bos_token_id if tokenizer is not None else cfg.bos_token_id,
      "eos_token_id": list(eos) if isinstance(eos, (list, tuple)) else eos,
      "pad_token_id": tokenizer.pad_token_id if tokenizer is not None else cfg.pad_token_id,
  })
  if tokenizer is not None:
    files |= _save_tokenizer(tokenizer, out_dir, previous | files, mark)

  for stale in previous - files:
    (out_dir / stale).unlink(missing_ok=True)
  mark(files)


def _save_tokenizer(tokenizer: Tokenizer, out_dir: Path, listed: set[str],
                    mark: Callable[[set[str]], None]) -> set[str]:
  """Saves the tokenizer in a scratch directory and renames its files into out_dir (listed in
  the manifest by `mark` first)."""
  with tempfile.TemporaryDirectory(dir=out_dir, prefix=".tokenizer-") as scratch:
    names = set(tokenizer.save(scratch))
    clobbered = sorted(n for n in names if (out_dir / n).exists() and n not in listed)
    if clobbered:
      raise ExportError(f"{out_dir}: the tokenizer would overwrite {clobbered}, which this "
                        f"package did not write")
    mark(listed | names)
    for name in names:
      os.replace(Path(scratch) / name, out_dir / name)
  return names
