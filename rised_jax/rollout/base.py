"""The engine protocol: what the agent loop asks of a sampler (in-process or SGLang)."""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  max_new_tokens: int
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0                         # 0: no top-k truncation
  stop_token_ids: tuple[int, ...] = ()   # generation ends after emitting one of these


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
  prompt_ids: Sequence[int]
  params: SamplingParams
  seed: int = 0


@dataclasses.dataclass
class GenerationResult:
  output_ids: list[int]          # exactly the sampled ids, the stop token included if emitted
  logprobs: list[float]          # log π(output_ids[i] | prefix) under the sampling policy
  finish_reason: str             # "stop" (a stop token) or "length" (max_new_tokens)


class GenerationFailed(RuntimeError):
  """Some requests of one `generate` call failed (after the engine's retries). `results` has
  one entry per request: the result, or None where that request failed."""

  def __init__(self, message: str, *, results: Sequence[GenerationResult | None]):
    super().__init__(message)
    self.results = list(results)


def generate_or_none(engine: Engine, requests: Sequence[GenerationRequest], **options: Any
                     ) -> list[GenerationResult | None]:
  """`engine.generate(requests, **options)`, with None in place of each request that failed:
  for callers that drop what a failed request spoils (a rollout group) and go on with the
  rest. `options` are engine-specific (JaxEngine's shared_prefill, stop_check)."""
  try:
    return engine.generate(requests, **options)
  except GenerationFailed as failure:
    return failure.results


def server_retries(engine: Any) -> int:
  """Retried server requests of an engine since it was built (0 for an in-process one)."""
  return int(getattr(engine, "server_retries", 0))


class Engine(Protocol):
  """A batched token-in, token-out sampler."""

  def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
    """One result per request, in order; raises `GenerationFailed` when some failed."""
    ...

  def update_weights(self, model: Any, version: int) -> None:
    """Makes later generations use the given model's current parameters."""
    ...
