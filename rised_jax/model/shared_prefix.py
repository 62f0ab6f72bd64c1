"""The layout that runs a group's shared prefix once: pure array functions.

A GRPO group's G rows share their prefix (the prompt) and differ in their responses. Laid out
as rows, the layers process the prefix G times; packed, a group is one sequence

    [prefix (P columns) | response 1 (R) | response 2 (R) | … | response G (R)]

whose responses each attend to the prefix and causally to themselves (`segments`, read by
`decoder.visible_keys`), at the positions they have in their own rows (`positions`). The
layers' work per group is P + G·R columns instead of G·(P + R); `unpack` gives every row its
[P + R] columns back, the prefix's copied to each (its gradient is then the sum over the G
rows, as in the row layout). Prefixes are left-padded and responses right-padded
(`learn.batching`), so the layout keeps each row's column order.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def pack(prefix: jax.Array, responses: jax.Array) -> jax.Array:
  """prefix [n, P, ...] and responses [n·G, R, ...] (group g: rows g·G … g·G + G − 1) →
  [n, P + G·R, ...]."""
  groups = prefix.shape[0]
  per_group = responses.reshape(groups, -1, *responses.shape[2:])
  return jnp.concatenate([prefix, per_group.astype(prefix.dtype)], axis=1)


def positions(prefix_mask: jax.Array, response_mask: jax.Array) -> jax.Array:
  """[n, P + G·R] int32 positions of the packed columns: a prefix column counts its group's
  real prefix tokens before it, a response column the prefix's and its own response's — the
  position the token has in its row (`decoder.positions_from_mask` of that row)."""
  groups = prefix_mask.shape[0]
  size = response_mask.shape[0] // groups
  prefix_count = jnp.cumsum(prefix_mask.astype(jnp.int32), axis=-1)
  response_count = (jnp.repeat(prefix_count[:, -1], size)[:, None]
                    + jnp.cumsum(response_mask.astype(jnp.int32), axis=-1))
  return jnp.maximum(pack(prefix_count, response_count) - 1, 0)


def segments(prefix_width: int, group_size: int, response_width: int) -> np.ndarray:
  """[P + G·R] int32 (static): 0 on the prefix, j + 1 on response j's columns."""
  return np.concatenate([np.zeros(prefix_width, np.int32),
                         np.repeat(np.arange(1, group_size + 1, dtype=np.int32),
                                   response_width)])


def unpack(packed: jax.Array, prefix_width: int, group_size: int) -> jax.Array:
  """[n, P + G·R, ...] → the rows [n·G, P + R, ...]: each row is its group's prefix columns
  followed by its own response's."""
  groups, width = packed.shape[:2]
  tail = packed.shape[2:]
  response_width = (width - prefix_width) // group_size
  prefix = jnp.broadcast_to(packed[:, None, :prefix_width],
                            (groups, group_size, prefix_width, *tail))
  responses = packed[:, prefix_width:].reshape(groups, group_size, response_width, *tail)
  rows = jnp.concatenate([prefix, responses], axis=2)
  return rows.reshape(groups * group_size, prefix_width + response_width, *tail)
