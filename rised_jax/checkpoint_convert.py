"""Converts a run's checkpoints between scanned and unrolled layer layouts.

`model.scan_layers=True` stores the decoder's layers stacked (`layers/<param>` of shape
[L, ...]); False stores them one by one (`layers/<i>/<param>`). The train state (parameters,
both Adam moments, an EMA/frozen teacher, the reference policy) follows the same layout, so a
checkpoint of one cannot be restored into the other. This copies a workdir, rewriting every
kept checkpoint's "layers" subtrees into the other layout and `config.json`'s
`model.scan_layers`, so the copy resumes (or is evaluated) with the other setting exactly where
the original stopped:

  python -m rised_jax.checkpoint_convert SRC_WORKDIR DST_WORKDIR --to scanned|unrolled

The source is only read; DST_WORKDIR must not exist. Nothing else changes: the logs, the host
state and every array's values (a stacked array's row i is layer i's array, bit for bit).
"""
from __future__ import annotations

import argparse
import json
import shutil
from typing import Any, Mapping

import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from rised_jax import checkpoint

LAYOUTS = ("scanned", "unrolled")
LAYERS_KEY = "layers"


def _is_unrolled(node: Any) -> bool:
  return (isinstance(node, Mapping) and bool(node)
          and all(str(key).isdigit() for key in node))


def _stack(per_layer: list[Any]) -> Any:
  """One tree whose leaves are the layers' leaves stacked on a new leading axis."""
  first = per_layer[0]
  if isinstance(first, Mapping):
    keys = list(first)
    for i, layer in enumerate(per_layer):
      if list(layer) != keys:
        raise ValueError(f"layer {i} has parameters {sorted(layer)}, layer 0 {sorted(keys)}: "
                         "the layers differ, so they cannot be stacked")
    return {key: _stack([layer[key] for layer in per_layer]) for key in keys}
  return np.stack([np.asarray(leaf) for leaf in per_layer])


def _unstack(stacked: Any, num_layers: int | None = None) -> list[Any]:
  """The inverse of `_stack`: one tree per row of the leading axis."""
  if isinstance(stacked, Mapping):
    parts = {key: _unstack(value, num_layers) for key, value in stacked.items()}
    count = {len(v) for v in parts.values()}
    if len(count) != 1:
      raise ValueError(f"stacked layer parameters disagree on the number of layers: {count}")
    return [{key: parts[key][i] for key in stacked} for i in range(count.pop())]
  array = np.asarray(stacked)
  if array.ndim == 0:
    raise ValueError("a stacked layer parameter is a scalar: not a scanned layout")
  return [array[i] for i in range(array.shape[0])]


def convert_tree(tree: Any, to: str) -> tuple[Any, int]:
  """`tree` with every "layers" subtree in layout `to`; also returns how many it converted
  (0: the tree had no layers in the other layout)."""
  if to not in LAYOUTS:
    raise ValueError(f"layout {to!r}: expected one of {LAYOUTS}")
  if isinstance(tree, (list, tuple)):   # optax's chained states are saved as lists
    parts = [convert_tree(item, to) for item in tree]
    return type(tree)(item for item, _ in parts), sum(n for _, n in parts)
  if not isinstance(tree, Mapping):
    return tree, 0
  out, converted = {}, 0
  for key, value in tree.items():
    if key == LAYERS_KEY and isinstance(value, Mapping):
      if to == "scanned" and _is_unrolled(value):
        out[key] = _stack([value[k] for k in sorted(value, key=int)])
        converted += 1
        continue
      if to == "unrolled" and not _is_unrolled(value):
        out[key] = {str(i): layer for i, layer in enumerate(_unstack(value))}
        converted += 1
        continue
    out[key], n = convert_tree(value, to)
    converted += n
  return out, converted


class _Document:
  """A host-state document passed through unchanged (`checkpoint.HostState`)."""

  def __init__(self, doc: Mapping[str, Any]):
    self.doc = dict(doc)

  def state_dict(self) -> dict[str, Any]:
    return self.doc

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    self.doc = dict(state)


def convert_workdir(src: str, dst: str, to: str) -> list[int]:
  """Copies run directory `src` to `dst` with its checkpoints in layout `to`; returns the
  converted steps."""
  src_path, dst_path = epath.Path(src), epath.Path(dst)
  config_file = src_path / "config.json"
  if not config_file.exists():
    raise FileNotFoundError(f"{config_file} not found: {src} is not a run directory")
  if dst_path.exists():
    raise FileExistsError(f"{dst} exists; the converted run goes into a new directory")
  config = json.loads(config_file.read_text())
  scanned = bool(config["model"]["scan_layers"])
  if scanned == (to == "scanned"):
    raise ValueError(f"{config_file}: model.scan_layers is already {scanned}; nothing to convert")
  source = checkpoint.Checkpointer(src_path / "checkpoints", keep=10**9, async_save=False)
  steps = sorted(source.all_steps())
  dst_path.mkdir(parents=True)
  for item in src_path.iterdir():
    if item.name == "checkpoints":
      continue
    if item.is_dir():
      shutil.copytree(item, dst_path / item.name)
    else:
      item.copy(dst_path / item.name)
  config["model"]["scan_layers"] = to == "scanned"
  (dst_path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
  target = checkpoint.Checkpointer(dst_path / "checkpoints", keep=max(len(steps), 1),
                                   async_save=False)
  reader = ocp.StandardCheckpointer()
  try:
    for step in steps:
      state = reader.restore(src_path / "checkpoints" / str(step) / "state")
      converted, count = convert_tree(state, to)
      if count == 0:
        raise ValueError(f"checkpoint {step} in {src_path / 'checkpoints'} has no layers in "
                         f"the {'scanned' if scanned else 'unrolled'} layout")
      host = {name: _Document(doc) for name, doc in source.restore_host(step).items()}
      target.save(step, converted, host, force=True)
  finally:
    source.close()
    target.close()
  return steps


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("src", help="the run directory to convert (read only)")
  parser.add_argument("dst", help="the new run directory (must not exist)")
  parser.add_argument("--to", required=True, choices=LAYOUTS, help="the layout to write")
  args = parser.parse_args(argv)
  steps = convert_workdir(args.src, args.dst, args.to)
  print(f"wrote {args.dst}: checkpoints {steps} in the {args.to} layout "
        f"(model.scan_layers={args.to == 'scanned'})")


if __name__ == "__main__":
  main()
