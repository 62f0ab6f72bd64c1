"""The warm-start's copy-task data (rised_jax.warmstart): each prompt is the positive teacher's
prompt with "Opens with X" among its behaviours, the loss covers exactly the reply X</answer>
and the end of turn, and no training instance is a held-out one."""
import collections

import numpy as np

from rised_jax import warmstart
from rised_jax.model import tiny


def test_copy_rows_name_their_target_and_keep_held_out_instances_apart():
  tokenizer = tiny.build_tokenizer(warmstart.tokenizer_words())
  unk = tokenizer.hf_tokenizer.convert_tokens_to_ids("<|unk|>")
  data = warmstart.Data(tokenizer, seed=0, held_out=8)
  batch = data.batch(32)
  named = collections.Counter()
  for ids, mask, loss_mask in zip(batch["ids"], batch["mask"], batch["loss_mask"]):
    ids = ids[mask > 0].tolist()
    assert unk not in ids
    predicted = [ids[i + 1] for i in np.flatnonzero(loss_mask)]   # what each position predicts
    prompt = ids[:len(ids) - len(predicted)]
    head = tokenizer.encode("<|im_start|>system\nBehaviours that succeed here:")
    assert prompt[:len(head)] == head
    tail = tokenizer.encode("<|im_start|>assistant\n<answer>")
    assert prompt[-len(tail):] == tail
    line = tokenizer.encode("- Opens with")
    starts = [i for i in range(len(prompt)) if prompt[i:i + len(line)] == line]
    assert len(starts) == 1
    move = tokenizer.decode([prompt[starts[0] + len(line)]])
    assert predicted == tokenizer.encode(f"{move}</answer>") + [tokenizer.eos_token_id]
    named[move] += 1
  assert set(named) == {"up", "down", "left", "right"}   # the named move varies
  assert len(data.held_out_keys) == 8
  assert not {data.training_instance()[2] for _ in range(100)} & data.held_out_keys
