"""A tiny random chat model for tests and smoke runs, written as a real HF checkpoint.

The tokenizer is word-level over the words the built-in environments use (system prompts,
observations of a few episodes, action names), with ChatML special tokens and template, so a
tiny decoder can play the environments with a handful of tokens per action. After those come
the words of the teacher's and guidance's text (`rubric_words`: the packaged rubric
vocabularies' descriptions, the generic-teacher control's advice and the teacher, guidance and
CriPO templates), so the teacher block and the "Avoid: …" hint reach the model as words rather
than `<|unk|>`; they are appended, so an environment word keeps the id it has without them
(`write(..., rubric=False)` leaves them out). The checkpoint is
written with our exporter, so `from_pretrained(out_dir)` — the same path as any real model —
loads it.

  python -m rised_jax.model.tiny OUT_DIR [--envs frozenlake,maze] [--seed 0] [--no-rubric-words]
"""
from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path
from typing import Sequence

import tokenizers
import transformers

from rised_jax import envs
from rised_jax.model import ModelConfig, Tokenizer, from_config, save_pretrained
from rised_jax.rubrics.prompt import load_template
from rised_jax.rubrics.vocabulary import BUILTIN_VOCABULARIES, Vocabulary
from rised_jax.teach import cripo_prefix, guidance, positive

SPECIAL = ["<|pad|>", "<|unk|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
          "{{ message['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WORD = re.compile(r"\w+|[^\w\s]")


def environment_words(env_names: Sequence[str], episodes: int = 20) -> list[str]:
  """Every word and punctuation mark of the environments' prompts, observations and actions."""
  words: set[str] = set()
  for name in env_names:
    env = envs.make(name)
    words.update(WORD.findall(env.system_prompt))
    for seed in range(episodes):
      words.update(WORD.findall(env.reset(seed)))
      for action in env.action_space()[:8]:
        words.update(WORD.findall(action))
  words.update(WORD.findall("<answer> </answer> assistant user system"))
  return sorted(words)


def rubric_words(vocabularies: Sequence[str] = BUILTIN_VOCABULARIES) -> list[str]:
  """Every word and punctuation mark the teacher and guidance can show the model: the
  vocabularies' descriptions, the generic-teacher control's advice, and the packaged positive
  teacher, guidance hint and CriPO templates rendered with them (so a template's own words and
  marks, its list bullets and its criterion numbers, are all included)."""
  entries = [e for name in vocabularies for e in Vocabulary.load(name).entries]
  descriptions = [e.description for e in entries] + list(positive.GENERIC_BEHAVIOURS)
  texts = list(descriptions)
  texts.append(load_template(None, positive.DEFAULT_TEMPLATE, package="rised_jax.teach").render(
      system_prompt="", behaviours=descriptions))
  texts.append(load_template(None, guidance.DEFAULT_TEMPLATE, package="rised_jax.teach").render(
      behaviours=descriptions))
  for messages in (cripo_prefix.injection_messages, cripo_prefix.counterfactual_messages):
    texts += [m["content"] for m in messages(descriptions[0], descriptions[1], descriptions)]
  return sorted({w for text in texts for w in WORD.findall(text)})


def build_tokenizer(words: Sequence[str]) -> Tokenizer:
  # A repeated word would take two ids, the vocabulary would hold fewer entries than the
  # largest id, and the embedding lookup past its end would read NaN.
  repeated = sorted(w for w, n in collections.Counter(words).items() if n > 1)
  if repeated:
    raise ValueError(f"tiny tokenizer: words {repeated} are listed more than once; expected "
                     "each word once")
  vocab = {token: i for i, token in enumerate(SPECIAL + [w for w in words if w not in SPECIAL])}
  backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<|unk|>"))
  backend.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([
      tokenizers.pre_tokenizers.WhitespaceSplit(),
      tokenizers.pre_tokenizers.Split(tokenizers.Regex(r"\w+|[^\w\s]"), behavior="isolated")])
  backend.decoder = tokenizers.decoders.WordPiece(prefix="##", cleanup=False)
  backend.add_special_tokens(SPECIAL)
  hf = transformers.PreTrainedTokenizerFast(
      tokenizer_object=backend, pad_token="<|pad|>", unk_token="<|unk|>",
      eos_token="<|im_end|>", bos_token=None)
  hf.chat_template = CHATML
  return Tokenizer(hf, chat_template=CHATML)


def tiny_config(vocab_size: int) -> ModelConfig:
  return ModelConfig.from_hf({
      "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab_size,
      "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
      "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True,
      "max_position_embeddings": 4096, "eos_token_id": 3, "pad_token_id": 0,
  }, source="rised_jax.model.tiny")


def tokenizer_words(env_names: Sequence[str], rubric: bool = True) -> list[str]:
  """The tiny tokenizer's words in id order: the environments' words, then (with `rubric`)
  the rubric words they lack."""
  words = environment_words(env_names)
  known = set(words)
  return words + [w for w in rubric_words() if w not in known] if rubric else words


def write(out_dir: str | Path, env_names: Sequence[str] = ("frozenlake",), seed: int = 0,
          rubric: bool = True) -> Path:
  tokenizer = build_tokenizer(tokenizer_words(env_names, rubric))
  model = from_config(tiny_config(tokenizer.vocab_size), seed)
  save_pretrained(model, tokenizer, out_dir)
  return Path(out_dir)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("out_dir")
  parser.add_argument("--envs", default="frozenlake")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--no-rubric-words", dest="rubric", action="store_false",
                      help="the environments' words only (no teacher, guidance or CriPO text)")
  args = parser.parse_args()
  print(write(args.out_dir, args.envs.split(","), args.seed, args.rubric))


if __name__ == "__main__":
  main()
