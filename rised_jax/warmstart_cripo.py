"""A supervised warm-start for CriPO's mechanism suite, and the suite's pre-checks before any RL.

The tiny model (rised_jax.model.tiny) starts random: no rollout meets a criterion, and neither
teacher context means anything to it. This stage trains it for a few hundred supervised steps
on the word_choice task family (`rubric_tasks.word_choice`) with three kinds of rows, each in
the exact chat the rubric pipeline renders (no system prompt; the packaged CriPO templates):

- student: the question -> one or two distinct random words of its list (never "please", and
  independent of the rubric: the rule "name the first listed word" is left for RL to find);
- injection teacher: question, an answer, and a random non-empty subset of the criteria it
  misses (rubric order, as the pipeline lists UC) -> the answer with the missing criteria's
  words appended (the minimal revision the template asks for);
- counterfactual teacher: question, an answer and a non-empty subset of the criteria it meets
  -> the answer with each named word replaced by another listed word.

Training lists never include a held-out task's list (`HELD_OUT`: the suite's
`rubric.eval_tasks`/`split_seed` split of the packaged task file), so the pre-checks read
instances the warm-start never saw.

What it can learn: copy a word named in a criterion line (injection), and avoid the word a
criterion line names (counterfactual). What it is not taught: the task's rule (first listed
word), nor "please" outside a teacher context.

Pre-checks (`injection_precheck`, `counterfactual_precheck`; printed by `main` as one line
each and written to warmstart_cripo.json):

- injection: on held-out tasks, for the answer "<third listed word>" (which misses every
  positive criterion), the probability the injection teacher puts on the missing criteria's
  words at each answer position, minus the student's at the same positions; holds when > 0.
- counterfactual: G sampled answers per training task from the student, judged, CriPO's group
  analysis (`learn.cripo.analyse_groups`), a counterfactual teacher for each answer it picks,
  and `learn.cripo.counterfactual_flips` on their tokens: holds when > 0 tokens flip.

  python -m rised_jax.warmstart_cripo OUT_DIR [--steps 5000] [--seed 0] [--batch 32] [--lr 3e-3]

Measured (seed 0, batch 32, 2026-12-04; docs/cripo.md "Mechanism suite"): the loss sits at
about 1.6 until step 1400, then falls (1.22 at 2500, 0.91 at 5000) as the model learns which
listed word a criterion line names. After 800 steps (the first default) the counterfactual
pre-check failed (0 of 12 tokens flip on 5 rows: the teacher did not locate the named word);
after 2500 it held barely (1 of 43); after 5000 (the default now; 14 min on 2 cores shared
with a test run) 15 of 103 tokens flip on 41 rows, and the injection teacher puts 0.307 on
the missing criteria's words against the student's 0.210.

OUT_DIR is an HF checkpoint (`--config.model.source=OUT_DIR`; experiments/configs/
mechanisms_cripo.py reads runs/cripo_warmstart by default).
"""
from __future__ import annotations

import argparse
import itertools
import json
import random
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rised_jax import warmstart
from rised_jax.learn import cripo
from rised_jax.model import from_config, save_pretrained, tiny
from rised_jax.rubric_tasks import tasks as tasks_lib
from rised_jax.rubric_tasks.split import split_tasks
from rised_jax.rubric_tasks import word_choice
from rised_jax.teach import cripo_prefix
from rised_jax.teach.action_mass import PAD_MULTIPLE

EVAL_TASKS = 64        # the suite's held-out tasks (config.rubric.eval_tasks)
SPLIT_SEED = 0         # config.rubric.split_seed
ROW_KINDS = ("student", "student", "injection", "counterfactual")   # drawn uniformly
POSITIVE_IDS = ("first", "second", "constant")


def task_set() -> tasks_lib.RubricTaskSet:
  return tasks_lib.load_jsonl(word_choice.PATH)


def split(tasks: tasks_lib.RubricTaskSet) -> tuple[list[tasks_lib.RubricTask],
                                                   list[tasks_lib.RubricTask]]:
  """(training, held-out) tasks, the rubric pipeline's split with the suite's settings."""
  train, held_out = split_tasks(len(tasks), EVAL_TASKS, SPLIT_SEED)
  return [tasks.tasks[i] for i in train], [tasks.tasks[i] for i in held_out]


def tokenizer_words() -> list[str]:
  """The tiny tokenizer's words plus the task family's (appended: ids stay put)."""
  words = tiny.tokenizer_words(["frozenlake"])
  texts = [word_choice.PROMPT, word_choice.CRITERION, word_choice.PITFALL,
           *word_choice.POOL, word_choice.CONSTANT_WORD]
  known = set(words)
  extra = sorted({w for t in texts for w in tiny.WORD.findall(t)} - known)
  return words + extra


