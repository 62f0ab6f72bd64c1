"""Models named by a Hugging Face hub id (`Qwen/Qwen3-4B`, `org/name@revision`).

`from_pretrained` takes a local directory, a GGUF file or a packaged name first; only a source
that is none of those *and* reads as a hub id is resolved here, through `huggingface_hub`'s own
cache (HF_HUB_CACHE / HF_HOME), so a second run, or an offline one (HF_HUB_OFFLINE=1) with the
files cached, downloads nothing. Only the files a decoder checkpoint needs are fetched: the
config, the safetensors shards and their index, and the tokenizer files.
"""
from __future__ import annotations

import re
from pathlib import Path

from rised_jax.model.errors import ModelFileNotFoundError

# What load_hf_dir reads; nothing else of a repository (no .bin, .pt, .gguf or ONNX copies).
CHECKPOINT_FILES = ("config.json", "generation_config.json", "*.safetensors",
                    "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
                    "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt")

# The hub's own naming rule for a repository id: "namespace/name", each of letters, digits,
# '-', '_' and '.', not starting or ending with '-' or '.'; an optional "@revision".
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})"
                     r"(?:@(?P<revision>[\w./-]+))?$")


def parse_hub_id(source: str) -> tuple[str, str | None] | None:
  """(repo_id, revision) when `source` is spelled as a hub id, else None."""
  match = _HUB_ID.match(source)
  if match is None or match["repo"].endswith((".", "-")) or ".." in match["repo"]:
    return None
  return match["repo"], match["revision"]


def snapshot(source: str) -> Path:
  """The local directory of hub id `source`'s checkpoint files, downloading what the cache
  lacks. Raises ModelFileNotFoundError naming the id when the hub (or, offline, the cache)
  does not have it."""
  parsed = parse_hub_id(source)
  if parsed is None:
    raise ModelFileNotFoundError(f"{source!r} is not a hub id (expected 'namespace/name' or "
                                 "'namespace/name@revision')")
  repo_id, revision = parsed
  import huggingface_hub  # noqa: PLC0415  (transformers' own dependency; only for hub ids)
  from huggingface_hub import errors as hub_errors  # noqa: PLC0415
  try:
    path = huggingface_hub.snapshot_download(repo_id, revision=revision,
                                             allow_patterns=list(CHECKPOINT_FILES))
  except (hub_errors.HfHubHTTPError, hub_errors.LocalEntryNotFoundError, OSError,
          ValueError) as err:
    raise ModelFileNotFoundError(
        f"model.source {source!r}: not a local directory, GGUF file or packaged name, and the "
        f"hub id {repo_id!r}{'@' + revision if revision else ''} could not be resolved "
        f"({type(err).__name__}: {err}). Check the id, log in for gated models "
        f"(`huggingface-cli login`), or download it and pass the directory") from err
  return Path(path)
