"""A tiny model, optimizer, step config and deterministic batches shared by the step tests."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rised_jax.learn import batching, train_step
from rised_jax.model import ModelConfig, from_config

ROWS = 8
VOCAB = 96

TINY_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": VOCAB,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "max_position_embeddings": 256,
}


def tiny_model(seed: int = 0, remat: bool = False, scan_layers: bool = False):
  return from_config(ModelConfig.from_hf(TINY_QWEN3, source="tests/helpers/step_fixtures.py"), seed,
                     remat=remat, scan_layers=scan_layers)


def optimizer() -> optax.GradientTransformation:
  # Adam normalises each coordinate by its own gradient scale, which turns float32 reordering
  # noise (sharded vs single-device sums) on near-zero gradients into O(lr) differences; an
  # eps well above that noise keeps the comparison about the step, not about rounding.
  return train_step.make_optimizer(train_step.OptimizerConfig(learning_rate=1e-3, eps=1e-6,
                                                              max_grad_norm=1.0))


def step_config(**overrides) -> train_step.StepConfig:
  base = dict(beta=0.1, chunk=8, aggregation="seq-mean-token-mean", importance_cap=2.0)
  base.update(overrides)
  return train_step.StepConfig.from_keys(base)


def rows(index: int, num_rows: int = ROWS, teacher: bool = True) -> list[batching.Row]:
  rng = np.random.default_rng(1000 + index)
  out = []
  for r in range(num_rows):
    prefix = rng.integers(1, VOCAB, rng.integers(3, 9)).tolist()
    n = int(rng.integers(4, 17))
    response = rng.integers(1, VOCAB, n).tolist()
    mask = (rng.random(n) < 0.8).astype(int).tolist()
    out.append(batching.Row(
        prefix_ids=prefix, response_ids=response, response_loss_mask=mask,
        response_behaviour_logprobs=(-rng.random(n) * 5).tolist(),
        advantage=float(rng.normal()),
        teacher_prefix_ids=(rng.integers(1, VOCAB, rng.integers(3, 11)).tolist()
                            if teacher and r % 3 else None)))
  return out


def batch(index: int, num_rows: int = ROWS) -> dict[str, np.ndarray]:
  return batching.assemble(rows(index, num_rows), pad_id=0, prefix_multiple=4,
                           response_multiple=8, with_distill=True)


def grouped_rows(index: int, group_size: int, num_rows: int = ROWS) -> list[batching.Row]:
  """`rows` with each group of `group_size` consecutive rows given its first row's prefix."""
  out = rows(index, num_rows)
  for i, row in enumerate(out):
    row.prefix_ids = out[i - i % group_size].prefix_ids
  return out


def grouped_batch(index: int, group_size: int, num_rows: int = ROWS) -> dict[str, np.ndarray]:
  """The batch of `grouped_rows`, each group's prefix carried once (`prefix_ids`)."""
  return batching.assemble(grouped_rows(index, group_size, num_rows), pad_id=0,
                           prefix_multiple=4, response_multiple=8, with_distill=True,
                           shared_prefix=True, group_size=group_size)


def target_logprobs(model, batch) -> tuple[jax.Array, jax.Array]:
  """log p(y_t) of every target column from full (unchunked) logits, and the log-softmax
  [B, T − 1, V] it came from: the references' forward."""
  ids = jnp.asarray(batch["input_ids"])
  logits = model(ids, jnp.asarray(batch["attention_mask"]))
  logp_all = jax.nn.log_softmax(logits[:, :-1], axis=-1)
  logp = jnp.take_along_axis(logp_all, ids[:, 1:, None], axis=-1)[..., 0]
  return jnp.pad(logp, [(0, 0), (1, 0)]), logp_all
