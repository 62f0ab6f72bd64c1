"""Shared-prefix groups: the packed layout's array functions (hand-worked), the batch that
carries each group's prefix once, and the train step on it against the full-logits reference
of the row layout (the decoder's packed forward against transformers is in
tests/model/test_parity.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rised_jax import parallel
from rised_jax.learn import batching, flops, train_step
from rised_jax.model import shared_prefix
from tests.helpers import step_fixtures
from tests.learn.test_train_step import _reference_loss, assert_fused_loss_equals_reference

GROUP = 4


def test_pack_positions_segments_unpack_by_hand():
  # One group of two rows: prefix [pad, 7, 8] (P = 3), responses [5, 6] and [9, pad] (R = 2).
  prefix = jnp.asarray([[0, 7, 8]])
  prefix_mask = jnp.asarray([[0, 1, 1]])
  responses = jnp.asarray([[5, 6], [9, 0]])
  response_mask = jnp.asarray([[1, 1], [1, 0]])
  np.testing.assert_array_equal(shared_prefix.pack(prefix, responses), [[0, 7, 8, 5, 6, 9, 0]])
  # In its own row [pad, 7, 8, 9, pad] the 9 is at position 2, as the 5 is in [pad, 7, 8, 5, 6].
  np.testing.assert_array_equal(shared_prefix.positions(prefix_mask, response_mask),
                                [[0, 0, 1, 2, 3, 2, 2]])
  np.testing.assert_array_equal(shared_prefix.segments(3, 2, 2), [0, 0, 0, 1, 1, 2, 2])
  hidden = jnp.arange(7.0)[None, :, None] * jnp.asarray([1.0, 10.0])   # [1, 7, 2]
  rows = np.asarray(shared_prefix.unpack(hidden, 3, 2))
  np.testing.assert_array_equal(rows[..., 0], [[0, 1, 2, 3, 4], [0, 1, 2, 5, 6]])
  np.testing.assert_array_equal(rows[..., 1], 10 * rows[..., 0])


def grouped_rows(index: int) -> list[batching.Row]:
  return step_fixtures.grouped_rows(index, GROUP, 2 * GROUP)


def grouped_batch(index: int) -> dict[str, np.ndarray]:
  return step_fixtures.grouped_batch(index, GROUP, 2 * GROUP)


def test_assemble_adds_each_groups_prefix_once():
  batch = grouped_batch(0)
  width = batch["prefix_ids"].shape[1]
  assert batch["prefix_ids"].shape == (2, width) and width < batch["input_ids"].shape[1]
  for g, row in enumerate(grouped_rows(0)[::GROUP]):
    n = len(row.prefix_ids)
    np.testing.assert_array_equal(batch["prefix_ids"][g], [0] * (width - n) + row.prefix_ids)
    np.testing.assert_array_equal(batch["prefix_mask"][g], [0] * (width - n) + [1] * n)
  # Padding rows (num_rows beyond the rows given) form groups of their own.
  padded = batching.assemble(grouped_rows(0), pad_id=0, num_rows=3 * GROUP, prefix_multiple=4,
                             shared_prefix=True, group_size=GROUP)
  assert padded["prefix_ids"].shape[0] == 3 and padded["prefix_mask"][2].sum() == 1
  # A group whose rows differ in prefix: the batch runs row by row.
  rows = grouped_rows(0)
  rows[5].prefix_ids = rows[5].prefix_ids + [3]
  assert "prefix_ids" not in batching.assemble(rows, pad_id=0, shared_prefix=True,
                                               group_size=GROUP)
  with pytest.raises(ValueError, match="group_size=3: expected an integer >= 1 that divides"):
    batching.assemble(grouped_rows(0), pad_id=0, shared_prefix=True, group_size=3)


def test_a_length_bucket_widens_the_responses_of_shared_prefix_batches_by_hand():
  rows = [batching.Row(prefix_ids=[5, 6, 7], response_ids=response,
                       response_loss_mask=[1] * len(response),
                       response_behaviour_logprobs=[0.0] * len(response), advantage=1.0)
          for response in ([8], [9, 10])]
  common = dict(pad_id=0, prefix_multiple=4, response_multiple=2, length_buckets=[10],
                group_size=2)
  shared = batching.assemble(rows, shared_prefix=True, **common)
  np.testing.assert_array_equal(shared["input_ids"], [[0, 5, 6, 7, 8, 0, 0, 0, 0, 0],
                                                      [0, 5, 6, 7, 9, 10, 0, 0, 0, 0]])
  np.testing.assert_array_equal(shared["prefix_ids"], [[0, 5, 6, 7]])
  np.testing.assert_array_equal(shared["prefix_mask"], [[0, 1, 1, 1]])
  rows_layout = batching.assemble(rows, **common)
  np.testing.assert_array_equal(rows_layout["input_ids"], [[0, 0, 0, 0, 0, 5, 6, 7, 8, 0],
                                                           [0, 0, 0, 0, 0, 5, 6, 7, 9, 10]])
  assert "prefix_ids" not in rows_layout


@pytest.mark.parametrize("layout", ["unrolled", "scanned-remat"])
def test_step_loss_and_grads_equal_the_row_reference(layout):
  """The fused loss on the grouped batch, each prefix run once, against the full-logits
  reference on its rows (distillation rows included)."""
  scanned = layout == "scanned-remat"
  assert_fused_loss_equals_reference(step_fixtures.tiny_model(remat=scanned,
                                                              scan_layers=scanned),
                                     grouped_batch(0), step_fixtures.step_config(chunk=5))


def test_micro_batched_step_by_group_equals_the_reference_update():
  """The jitted step, two micro-batches of one group each: SGD moves the parameters by the
  learning rate times the reference's gradient of the whole batch."""
  sgd_rate = 0.5
  config = step_fixtures.step_config(micro_batches=2)
  model = step_fixtures.tiny_model(remat=True, scan_layers=True)
  graphdef, params0, rest = nnx.split(model, nnx.Param, ...)
  params0 = jax.tree.map(jnp.copy, params0)
  mesh = parallel.make_mesh(parallel.MeshShape(1, 1, 1), devices=jax.devices()[:1])
  trainable, state = train_step.create(model, optax.sgd(sgd_rate), config, mesh)
  batch = grouped_batch(1)
  state, metrics = trainable.step(state, trainable.put_batch(batch))
  rows_only = {k: jnp.asarray(v) for k, v in batch.items()
               if k not in train_step.SHARED_PREFIX_KEYS}
  ref_loss, ref_grads = jax.value_and_grad(
      lambda p: _reference_loss(nnx.merge(graphdef, p, rest), rows_only, config,
                                config.teacher_kl.beta))(params0)
  np.testing.assert_allclose(metrics["loss"], ref_loss, rtol=1e-5, atol=1e-6)
  for new, old, g in zip(jax.tree.leaves(state.params), jax.tree.leaves(params0),
                         jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(new, np.asarray(old) - sgd_rate * np.asarray(g), rtol=1e-5,
                               atol=1e-6)


def test_put_batch_refuses_a_prefix_that_is_not_the_rows():
  mesh = parallel.make_mesh(parallel.MeshShape(1, 1, 1), devices=jax.devices()[:1])
  trainable, _ = train_step.create(step_fixtures.tiny_model(), optax.sgd(0.1),
                                   step_fixtures.step_config(micro_batches=4), mesh)
  with pytest.raises(ValueError, match=r"global batch of 2 shared-prefix groups must be "
                                       r"divisible by .* micro_batches \(4\)"):
    trainable.put_batch(grouped_batch(0))
  trainable, _ = train_step.create(step_fixtures.tiny_model(), optax.sgd(0.1),
                                   step_fixtures.step_config(), mesh)
  batch = grouped_batch(0)
  batch["prefix_ids"][1, -1] += 1
  with pytest.raises(ValueError, match="prefix_ids is not the first .* columns of input_ids"):
    trainable.put_batch(batch)


def test_flops_count_the_packed_layers_by_hand():
  cfg = step_fixtures.tiny_model().cfg
  batch = grouped_batch(0)   # 2 groups of 4 rows
  rows, seq_len = batch["input_ids"].shape
  width = batch["prefix_ids"].shape[1]
  response = seq_len - width
  packed = width + GROUP * response
  # Each group: its prefix sees itself, each response the prefix and itself, as in its row.
  pairs = width**2 + GROUP * response * (width + response)
  assert flops.student_layout_of(batch) == (2, packed, pairs)
  assert flops.student_layout_of({"input_ids": batch["input_ids"]}) == (rows, seq_len,
                                                                       seq_len**2)
  n = flops.nonembedding_params(cfg)
  attention = 4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim
  head = 2.0 * cfg.hidden_size * cfg.vocab_size * rows * (seq_len - 1)
  student = 2.0 * n * 2 * packed + attention * 2 * pairs + head
  teacher = 2.0 * n * rows * seq_len + attention * rows * seq_len**2 + head
  # Student forward + backward and one reference forward over the packed layout, one teacher
  # forward over the rows.
  got = flops.train_step_flops(cfg, rows, seq_len, teacher_forwards=1,
                               student_layout=(2, packed, pairs), reference_forwards=1)
  np.testing.assert_allclose(got["total"], 4 * student + teacher, rtol=1e-12)
  # The teacher-skip share counts micro-batches of whole groups: group 1 alone reads it.
  batch["distill_mask"][:GROUP] = 0
  assert batch["distill_mask"][GROUP:].any()
  assert flops.batch_forwards(batch, ref_kl=False, micro_batches=2) == 0.5
