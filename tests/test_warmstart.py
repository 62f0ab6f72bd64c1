"""The warm-start (rised_jax.warmstart): its copy-task data (each prompt is the positive
teacher's prompt with "Opens with X" among its behaviours, the loss covers exactly the reply
X</answer> and the end of turn, no training instance is a held-out one), and its pre-check
after a short training."""
import collections

import numpy as np
import pytest

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
  assert not {data.training_instance()[1][2] for _ in range(100)} & data.held_out_keys


@pytest.mark.slow
def test_warm_start_makes_the_teacher_line_raise_the_winning_move():
  """The pre-check the mechanism suite needs: after 300 steps, on held-out instances, the
  teacher prompt naming the winning move gives it >= 0.3 more probability than the student
  prompt (measured: 0.84 after 450 steps, seed 0; the loss falls between steps 150 and 250)."""
  model, tokenizer, data, losses = warmstart.train(steps=300, seed=0, batch_size=16,
                                                   learning_rate=3e-3, log_every=0)
  assert np.isfinite(losses).all()
  check = warmstart.precheck(model, tokenizer, data)
  assert check["teacher_minus_student"] >= 0.3, check
  assert check["teacher_argmax_wins"] >= 0.75 * check["held_out"], check


def test_doors_rows_teach_the_line_the_hint_and_the_prior():
  """--game doors: teacher rows name a non-trap door and target it; guidance rows (trap game
  only) carry "Avoid: Opens with black." and target another door; prior rows are the student
  prompt and target the system prompt's example door about half the time (else any door)."""
  tokenizer = tiny.build_tokenizer(warmstart.tokenizer_words("doors"))
  unk = tokenizer.hf_tokenizer.convert_tokens_to_ids("<|unk|>")
  data = warmstart.Data(tokenizer, seed=1, held_out=4, game="doors", avoid_share=0.5,
                        prior_share=0.4)
  kinds = collections.Counter()
  example_hits = 0
  for _ in range(400):
    prompt, target = data.row()
    assert unk not in prompt + target
    text = tokenizer.decode(prompt)
    door = tokenizer.decode(target[:1])
    assert door in ("red", "blue", "green", "white", "black")
    if "Behaviours that succeed here" in text:
      kinds["teacher"] += 1
      assert door != "black" and f"Opens with {door} Doors" in text
    elif "Avoid : Opens with black ." in text:
      kinds["avoid"] += 1
      assert door != "black" and "black" in text.split("Doors :")[1]
    else:
      kinds["prior"] += 1
      example = text.split("Example : < answer >")[1].split()[0]
      example_hits += door == example
  assert kinds["prior"] == pytest.approx(0.4 * 400, abs=40)
  assert kinds["avoid"] == pytest.approx(0.6 * 0.5 * 0.5 * 400, abs=30)   # trap game: half
  # The example's door: 1/2 + 1/2 * (1/4 or 1/5) of prior rows.
  assert 0.55 < example_hits / kinds["prior"] < 0.72
  with pytest.raises(ValueError, match="prior_share=1.0; expected a fraction in \\[0, 1\\)"):
    warmstart.Data(tokenizer, seed=1, held_out=4, game="doors", prior_share=1.0)
