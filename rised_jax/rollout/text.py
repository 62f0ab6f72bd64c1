"""Text in, text out through any engine: what an in-process LLM judge calls."""
from __future__ import annotations

from typing import Callable

from rised_jax.rollout.base import Engine, GenerationRequest, SamplingParams


def text_generator(engine: Engine, tokenizer, *, max_new_tokens: int = 256,
                   system_prompt: str | None = None) -> Callable[[list[str]], list[str]]:
  """`generate(prompts) -> answers`: each prompt is one user turn, answered greedily."""
  params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0,
                          stop_token_ids=tuple(tokenizer.stop_token_ids))

  def generate(prompts: list[str]) -> list[str]:
    requests = []
    for prompt in prompts:
      messages = [{"role": "user", "content": prompt}]
      if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
      requests.append(GenerationRequest(tokenizer.encode_chat(messages, add_generation_prompt=True),
                                        params))
    return [tokenizer.decode(r.output_ids, skip_special_tokens=True)
            for r in engine.generate(requests)]
  return generate
