"""The rule-based judge: tags from the environments' event traces (offline default).

Deterministic and free. Each built-in tag id has one rule over the trajectory's turns
(`Turn.events`, values of `rised_jax.types.Event`, and `Turn.invalid`). Tags describe
behaviour, not the outcome: no rule reads `Trajectory.success`, and the *winning turn* (the one reporting
the `success` event) counts as a turn but its other events are not read — the move that wins
always reports `progress` (and in Wordle `used_feedback`), so counting them made "won" and
"made progress" the same tag. The losing step (`irreversible_failure`) is its own tag and no
waste. A selector that wants the outcome adds it as a feature of its own (RISED's
`with_success`). How much the tags still reveal about success is measured per environment by
`success_predictability`, `best_single_tag_accuracy` and `success_information` below (logged
each step as judge/{env}/success_from_tags; experiments/tag_predictability.py for a table).

A turn is *invalid* when it reports `invalid_action`, or `Turn.invalid` is set and it does not
report `unknown_object` (environments also refuse to execute actions on unknown objects: that
is a hallucination, not a syntax error); *ineffective* when it is invalid or reports
`no_effect`; a *mistake* when it is ineffective or reports `regress` or `unknown_object`;
*wasted* when it is a mistake or reports `repeated_action`, `ignored_feedback` or `gave_up`.
*Before the win* means every turn except a winning one.

| tag id                       | pol. | applies when |
| ---------------------------- | ---- | ------------ |
| valid_syntax                 | +    | at least one turn and no invalid turn |
| makes_progress               | +    | some turn before the win, and at least `progress_min_fraction` (0.5) of the turns before the win report `progress` |
| uses_feedback                | +    | some turn before the win reports `used_feedback` and no turn `ignored_feedback` |
| recovers_from_mistakes       | +    | a mistake is followed, in a later turn before the win, by `progress` |
| efficient                    | +    | at least one turn and at most `efficient_max_wasted_turns` (0) wasted turns |
| checks_before_irreversible   | +    | no rule: no event reveals it (only LLM judges set it) |
| repeats_ineffective_action   | -    | a turn reports `repeated_action` and it, or the turn before it, is ineffective |
| malformed_action             | -    | some turn is invalid |
| hallucinated_object          | -    | some turn reports `unknown_object` |
| gave_up                      | -    | some turn reports `gave_up`; or the agent stopped on its own: the episode has no turn, or its last turn is not `done` and it was not truncated |
| ignores_feedback             | -    | some turn reports `ignored_feedback` |
| irreversible_losing_step     | -    | some turn reports `irreversible_failure` (a failure mode: it implies a loss, and in Countdown, where every loss is such a step, it is the loss) |
| loses_ground                 | -    | more turns report `regress` than `progress` |

Until issue 14, `efficient` counted the losing step as waste (every lost Countdown game was
inefficient) and `makes_progress`, `recovers_from_mistakes` and `uses_feedback` read the
winning turn; docs/judges.md gives the tags' predictability per environment before and after.

An id `event.NAME` is an *event tag*: it applies when some turn reports the event NAME. Plug-in
games name their own behaviours this way (rised_jax.envs.doors reports `opens_named_door`
when its move opens the door the note names; its vocabulary's tag `event.opens_named_door`
reads "Opens the door the note names"), so a game-specific rubric needs no judge of its own.
A vocabulary without some of the built-in ids simply never gets them; a vocabulary with
neither built-in ids nor event tags is refused (its tags could never be set). Rule-based
verdicts are never unjudged.
"""
from __future__ import annotations

import logging
from typing import Callable, Sequence

import numpy as np

from rised_jax.rubrics.judge import Judge, JudgeStats
from rised_jax.rubrics.vocabulary import Vocabulary
from rised_jax.types import Event, Trajectory, Turn, Verdict

log = logging.getLogger(__name__)

Events = list[frozenset[str]]   # per turn, the event names

# Besides ineffective turns (invalid or no_effect), which are both mistakes and waste:
_MISTAKE_EVENTS = frozenset({Event.REGRESS.value, Event.UNKNOWN_OBJECT.value})
# The losing step itself (`irreversible_failure`) is no waste: it is the outcome, which has a
# tag of its own (`irreversible_losing_step`); counting it made every lost Countdown game
# inefficient, so `efficient` read "won".
_WASTE_EVENTS = _MISTAKE_EVENTS | {Event.REPEATED_ACTION.value, Event.IGNORED_FEEDBACK.value,
                                   Event.GAVE_UP.value}
_PROGRESS = Event.PROGRESS.value


def _won(events: frozenset[str]) -> bool:
  """The winning turn: its other events (progress, feedback used) are the outcome itself —
  the move that wins always advances and always agrees with the feedback — so the rules that
  measure how the agent advanced do not read them."""
  return Event.SUCCESS.value in events


