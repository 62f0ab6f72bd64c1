"""Positive rubrics → the self-distillation teacher's prefix (docs/ALGORITHMS.md §2.5).

For a selected group of environment e, the *available positives* come from the first source
of the fallback chain that has any:
  1. "group":  positive tags of this group's successful, tagged rollouts;
  2. "pool":   positive tags of successful, tagged rollouts of e in the other groups of the pool;
  3. "memory": positive tags recently seen in successful rollouts of e (`PositiveMemory`);
  4. none:     no teacher; the group gets the policy-gradient loss only.
Tags are listed most frequent first (count of successful rollouts carrying them; the memory
ranks by recency), ties in vocabulary order. The teacher prefix is "Behaviours that succeed
here:" and their descriptions, then the system prompt (teach/data/positive_prefix.jinja); the
teacher's prompt is that prefix as the system message and the group's first observation as the
user turn (`teacher_prompt_ids`). The block goes *before* the system prompt because there it
keeps the student's action format: with SmolLM2-135M on one-move FrozenLake and the reply prefix
"<answer>", the probability of a valid move's first token is 0.93x the student prompt's with the
block first and 0.55x with it after the system prompt, where it stood first (0.52x after the
observation; benchmarks/teacher_context.py, 32 instances; docs/rised.md, "Teacher"). The
generic-teacher control renders through the same template.

With `context="generic"` (the control for the rubric content) the same groups get a teacher
(the chain above still decides which), but the prefix lists `GENERIC_BEHAVIOURS`, advice that
fits every task and says nothing of what the judge saw, in place of the positives.

The memory is updated *after* a step's prefixes are built, so level 3 holds earlier steps
only (this step's pool is level 2).

Options — this project's reconstruction **[R-choice: which positives, template, weight]**:

| option          | default                        | alternatives | meaning |
| --------------- | ------------------------------ | ------------ | ------- |
| sources         | ("group", "pool", "memory")    | any ordered subset, e.g. ("group",) | the fallback chain |
| max_tags        | None (all available)           | int ≥ 1      | cap on the listed behaviours |
| memory_max_age  | 20                             | int ≥ 0      | steps a positive stays in the memory |
| template_path   | None (the packaged template)   | a .jinja file with `system_prompt`, `behaviours` | the prefix text |
| context         | "rubric"                       | "generic"    | list the positives' descriptions, or `GENERIC_BEHAVIOURS` (control) |
| β (weight)      | the trainer's `distill_weight` | —            | distillation weight, forward KL on every agent token of the group (§1.4–1.5) |
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jinja2
import numpy as np

from rised_jax.rubrics.profiles import check_aligned
from rised_jax.rubrics.prompt import load_template
from rised_jax.rubrics.vocabulary import Vocabulary
from rised_jax.types import Group, GroupTags

SOURCES = ("group", "pool", "memory")
DEFAULT_TEMPLATE = "positive_prefix.jinja"
CONTEXTS = ("rubric", "generic")
# Task-agnostic advice of the generic-context control: no rubric, nothing judged.
GENERIC_BEHAVIOURS = ("Reads the task and the latest observation carefully",
                      "Chooses each action to get closer to the goal")


def positive_counts(groups: Sequence[Group], tags: Sequence[GroupTags],
                    vocab: Vocabulary) -> np.ndarray:
  """Per vocabulary entry, how many successful judged rollouts carry it (0 for negatives);
  `tags[k]` is the judge's answer for `groups[k]`."""
  check_aligned(groups, tags)   # a mismatched row count would broadcast, not fail
  counts = np.zeros(len(vocab), np.int64)
  for group, group_tags in zip(groups, tags):
    keep = group.successes.astype(bool) & group_tags.judged
    counts += (np.asarray(group_tags.tags)[keep] > 0.5).sum(0).astype(np.int64)
  return np.where(vocab.positive_mask, counts, 0)


def ranked_ids(counts: np.ndarray, vocab: Vocabulary) -> list[str]:
  """Ids with a positive count, most frequent first, ties in vocabulary order."""
  order = np.argsort(-counts, kind="stable")
  return [vocab.entries[i].id for i in order if counts[i] > 0]


class PositiveMemory:
  """Per environment, the positive tags seen in successful rollouts and the last step seen."""

  def __init__(self, vocab: Vocabulary, max_age: int = 20):
    if max_age < 0:
      raise ValueError(f"positive memory: max_age={max_age}; expected >= 0")
    self.vocab = vocab
    self.max_age = max_age
    self.last_seen: dict[str, dict[str, int]] = {}   # env -> tag id -> step

  def update(self, groups: Sequence[Group], tags: Sequence[GroupTags], step: int) -> None:
    by_env: dict[str, list[int]] = {}
    for k, group in enumerate(groups):
      by_env.setdefault(group.task.env, []).append(k)
    for env, members in by_env.items():
      seen = self.last_seen.setdefault(env, {})
      counts = positive_counts([groups[k] for k in members], [tags[k] for k in members],
                               self.vocab)
      for tag in ranked_ids(counts, self.vocab):
        seen[tag] = step
      self.last_seen[env] = {t: s for t, s in seen.items() if step - s <= self.max_age}

  def recall(self, env: str, step: int) -> list[str]:
    """Tags seen within `max_age` steps before `step`, most recent first, ties in vocab order."""
    seen = self.last_seen.get(env, {})
    live = [t for t, s in seen.items() if 0 <= step - s <= self.max_age]
    return sorted(live, key=lambda t: (-seen[t], self.vocab.index(t)))

  def state_dict(self) -> dict[str, Any]:
    return {"last_seen": {env: dict(tags) for env, tags in self.last_seen.items()}}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    if set(state) != {"last_seen"}:
      raise ValueError(f"positive memory: state has keys {sorted(state)}; expected ['last_seen']")
    last_seen = {}
    for env, tags in state["last_seen"].items():
      for tag in tags:
        if tag not in self.vocab.ids or not self.vocab.entry(tag).positive:
          raise ValueError(f"positive memory: saved tag {tag!r} (env {env!r}) is not a positive "
                           f"tag of vocabulary {self.vocab.source}")
      last_seen[str(env)] = {str(t): int(s) for t, s in tags.items()}
    self.last_seen = last_seen


