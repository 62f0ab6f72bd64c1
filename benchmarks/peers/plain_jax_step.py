"""The naive version of our GRPO step: the same objective written the plainest way in JAX.

One `jax.jit(value_and_grad)` over the whole batch: the model's full logits, one
`log_softmax` over the vocabulary, the clipped surrogate against the batch's π_old,
seq-mean-token-mean, then `optax.adamw`. No loss chunking, no rematerialisation, no
non-finite guard, no metrics, no sharding. `benchmarks/e2e.py` runs it beside our step on the
same batch and parameters: the ratio of the two says what our step's structure costs (or
saves) over the simplest JAX program of the same work, and the loss and gradient norm it
returns must equal our step's, which shows it is the same work.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


class PlainGRPOStep:
  """`plain(params, batch) -> (new params, loss, gradient norm)` for `model`'s architecture;
  the AdamW moments stay inside (they do not change what the step computes or costs)."""

  def __init__(self, model: nnx.Module, *, learning_rate: float, weight_decay: float,
               eps_low: float, eps_high: float):
    self.graphdef, params, self.rest = nnx.split(model, nnx.Param, ...)
    self.optimizer = optax.adamw(learning_rate, weight_decay=weight_decay)
    # Initialised as the step returns it (committed), so the second call does not compile again.
    self.opt_state = jax.jit(self.optimizer.init)(params)
    self.clip = (1.0 - eps_low, 1.0 + eps_high)
    self._step = jax.jit(self._update)

  def params(self, model: nnx.Module):
    """A copy of `model`'s parameters through the host (our step donates its own, and its
    output's sharding would otherwise make the first call after a step compile again)."""
    return jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), nnx.state(model, nnx.Param))

  def loss(self, params, batch: Mapping[str, jax.Array]) -> jax.Array:
    logits = nnx.merge(self.graphdef, params, self.rest)(
        batch["input_ids"], batch["attention_mask"])[:, :-1]
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits.astype(jnp.float32)),
                               batch["input_ids"][:, 1:, None], axis=-1)[..., 0]
    mask = batch["loss_mask"][:, 1:]
    advantages = batch["advantages"][:, 1:]
    ratio = jnp.exp(logp - batch["old_logprobs"][:, 1:])
    surrogate = jnp.minimum(ratio * advantages, jnp.clip(ratio, *self.clip) * advantages)
    tokens = mask.sum(axis=1)
    per_sequence = -(surrogate * mask).sum(axis=1) / jnp.maximum(tokens, 1.0)
    return per_sequence.sum() / jnp.maximum((tokens > 0).sum(), 1)

  def _update(self, params, opt_state, batch):
    loss, grads = jax.value_and_grad(self.loss)(params, batch)
    updates, opt_state = self.optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, optax.tree.norm(grads)

  def __call__(self, params, batch: Mapping[str, Any]):
    params, self.opt_state, loss, grad_norm = self._step(params, self.opt_state, batch)
    return params, loss, grad_norm
