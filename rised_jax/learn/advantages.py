"""Group-relative advantage estimators (docs/ALGORITHMS.md §1.1).

Each estimator maps scalar rewards `[N, G]` (N prompt groups of G rollouts) to one advantage
per rollout, `[N, G]`, vectorised over groups. An optional `mask` `[N, G]` (1 = valid rollout)
supports groups with fewer than G usable rollouts: statistics use the valid entries only and
invalid entries get advantage 0.

A group whose valid rewards are all equal (all-pass, all-fail, a single valid rollout, or no
valid rollout) gets advantage exactly 0 for every rollout: the subtraction of a float mean can
leave a residue of a few ulps, which GRPO's division by (0 + eps) would blow up into a spurious
signal, so such groups are zeroed explicitly.

Choice of spread for `grpo`: the **population** standard deviation of the group (divide by the
number of valid rollouts n, not n − 1), as in the DeepSeekMath formulation.

Registry: `ADVANTAGES[name]` (a `rised_jax.plugins.Registry`: built-ins, entry points, import
paths) has the signature `(rewards, mask=None, **options)`; `ADVANTAGES.bind(name, **options)`
binds a config's options, rejecting unknown names and options.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rised_jax import plugins

Array = jax.Array


def _prepare(rewards: jax.typing.ArrayLike,
             mask: jax.typing.ArrayLike | None) -> tuple[Array, Array, Array]:
  """Returns float32 rewards, a float 0/1 validity mask and the valid count per group [N, 1]."""
  rewards = jnp.asarray(rewards, jnp.float32)
  if rewards.ndim != 2:
    raise ValueError(f"rewards must have shape [num_groups, group_size]; got {rewards.shape}")
  if mask is None:
    valid = jnp.ones_like(rewards)
  else:
    valid = jnp.asarray(mask)
    if valid.shape != rewards.shape:
      raise ValueError(f"mask shape {valid.shape} does not match rewards shape {rewards.shape}")
    valid = (valid > 0).astype(jnp.float32)
  count = valid.sum(axis=1, keepdims=True)
  return rewards, valid, count


def _centered(rewards: Array, valid: Array, count: Array) -> Array:
  """r − mean of the valid rewards of the group (0 on invalid entries)."""
  mean = (rewards * valid).sum(axis=1, keepdims=True) / jnp.maximum(count, 1.0)
  return (rewards - mean) * valid


def _zero_flat_groups(advantages: Array, rewards: Array, valid: Array) -> Array:
  """Sets the advantage to exactly 0 in groups whose valid rewards are all equal."""
  is_valid = valid > 0
  high = jnp.max(jnp.where(is_valid, rewards, -jnp.inf), axis=1, keepdims=True)
  low = jnp.min(jnp.where(is_valid, rewards, jnp.inf), axis=1, keepdims=True)
  # A group with no valid entry has high = −inf < low = +inf; it is flat as well.
  flat = high <= low
  return jnp.where(flat | ~is_valid, 0.0, advantages)


def grpo(rewards: jax.typing.ArrayLike, mask: jax.typing.ArrayLike | None = None, *,
         eps: float = 1e-6) -> Array:
  """A_i = (r_i − mean r) / (std r + eps), std = population standard deviation of the group."""
  if not eps >= 0:
    raise ValueError(f"grpo eps must be >= 0; got {eps}")
  return _grpo(rewards, mask, eps)


def drgrpo(rewards: jax.typing.ArrayLike, mask: jax.typing.ArrayLike | None = None) -> Array:
  """A_i = r_i − mean r (Dr. GRPO: no division by the group's spread)."""
  return _drgrpo(rewards, mask)


def rloo(rewards: jax.typing.ArrayLike, mask: jax.typing.ArrayLike | None = None) -> Array:
  """A_i = r_i − mean_{j≠i} r_j over the valid rollouts; 0 when a group has < 2 valid ones."""
  return _rloo(rewards, mask)


# The estimators' bodies are jitted: run eagerly, each is a dozen dispatched operations,
# about 0.6 ms of every training iteration on a CPU (benchmarks/e2e.py's `advantages`).
@functools.partial(jax.jit, static_argnums=2)
def _grpo(rewards: jax.typing.ArrayLike, mask: jax.typing.ArrayLike | None,
          eps: float) -> Array:
  rewards, valid, count = _prepare(rewards, mask)
  centered = _centered(rewards, valid, count)
  std = jnp.sqrt((centered ** 2).sum(axis=1, keepdims=True) / jnp.maximum(count, 1.0))
  return _zero_flat_groups(centered / (std + eps), rewards, valid)


@jax.jit
def _drgrpo(rewards: jax.typing.ArrayLike, mask: jax.typing.ArrayLike | None) -> Array:
  rewards, valid, count = _prepare(rewards, mask)
  return _zero_flat_groups(_centered(rewards, valid, count), rewards, valid)


@jax.jit
def _rloo(rewards: jax.typing.ArrayLike, mask: jax.typing.ArrayLike | None) -> Array:
  rewards, valid, count = _prepare(rewards, mask)
  total = (rewards * valid).sum(axis=1, keepdims=True)
  leave_one_out_mean = (total - rewards) / jnp.maximum(count - 1.0, 1.0)
  return _zero_flat_groups((rewards - leave_one_out_mean) * valid, rewards, valid)


ADVANTAGES = plugins.Registry("advantage estimator", "advantage", {
    "grpo": grpo,
    "drgrpo": drgrpo,
    "rloo": rloo,
}, check=plugins.check_function("advantage estimator"))