@dataclasses.dataclass(frozen=True)
class Positives:
  tags: tuple[str, ...]
  source: str          # "group", "pool", "memory" or "none"


def available_positives(index: int, pool: Sequence[Group], pool_tags: Sequence[GroupTags],
                        vocab: Vocabulary, memory: PositiveMemory | None = None, step: int = 0,
                        sources: Sequence[str] = SOURCES) -> Positives:
  """The first non-empty source of the fallback chain (module docstring) for `pool[index]`."""
  check_aligned(pool, pool_tags)
  group = pool[index]
  for source in sources:
    if source == "group":
      tags = ranked_ids(positive_counts([group], [pool_tags[index]], vocab), vocab)
    elif source == "pool":
      others = [k for k, g in enumerate(pool) if k != index and g.task.env == group.task.env]
      tags = ranked_ids(positive_counts([pool[k] for k in others],
                                        [pool_tags[k] for k in others], vocab), vocab)
    elif source == "memory":
      tags = memory.recall(group.task.env, step) if memory is not None else []
    else:
      raise ValueError(f"positive teacher: unknown source {source!r}; expected one of "
                       f"{list(SOURCES)}")
    if tags:
      return Positives(tuple(tags), source)
  return Positives((), "none")


def positive_teacher_prefix(system_prompt: str, index: int, pool: Sequence[Group],
                            pool_tags: Sequence[GroupTags], vocab: Vocabulary,
                            memory: PositiveMemory | None = None,
                            step: int = 0, sources: Sequence[str] = SOURCES,
                            max_tags: int | None = None,
                            template: jinja2.Template | None = None,
                            context: str = "rubric") -> tuple[str | None, Positives]:
  """The teacher prefix for `pool[index]` (None when no positive is available) and its source;
  `context="generic"` lists `GENERIC_BEHAVIOURS` instead of the positives."""
  if context not in CONTEXTS:
    raise ValueError(f"positive teacher: context={context!r}; expected one of {list(CONTEXTS)}")
  positives = available_positives(index, pool, pool_tags, vocab, memory, step, sources)
  if not positives.tags:
    return None, positives
  tags = positives.tags[:max_tags] if max_tags else positives.tags
  template = template or load_template(None, DEFAULT_TEMPLATE, package="rised_jax.teach")
  behaviours = (list(GENERIC_BEHAVIOURS) if context == "generic"
                else [vocab.entry(t).description for t in tags])
  return template.render(system_prompt=system_prompt, behaviours=behaviours).rstrip(), positives


def teacher_prompt_ids(chat, prefix: str, first_observation: str) -> list[int]:
  """The teacher's prompt ids for a group: its prefix as the system message, the group's first
  observation as the user turn (a `ChatFormat`'s prompt, reply prefix included)."""
  return chat.prompt_ids(prefix, first_observation)


class PositiveTeacher:
  """Builds teacher prefixes for selected groups and keeps the per-environment memory."""

  def __init__(self, vocab: Vocabulary, sources: Sequence[str] = SOURCES,
               max_tags: int | None = None, memory_max_age: int = 20,
               template_path: str | None = None, context: str = "rubric"):
    unknown = [s for s in sources if s not in SOURCES]
    if unknown or len(set(sources)) != len(sources):
      raise ValueError(f"positive teacher: sources={list(sources)}; expected distinct entries "
                       f"of {list(SOURCES)}")
    if max_tags is not None and max_tags < 1:
      raise ValueError(f"positive teacher: max_tags={max_tags}; expected >= 1 or None")
    if context not in CONTEXTS:
      raise ValueError(f"positive teacher: context={context!r}; expected one of {list(CONTEXTS)}")
    self.context = context
    self.vocab = vocab
    self.sources = tuple(sources)
    self.max_tags = max_tags
    self.memory = PositiveMemory(vocab, memory_max_age)
    self.template = load_template(template_path, DEFAULT_TEMPLATE, package="rised_jax.teach")

  def assign(self, chosen: Sequence[int], pool: Sequence[Group], tags: Sequence[GroupTags],
             step: int) -> tuple[list[str | None], dict[str, int]]:
    """The teacher prefix of each chosen group (`pool[i]`, in order; None: no teacher), built
    on the group's own system prompt, and how many groups took their positives from each
    source; then remembers the pool's positives."""
    counts = {source: 0 for source in (*SOURCES, "none")}
    prefixes = []
    for i in chosen:
      prefix, positives = positive_teacher_prefix(
          pool[i].system_prompt, i, pool, tags, self.vocab, self.memory, step, self.sources,
          self.max_tags, self.template, self.context)
      prefixes.append(prefix)
      counts[positives.source] += 1
    self.memory.update(pool, tags, step)
    return prefixes, counts

  def state_dict(self) -> dict[str, Any]:
    return {"memory": self.memory.state_dict()}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    if set(state) != {"memory"}:
      raise ValueError(f"positive teacher: state has keys {sorted(state)}; expected ['memory']")
    self.memory.load_state_dict(state["memory"])