def event_names(turn: Turn) -> frozenset[str]:
  """The turn's events as plain strings (environments may report `Event` members or values)."""
  return frozenset(e.value if isinstance(e, Event) else str(e) for e in turn.events)


EVENT_TAG = "event."   # the id prefix of an event tag (module docstring)


def _event_rule(name: str) -> Callable[[Trajectory, Events], bool]:
  """The rule of the event tag `event.NAME`: some turn reports the event NAME."""
  return lambda traj, events: any(name in e for e in events)


class RuleBasedJudge(Judge):
  """Tags rollouts by the rules in this module's table."""

  backend = "rules"

  def __init__(self, vocab: Vocabulary, progress_min_fraction: float = 0.5,
               efficient_max_wasted_turns: int = 0):
    super().__init__(vocab)
    if not 0.0 < progress_min_fraction <= 1.0:
      raise ValueError(f"rules judge: progress_min_fraction={progress_min_fraction}; expected a "
                       "fraction in (0, 1]")
    if efficient_max_wasted_turns < 0:
      raise ValueError(f"rules judge: efficient_max_wasted_turns={efficient_max_wasted_turns}; "
                       "expected >= 0")
    self.progress_min_fraction = progress_min_fraction
    self.efficient_max_wasted_turns = efficient_max_wasted_turns
    rules: dict[str, Callable[[Trajectory, Events], bool]] = {
        "valid_syntax": self._valid_syntax,
        "makes_progress": self._makes_progress,
        "uses_feedback": self._uses_feedback,
        "recovers_from_mistakes": self._recovers_from_mistakes,
        "efficient": self._efficient,
        "repeats_ineffective_action": self._repeats_ineffective_action,
        "malformed_action": self._malformed_action,
        "hallucinated_object": self._hallucinated_object,
        "gave_up": self._gave_up,
        "ignores_feedback": self._ignores_feedback,
        "irreversible_losing_step": self._irreversible_losing_step,
        "loses_ground": self._loses_ground,
    }
    rules.update({tag: _event_rule(tag[len(EVENT_TAG):]) for tag in vocab.ids
                  if tag.startswith(EVENT_TAG)})
    self.rules = {tag: rule for tag, rule in rules.items() if tag in vocab.ids}
    if not self.rules:
      raise ValueError(f"rules judge: vocabulary {vocab.source} has none of the ids it has rules "
                       f"for; expected some of {sorted(rules)} or event tags "
                       f"'{EVENT_TAG}NAME'")
    without_rule = [t for t in vocab.ids if t not in self.rules]
    if without_rule:
      log.info("rules judge: no rule for %s; these tags are never set", without_rule)

  def verdict(self, traj: Trajectory) -> Verdict:
    events = [event_names(t) for t in traj.turns]
    tags = np.zeros(len(self.vocab), np.float32)
    for tag, rule in self.rules.items():
      if rule(traj, events):
        tags[self.vocab.index(tag)] = 1.0
    return Verdict(tags=tags)

  def judge_trajectories(self, trajectories: Sequence[Trajectory]
                         ) -> tuple[list[Verdict], JudgeStats]:
    return [self.verdict(t) for t in trajectories], JudgeStats(judged=len(trajectories))

  @staticmethod
  def _invalid(turn: Turn, events: frozenset[str]) -> bool:
    return Event.INVALID_ACTION.value in events or (
        turn.invalid and Event.UNKNOWN_OBJECT.value not in events)

  def _ineffective(self, turn: Turn, events: frozenset[str]) -> bool:
    return self._invalid(turn, events) or Event.NO_EFFECT.value in events

  def _valid_syntax(self, traj: Trajectory, events: Events) -> bool:
    return bool(traj.turns) and not self._malformed_action(traj, events)

  def _makes_progress(self, traj: Trajectory, events: Events) -> bool:
    before_win = [e for e in events if not _won(e)]
    advancing = sum(_PROGRESS in e for e in before_win)
    return bool(before_win) and advancing >= self.progress_min_fraction * len(before_win)

  def _uses_feedback(self, traj: Trajectory, events: Events) -> bool:
    return (any(Event.USED_FEEDBACK.value in e for e in events if not _won(e))
            and not self._ignores_feedback(traj, events))

  def _recovers_from_mistakes(self, traj: Trajectory, events: Events) -> bool:
    mistake_seen = False
    for turn, e in zip(traj.turns, events):
      if mistake_seen and _PROGRESS in e and not _won(e):
        return True
      mistake_seen |= self._ineffective(turn, e) or bool(e & _MISTAKE_EVENTS)
    return False

  def _efficient(self, traj: Trajectory, events: Events) -> bool:
    wasted = sum(self._ineffective(t, e) or bool(e & _WASTE_EVENTS)
                 for t, e in zip(traj.turns, events))
    return bool(events) and wasted <= self.efficient_max_wasted_turns

  def _repeats_ineffective_action(self, traj: Trajectory, events: Events) -> bool:
    return any(Event.REPEATED_ACTION.value in events[i]
               and (self._ineffective(traj.turns[i], events[i])
                    or (i > 0 and self._ineffective(traj.turns[i - 1], events[i - 1])))
               for i in range(len(events)))

  def _malformed_action(self, traj: Trajectory, events: Events) -> bool:
    return any(self._invalid(t, e) for t, e in zip(traj.turns, events))

  def _hallucinated_object(self, traj: Trajectory, events: Events) -> bool:
    return any(Event.UNKNOWN_OBJECT.value in e for e in events)

  def _gave_up(self, traj: Trajectory, events: Events) -> bool:
    if any(Event.GAVE_UP.value in e for e in events):
      return True
    return not traj.turns or (not traj.turns[-1].done and not traj.truncated)

  def _ignores_feedback(self, traj: Trajectory, events: Events) -> bool:
    return any(Event.IGNORED_FEEDBACK.value in e for e in events)

  def _irreversible_losing_step(self, traj: Trajectory, events: Events) -> bool:
    return any(Event.IRREVERSIBLE_FAILURE.value in e for e in events)

  def _loses_ground(self, traj: Trajectory, events: Events) -> bool:
    return (sum(Event.REGRESS.value in e for e in events)
            > sum(Event.PROGRESS.value in e for e in events))


