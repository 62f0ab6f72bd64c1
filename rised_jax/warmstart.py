"""A supervised warm-start that teaches the tiny model to read a rubric line.

The tiny model (rised_jax.model.tiny) starts random, so a teacher context means nothing to it.
This stage trains it for a few hundred steps on a synthetic copy task built from the positive
teacher's own template (rised_jax.teach.positive): the prompt is the teacher prompt of a
one-move FrozenLake instance whose behaviour list ends with "Opens with X" (X a move drawn at
random, independent of the board, after a random subset of the vocabulary's positive
descriptions); the target is the reply `X</answer>` after the reply prefix
"<answer>", end of turn included. Because X is independent of the board in training, the only
way to fit the data is to copy the move the rubric line names.

It can learn: copy a move named by a rubric line in the teacher block; with `--game doors`,
follow a general rubric line ("Opens the door the note names") by copying the door the
observation's note names, and keep its prior where the line is absent (3000 steps at batch 32;
400 steps at batch 16 left it at teacher p(win) 0.24, 1500 at batch 16 at 0.63, 1500 at batch
32 at 0.996 on one machine and 0.676 on another: see the suite's model below). It is not
taught (and the measurement in issue 20 found that 200–300 steps do not teach) content matching
(find the colour a rubric line names among the observation's signs) or rules that interact
with the observation beyond that copy: the warm-started model is a reader of explicit hints,
not a planner.

Pre-check (`precheck`, printed at the end and written to warmstart.json): on held-out
instances (instance keys disjoint from the training ones), the probability of the winning
move's token after the teacher prompt whose line names it (`--game doors`: lists the rule),
minus that after the student prompt (no teacher block); the mechanism suite needs it >= 0.3
(`rised_jax.mechanisms` also needs the teacher's own p(win) >= 0.9).

  python -m rised_jax.warmstart OUT_DIR [--steps 300] [--seed 0] [--batch 16] [--lr 3e-3]
      [--game frozenlake|doors] [--avoid-share 0.0] [--prior-share 0.0] [--example-rate 0.5]

`--game doors` uses the prompts of the RISED mechanism suite's two Doors games
(rised_jax.envs.doors; experiments/configs/mechanisms_rised.py) and its vocabulary. Its
teacher rows list the vocabulary's other positives and, in RULE_SHARE of them, the rule: with
it the target is the note's door (never the trap), without it the prior's. `--avoid-share`
turns that share of the trap game's rows into guidance rows (student prompt + "Avoid: Opens
with black." -> a non-trap door), `--prior-share` that share of all rows into prior rows
(student prompt -> the system prompt's example door at `--example-rate`, else a random door):
the suite's sparse reward and its recurring failure, by construction. The suite's model:
`--game doors --steps 3000 --batch 32 --avoid-share 0.25 --prior-share 0.3 --example-rate 0.9`.
The float path of 1500 steps differs between machine kinds: on an Intel Xeon (AVX-512;
2026-12-04) they reached held-out teacher p(win) 0.996 against the student's 0.080 (final loss
0.058), on an AMD EPYC (AVX2; 2026-12-05) only 0.676 (loss 0.079), half-way through the
transition; 3000 steps there reach 0.997 (loss 0.054; 2 min 37 s on 2 cores). The rate decays
to 0 over the last fifth of the steps (`learning_rates`): at a constant rate a late loss spike
could leave the saved model outside the transition (docs/rised.md, "Across warm starts").
With 8 doors instead of 4 the copy-the-named-door variant of issue 20's first suite sat at
the no-copying loss for 550 steps: the model told only which half of the doors a line named.

Measured (seed 0, defaults, 2-core CPU, a few minutes): 300 steps give a held-out teacher
p(win) of 0.992 against the student's 0.069 (difference 0.92, 32 / 32 argmax right).

OUT_DIR is an HF checkpoint (`from_pretrained(OUT_DIR)`, `--config.model.source=OUT_DIR`).
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rised_jax import envs
from rised_jax.model import from_config, save_pretrained, tiny
from rised_jax.envs import doors, parsing
from rised_jax.envs.doors import TRAP
from rised_jax.rollout.chat import ChatFormat, join_system_text
from rised_jax.rubrics import Vocabulary
from rised_jax.teach import guidance, positive
from rised_jax.teach.action_mass import next_token_logits

ENV = "frozenlake"
# The share of the steps over which the learning rate decays linearly to 0 (`learning_rates`).
DECAY_SHARE = 0.2
DIFFICULTY = dict(size=3, holes=1, min_distance=1, max_turns=1)
# --game: the (environment, knobs) variants whose prompts the copy task uses, and the
# vocabulary whose positive descriptions fill the teacher block besides the named move.
# "doors" is the mechanism suite's (experiments/configs/mechanisms_rised.py): both its games.
GAMES = {
    "frozenlake": (((ENV, DIFFICULTY),), "agentic_v1"),
    "doors": (tuple((doors.PATH, knobs) for knobs in doors.SUITE_GAMES.values()),
              "rised_jax.envs.doors:VOCABULARY"),
}
# --game doors: the share of teacher rows whose block lists the game's rule (doors.RULE, target
# the note's door); the others list only its other positives and keep the prior's target, so
# the model follows the rule line itself, not the block's header (the generic-teacher control
# then gets the prior).
RULE_SHARE = 0.5
REPLY_PREFIX = "<answer>"
EXAMPLE_RATE = 0.5   # default share of a prior row's targets that are the example's move
LINE = "Opens with {move}"
HELD_OUT_SEED_OFFSET = 1_000_000


def instance(seed: int, env_name: str = ENV, difficulty=DIFFICULTY):
  """(system prompt, first observation, instance key, winning moves) of one instance."""
  env = envs.make(env_name, **difficulty)
  observation = env.reset(seed)
  probe = envs.make(env_name, **difficulty)   # reset before each move: one fresh game a move
  wins = []
  for move in env.action_space():
    probe.reset(seed)
    if probe.step(envs.format_answer(move))[3]["success"]:
      wins.append(move)
  return (env.system_prompt, observation, envs.instance_key(env_name, seed, difficulty), wins)


def guidance_hint(move: str) -> str:
  """The guidance hint (its packaged template) that names "Opens with MOVE"."""
  template = positive.load_template(None, guidance.DEFAULT_TEMPLATE, package="rised_jax.teach")
  return template.render(behaviours=[LINE.format(move=move)]).strip()


def teacher_text(system_prompt: str, behaviours: Sequence[str]) -> str:
  """The positive teacher's prefix (its packaged template) listing `behaviours`."""
  template = positive.load_template(None, positive.DEFAULT_TEMPLATE, package="rised_jax.teach")
  return template.render(system_prompt=system_prompt, behaviours=list(behaviours)).rstrip()