def _positive(task: tasks_lib.RubricTask) -> list[tasks_lib.Criterion]:
  return [c for c in task.criteria if c.id in POSITIVE_IDS]


def _criterion_word(criterion: tasks_lib.Criterion) -> str:
  return criterion.check.all_of[0][0]


class Data:
  """Warm-start rows on random lists that no held-out task shows."""

  def __init__(self, tokenizer, seed: int):
    self.tokenizer = tokenizer
    self.rng = random.Random(seed)
    _, held_out = split(task_set())
    self.held_out_ids = {t.id for t in held_out}
    self.lists = [w for w in itertools.permutations(word_choice.POOL, word_choice.LIST_LENGTH)
                  if "-".join(w) not in self.held_out_ids]

  def task(self) -> tasks_lib.RubricTask:
    words = self.rng.choice(self.lists)
    return tasks_lib.parse_task(word_choice.task_json(words), "warm-start task")

  def answer(self, words: Sequence[str]) -> list[str]:
    return self.rng.sample(list(words), self.rng.choice((1, 2)))

  def row(self) -> tuple[list[int], list[int]]:
    """(prompt ids, target ids) of one random row (module docstring)."""
    task = self.task()
    words = word_choice.listed_words(task)
    kind = self.rng.choice(ROW_KINDS)
    answer = self.answer(words)
    if kind == "student":
      return student_prefix(self.tokenizer, task), self.target(answer)
    text = tasks_lib.check(task, " ".join(answer))
    positive = _positive(task)
    met = [c for c, m in zip(task.criteria, text) if m and c in positive]
    if kind == "injection":
      missing = [c for c in positive if c not in met]
      chosen = [c for c in missing if self.rng.random() < 0.5] or [self.rng.choice(missing)]
      revised = answer + [_criterion_word(c) for c in chosen]
      return injection_prefix(self.tokenizer, task, answer, chosen), self.target(revised)
    if not met:   # a counterfactual row needs an answer that meets a criterion
      answer = [_criterion_word(self.rng.choice(positive[:2]))] + answer[:1]
      answer = list(dict.fromkeys(answer))
      met = [c for c, m in zip(task.criteria, tasks_lib.check(task, " ".join(answer)))
             if m and c in positive]
    chosen = [c for c in met if self.rng.random() < 0.5] or [self.rng.choice(met)]
    named = {_criterion_word(c) for c in chosen}
    spare = [w for w in words if w not in answer and w not in named]
    self.rng.shuffle(spare)
    rewritten = [spare.pop() if w in named else w for w in answer]
    return counterfactual_prefix(self.tokenizer, task, answer, chosen), self.target(rewritten)

  def target(self, words: Sequence[str]) -> list[int]:
    return self.tokenizer.encode(" ".join(words)) + [self.tokenizer.eos_token_id]

  def batch(self, size: int) -> dict[str, np.ndarray]:
    return warmstart.pack([self.row() for _ in range(size)], PAD_MULTIPLE)


def student_prefix(tokenizer, task: tasks_lib.RubricTask) -> list[int]:
  return tokenizer.encode_chat([{"role": "user", "content": task.prompt}],
                               add_generation_prompt=True)


def injection_prefix(tokenizer, task, answer: Sequence[str], criteria) -> list[int]:
  return tokenizer.encode_chat(cripo_prefix.injection_messages(
      task.prompt, " ".join(answer), [c.text for c in criteria]), add_generation_prompt=True)


def counterfactual_prefix(tokenizer, task, answer: Sequence[str], criteria) -> list[int]:
  return tokenizer.encode_chat(cripo_prefix.counterfactual_messages(
      task.prompt, " ".join(answer), [c.text for c in criteria]), add_generation_prompt=True)


def train(steps: int, seed: int, batch_size: int, learning_rate: float, log_every: int = 100):
  """(model, tokenizer, loss history) after `steps` supervised steps."""
  tokenizer = tiny.build_tokenizer(tokenizer_words())
  model = from_config(tiny.tiny_config(tokenizer.vocab_size), seed)
  data = Data(tokenizer, seed)
  model, losses = warmstart.fit(model, lambda: data.batch(batch_size), steps, learning_rate,
                                log_every, what="CriPO warm-start")
  return model, tokenizer, losses


@nnx.jit
def _log_softmax(model, ids, mask):
  return jax.nn.log_softmax(model(ids, mask).astype(jnp.float32))


