"""The engine protocol: everything the rollout stages ask of a sampler (in-process or SGLang).

`Engine` declares all of it (generation, weight sync, the request limits, the prefix cache,
the retry and failure counters); `EngineDefaults` gives an engine without fixed shapes, prefix
cache or server (SGLang's client, the tests' fakes) the answers that mean "none", so callers
never probe an engine for what it has.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, Sequence


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
  rest. `options`: the savings of `Engine.generate` (shared_prefill, stop_check)."""
  try:
    return engine.generate(requests, **options)
  except GenerationFailed as failure:
    return failure.results


@dataclasses.dataclass(frozen=True)
class EngineLimits:
  """The longest prompt and reply one request may have (None: no fixed bound): JaxEngine's
  largest prompt and new-token buckets; a server takes whatever its context allows."""

  max_prompt_tokens: int | None = None
  max_new_tokens: int | None = None

  @classmethod
  def of_buckets(cls, prompt_buckets: Sequence[int],
                 new_token_buckets: Sequence[int]) -> EngineLimits:
    return cls(max(prompt_buckets), max(new_token_buckets))

  def prompt_fits(self, tokens: int) -> bool:
    return self.max_prompt_tokens is None or tokens <= self.max_prompt_tokens

  def reply_fits(self, tokens: int) -> bool:
    return self.max_new_tokens is None or tokens <= self.max_new_tokens


StopCheck = Callable[[int, list[int]], bool]


class Engine(Protocol):
  """A batched token-in, token-out sampler."""

  # Retried server requests since the engine was built (0 for an in-process engine).
  server_retries: int
  # Requests given up on after their retries, since the engine was built (0 in-process).
  failed_requests: int
  # True when every process of a multi-process run must make the same `generate` calls (the
  # in-process engine samples with one program over all hosts' devices); False when each
  # process may send requests of its own (a server's client): the pipelines then split the
  # roll-outs across processes (`rollout.hosts`).
  collective: bool
  # Bytes the last `update_weights` moved to the sampler (an export's files, request bodies;
  # 0 in-process, where the sampler takes the trainer's arrays).
  last_sync_bytes: int

  def limits(self) -> EngineLimits:
    """The largest prompt and reply a request may have; checked at build time by each stage
    that knows its longest prompt and reply, so a run fails before its first step."""
    ...

  def reset_prefix_cache(self) -> None:
    """Forgets kept prompt prefixes: what follows must not depend on what came before."""
    ...

  def generate(self, requests: Sequence[GenerationRequest], *, shared_prefill: bool = False,
               stop_check: StopCheck | None = None) -> list[GenerationResult]:
    """One result per request, in order; raises `GenerationFailed` when some failed.

    Two savings a caller may offer, which change no token and which an engine may ignore (a
    server caches prefixes itself): `shared_prefill`, rows with the same whole prompt prefilled
    once; `stop_check(request index, output ids so far) -> True` ends a row early (the caller
    still cuts the reply at its stop string).
    """
    ...

  def update_weights(self, model: Any, version: int) -> None:
    """Makes later generations use the given model's current parameters."""
    ...


class EngineDefaults:
  """What an engine without bucket limits, prefix cache or server retries answers."""

  server_retries = 0
  failed_requests = 0
  collective = False
  last_sync_bytes = 0

  def limits(self) -> EngineLimits:
    return EngineLimits()

  def reset_prefix_cache(self) -> None:
    pass
