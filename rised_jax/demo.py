"""Chat demo: greedy answers from a model, by default the packaged SmolLM2-135M-Instruct.

  python3 -m rised_jax.demo
  python3 -m rised_jax.demo --prompt "What is 7 times 6?" --max-new-tokens 24
  python3 -m rised_jax.demo --model path/to/model.gguf|path/to/hf_dir|<packaged name>

Each prompt is rendered with the model's chat template (a model without one, such as a base
model, continues the raw text instead) and decoded greedily, all prompts as one batch, by the
KV-cache sampler training rolls out with (`rised_jax.rollout.jax_engine.JaxEngine`), on the
device JAX finds (set JAX_PLATFORMS=cpu to force the CPU).
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

import jax

from rised_jax.model import Decoder, Tokenizer, from_pretrained, packaged
from rised_jax.rollout.base import GenerationRequest, SamplingParams
from rised_jax.rollout.jax_engine import JaxEngine

DEFAULT_PROMPTS = ("What is the capital of France?", "Name the three primary colors.")
BUFFER_MULTIPLE = 64   # prompt buckets are rounded up to this, so prompts share one compile


def greedy_generate(model: Decoder, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                    stop_token_ids: Sequence[int]) -> list[list[int]]:
  """Greedy continuations of a batch of prompts (token ids), by the KV-cache sampler.

  A row ends after emitting a stop token (kept in its output) or `max_new_tokens` tokens.
  """
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
  if not prompts or any(len(p) == 0 for p in prompts):
    raise ValueError("every prompt needs at least one token")
  longest = max(len(p) for p in prompts)
  limit = model.cfg.max_position_embeddings
  if longest + max_new_tokens > limit:
    raise ValueError(f"the longest prompt ({longest} tokens) plus max_new_tokens "
                     f"({max_new_tokens}) exceeds the model's {limit} positions")
  bucket = min(-(-longest // BUFFER_MULTIPLE) * BUFFER_MULTIPLE, limit - max_new_tokens)
  stops = tuple(dict.fromkeys(int(t) for t in stop_token_ids))
  engine = JaxEngine(model, max_batch=len(prompts), prompt_buckets=(bucket,),
                     max_new_tokens_buckets=(max_new_tokens,), max_stop_tokens=max(len(stops), 1))
  params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop_token_ids=stops)
  results = engine.generate([GenerationRequest(list(p), params) for p in prompts])
  return [list(result.output_ids) for result in results]


def prompt_ids(tokenizer: Tokenizer, prompt: str) -> list[int]:
  """The prompt as one user turn in the chat template, or as raw text (with BOS if the
  tokenizer adds one) for a model without a template."""
  if tokenizer.chat_template:
    return tokenizer.encode_chat([{"role": "user", "content": prompt}])
  return list(tokenizer.hf_tokenizer.encode(prompt))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog="python3 -m rised_jax.demo", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", default=packaged.DEFAULT_MODEL,
                      help=f"packaged name ({', '.join(packaged.names())}), a .gguf file or "
                           f"an HF checkpoint directory (default: %(default)s)")
  parser.add_argument("--prompt", action="append", dest="prompts", metavar="TEXT",
                      help="a user message; repeat for several (default: two examples)")
  parser.add_argument("--max-new-tokens", type=int, default=32,
                      help="most tokens generated per answer (default: %(default)s)")
  args = parser.parse_args(argv)
  if args.max_new_tokens < 1:
    parser.error(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
  args.prompts = args.prompts or list(DEFAULT_PROMPTS)
  if any(not p.strip() for p in args.prompts):
    parser.error("--prompt must not be empty")
  return args


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  start = time.perf_counter()
  model, tokenizer = from_pretrained(args.model)
  cfg = model.cfg
  print(f"{args.model}: {cfg.model_type}, {cfg.num_layers} layers, hidden {cfg.hidden_size}, "
        f"vocab {cfg.vocab_size}; loaded in {time.perf_counter() - start:.1f} s; on "
        f"{jax.devices()[0].platform} ({jax.device_count()} device(s))")
  if not tokenizer.chat_template:
    print("(no chat template: continuing the raw prompt text)")
  prompts = [prompt_ids(tokenizer, p) for p in args.prompts]
  start = time.perf_counter()
  answers = greedy_generate(model, prompts, args.max_new_tokens, tokenizer.stop_token_ids)
  seconds = time.perf_counter() - start
  for prompt, answer in zip(args.prompts, answers):
    print(f"\n> {prompt}\n{tokenizer.decode(answer, skip_special_tokens=True).strip()}")
  print(f"\n{sum(map(len, answers))} tokens in {seconds:.1f} s (greedy, KV cache; the first call "
        "compiles)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
