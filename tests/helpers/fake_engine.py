"""The tests' one fake engine: scripted replies behind the whole `Engine` protocol.

A test subclasses `FakeEngine` with `reply(request, call)` (one `GenerationResult` per request;
`call` is the requests of the current `generate` call so far, for replies that depend on what
came before within a call). Every `generate` call is recorded in `calls`, its requests in
`requests`; `limits` stands for a bucketed engine's (JaxEngine's) largest buckets.
"""
from __future__ import annotations

from typing import Sequence

from rised_jax.rollout.base import (EngineDefaults, EngineLimits, GenerationRequest,
                                    GenerationResult)


class FakeEngine(EngineDefaults):

  def __init__(self, limits: EngineLimits = EngineLimits()):
    self.fake_limits = limits
    self.calls: list[list[GenerationRequest]] = []
    self.requests: list[GenerationRequest] = []

  def reply(self, request: GenerationRequest,
            call: Sequence[GenerationRequest]) -> GenerationResult:
    raise NotImplementedError

  def generate(self, requests: Sequence[GenerationRequest], *, shared_prefill: bool = False,
               stop_check=None) -> list[GenerationResult]:
    del shared_prefill, stop_check   # savings that change no token
    self.calls.append(list(requests))
    self.requests.extend(requests)
    return [self.reply(request, requests[:k]) for k, request in enumerate(requests)]

  def limits(self) -> EngineLimits:
    return self.fake_limits

  def update_weights(self, model, version: int) -> None:
    del model, version


class FixedReplyEngine(FakeEngine):
  """Every request gets the same reply: `text`'s ids and the EOS, log-prob -0.5 each."""

  def __init__(self, tokenizer, text: str):
    super().__init__()
    self.ids = tokenizer.encode(text) + [tokenizer.eos_token_id]

  def reply(self, request: GenerationRequest,
            call: Sequence[GenerationRequest]) -> GenerationResult:
    del request, call
    return GenerationResult(list(self.ids), [-0.5] * len(self.ids), "stop")
