"""Where and how the positive teacher's rubric block keeps the student's action format.

For each candidate teacher context (where the "Behaviours that succeed here" block goes and
how it is worded), on N one-move 3x3 FrozenLake instances, with the main job's reply prefix
(experiments/configs/smollm2_cpu.py: "<answer>"), one forward per prompt gives the next-token
distribution after the reply prefix; the valid-action mass is its probability summed over the
four moves' first tokens (rised_jax.teach.action_mass). Reported per model and candidate:

  ratio          mean teacher mass / mean student mass (the student prompt: system prompt +
                 observation, no block); >= 0.9 is the bar for the shipped template
  teacher_mass, student_mass   the two means
  p_win          mean p(winning move's token), renormalised over the moves, teacher vs student

The block lists the positives a one-move win earns from the rule judge (valid syntax, progress,
efficiency) — the stock positives, not an answer. `shipped` is the template the positive
teacher renders by default (rised_jax.teach.positive), through the same functions as a run.

  python benchmarks/teacher_context.py --out runs/teacher_context.json [--instances 32]
      [--models smollm2-135m-instruct,tiny]

The tiny model is random (rised_jax.model.tiny, frozenlake words + rubric words): its figures
show what a template does to a model that has learned nothing, not what a trained one does.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from rised_jax import envs, warmstart
from rised_jax.model import from_pretrained, tiny
from rised_jax.rollout.chat import ChatFormat
from rised_jax.rubrics import Vocabulary
from rised_jax.teach import action_mass, positive
from rised_jax.types import Group, GroupTags, Task, Trajectory

ENV, DIFFICULTY = warmstart.ENV, warmstart.DIFFICULTY   # one-move 3x3 FrozenLake
REPLY_PREFIX = "<answer>"          # experiments/configs/smollm2_cpu.py's rollout.reply_prefix
STOCK_POSITIVES = ("valid_syntax", "makes_progress", "efficient")


def _block(behaviours, head="Behaviours that succeed here:"):
  return head + "\n" + "".join(f"- {b}\n" for b in behaviours).rstrip()


def _inline(behaviours, head):
  return f"{head} {'; '.join(b[0].lower() + b[1:] for b in behaviours)}."


# name -> (system prompt, observation, behaviours) -> (system text, user text)
Candidate = Callable[[str, str, list[str]], tuple[str, str]]
CANDIDATES: dict[str, Candidate] = {
    "user_after_observation": lambda s, o, b: (s, f"{o}\n\n{_block(b)}"),
    "system_before": lambda s, o, b: (f"{_block(b)}\n\n{s}", o),
    "user_before_observation": lambda s, o, b: (s, f"{_block(b)}\n\n{o}"),
    "system_after_inline": lambda s, o, b: (f"{s} {_inline(b, 'Behaviours that succeed here:')}", o),
    "system_before_inline": lambda s, o, b: (f"{_inline(b, 'Behaviours that succeed here:')} {s}", o),
    "system_before_tips": lambda s, o, b: (
        f"{_inline(b, 'Tips from earlier successful attempts:')} {s}", o),
    "user_before_inline": lambda s, o, b: (s, f"{_inline(b, 'Behaviours that succeed here:')}\n{o}"),
    "system_after (the first default)": lambda s, o, b: (f"{s}\n\n{_block(b)}", o),
}


def instances(count: int):
  """(system prompt, first observation, winning move) of `count` one-move instances, and the
  moves."""
  rows = [warmstart.instance(seed) for seed in range(count)]
  return [(s, o, wins[0]) for s, o, _, wins in rows], envs.make(ENV, **DIFFICULTY).action_space()


def shipped_prompts(chat: ChatFormat, vocab: Vocabulary, system_prompt: str, observation: str):
  """The teacher prompt the positive teacher builds in a run (one group, one successful
  rollout carrying the stock positives)."""
  task = Task(ENV, 0, DIFFICULTY)
  group = Group(task, [Trajectory(task, [], [], [], 0, [], success=True, reward=1.0)],
                system_prompt=system_prompt, first_observation=observation)
  tags = GroupTags(vocab.multi_hot(STOCK_POSITIVES)[None], np.zeros(1, bool))
  prefix, _ = positive.positive_teacher_prefix(system_prompt, 0, [group], [tags], vocab)
  return positive.teacher_prompt_ids(chat, prefix, observation)


def measure(model, tokenizer, count: int, progress=None) -> dict[str, dict[str, float]]:
  """Per prompt kind (student, shipped, each candidate): mean valid-action mass, mean
  renormalised p(winning move), mean prompt length and the mass ratio to the student's.
  `progress(name, row)` is called after each kind (the student's first)."""
  vocab = Vocabulary.load("agentic_v1")
  behaviours = [vocab.entry(t).description for t in STOCK_POSITIVES]
  chat = ChatFormat(tokenizer, REPLY_PREFIX)
  rows, moves = instances(count)
  valid = action_mass.first_action_token_ids(tokenizer, moves, REPLY_PREFIX)
  move_ids = {m: int(action_mass.first_action_token_ids(tokenizer, [m], REPLY_PREFIX)[0])
              for m in moves}
  kinds = {"student": lambda s, o: chat.prompt_ids(s, o),
           "shipped": lambda s, o: shipped_prompts(chat, vocab, s, o)}
  for name, candidate in CANDIDATES.items():
    kinds[name] = lambda s, o, candidate=candidate: chat.prompt_ids(*candidate(s, o, behaviours))
  results = {}
  for name, build in kinds.items():
    ids = [build(s, o) for s, o, _ in rows]
    logits = action_mass.next_token_logits(model, ids)
    mass = action_mass.valid_action_mass(logits, valid)
    win = np.asarray([action_mass.valid_action_mass(logits[r], [move_ids[w]])
                      for r, (_, _, w) in enumerate(rows)])
    results[name] = {"mass": float(mass.mean()), "p_win": float((win / mass).mean()),
                     "tokens": float(np.mean([len(i) for i in ids]))}
    results[name]["ratio"] = results[name]["mass"] / results["student"]["mass"]
    if progress is not None:
      progress(name, results[name])
  return results


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", required=True)
  parser.add_argument("--instances", type=int, default=32)
  parser.add_argument("--models", default="smollm2-135m-instruct,tiny")
  args = parser.parse_args()
  out = Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  report = {"env": ENV, "difficulty": DIFFICULTY, "reply_prefix": REPLY_PREFIX,
            "instances": args.instances, "stock_positives": list(STOCK_POSITIVES), "models": {}}
  for name in args.models.split(","):
    if name == "tiny":
      with tempfile.TemporaryDirectory() as workdir:
        model, tokenizer = from_pretrained(tiny.write(Path(workdir) / "model", [ENV]))
    else:
      model, tokenizer = from_pretrained(name, "float32")
    report["models"][name] = {}

    def progress(candidate, row, name=name):
      report["models"][name][candidate] = row
      out.write_text(json.dumps(report, indent=2))   # a partial report survives an interrupt
      print(f"{name:24s} {candidate:28s} ratio {row['ratio']:.3f}  mass {row['mass']:.3f}  "
            f"p_win {row['p_win']:.3f}  tokens {row['tokens']:.0f}", flush=True)

    measure(model, tokenizer, args.instances, progress)


if __name__ == "__main__":
  main()