def response_log_probs(model, prefixes: Sequence[Sequence[int]],
                       responses: Sequence[Sequence[int]]) -> list[np.ndarray]:
  """Per row, log p(v | prefix ⊕ response[:t]) for every response position t: [len, V]."""
  rows = [list(p) + list(r) for p, r in zip(prefixes, responses)]
  width = -(-max(map(len, rows)) // PAD_MULTIPLE) * PAD_MULTIPLE
  ids = np.zeros((len(rows), width), np.int32)
  mask = np.zeros_like(ids)
  for i, row in enumerate(rows):
    ids[i, :len(row)], mask[i, :len(row)] = row, 1
  logp = np.asarray(_log_softmax(model, ids, mask))
  return [logp[i, len(p) - 1:len(p) - 1 + len(r)] for i, (p, r) in enumerate(zip(prefixes,
                                                                               responses))]


def injection_precheck(model, tokenizer, tasks: Sequence[tasks_lib.RubricTask]) -> dict:
  """Teacher vs student probability of the missing criteria's words (module docstring), and
  the mean forward KL(teacher ‖ student) over the same answer positions."""
  teacher_prefixes, student_prefixes, responses, targets = [], [], [], []
  for task in tasks:
    words = word_choice.listed_words(task)
    answer = [words[2]]                      # meets no positive criterion
    positive = _positive(task)
    teacher_prefixes.append(injection_prefix(tokenizer, task, answer, positive))
    student_prefixes.append(student_prefix(tokenizer, task))
    responses.append(tokenizer.encode(" ".join(answer)) + [tokenizer.eos_token_id])
    targets.append([tokenizer.encode(_criterion_word(c))[0] for c in positive])
  teacher = response_log_probs(model, teacher_prefixes, responses)
  student = response_log_probs(model, student_prefixes, responses)
  p_teacher = [np.exp(t[:, ids]).sum(-1).mean() for t, ids in zip(teacher, targets)]
  p_student = [np.exp(s[:, ids]).sum(-1).mean() for s, ids in zip(student, targets)]
  kl = [(np.exp(t) * (t - s)).sum(-1).mean() for t, s in zip(teacher, student)]
  diff = float(np.mean(p_teacher) - np.mean(p_student))
  return {"teacher_p_criterion_words": float(np.mean(p_teacher)),
          "student_p_criterion_words": float(np.mean(p_student)),
          "teacher_minus_student": diff, "teacher_student_kl": float(np.mean(kl)),
          "tasks": len(tasks), "holds": bool(diff > 0)}


def sample_answers(model, tokenizer, prefixes: Sequence[Sequence[int]], max_new_tokens: int,
                   rng: np.random.Generator) -> list[list[int]]:
  """Temperature-1 answers (ids, the stop token included when sampled) of each prefix."""
  answers = [[] for _ in prefixes]
  for _ in range(max_new_tokens):
    live = [i for i, a in enumerate(answers) if not a or a[-1] != tokenizer.eos_token_id]
    if not live:
      break
    logp = response_log_probs(model, [prefixes[i] for i in live],
                              [answers[i] + [0] for i in live])
    for i, row in zip(live, logp):
      p = np.exp(row[-1].astype(np.float64))
      answers[i].append(int(rng.choice(len(p), p=p / p.sum())))
  return answers


def counterfactual_precheck(model, tokenizer, tasks: Sequence[tasks_lib.RubricTask],
                            group_size: int = 8, max_new_tokens: int = 4, seed: int = 0,
                            alpha: float = 0.1) -> dict:
  """Sampled groups, CriPO's analysis and the counterfactual flips on them (module docstring)."""
  rng = np.random.default_rng(seed)
  prefixes = [student_prefix(tokenizer, t) for t in tasks for _ in range(group_size)]
  answers = sample_answers(model, tokenizer, prefixes, max_new_tokens, rng)
  texts = [tokenizer.decode(a, skip_special_tokens=True).strip() for a in answers]
  config = cripo.CriPOGroupConfig(reward_normalizer=word_choice.NORMALIZER)
  uc_groups = sc_groups = cf_rows = tokens = flipped = 0
  for k, task in enumerate(tasks):
    mine = slice(k * group_size, (k + 1) * group_size)
    verdicts = tasks_lib.check_group(task, texts[mine])
    analysis = cripo.analyse_groups(verdicts[None], task.weights[None], None, config)
    uc_groups += bool(analysis.uc_mask[0].any())
    sc_groups += bool(analysis.sc_mask[0].any())
    rows = [i for i in np.flatnonzero(analysis.cf_rollouts[0]) if texts[mine][i]]
    if not rows:
      continue
    criteria = [[c for c, on in zip(task.criteria, analysis.cf_criteria[0, i]) if on]
                for i in rows]
    responses = [answers[mine][i] for i in rows]
    teacher = response_log_probs(model, [
        tokenizer.encode_chat(cripo_prefix.counterfactual_messages(
            task.prompt, texts[mine][i], [c.text for c in crit]), add_generation_prompt=True)
        for i, crit in zip(rows, criteria)], responses)
    student = response_log_probs(model, [prefixes[k * group_size + i] for i in rows], responses)
    for i, t, s, response in zip(rows, teacher, student, responses):
      picked = np.arange(len(response)), np.asarray(response)
      _, flips = cripo.counterfactual_flips(
          jnp.asarray(s[picked])[None], jnp.asarray(t[picked])[None],
          jnp.asarray(t.max(-1))[None],
          jnp.full((1, len(response)), analysis.advantages[0, i]),
          jnp.ones((1, len(response))), alpha=alpha)
      cf_rows += 1
      tokens += len(response)
      flipped += int(np.asarray(flips).sum())
  return {"groups": len(tasks), "group_size": group_size,
          "frac_groups_with_uc": uc_groups / len(tasks),
          "frac_groups_with_sc": sc_groups / len(tasks), "counterfactual_rows": cf_rows,
          "counterfactual_tokens": tokens, "flipped_tokens": flipped,
          "flip_frac": flipped / tokens if tokens else 0.0, "holds": flipped > 0}


def branch_activity(records: Sequence[dict]) -> dict:
  """Whether both CriPO branches acted in a run, from its metrics.jsonl step records: tokens
  flipped (flipped_tokens > 0 in some step), tokens kept for the distillation (kept_tokens > 0
  in some step), and the KL to the injection teacher (distill_loss, the mean forward KL over
  the kept tokens) falling: its mean over the second half of the steps that distil below its
  mean over the first half. A run without a branch logs none of its keys and does not pass."""
  steps = [r for r in records if "loss" in r]
  flipped = sum(r.get("flipped_tokens", 0.0) for r in steps)
  kept = sum(r.get("kept_tokens", 0.0) for r in steps)
  kl = [r["distill_loss"] for r in steps if r.get("kept_tokens", 0.0) > 0]
  half = len(kl) // 2
  first = float(np.mean(kl[:half])) if half else float("nan")
  second = float(np.mean(kl[half:])) if half else float("nan")
  flip_fracs = [r["flip_frac"] for r in steps if r.get("cf_tokens", 0.0) > 0]
  return {"steps": len(steps), "flipped_tokens": flipped, "kept_tokens": kept,
          "mean_flip_frac": float(np.mean(flip_fracs)) if flip_fracs else 0.0,
          "kl_first_half": first, "kl_second_half": second,
          "holds": bool(flipped > 0 and kept > 0 and half and second < first)}


def precheck_lines(injection: dict, counterfactual: dict) -> list[str]:
  """The two printed pre-check lines."""
  return [
      f"precheck injection: teacher p(criterion words) {injection['teacher_p_criterion_words']:.3f}"
      f" vs student {injection['student_p_criterion_words']:.3f} (diff "
      f"{injection['teacher_minus_student']:+.3f}, {injection['tasks']} held-out tasks): "
      f"{'holds' if injection['holds'] else 'FAILS'}",
      f"precheck counterfactual: {counterfactual['flipped_tokens']} of "
      f"{counterfactual['counterfactual_tokens']} tokens flip on "
      f"{counterfactual['counterfactual_rows']} counterfactual rows ({counterfactual['groups']} "
      f"groups of {counterfactual['group_size']}; groups with UC "
      f"{counterfactual['frac_groups_with_uc']:.2f}, with SC "
      f"{counterfactual['frac_groups_with_sc']:.2f}): "
      f"{'holds' if counterfactual['holds'] else 'FAILS'}"]


def prechecks(model, tokenizer, groups: int = 128) -> dict:
  """Both pre-checks on the suite's split: injection on the held-out tasks, counterfactual on
  `groups` training tasks."""
  train_tasks, held_out = split(task_set())
  return {"injection": injection_precheck(model, tokenizer, held_out),
          "counterfactual": counterfactual_precheck(model, tokenizer, train_tasks[:groups])}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("out_dir")
  parser.add_argument("--steps", type=int, default=5000)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--lr", type=float, default=3e-3)
  args = parser.parse_args()
  model, tokenizer, losses = train(args.steps, args.seed, args.batch, args.lr)
  checks = prechecks(model, tokenizer)
  out = save_pretrained(model, tokenizer, args.out_dir)
  report = {"steps": args.steps, "seed": args.seed, "batch": args.batch, "lr": args.lr,
            "final_loss": float(np.mean(losses[-20:])), "precheck": checks}
  (Path(out) / "warmstart_cripo.json").write_text(json.dumps(report, indent=2))
  print(json.dumps(report, indent=2))
  for line in precheck_lines(checks["injection"], checks["counterfactual"]):
    print(line)


if __name__ == "__main__":
  main()
