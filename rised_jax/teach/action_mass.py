"""Valid-action mass: how much of a model's next-token probability starts a valid action.

The agent answers `<answer>ACTION</answer>` (`envs.format_answer`), continuing after the reply
prefix (`rollout.reply_prefix`; "" for none). For an environment whose actions can be listed
(`action_space()` of the first state), the *valid first tokens* are the distinct first ids of
the formatted actions past the reply prefix: with the prefix "<answer>", the first token of
each action name; with no prefix, the token that opens "<answer>" (then the mass measures
whether the reply starts in the answer format at all). The valid-action mass of a prompt is
the softmax probability at its last position summed over those ids.

`teacher/valid_action_mass_ratio`, logged per step by the agentic pipeline when a teacher is
on, is over the step's chosen groups that have a teacher prefix and an enumerable action space:

  mean over those groups of the mass after the teacher prompt (teacher prefix + first
  observation + reply prefix)  /  mean over the same groups of the mass after the student
  prompt (the hint-free system prompt + first observation + reply prefix),

both under the live policy before the step's update. The forward KL pulls the student toward
the teacher's first-token distribution, so a ratio well below 1 means the teacher context pulls
the student off the action format.
"""
from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from rised_jax import envs

PAD_MULTIPLE = 64   # prompt widths are padded to a multiple of this: few compilations


def first_action_token_ids(tokenizer, actions: Sequence[str], reply_prefix: str = "") -> np.ndarray:
  """The sorted distinct first ids of each formatted action (`envs.format_answer`) continuing
  `reply_prefix`. ValueError when the prefix is not the start of a formatted action, or when
  an action's encoding does not extend the prefix's (the tokenizer merges across them)."""
  prefix = tokenizer.encode(reply_prefix) if reply_prefix else []
  firsts = set()
  for action in actions:
    text = envs.format_answer(action)
    if not text.startswith(reply_prefix):
      raise ValueError(f"reply prefix {reply_prefix!r} is not the start of the answer "
                       f"{text!r}: the valid first tokens are undefined")
    ids = tokenizer.encode(text)
    if ids[:len(prefix)] != prefix or len(ids) == len(prefix):
      raise ValueError(f"answer {text!r} encodes as {ids}, which does not extend the reply "
                       f"prefix's ids {prefix}")
    firsts.add(ids[len(prefix)])
  return np.asarray(sorted(firsts), np.int64)


def task_first_action_token_ids(tokenizer, task, reply_prefix: str = "") -> np.ndarray | None:
  """`first_action_token_ids` of the actions in `task`'s first state (a fresh instance of its
  environment), or None where they are undefined: the environment lists no actions (no
  `action_space`, or an empty one), or `first_action_token_ids` refuses the reply prefix."""
  env = envs.make(task.env, **task.difficulty)
  try:
    env.reset(task.seed)
    actions = env.action_space() if hasattr(env, "action_space") else []
  finally:
    envs.close(env)
  if not actions:
    return None
  try:
    return first_action_token_ids(tokenizer, actions, reply_prefix)
  except ValueError:
    return None


def valid_action_mass(logits: np.ndarray, valid_ids: Sequence[int]) -> np.ndarray:
  """[..., V] next-token logits -> [...] softmax probability summed over `valid_ids`."""
  logits = np.asarray(logits, np.float64)
  shifted = logits - logits.max(-1, keepdims=True)
  log_norm = np.log(np.exp(shifted).sum(-1))
  return np.exp(shifted[..., np.asarray(valid_ids)] - log_norm[..., None]).sum(-1)


def mass_ratio(teacher_mass: Sequence[float], student_mass: Sequence[float]) -> float:
  """Mean teacher mass over mean student mass of paired prompts (nan without a pair or when
  the student's mean is 0)."""
  teacher_mass, student_mass = np.asarray(teacher_mass, float), np.asarray(student_mass, float)
  if teacher_mass.shape != student_mass.shape:
    raise ValueError(f"teacher masses {teacher_mass.shape} and student masses "
                     f"{student_mass.shape} must pair up")
  if not teacher_mass.size or student_mass.mean() == 0:
    return float("nan")
  return float(teacher_mass.mean() / student_mass.mean())


@nnx.jit
def _last_logits(model, ids, mask, last):
  hidden = model.hidden_states(ids, mask)
  return model.logits(hidden[jnp.arange(hidden.shape[0]), last])


def next_token_logits(model, prompts: Sequence[Sequence[int]], *, rows: int = 0,
                      widths: Sequence[int] = ()) -> np.ndarray:
  """[N, V] float32 logits of the token after each prompt: one forward, right-padded.

  The forward's shape is fixed by the caller so that it compiles once: at least `rows` rows
  (one-token filler rows past the prompts, dropped from the result) and the smallest of
  `widths` that holds the longest prompt (else that length rounded up to PAD_MULTIPLE)."""
  longest = max(map(len, prompts))
  width = min((w for w in widths if w >= longest),
              default=-(-longest // PAD_MULTIPLE) * PAD_MULTIPLE)
  ids = np.zeros((max(rows, len(prompts)), width), np.int32)
  mask = np.zeros_like(ids)
  mask[:, 0] = 1   # filler rows attend to one token (a row attending to none has no softmax)
  last = np.zeros(len(ids), np.int32)
  for r, prompt in enumerate(prompts):
    ids[r, :len(prompt)], mask[r, :len(prompt)], last[r] = prompt, 1, len(prompt) - 1
  return np.asarray(_last_logits(model, ids, mask, last))[:len(prompts)]
