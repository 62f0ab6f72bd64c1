"""The rubric pipeline's chat: a criteria task's question as prompt ids, a sampled answer as the
text the judge reads (and as a `Trajectory`), the engine seed of each answer, and the engine
limits they must fit.

Every prefix an answer follows (the question prompt, each teacher's chat) is rendered with the
generation prompt and must end with the chat template's assistant start, checked, so the same
answer ids follow each prefix unchanged.
"""
from __future__ import annotations

from typing import Sequence

from rised_jax.rollout.agent_loop import sampling_seed
from rised_jax.rollout.base import EngineLimits, GenerationResult
from rised_jax.rubric_tasks import RubricTask
from rised_jax.types import Task, Trajectory, Turn


def assistant_start_ids(tokenizer) -> list[int]:
  """The ids the chat template appends as the generation prompt (the assistant's header).

  Every prefix that an answer follows must end with them: the answer was generated after them.
  """
  probe = [{"role": "user", "content": "Probe question?"}]
  with_start = tokenizer.encode_chat(probe, add_generation_prompt=True)
  without = tokenizer.encode_chat(probe, add_generation_prompt=False)
  if len(with_start) <= len(without) or with_start[:len(without)] != without:
    raise ValueError("chat template: rendering with the generation prompt does not extend the "
                     "rendering without it, so the assistant start cannot be located; the rubric "
                     "pipeline needs a template whose generation prompt is appended text")
  return with_start[len(without):]


def visible_answer(text: str, strip_thinking: bool) -> str:
  """The answer a reader sees: without a leading <think>…</think> block (empty if unclosed)."""
  if strip_thinking and text.lstrip().startswith("<think>"):
    _, closed, after = text.partition("</think>")
    return after.strip() if closed else ""
  return text.strip()


class QuestionChat:
  """Questions in, prompt ids out; sampled ids in, the visible answer out (module docstring).

  system_prompt: the system message before every question ("" or None: none).
  strip_thinking: a leading <think>…</think> block is not part of the answer (`visible_answer`).
  """

  def __init__(self, tokenizer, system_prompt: str | None, strip_thinking: bool):
    self.tokenizer = tokenizer
    self.system_prompt = system_prompt or None
    self.strip_thinking = strip_thinking
    self.assistant_start = assistant_start_ids(tokenizer)

  def messages(self, question: str) -> list[dict[str, str]]:
    messages = [{"role": "user", "content": question}]
    if self.system_prompt:
      messages.insert(0, {"role": "system", "content": self.system_prompt})
    return messages

  def prefix_ids(self, messages: list[dict[str, str]], what: str) -> list[int]:
    """The chat with the generation prompt; it must end with the assistant start."""
    ids = self.tokenizer.encode_chat(messages, add_generation_prompt=True)
    if ids[-len(self.assistant_start):] != self.assistant_start:
      raise ValueError(f"{what}: the chat template's rendering ends with "
                       f"{ids[-len(self.assistant_start):]} instead of the assistant start "
                       f"{self.assistant_start}, so an answer would not follow it unchanged")
    return ids

  def question_ids(self, task: RubricTask) -> list[int]:
    """The prompt the task's answers are sampled after."""
    return self.prefix_ids(self.messages(task.prompt), f"task {task.id!r}")

  def answer_text(self, output_ids: Sequence[int]) -> str:
    return visible_answer(self.tokenizer.decode(output_ids, skip_special_tokens=True),
                          self.strip_thinking)

  def answer_trajectory(self, task: RubricTask, prompt: Sequence[int],
                        result: GenerationResult) -> Trajectory:
    """One sampled answer after `prompt`: prompt ⊕ answer ids, the loss mask on the answer, the
    sampler's log-probs and the visible answer text (`turns[0]`), not judged yet."""
    answer = [int(t) for t in result.output_ids]
    if not answer or len(result.logprobs) != len(answer):
      raise RuntimeError(f"engine result for task {task.key} breaks the Engine contract: "
                         f"{len(answer)} output ids, {len(result.logprobs)} log-probs")
    text = self.answer_text(answer)
    return Trajectory(task=task, token_ids=list(prompt) + answer,
                      loss_mask=[0] * len(prompt) + [1] * len(answer),
                      behaviour_logprobs=[0.0] * len(prompt) + [float(x) for x in result.logprobs],
                      prompt_len=len(prompt),
                      turns=[Turn(action_text=text, observation="", reward=0.0, done=True,
                                  invalid=False, events=[])],
                      success=False, reward=0.0, truncated=result.finish_reason == "length")


def answer_seed(run_seed: int, task_set: str, index: int, task: RubricTask, rollout: int) -> int:
  """The engine seed of one answer: `sampling_seed` over the key (set name, task index, task id),
  the one rubric questions had as `types.Task`s, so every answer is sampled as before."""
  return sampling_seed(run_seed, Task(env=task_set, seed=index, difficulty={"id": task.id}),
                       rollout, 0)


def check_answer_fits(limits: EngineLimits, max_new_tokens: int) -> None:
  """The engine (JaxEngine's buckets) takes answers of `config.rubric.max_new_tokens`."""
  if not limits.reply_fits(max_new_tokens):
    raise ValueError(f"config.rubric.max_new_tokens={max_new_tokens} is above the engine's "
                     f"largest new-token bucket {limits.max_new_tokens}; raise "
                     "config.rollout.new_token_buckets")


def check_prompts_fit(limits: EngineLimits, prompt_ids: Sequence[Sequence[int]],
                      tasks: Sequence[RubricTask]) -> None:
  """The engine takes every task's prompt (`prompt_ids[i]` is `tasks[i]`'s)."""
  longest = max(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
  if not limits.prompt_fits(len(prompt_ids[longest])):
    raise ValueError(f"rubric task {tasks[longest].id!r}: its prompt has "
                     f"{len(prompt_ids[longest])} tokens, more than the engine's largest "
                     f"prompt bucket {limits.max_prompt_tokens}; raise "
                     "config.rollout.prompt_buckets")
