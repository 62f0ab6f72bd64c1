"""Chat segments for token-exact multi-turn transcripts, derived from a tokenizer's template.

A transcript is built from pieces that are each encoded once and then only concatenated:

  prompt        the template's rendering of [system, user(first observation)] with the
                generation prompt (e.g. "...<|im_start|>assistant\\n");
  agent turn    the ids the engine generated, ending with the end-of-turn token;
  observation   the text the template writes between the end-of-turn token of an assistant
                message and the start of the next assistant content, e.g. for ChatML
                "\\n<|im_start|>user\\nOBS<|im_end|>\\n<|im_start|>assistant\\n".

A reply prefix (e.g. "<answer>"), when set, is forced text at the start of every assistant
turn: its ids end the prompt and every observation segment, so the model continues from it.
It is context, not a sampled action (loss_mask 0); the environment reads prefix + reply.

The observation segment and the end-of-turn marker are found generically: the template
renders [user, assistant(SENTINEL), user(observation)] with the generation prompt; the text
after SENTINEL starts with the end-of-turn marker (the text of one of the tokenizer's stop
tokens), and the rest is the segment. Rendering the real observation (rather than pasting it
into a cached pattern) keeps whatever the template does to message content (Gemma's `trim`).
"""
from __future__ import annotations

from rised_jax.model.tokenizer import Tokenizer

# Stand-in assistant content: plain text that no template alters and no real message holds.
_SENTINEL = "RISEDJAXASSISTANTCONTENTSENTINEL"
_PROBE_USER = "RISEDJAXFIRSTUSERMESSAGE"


def join_system_text(system_prompt: str, extra: str = "") -> str:
  """The system message: the environment's prompt, then extra context (a hint, a teacher
  block) as its own paragraph when given."""
  return f"{system_prompt}\n\n{extra}" if extra else system_prompt


class ChatFormat:
  """Prompt, end-of-turn and observation-segment encoding for one tokenizer's template.

  `reply_prefix` is encoded once on its own (no special tokens) and appended to the prompt
  and to every observation segment. Raises ValueError when the template cannot be split this
  way (it does not render alternating user/assistant messages, or does not close an assistant
  message with one of the tokenizer's stop tokens).
  """

  def __init__(self, tokenizer: Tokenizer, reply_prefix: str = ""):
    if not isinstance(reply_prefix, str):
      raise ValueError(f"chat format: reply_prefix must be a string, got {reply_prefix!r}")
    self.tokenizer = tokenizer
    self.reply_prefix = reply_prefix
    self.reply_prefix_ids = tuple(tokenizer.encode(reply_prefix)) if reply_prefix else ()
    after = self._after_assistant_content("")
    markers = sorted({tokenizer.decode([t]) for t in tokenizer.stop_token_ids}, key=len,
                     reverse=True)
    marker = next((m for m in markers if m and after.startswith(m)), None)
    if marker is None:
      raise ValueError(f"chat template: an assistant message is followed by {after[:40]!r}, "
                       f"which does not start with any stop token of the tokenizer "
                       f"({markers}); the agent loop needs the template to close assistant "
                       f"turns with a stop token")
    self.end_of_turn_text = marker
    self.end_of_turn_ids = tuple(tokenizer.encode(marker))

  def _after_assistant_content(self, observation: str) -> str:
    """The rendered text after an assistant message's content, up to the next assistant
    content (the generation prompt included)."""
    messages = [{"role": "user", "content": _PROBE_USER},
                {"role": "assistant", "content": _SENTINEL},
                {"role": "user", "content": observation}]
    try:
      text = self.tokenizer.render_chat(messages, add_generation_prompt=True)
    except Exception as e:  # jinja raises whatever the template author chose
      raise ValueError(f"chat template: cannot render a user/assistant/user conversation "
                       f"({type(e).__name__}: {e})") from e
    if text.count(_SENTINEL) != 1:
      raise ValueError(f"chat template: the assistant content appears "
                       f"{text.count(_SENTINEL)} times in its rendering, expected once")
    return text.split(_SENTINEL, 1)[1]

  def prompt_ids(self, system_text: str, first_observation: str) -> list[int]:
    """The episode's prompt: [system, user(first observation)], the generation prompt and the
    reply prefix."""
    messages = [{"role": "user", "content": first_observation}]
    if system_text:
      messages.insert(0, {"role": "system", "content": system_text})
    return (self.tokenizer.encode_chat(messages, add_generation_prompt=True)
            + list(self.reply_prefix_ids))

  def observation_text(self, observation: str) -> str:
    """The template text between an agent's end-of-turn marker and its next reply."""
    after = self._after_assistant_content(observation)
    if not after.startswith(self.end_of_turn_text):
      raise ValueError(f"chat template: the assistant end-of-turn marker "
                       f"{self.end_of_turn_text!r} changed with the observation "
                       f"{observation[:40]!r}")
    return after[len(self.end_of_turn_text):]

  def observation_ids(self, observation: str) -> list[int]:
    """`observation_text` encoded (once; it is never re-tokenised with its neighbours), then
    the reply prefix."""
    return (self.tokenizer.encode(self.observation_text(observation))
            + list(self.reply_prefix_ids))