def tokenizer_words(game: str = "frozenlake") -> list[str]:
  """The tiny tokenizer's words for `game` plus those of the rubric line and of the game's
  vocabulary, its variants' prompts and moves (appended: the ids of "frozenlake" stay put)."""
  variants, vocabulary = GAMES[game]
  words = tiny.tokenizer_words([ENV] if game == "frozenlake" else [])
  texts = [LINE.format(move="")]
  if game != "frozenlake":   # the built-in game's words are all in the tiny tokenizer already
    texts += [e.description for e in Vocabulary.load(vocabulary).entries]
  for name, knobs in variants if game != "frozenlake" else ():
    env = envs.make(name, **knobs)
    texts += [env.system_prompt, *env.action_space()]
    texts += [env.reset(seed) for seed in range(64)]
  for text in texts:
    for word in tiny.WORD.findall(text):   # one id per word, however often a text repeats it
      if word not in words:
        words.append(word)
  return words


class Data:
  """Training rows drawn from instances of `game` (a key of GAMES) whose keys are not held out.

  With `avoid_share` > 0, that share of the rows drawn from a variant with a trap move (the
  suite's Doors with `trap=True`) is a guidance row instead: the student prompt with the hint
  "Avoid: Opens with TRAP." (the packaged guidance template), target a non-trap move drawn
  uniformly, so the model learns that the hint rules the named move out.
  """

  def __init__(self, tokenizer, seed: int, held_out: int = 32, game: str = "frozenlake",
               avoid_share: float = 0.0, prior_share: float = 0.0,
               example_rate: float = EXAMPLE_RATE):
    if game not in GAMES:
      raise ValueError(f"warm-start: game {game!r}; expected one of {sorted(GAMES)}")
    for name, share in (("avoid_share", avoid_share), ("prior_share", prior_share)):
      if not 0.0 <= share < 1.0:
        raise ValueError(f"warm-start: {name}={share}; expected a fraction in [0, 1)")
    if not 0.0 <= example_rate <= 1.0:
      raise ValueError(f"warm-start: example_rate={example_rate}; expected a fraction in [0, 1]")
    self.example_rate = example_rate
    self.tokenizer = tokenizer
    self.chat = ChatFormat(tokenizer, REPLY_PREFIX)
    self.rng = random.Random(seed)
    self.variants, vocabulary = GAMES[game]
    self.avoid_share = avoid_share
    self.prior_share = prior_share
    # The teacher block's other lines: positives that name no move (in the suite, a won
    # rollout's other positive is its syntax tag; another door's line would be false).
    self.rule = doors.RULE if game == "doors" else None
    self.descriptions = [e.description for e in Vocabulary.load(vocabulary).entries
                         if e.positive and e.description != self.rule]
    self.held_out = [(v, *instance(HELD_OUT_SEED_OFFSET + s, *self.variants[v]))
                     for s in range(held_out) for v in [s % len(self.variants)]]
    self.held_out_keys = {key for _, _, _, key, _ in self.held_out}
    self.end = tokenizer.encode("</answer>") + [tokenizer.eos_token_id]
    self.hint = guidance_hint(TRAP)

  def moves(self, variant: int) -> list[str]:
    name, knobs = self.variants[variant]
    return envs.make(name, **knobs).action_space()

  def training_instance(self):
    """A random variant and instance (`instance`'s tuple) whose key is not held out."""
    variant = self.rng.randrange(len(self.variants)) if len(self.variants) > 1 else 0
    while True:
      drawn = instance(self.rng.randrange(HELD_OUT_SEED_OFFSET), *self.variants[variant])
      if drawn[2] not in self.held_out_keys:
        return variant, drawn

  def prior_move(self, system_prompt: str, moves: Sequence[str]) -> str:
    """The prior's move: the system prompt's example with probability `example_rate`, else
    any move."""
    example = parsing.extract_answer(system_prompt)
    return example if self.rng.random() < self.example_rate else self.rng.choice(moves)

  def row(self) -> tuple[list[int], list[int]]:
    """(prompt ids, target ids) of one random training instance and move."""
    variant, (system_prompt, observation, _, wins) = self.training_instance()
    moves = self.moves(variant)
    if self.prior_share and self.rng.random() < self.prior_share:
      return (self.chat.prompt_ids(system_prompt, observation),
              self.tokenizer.encode(self.prior_move(system_prompt, moves)) + self.end)
    if TRAP in moves and self.avoid_share and self.rng.random() < self.avoid_share:
      move = self.rng.choice([m for m in moves if m != TRAP])
      prompt = self.chat.prompt_ids(join_system_text(system_prompt, self.hint), observation)
      return prompt, self.tokenizer.encode(move) + self.end
    others = self.rng.sample(self.descriptions, self.rng.randrange(len(self.descriptions) + 1))
    if self.rule is None:   # copy the move the line names (independent of the board)
      move = self.rng.choice([m for m in moves if m != TRAP])
      behaviours = [*others, LINE.format(move=move)]
    elif self.rng.random() < RULE_SHARE:   # follow the rule: the winning move
      move, behaviours = wins[0], [*others, self.rule]
    else:   # no rule listed: the prior's move
      move, behaviours = self.prior_move(system_prompt, moves), others
    prompt = positive.teacher_prompt_ids(self.chat, teacher_text(system_prompt, behaviours),
                                         observation)
    return prompt, self.tokenizer.encode(move) + self.end

  def batch(self, size: int) -> dict[str, np.ndarray]:
    return pack([self.row() for _ in range(size)])


