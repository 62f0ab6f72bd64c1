"""`Tokenizer`: a thin wrapper over a transformers fast tokenizer (tokenizers backend, no torch)
with the chat template, the stop tokens and the ids the rollout and training code need.

Text is always encoded without adding special tokens: chat templates spell out BOS and turn
markers themselves, and the agent loop concatenates encoded segments token-exactly.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from rised_jax.model.errors import ModelFileNotFoundError, TokenizerError

# Tokens that end an assistant turn in the chat formats we meet (ChatML, Gemma, Llama 3, Phi);
# generation stops on any of them that the vocabulary has, as well as on EOS.
END_OF_TURN_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
                      "<|endoftext|>")
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# transformers 5.x names its generic class "TokenizersBackend"; 4.x readers (an SGLang
# server, say) only know it by its older name, which 5.x maps back to the same class.
_PORTABLE_CLASS_NAMES = {"TokenizersBackend": "PreTrainedTokenizerFast"}


class Tokenizer:
  """Encodes, decodes and renders chats for one model.

  Args:
    hf_tokenizer: a transformers fast tokenizer. The wrapper owns it: a given `chat_template`
      is set on it, so that `save` writes it.
    chat_template: a jinja chat template overriding the tokenizer's own.
  """

  def __init__(self, hf_tokenizer: PreTrainedTokenizerFast, chat_template: str | None = None):
    if not isinstance(hf_tokenizer, PreTrainedTokenizerFast):
      raise TokenizerError(f"expected a transformers fast tokenizer (tokenizers backend), got "
                           f"{type(hf_tokenizer).__name__}")
    if chat_template is not None:
      hf_tokenizer.chat_template = chat_template
    self.hf_tokenizer = hf_tokenizer

  @classmethod
  def from_dir(cls, path: str | os.PathLike) -> Tokenizer:
    """Loads tokenizer.json (+ tokenizer_config.json, chat template) from a model directory."""
    path = Path(path)
    if not (path / TOKENIZER_FILE).is_file():
      raise ModelFileNotFoundError(
          f"{path / TOKENIZER_FILE}: not found; expected a fast-tokenizer file "
          f"({TOKENIZER_FILE}) in the model directory {path}")
    try:
      hf_tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError, json.JSONDecodeError) as e:
      raise TokenizerError(f"{path}: cannot load the tokenizer: {e}") from e
    return cls(hf_tokenizer)

  @property
  def chat_template(self) -> str | None:
    return self.hf_tokenizer.chat_template

  @property
  def vocab_size(self) -> int:
    """Number of ids the tokenizer can produce (base vocabulary plus added tokens)."""
    return len(self.hf_tokenizer)

  @property
  def bos_token_id(self) -> int | None:
    return self.hf_tokenizer.bos_token_id

  @property
  def eos_token_id(self) -> int:
    eos = self.hf_tokenizer.eos_token_id
    if eos is None:
      raise TokenizerError("the tokenizer has no EOS token (tokenizer_config.json 'eos_token')")
    return eos

  @property
  def pad_token_id(self) -> int:
    """The pad id, falling back to EOS (padding is always masked out anyway)."""
    pad = self.hf_tokenizer.pad_token_id
    return self.eos_token_id if pad is None else pad

  @property
  def stop_token_ids(self) -> tuple[int, ...]:
    """EOS followed by every end-of-turn token the vocabulary has, without repeats."""
    stops = [self.eos_token_id]
    vocab = self.hf_tokenizer.get_vocab()
    for token in END_OF_TURN_TOKENS:
      token_id = vocab.get(token)
      if token_id is not None and token_id not in stops:
        stops.append(token_id)
    return tuple(stops)

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`; no special tokens are added (special-token text still maps to them)."""
    return list(self.hf_tokenizer.encode(text, add_special_tokens=False))

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    return self.hf_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

  def render_chat(self, messages: Sequence[Mapping[str, Any]],
                  add_generation_prompt: bool = True) -> str:
    """The chat as the model's template writes it (ends with the assistant header if asked)."""
    if not self.chat_template:
      raise TokenizerError("the tokenizer has no chat template (tokenizer_config.json "
                           "'chat_template' or chat_template.jinja); pass chat_template=")
    for i, message in enumerate(messages):
      if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
        raise TokenizerError(f"messages[{i}] must be a mapping with 'role' and 'content', "
                             f"got {message!r}")
    return self.hf_tokenizer.apply_chat_template(
        [dict(m) for m in messages], tokenize=False, add_generation_prompt=add_generation_prompt)

  def encode_chat(self, messages: Sequence[Mapping[str, Any]],
                  add_generation_prompt: bool = True) -> list[int]:
    return self.encode(self.render_chat(messages, add_generation_prompt))

  def save(self, out_dir: str | os.PathLike) -> list[str]:
    """Writes the tokenizer files (and chat template) to out_dir; returns their names."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(os.listdir(out_dir))
    written = self.hf_tokenizer.save_pretrained(str(out_dir))
    config_path = out_dir / TOKENIZER_CONFIG_FILE
    if config_path.is_file():
      config = json.loads(config_path.read_text())
      portable = _PORTABLE_CLASS_NAMES.get(config.get("tokenizer_class"))
      if portable is not None:
        config["tokenizer_class"] = portable
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    names = {Path(p).name for p in written} | (set(os.listdir(out_dir)) - before)
    return sorted(n for n in names if (out_dir / n).is_file())
