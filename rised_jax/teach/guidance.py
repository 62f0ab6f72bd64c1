"""Negative rubrics → rollout guidance (docs/ALGORITHMS.md §2.6).

Per environment e and negative tag k, an exponential moving frequency over recent rollouts:
each `update(groups)` takes, per environment present, x̄_{e,k} = the fraction of its tagged
rollouts carrying k, and sets f_{e,k} ← f_{e,k} + α·(x̄_{e,k} − f_{e,k}) (the first update of
an environment sets f_{e,k} = x̄_{e,k} with `init="first"`, or starts from 0 with
`init="zero"`). Untagged rollouts are not counted; environments absent from an update keep
their frequencies. `hint(e)` lists the descriptions of the `top_m` negative tags whose
frequency exceeds `threshold` (highest first, ties in vocabulary order) through the template
teach/data/guidance_hint.jinja ("Avoid: …"), or "" when none does.

The agent loop appends the hint to the environment's rollout system prompt during training
(and records it in `Trajectory.hint`); evaluation never shows hints.

Options — this project's reconstruction **[R-choice: memory, injection, correction]**:

| option          | default | alternatives | meaning |
| --------------- | ------- | ------------ | ------- |
| rate            | 0.1     | (0, 1]       | α, the EMA rate per update (one update per training step) |
| init            | "first" | "zero"       | the first update's value, or 0 (hints then appear only after several steps) |
| threshold       | 0.3     | [0, 1)       | a tag is hinted when its frequency is strictly above this |
| top_m           | 2       | int ≥ 1      | at most this many tags per hint |
| template_path   | None    | a .jinja file with `behaviours` | the hint text |
| train_with_hint | False   | True         | (trainer option, documented here) False: the hint changes only the behaviour policy; the policy-gradient term is computed on the prompt *without* the hint, and the ratio is corrected with the truncated importance weight w_t = min(π(y_t | x) / π(y_t | x + hint), C) (§1.2; the trainer re-scores the response without the hint to get π(y_t | x)). True: train on the prompt with the hint, as it was sampled (no correction; the policy then learns a hint-dependent behaviour that evaluation never triggers). |
| no correction   | —       | `step.behaviour_weight=False` | (step option, the `rised_hint_no_iw` control) trains on the hint-free prompt like the default but with w_t = 1: the gradient of a hinted rollout is then taken as if the hint-free policy had sampled it. It isolates what the importance correction contributes. |

Rollouts generated with a hint update the memory like any other: as the hint suppresses a
behaviour its frequency decays and the hint eventually drops, which is intended (the policy
must then avoid it unprompted).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from rised_jax.rubrics.profiles import tag_frequencies
from rised_jax.rubrics.prompt import load_template
from rised_jax.rubrics.vocabulary import Vocabulary
from rised_jax.types import Group, GroupTags

DEFAULT_TEMPLATE = "guidance_hint.jinja"
INITS = ("first", "zero")


class GuidanceMemory:
  """Per-environment moving frequencies of negative tags, and the hints they yield."""

  def __init__(self, vocab: Vocabulary, rate: float = 0.1, threshold: float = 0.3,
               top_m: int = 2, init: str = "first", template_path: str | None = None):
    if not 0 < rate <= 1:
      raise ValueError(f"guidance memory: rate={rate}; expected (0, 1]")
    if not 0 <= threshold < 1:
      raise ValueError(f"guidance memory: threshold={threshold}; expected [0, 1)")
    if top_m < 1:
      raise ValueError(f"guidance memory: top_m={top_m}; expected >= 1")
    if init not in INITS:
      raise ValueError(f"guidance memory: init={init!r}; expected one of {list(INITS)}")
    if not vocab.negative_ids:
      raise ValueError(f"guidance memory: vocabulary {vocab.source} has no negative tag")
    self.vocab = vocab
    self.rate = rate
    self.threshold = threshold
    self.top_m = top_m
    self.init = init
    self.template = load_template(template_path, DEFAULT_TEMPLATE, package="rised_jax.teach")
    self._negative = np.flatnonzero(vocab.negative_mask)
    self._freq: dict[str, np.ndarray] = {}   # env -> [num negative tags]

  def update(self, groups: Sequence[Group], tags: Sequence[GroupTags]) -> None:
    """Folds in the negative-tag frequencies of the judged rollouts of `groups` (`tags[k]`:
    the judge's answer for `groups[k]`)."""
    for env, by_tag in tag_frequencies(groups, tags, self.vocab).items():
      batch_mean = np.asarray([by_tag[tag] for tag in self.vocab.negative_ids])
      if env not in self._freq:
        self._freq[env] = batch_mean if self.init == "first" else self.rate * batch_mean
      else:
        self._freq[env] = self._freq[env] + self.rate * (batch_mean - self._freq[env])

  def frequencies(self, env: str) -> dict[str, float]:
    """The moving frequency of every negative tag in `env` (zeros if never updated)."""
    freq = self._freq.get(env, np.zeros(len(self._negative)))
    return dict(zip(self.vocab.negative_ids, freq.tolist()))

  def active_tags(self, env: str) -> list[str]:
    """The top-m negative tags above the threshold, highest frequency first."""
    freq = self._freq.get(env)
    if freq is None:
      return []
    order = np.argsort(-freq, kind="stable")
    ids = self.vocab.negative_ids
    return [ids[i] for i in order if freq[i] > self.threshold][:self.top_m]

  def hint(self, env: str) -> str:
    """The guidance text for `env`'s training rollouts, or "" when no tag is frequent enough."""
    tags = self.active_tags(env)
    if not tags:
      return ""
    behaviours = [self.vocab.entry(t).description for t in tags]
    return self.template.render(behaviours=behaviours).strip()

  def state_dict(self) -> dict[str, Any]:
    return {"frequencies": {env: self.frequencies(env) for env in sorted(self._freq)}}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    if set(state) != {"frequencies"}:
      raise ValueError(f"guidance memory: state has keys {sorted(state)}; expected "
                       "['frequencies']")
    freq = {}
    for env, tags in state["frequencies"].items():
      if sorted(tags) != sorted(self.vocab.negative_ids):
        raise ValueError(f"guidance memory: saved tags for env {env!r} are {sorted(tags)}; "
                         f"vocabulary {self.vocab.source} has negatives "
                         f"{sorted(self.vocab.negative_ids)}")
      freq[str(env)] = np.asarray([float(tags[t]) for t in self.vocab.negative_ids])
    self._freq = freq
