"""batching.length_buckets: a batch widened to a fixed total width by left-padding its
prefixes, by hand, and the step's loss unchanged by the extra padding."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rised_jax.learn import batching, train_step
from tests.helpers import step_fixtures


def _row(prefix, response, teacher=None):
  n = len(response)
  return batching.Row(prefix_ids=prefix, response_ids=response, response_loss_mask=[1] * n,
                      response_behaviour_logprobs=[-1.0] * n, advantage=0.5,
                      teacher_prefix_ids=teacher)


def test_widened_to_the_smallest_bucket_that_holds_it():
  rows = [_row([7, 8, 9], [4, 5, 6, 3, 2], teacher=[1, 2, 3, 4, 5])]
  # P = bucket(5, 4) = 8, R = bucket(5, 8) = 8: width 16; the bucket 20 adds 4 prefix columns.
  plain = batching.assemble(rows, pad_id=0, prefix_multiple=4, response_multiple=8,
                            with_distill=True)
  wide = batching.assemble(rows, pad_id=0, prefix_multiple=4, response_multiple=8,
                           length_buckets=(12, 20, 32), with_distill=True)
  assert plain["input_ids"].shape == (1, 16) and wide["input_ids"].shape == (1, 20)
  np.testing.assert_array_equal(
      wide["input_ids"][0], [0] * 9 + [7, 8, 9] + [4, 5, 6, 3, 2] + [0] * 3)
  np.testing.assert_array_equal(
      wide["teacher_input_ids"][0], [0] * 7 + [1, 2, 3, 4, 5] + [4, 5, 6, 3, 2] + [0] * 3)
  np.testing.assert_array_equal(wide["loss_mask"][0], [0] * 12 + [1] * 5 + [0] * 3)
  np.testing.assert_array_equal(wide["attention_mask"][0], [0] * 9 + [1] * 8 + [0] * 3)
  for key in plain:   # the same arrays, 4 more left-padding columns
    np.testing.assert_array_equal(wide[key][:, 4:], plain[key], err_msg=key)
  # Wider than every bucket: its own width.
  assert batching.assemble(rows, pad_id=0, prefix_multiple=4, response_multiple=8,
                           length_buckets=(12,), with_distill=True)["input_ids"].shape == (1, 16)


@pytest.mark.slow
def test_the_step_loss_does_not_change_with_the_bucket():
  """Positions follow the attention mask, so extra left padding changes no value."""
  rows = step_fixtures.rows(0)
  plain = step_fixtures.batch(0)
  wide = batching.assemble(rows, pad_id=0, prefix_multiple=4, response_multiple=8,
                           length_buckets=(plain["input_ids"].shape[1] + 24,), with_distill=True)
  assert wide["input_ids"].shape[1] == plain["input_ids"].shape[1] + 24
  config = step_fixtures.step_config(chunk=5)
  graphdef, params, rest = nnx.split(step_fixtures.tiny_model(), nnx.Param, ...)

  def loss(batch):
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    tokens = batch["loss_mask"].sum(-1)
    denominators = {"pg": (tokens > 0).sum().astype(jnp.float32),
                    "distill": batch["distill_mask"].sum()}
    return float(train_step._micro_loss(params, rest, None, graphdef, config, batch,
                                        denominators, jnp.float32(config.teacher_kl.beta))[0])

  assert loss(wide) == pytest.approx(loss(plain), rel=1e-5, abs=1e-6)