def _loss(params, graphdef, rest, batch):
  model = nnx.merge(graphdef, params, rest)
  logits = model(batch["ids"], batch["mask"])[:, :-1]
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, batch["ids"][:, 1:, None], -1)[..., 0]
  mask = batch["loss_mask"][:, :-1]
  return (nll * mask).sum() / mask.sum()


def pack(rows: Sequence[tuple[list[int], list[int]]], multiple: int = 1
         ) -> dict[str, np.ndarray]:
  """(prompt, target) token rows as the supervised batch `_loss` reads: ids and attention
  mask right-padded to a multiple of `multiple`, the loss on the positions predicting the
  target."""
  width = -(-max(len(p) + len(t) for p, t in rows) // multiple) * multiple
  ids = np.zeros((len(rows), width), np.int32)
  mask = np.zeros_like(ids)
  loss_mask = np.zeros(ids.shape, np.float32)
  for r, (prompt, target) in enumerate(rows):
    full = prompt + target
    ids[r, :len(full)], mask[r, :len(full)] = full, 1
    loss_mask[r, len(prompt) - 1:len(full) - 1] = 1.0   # positions that predict the target
  return {"ids": ids, "mask": mask, "loss_mask": loss_mask}


def learning_rates(steps: int, peak: float) -> optax.Schedule:
  """`peak` for the first 1 - DECAY_SHARE of the steps, then linearly down to 0 at `steps`.

  At a constant rate Adam's loss spiked 7x three steps from the end of a 3000-step doors
  warm-start (seed 0, Intel Xeon, 2026-12-06) and the saved model had lost the transition
  (teacher p(win) 0.29 against 0.996 for seed 1); the decay lets the last steps settle
  instead of ending wherever the last spike left them (docs/rised.md, "Across warm starts")."""
  stable = steps - int(DECAY_SHARE * steps)
  return optax.join_schedules(
      [optax.constant_schedule(peak), optax.linear_schedule(peak, 0.0, steps - stable)],
      [stable])


def fit(model, batch: Callable[[], dict[str, np.ndarray]], steps: int, learning_rate: float,
        log_every: int, what: str = "warm-start"):
  """(model, loss history) after `steps` Adam steps on the masked next-token NLL of
  `batch()`'s target tokens (`_loss`), the rate following `learning_rates`. A non-finite
  loss stops it before anything is saved."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  optimizer = optax.adam(learning_rates(steps, learning_rate))
  opt_state = optimizer.init(params)

  @jax.jit
  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(_loss)(params, graphdef, rest, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  losses = []
  for i in range(steps):
    params, opt_state, loss = step(params, opt_state, batch())
    loss = float(loss)
    if not np.isfinite(loss):
      raise FloatingPointError(f"{what} step {i}: loss {loss}; nothing saved")
    losses.append(loss)
    if log_every and (i + 1) % log_every == 0:
      print(f"step {i + 1}: loss {np.mean(losses[-log_every:]):.4f}", flush=True)
  return nnx.merge(graphdef, params, rest), losses


def train(steps: int, seed: int, batch_size: int, learning_rate: float, log_every: int = 50,
          game: str = "frozenlake", avoid_share: float = 0.0, prior_share: float = 0.0,
          example_rate: float = EXAMPLE_RATE):
  """(model, tokenizer, data, loss history) after `steps` supervised steps on `game`."""
  tokenizer = tiny.build_tokenizer(tokenizer_words(game))
  model = from_config(tiny.tiny_config(tokenizer.vocab_size), seed)
  data = Data(tokenizer, seed, game=game, avoid_share=avoid_share, prior_share=prior_share,
              example_rate=example_rate)
  model, losses = fit(model, lambda: data.batch(batch_size), steps, learning_rate, log_every)
  return model, tokenizer, data, losses


def precheck(model, tokenizer, data: Data) -> dict[str, float]:
  """Mean p(winning move) after the teacher prompt naming it and after the student prompt,
  over the held-out instances, and their difference."""
  teacher, student, wins = [], [], []
  for _, system_prompt, observation, _, moves in data.held_out:
    win = moves[0]
    line = LINE.format(move=win) if data.rule is None else data.rule
    teacher.append(positive.teacher_prompt_ids(
        data.chat, teacher_text(system_prompt, [*data.descriptions[:2], line]), observation))
    student.append(data.chat.prompt_ids(system_prompt, observation))
    wins.append(tokenizer.encode(win)[0])
  logits = next_token_logits(model, teacher + student)
  probs = np.asarray(jax.nn.softmax(jnp.asarray(logits, jnp.float32)))
  n = len(wins)
  p_teacher = probs[np.arange(n), wins]
  p_student = probs[n + np.arange(n), wins]
  return {"teacher_p_win": float(p_teacher.mean()), "student_p_win": float(p_student.mean()),
          "teacher_minus_student": float((p_teacher - p_student).mean()),
          "teacher_argmax_wins": int((probs[:n].argmax(-1) == np.asarray(wins)).sum()),
          "held_out": n}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("out_dir")
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--lr", type=float, default=3e-3)
  parser.add_argument("--game", choices=sorted(GAMES), default="frozenlake",
                      help="whose prompts the copy task uses (doors: the mechanism suite's)")
  parser.add_argument("--avoid-share", type=float, default=0.0,
                      help="share of a trap game's rows that teach the guidance hint")
  parser.add_argument("--prior-share", type=float, default=0.0,
                      help="share of rows that give the student prompt a prior (the system "
                      "prompt's example move at --example-rate, else a random move)")
  parser.add_argument("--example-rate", type=float, default=EXAMPLE_RATE,
                      help="share of the prior's moves that are the system prompt's example "
                      "(the rest uniform over the moves)")
  args = parser.parse_args()
  model, tokenizer, data, losses = train(args.steps, args.seed, args.batch, args.lr,
                                         game=args.game, avoid_share=args.avoid_share,
                                         prior_share=args.prior_share,
                                         example_rate=args.example_rate)
  check = precheck(model, tokenizer, data)
  out = save_pretrained(model, tokenizer, args.out_dir)
  report = {"game": args.game, "avoid_share": args.avoid_share, "prior_share": args.prior_share,
            "example_rate": args.example_rate,
            "steps": args.steps, "seed": args.seed, "batch": args.batch, "lr": args.lr,
            "final_loss": float(np.mean(losses[-20:])), "precheck": check}
  (Path(out) / "warmstart.json").write_text(json.dumps(report, indent=2))
  print(json.dumps(report, indent=2))


if __name__ == "__main__":
  main()
