"""Mixed precision: float32 master weights, compute-dtype copies for what only runs forward.

The train state keeps the parameters and the Adam moments in `model.param_dtype` (float32 by
default): an AdamW update at a small learning rate is far below bfloat16's spacing (8
significant bits: 2^-7 relative), so bf16 master weights round most updates away. The decoder
casts each parameter to its compute dtype where it uses it (`Decoder(dtype=compute,
param_dtype=master)`), so the gradient of that cast hands float32 gradients to the float32
master.

What only runs forward needs no master copy: the sampler's weights, the exported weights and
the frozen reference policy hold `compute_params`, the parameters as the forward sees them —
matrices, embeddings and biases cast to the compute dtype (the forward casts them anyway, so
nothing is lost) and RMSNorm scales kept as stored (the forward applies them in float32).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rised_jax.model.decoder import RMSNorm

PathKey = tuple[str, ...]


def _key(path) -> PathKey:
  """A pytree path as names, without the Variable's own attribute (`.value`)."""
  return tuple(str(k.key if isinstance(k, jax.tree_util.DictKey) else k.idx
                   if isinstance(k, jax.tree_util.SequenceKey) else k)
               for k in path if not isinstance(k, jax.tree_util.GetAttrKey))


def uncast_param_paths(model: nnx.Module) -> frozenset[PathKey]:
  """Paths (in `nnx.state(model, nnx.Param)`) of the parameters the forward uses as stored,
  not cast to the compute dtype: the RMSNorm scales (applied in float32)."""
  return frozenset(_key((*path, "scale")) for path, node in nnx.iter_graph(model)
                   if isinstance(node, RMSNorm))


def compute_params(params: Any, compute_dtype, keep: frozenset[PathKey], *,
                   copy: bool = False) -> Any:
  """`params` as the forward sees them: every leaf in `compute_dtype` except those at `keep`.

  copy=False returns a leaf whose dtype is already right as it is (no new buffer); copy=True
  always makes new buffers (a copy that must survive the train step donating `params`).
  """
  def one(path, x):
    dtype = x.dtype if _key(path) in keep else compute_dtype
    if x.dtype == dtype and not copy:
      return x
    return jnp.array(x, dtype=dtype, copy=True)
  return jax.tree_util.tree_map_with_path(one, params)
