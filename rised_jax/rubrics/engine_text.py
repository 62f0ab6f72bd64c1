"""Text in, text out through any engine: what an in-process LLM judge calls."""
from __future__ import annotations

from typing import Any, Callable

from rised_jax.checks import frozen
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


def judge_options(judge_config: Any, engine: Engine, tokenizer) -> dict[str, Any]:
  """The keyword options of the judge `judge_config` names (the typed `settings.JudgeConfig`
  of config.judge, or config.rubric.judge): its `options`, plus for the `inprocess` backend the
  policy itself as `generate_text`, through the same engine, answering at most
  `judge_config.max_new_tokens` (`supplied_options`: what config validation must not ask for)."""
  options = dict(frozen(judge_config.options))
  if "generate_text" in supplied_options(judge_config.backend):
    options["generate_text"] = text_generator(engine, tokenizer,
                                              max_new_tokens=judge_config.max_new_tokens)
  return options


def supplied_options(backend: str) -> tuple[str, ...]:
  """Options of a judge backend that the pipeline supplies itself: the in-process judge's
  `generate_text` (the policy, through the rollout engine; `judge_options`)."""
  return ("generate_text",) if backend == "inprocess" else ()
