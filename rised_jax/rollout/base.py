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


class Engine(Protocol):
  """A batched token-in, token-out sampler."""

  def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
    ...

  def update_weights(self, model: Any, version: int) -> None:
    """Makes later generations use the given model's current parameters."""
    ...
