"""The data that flows between the stages of a training step.

Host-side stages (environments, agent loop, judge, selection, teachers) exchange the
dataclasses below; the jitted train step consumes a `Batch` of dense arrays.

Batch contract (what `rised_jax.learn.train_step` consumes), shapes [B, T] unless noted:

  input_ids            int32  student rows: prefix ⊕ response. Prefixes are LEFT-padded to
                              a common length P so that response column t is the same column
                              in student and teacher rows; responses are right-padded.
  attention_mask       int32  1 on real tokens, 0 on padding. Positions are derived from it
                              (cumsum − 1), so left padding is free.
  loss_mask            f32    1 where token input_ids[b, t] carries policy-gradient loss
                              (agent-generated tokens only; environment observations, prompt
                              and padding are 0). Logits at column t − 1 predict column t.
  advantages           f32    per-token advantage A_t (broadcast of the group advantage,
                              possibly edited per token, e.g. by CriPO).
  old_logprobs         f32    (optional) log π_old(y_t) at the masked columns: the policy
                              the PPO ratio is taken against. The trainer never sends it:
                              with num_iterations = 1 the step uses its own forward (ratio 1),
                              with more the step computes it once per batch before the first
                              update (`train_step.old_policy_pass`); a batch that carries it
                              keeps it.
  behaviour_logprobs   f32    log π_behaviour(y_t): the policy that actually sampled y_t
                              (other context, other precision, an older policy under async
                              rollouts). Only the truncated importance weight π_old/π_beh
                              uses it, never the PPO ratio.
  teacher_input_ids    int32  teacher rows: teacher prefix ⊕ the same response, response
                              columns aligned with input_ids.
  teacher_attention_mask int32
  distill_mask         f32    1 where the distillation divergence applies (a subset of the
                              loss_mask columns); all zero for rows without a teacher.
  cf_teacher_input_ids / cf_teacher_attention_mask / cf_mask   (optional, CriPO)
                              counterfactual-teacher rows and the columns it may flip.
  prefix_ids / prefix_mask  int32 [B / G, P]  (optional) each group's shared prefix: the
                              first P columns of its G consecutive rows, which must all be
                              equal (`batching.group_prefixes`); the step then runs each
                              prefix once (`model.shared_prefix`) and splits micro- and
                              mini-batches by group.
  seq_len_norm         f32 [] constant length used by `seq-mean-token-sum-norm`.

Every array is padded to bucketed shapes by `rised_jax.learn.batching` so the step compiles
once per bucket.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Mapping, Sequence

import numpy as np


class Event(str, enum.Enum):
  """What an environment reports about one step; the rule-based judge reads these."""

  INVALID_ACTION = "invalid_action"        # unparsable or not an admissible action
  NO_EFFECT = "no_effect"                  # a legal action that changed nothing (bumped a wall…)
  REPEATED_ACTION = "repeated_action"      # the same action as the previous turn
  PROGRESS = "progress"                    # moved measurably closer to the goal
  REGRESS = "regress"                      # moved measurably away from the goal
  IRREVERSIBLE_FAILURE = "irreversible_failure"  # the episode can no longer be won
  UNKNOWN_OBJECT = "unknown_object"        # referred to something absent from the observation
  USED_FEEDBACK = "used_feedback"          # an action consistent with the latest feedback
  IGNORED_FEEDBACK = "ignored_feedback"    # an action the latest feedback already ruled out
  SUCCESS = "success"                      # the goal is reached
  GAVE_UP = "gave_up"                      # the agent stopped before the goal


@dataclasses.dataclass(frozen=True)
class Task:
  """One environment instance: the environment's name, its seed and difficulty knobs.

  (A rubric question is a `rubric_tasks.RubricTask`, not a Task.)"""

  env: str
  seed: int
  difficulty: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def key(self) -> str:
    return f"{self.env}:{self.seed}"


@dataclasses.dataclass
class Turn:
  """One agent action and the environment's answer to it."""

  action_text: str
  observation: str
  reward: float
  done: bool
  invalid: bool
  events: list[str]


@dataclasses.dataclass
class Trajectory:
  """One rollout of a task, kept token-exact.

  token_ids is the whole transcript as the model saw it: the prompt (system prompt, optional
  hint, first observation, all chat-formatted) followed by alternating agent and environment
  segments. Agent tokens are exactly the ids the engine generated; environment segments are
  encoded once and never re-tokenised.
  """

  task: Task
  token_ids: list[int]
  loss_mask: list[int]              # 1 on agent-generated tokens
  behaviour_logprobs: list[float]   # log-prob of each token under the sampler; 0 elsewhere
  prompt_len: int                   # tokens before the first agent token
  turns: list[Turn]
  success: bool
  reward: float
  truncated: bool = False           # ran out of turn or token budget (counts as failure)
  hint: str = ""                    # guidance text that was in the rollout prompt, if any

  @property
  def events(self) -> list[str]:
    return [e for t in self.turns for e in t.events]

  @property
  def num_agent_tokens(self) -> int:
    return int(sum(self.loss_mask))


@dataclasses.dataclass(frozen=True)
class Group:
  """G rollouts of the same task: what the rollouts were, nothing the later stages decided.

  Advantages, selection, judgements and teacher contexts live in the pipeline's per-step record
  (`rised_jax.pipelines`). `system_prompt` and `first_observation` are what the environment
  showed before the first action (the hint-free prompt and teacher prefixes are built from
  them without resetting an environment again); empty for rubric questions.
  """

  task: Any                         # `Task`, or `rubric_tasks.RubricTask` for rubric questions
  trajectories: list[Trajectory]
  system_prompt: str = ""
  first_observation: str = ""

  @property
  def rewards(self) -> np.ndarray:
    return np.asarray([t.reward for t in self.trajectories], np.float32)

  @property
  def successes(self) -> np.ndarray:
    return np.asarray([t.success for t in self.trajectories], np.float32)


@dataclasses.dataclass(frozen=True)
class GroupTags:
  """The tag judge's answer for one group: one multi-hot row per rollout.

  tags      float32 [G, V] over the rubric vocabulary (a zero row where unjudged)
  unjudged  bool [G]: the judge gave no usable verdict for that rollout
  """

  tags: np.ndarray
  unjudged: np.ndarray

  @property
  def judged(self) -> np.ndarray:
    return ~np.asarray(self.unjudged, bool)


@dataclasses.dataclass
class Verdict:
  """A judge's answer for one rollout."""

  tags: np.ndarray                 # multi-hot over the vocabulary (zeros when unjudged)
  unjudged: bool = False           # the answer was unusable: no verdict
  unknown_tags: Sequence[str] = () # names in the answer that are not in the vocabulary
  raw: str = ""                    # the judge's raw answer, for the logs