def success_predictability(tags: np.ndarray, successes: np.ndarray) -> tuple[float, float]:
  """How well the tag vectors predict success: (accuracy of the best rule, base rate).

  tags [N, D] (multi-hot), successes [N] (bool). The best rule on the full tag vector predicts,
  for each distinct vector v, the majority outcome of the rollouts tagged exactly v; its
  accuracy is (1/N)·Σ_v max(#successes with v, #failures with v), the highest any function of
  the tags reaches on these rollouts (in-sample). The base rate max(p, 1 − p), p the success
  rate, is what a constant prediction reaches: accuracy = base rate means the tags say nothing
  about the outcome, accuracy = 1 means they decide it.
  """
  tags, successes = _checked(tags, successes)
  _, vector_id = np.unique(tags > 0.5, axis=0, return_inverse=True)
  vector_id = vector_id.reshape(-1)
  wins = np.bincount(vector_id, weights=successes)
  totals = np.bincount(vector_id)
  accuracy = float(np.maximum(wins, totals - wins).sum() / len(tags))
  rate = float(successes.mean())
  return accuracy, max(rate, 1.0 - rate)


def best_single_tag_accuracy(tags: np.ndarray, successes: np.ndarray) -> float:
  """Accuracy of the best one-tag threshold rule: "success iff tag j is set" or "success iff
  tag j is not set", the best j and direction, over tags [N, D] and successes [N] (a rule a
  selector could learn from a single profile coordinate; at least the base rate, through a
  tag that is never set)."""
  tags, successes = _checked(tags, successes)
  agree = ((tags > 0.5) == successes[:, None]).mean(axis=0)
  return float(np.maximum(agree, 1.0 - agree).max())


def success_information(tags: np.ndarray, successes: np.ndarray) -> float:
  """Share of the outcome's entropy the tag vector explains: I(V; S) / H(S) in [0, 1], V the
  whole tag vector, plug-in estimates over tags [N, D] and successes [N] (0 when every rollout
  has the same outcome). 1 means the tags decide success, 0 that they are independent of it."""
  tags, successes = _checked(tags, successes)
  _, vector_id = np.unique(tags > 0.5, axis=0, return_inverse=True)
  joint = np.zeros((int(vector_id.max()) + 1, 2))
  np.add.at(joint, (vector_id.reshape(-1), successes.astype(int)), 1.0)
  joint /= len(tags)
  outcome = joint.sum(axis=0)
  if outcome.min() == 0.0:
    return 0.0
  vector = joint.sum(axis=1, keepdims=True)
  nonzero = joint > 0
  information = float((joint[nonzero] * np.log2(joint[nonzero] / (vector * outcome)[nonzero])).sum())
  return information / float(-(outcome * np.log2(outcome)).sum())


def _checked(tags: np.ndarray, successes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  tags = np.asarray(tags)
  successes = np.asarray(successes, bool)
  if tags.ndim != 2 or successes.shape != (len(tags),) or not len(tags):
    raise ValueError(f"tag predictability: tags {tags.shape} and successes "
                     f"{successes.shape}; expected [N, D] and [N] with N >= 1")
  return tags, successes
