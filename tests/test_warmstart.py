"""The warm-start (rised_jax.warmstart): its copy-task data (each prompt is the positive
teacher's prompt with "Opens with X" among its behaviours, the loss covers exactly the reply
X</answer> and the end of turn, no training instance is a held-out one), and its pre-check
after a short training."""
import collections

import numpy as np
import pytest

from rised_jax import warmstart
from rised_jax.model import from_config, tiny


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


def test_learning_rate_holds_then_decays_to_zero_over_the_last_fifth():
  rates = warmstart.learning_rates(10, 3e-3)
  expected = [3e-3] * 9 + [1.5e-3, 0.0]   # steps 0-8 at the peak, then halfway, then 0
  np.testing.assert_allclose([float(rates(i)) for i in range(11)], expected, atol=1e-12)


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


def test_doors_rows_teach_the_rule_the_hint_and_the_prior():
  """--game doors: teacher rows that list the rule ("Opens the door the note names") target
  the door the note names; teacher rows without it, and prior rows (the student prompt),
  target the system prompt's example door about half the time (else any door); guidance rows
  (trap game only) carry "Avoid: Opens with black." and target another door."""
  tokenizer = tiny.build_tokenizer(warmstart.tokenizer_words("doors"))
  unk = tokenizer.hf_tokenizer.convert_tokens_to_ids("<|unk|>")
  data = warmstart.Data(tokenizer, seed=1, held_out=4, game="doors", avoid_share=0.5,
                        prior_share=0.4)
  kinds = collections.Counter()
  example_hits = collections.Counter()
  for _ in range(600):
    prompt, target = data.row()
    assert unk not in prompt + target
    text = tokenizer.decode(prompt)
    door = tokenizer.decode(target[:1])
    assert door in ("red", "blue", "green", "white", "black")
    example = text.split("Example : < answer >")[1].split()[0]
    if "Opens the door the note names" in text:
      kinds["rule"] += 1
      assert "Behaviours that succeed here" in text
      named = text.split("behind the")[1].split()[2]   # "... behind the SIZE SHAPE DOOR door"
      assert door == named != "black"
    elif "Behaviours that succeed here" in text:
      kinds["no rule"] += 1
      example_hits["no rule"] += door == example
    elif "Avoid : Opens with black ." in text:
      kinds["avoid"] += 1
      assert door != "black" and "black" in text.split("Doors :")[1]
    else:
      kinds["prior"] += 1
      example_hits["prior"] += door == example
  assert kinds["prior"] == pytest.approx(0.4 * 600, abs=50)
  assert kinds["avoid"] == pytest.approx(0.6 * 0.5 * 0.5 * 600, abs=40)   # trap game: half
  teacher = 600 - kinds["prior"] - kinds["avoid"]
  assert kinds["rule"] == pytest.approx(warmstart.RULE_SHARE * teacher, abs=40)
  # The example's door: 1/2 + 1/2 * (1/4 or 1/5) of the rows that keep the prior.
  for kind in ("prior", "no rule"):
    assert 0.5 < example_hits[kind] / kinds[kind] < 0.77, (kind, example_hits, kinds)
  with pytest.raises(ValueError, match="prior_share=1.0; expected a fraction in \\[0, 1\\)"):
    warmstart.Data(tokenizer, seed=1, held_out=4, game="doors", prior_share=1.0)


def test_doors_tokenizer_has_one_id_per_word():
  """A word repeated within one text (the example's door in the system prompt) gets one id:
  every id is below the vocabulary size, so no embedding lookup runs past its end."""
  words = warmstart.tokenizer_words("doors")
  assert len(words) == len(set(words))
  tokenizer = tiny.build_tokenizer(words)
  data = warmstart.Data(tokenizer, seed=0, held_out=4, game="doors")
  assert max(max(p + t) for p, t in (data.row() for _ in range(200))) < tokenizer.vocab_size
  with pytest.raises(ValueError, match=r"words \['red'\] are listed more than once"):
    tiny.build_tokenizer(["red", "blue", "red"])


def test_example_rate_sets_how_often_the_prior_opens_the_example_door():
  """--example-rate: prior rows target the example's door with probability rate + (1 - rate)
  / doors (the uniform rest may pick it too); a rate outside [0, 1] is refused by name."""
  tokenizer = tiny.build_tokenizer(warmstart.tokenizer_words("doors"))
  data = warmstart.Data(tokenizer, seed=2, held_out=4, game="doors", prior_share=0.99,
                        example_rate=0.9)
  hits = total = 0
  for _ in range(800):
    prompt, target = data.row()
    text = tokenizer.decode(prompt)
    if "Behaviours that succeed here" in text or "Avoid :" in text:
      continue
    total += 1
    hits += tokenizer.decode(target[:1]) == text.split("Example : < answer >")[1].split()[0]
  # 0.9 + 0.1 / 4 (doors) or 0.9 + 0.1 / 5 (trapdoors), about 0.92: 3 sigma is about 0.03.
  assert total > 700 and 0.88 < hits / total < 0.96, (hits, total)
  with pytest.raises(ValueError, match=r"example_rate=1.5; expected a fraction in \[0, 1\]"):
    warmstart.Data(tokenizer, seed=2, held_out=4, game="doors", example_rate=1.5)


def test_fit_stops_at_the_first_non_finite_loss_before_returning():
  """An infinite learning rate makes step 0's update non-finite: step 0's loss is finite,
  step 1's is not, and `fit` raises there."""
  tokenizer = tiny.build_tokenizer(warmstart.tokenizer_words("doors"))
  data = warmstart.Data(tokenizer, 0, game="doors")
  model = from_config(tiny.tiny_config(tokenizer.vocab_size), 0)
  with pytest.raises(FloatingPointError, match=r"warm-start step 1: loss nan; nothing saved"):
    warmstart.fit(model, lambda: data.batch(4), 5, float("inf"), 0)


def test_fit_records_every_step_loss_in_order():
  """Three steps, three losses; the first is the untrained model's NLL of the first batch's
  target tokens, in numpy from its logits: the mean over the positions that predict them."""
  tokenizer = tiny.build_tokenizer(warmstart.tokenizer_words("doors"))
  data = warmstart.Data(tokenizer, 0, game="doors")
  batches = [data.batch(4) for _ in range(3)]
  model = from_config(tiny.tiny_config(tokenizer.vocab_size), 0)
  ids, mask = batches[0]["ids"], batches[0]["mask"]
  logits = np.asarray(model(ids, mask), np.float64)[:, :-1]
  logp = logits - logits.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  nll = -np.take_along_axis(logp, ids[:, 1:, None], -1)[..., 0]
  predicting = batches[0]["loss_mask"][:, :-1] > 0
  first = nll[predicting].mean()
  feed = iter(batches)
  _, losses = warmstart.fit(model, lambda: next(feed), 3, 1e-3, 0)
  assert len(losses) == 3 and losses[0] == pytest.approx(first, rel=1e-5)
