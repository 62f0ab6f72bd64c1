"""A generated rubric task family that a warm-started tiny model can meet: CriPO's mechanism suite.

Each task shows a list of four distinct words from `POOL` and asks for words from it:

  "Answer with words from this list: plum cat red fish ."

Its rubric (weights exact; reward normaliser "positive", Z = 5):

  A  "Uses the word <first listed>"     +3   the rule to learn from the reward: read the list
  B  "Uses the word <second listed>"    +1
  C  "Uses the word please"             +1   constant, and outside every list
  P  "Uses more than three words"       -4   a pitfall: listing everything does not pay

so "<first> <second> please" scores 1. The warm-started student (`rised_jax.warmstart_cripo`)
is trained to answer one or two random words of the list and never "please", which is what
gives each branch something to act on:

- unexplored criteria: C is met by no rollout at first (the injection teacher, told "misses:
  Uses the word please", can raise it; GRPO's reward only once some rollout happens to say it,
  which the warm-started student does now and then: docs/cripo.md "Mechanism suite"), and A is
  unexplored in the groups where no rollout names the first word;
- suppressed criteria: an answer naming the second word but not the first scores 1/5 while
  first-word answers score 3/5 or more, so in groups where A is common B's rollouts carry
  negative advantage (Σ A_i over B's rollouts < 0): the counterfactual teacher can locate B's
  word in them and flip its token's advantage.

Trivial policies (exact, over a task set, `trivial_scores`): the best prompt-blind answer (one
fixed answer for every task) and the warm-started behaviour (uniform over the list) are stated
by the suite; the policy that reads the rule scores 1.

Tasks are distinct ordered lists, so every held-out task shows the model a list no training task
shows. `python -m rised_jax.rubric_tasks.word_choice OUT.jsonl [--tasks 400] [--seed 0]`
writes a set; the packaged file `data/word_choice.jsonl` is the default set (a test checks it
equals `generate()`).
"""
from __future__ import annotations

import argparse
import fractions
import itertools
import json
import os
import random
from typing import Sequence

import numpy as np

from rised_jax.rubric_tasks import tasks as tasks_lib

POOL = ("red", "blue", "green", "cat", "dog", "fish", "bird", "apple", "pear", "plum", "lime",
        "frog")
CONSTANT_WORD = "please"
LIST_LENGTH = 4
PROMPT = "Answer with words from this list: {words} ."
CRITERION = "Uses the word {word}"
PITFALL = "Uses more than three words"
WEIGHTS = {"first": 3, "second": 1, "constant": 1, "too-long": -4}
NORMALIZER = "positive"
DOMAIN = "words"
PATH = os.path.join(os.path.dirname(__file__), "data", "word_choice.jsonl")
NUM_TASKS = 400
SEED = 0


def criterion_text(word: str) -> str:
  return CRITERION.format(word=word)


def task_json(words: Sequence[str]) -> dict:
  """One task (the `rubric_tasks` JSONL format) for the ordered list `words`."""
  if len(words) != LIST_LENGTH or len(set(words)) != LIST_LENGTH or not set(words) <= set(POOL):
    raise ValueError(f"word_choice: {words!r} is not {LIST_LENGTH} distinct words of {POOL}")

  def word_criterion(cid: str, word: str) -> dict:
    return {"id": cid, "text": criterion_text(word), "weight": WEIGHTS[cid],
            "check": {"type": "keywords", "all_of": [[word]]}}

  return {"id": "-".join(words), "domain": DOMAIN, "prompt": PROMPT.format(words=" ".join(words)),
          "criteria": [word_criterion("first", words[0]), word_criterion("second", words[1]),
                       word_criterion("constant", CONSTANT_WORD),
                       {"id": "too-long", "text": PITFALL, "weight": WEIGHTS["too-long"],
                        "check": {"type": "words", "min": 4}}],
          "reference": f"{words[0]} {words[1]} {CONSTANT_WORD}"}


def generate(num_tasks: int = NUM_TASKS, seed: int = SEED) -> list[dict]:
  """`num_tasks` distinct ordered lists drawn at random (seeded) from the POOL's permutations."""
  lists = list(itertools.permutations(POOL, LIST_LENGTH))
  if not 1 <= num_tasks <= len(lists):
    raise ValueError(f"word_choice: num_tasks={num_tasks}; expected 1..{len(lists)}")
  return [task_json(words) for words in random.Random(seed).sample(lists, num_tasks)]


def listed_words(task: tasks_lib.RubricTask) -> list[str]:
  """The list a word_choice task shows, in order."""
  prefix, suffix = PROMPT.split("{words}")
  if not (task.prompt.startswith(prefix) and task.prompt.endswith(suffix)):
    raise ValueError(f"rubric task {task.id!r} is not a word_choice task: {task.prompt!r}")
  return task.prompt[len(prefix):len(task.prompt) - len(suffix)].split()


def score(task: tasks_lib.RubricTask, answer: str) -> fractions.Fraction:
  """The task's weighted reward of `answer` with the "positive" normaliser, exactly."""
  met = tasks_lib.check(task, answer)
  weights = [c.weight for c in task.criteria]
  positive = sum(w for w in weights if w > 0)
  return sum((w for w, m in zip(weights, met) if m), fractions.Fraction(0)) / positive


def trivial_scores(task_set: Sequence[tasks_lib.RubricTask]) -> dict[str, float]:
  """Exact mean scores over `task_set` of the reference policies the suite states:

  best_blind: the best single answer given to every task (every answer of at most three words
    from POOL + "please", with order irrelevant to the checks: the prompt-blind optimum);
  uniform_list: one or two distinct listed words, uniformly (the warm-started student);
  rule: "<first> <second> please".
  """
  vocabulary = POOL + (CONSTANT_WORD,)
  best = max(np.mean([float(score(t, " ".join(answer))) for t in task_set])
             for n in (1, 2, 3) for answer in itertools.combinations(vocabulary, n))
  uniform = []
  for t in task_set:
    words = listed_words(t)
    singles = [float(score(t, w)) for w in words]
    pairs = [float(score(t, f"{a} {b}")) for a, b in itertools.permutations(words, 2)]
    uniform.append(0.5 * np.mean(singles) + 0.5 * np.mean(pairs))
  rule = [float(score(t, t.reference)) for t in task_set]
  return {"best_blind": float(best), "uniform_list": float(np.mean(uniform)),
          "rule": float(np.mean(rule))}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("out")
  parser.add_argument("--tasks", type=int, default=NUM_TASKS)
  parser.add_argument("--seed", type=int, default=SEED)
  args = parser.parse_args()
  with open(args.out, "w", encoding="utf-8") as f:
    for task in generate(args.tasks, args.seed):
      f.write(json.dumps(task) + "\n")
  print(args.out)


if __name__ == "__main__":
  main()
