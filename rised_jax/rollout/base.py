"""The engine protocol: everything the rollout stages ask of a sampler (in-process or SGLang).

`Engine` declares all of it (generation, weight sync, the request limits, the prefix cache);
`EngineDefaults` gives an engine without fixed shapes, prefix cache or server (SGLang's client,
the tests' fakes) the answers that mean "none", so callers never probe an engine for what it has.

Faults are reported per call, never kept on the engine for a caller to diff: `generate_counted`
returns one call's results with the retries and failed requests that call met (`EngineFaults`),
so a roll-out's counts are its own even while another thread (a weight sync, a judge) uses the
same engine.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, Sequence

# The in-process sampler's dense-layer and head operands (`config.rollout.matmul_operands`):
# the model's compute dtype, or float32 rounded to bfloat16 with float32 sums
# (`JaxEngine._traced`, `decoder.bfloat16_operands`).
MATMUL_OPERANDS = ("compute", "bfloat16")


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


@dataclasses.dataclass(frozen=True)
class EngineFaults:
  """What one `generate_counted` call met: attempts retried (each faulty reply that was asked
  again) and requests given up on after their retries; their sum is the faulty replies."""

  server_retries: int = 0
  failed_requests: int = 0

  def __add__(self, other: EngineFaults) -> EngineFaults:
    return EngineFaults(self.server_retries + other.server_retries,
                        self.failed_requests + other.failed_requests)


@dataclasses.dataclass(frozen=True)
class Generation:
  """One `generate_counted` call: a result per request, in order (None where the request
  failed after its retries), and the faults the call met."""

  results: tuple[GenerationResult | None, ...]
  faults: EngineFaults = EngineFaults()


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

  def generate_counted(self, requests: Sequence[GenerationRequest], *,
                       shared_prefill: bool = False,
                       stop_check: StopCheck | None = None) -> Generation:
    """`generate` for callers that drop what a failed request spoils (a rollout group) and go
    on with the rest: never raises `GenerationFailed`; None stands for each failed request,
    and the call's faults come with the results."""
    ...

  def update_weights(self, model: Any, version: int) -> None:
    """Makes later generations use the given model's current parameters."""
    ...


class EngineDefaults:
  """What an engine without bucket limits, prefix cache or server retries answers."""

  collective = False
  last_sync_bytes = 0

  def limits(self) -> EngineLimits:
    return EngineLimits()

  def reset_prefix_cache(self) -> None:
    pass

  def generate_counted(self, requests: Sequence[GenerationRequest], **options: Any) -> Generation:
    """`generate`; an engine that never retries counts each failed request, no retry."""
    try:
      results = self.generate(requests, **options)
    except GenerationFailed as failure:
      results = failure.results
    return Generation(tuple(results),
                      EngineFaults(failed_requests=sum(r is None for r in results)))
