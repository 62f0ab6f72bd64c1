"""The judge interface and the machinery shared by the LLM backends (docs/ALGORITHMS.md §2.3).

A judge returns, for every group it is given, a `GroupTags` (multi-hot float32 rows over the
vocabulary and which rollouts are unjudged), and `JudgeStats` counters for the logs.

LLM backends share, in `LLMJudge`:
- the prompt (`JudgePrompt`, a Jinja template) and the lenient parser (`parse_verdict`);
- a cache keyed by sha256(backend, model, prompt): an identical transcript, in the same call
  or a later one, is not judged twice. Only usable answers are cached, so an unusable answer
  is asked again next time (it may have been a sampling accident);
and in `RemoteJudge` (the HTTP backends):
- bounded concurrency (a thread pool of `max_concurrency` requests in flight);
- the retry policy of every model-server client (`rised_jax.http_retry`: jittered exponential
  backoff, the server's Retry-After honoured) on transient errors (timeouts, connection
  errors, HTTP 408/429/5xx); a request that still fails marks its rollouts unjudged;
- configuration errors (HTTP 401/403/404: bad key, no such model or endpoint) raise
  `JudgeError` at once instead of silently untagging every rollout.
Error texts are scrubbed of the API key's value before they are logged or raised.
"""
from __future__ import annotations

import abc
import collections
import concurrent.futures
import dataclasses
import hashlib
import logging
import os
import threading
from typing import Any, Callable, Sequence

import numpy as np

from rised_jax import http_retry
from rised_jax.rubrics.parsing import parse_verdict
from rised_jax.rubrics.prompt import JudgePrompt
from rised_jax.rubrics.vocabulary import Vocabulary
from rised_jax.types import Group, GroupTags, Trajectory, Verdict

log = logging.getLogger(__name__)


class JudgeError(RuntimeError):
  """A judge is misconfigured (bad key, unknown model, unreachable endpoint)."""


@dataclasses.dataclass
class JudgeStats:
  """Counters of one `judge` call."""

  judged: int = 0           # trajectories the judge was asked about
  unjudged: int = 0         # of those, verdicts that were unusable
  unknown_tags: int = 0     # tag names in answers that are not in the vocabulary (dropped)
  cache_hits: int = 0       # trajectories answered from the cache (earlier or same call)
  requests: int = 0         # prompts sent to the model (first attempts)
  retries: int = 0          # extra attempts after transient errors
  failed_requests: int = 0  # prompts that got no answer after all retries

  def as_dict(self) -> dict[str, int]:
    return dataclasses.asdict(self)


class Judge(abc.ABC):
  """Tags rollouts with the rubric vocabulary."""

  backend: str = ""

  def __init__(self, vocab: Vocabulary):
    self.vocab = vocab

  @abc.abstractmethod
  def judge_trajectories(self, trajectories: Sequence[Trajectory]
                         ) -> tuple[list[Verdict], JudgeStats]:
    """One verdict per trajectory, in order, and the call's counters."""

  def judge(self, groups: Sequence[Group]) -> tuple[list[GroupTags], JudgeStats]:
    """The tags of every group's rollouts, in order, and the call's counters."""
    trajectories = [t for g in groups for t in g.trajectories]
    verdicts, stats = self.judge_trajectories(trajectories)
    if len(verdicts) != len(trajectories):
      raise RuntimeError(f"{self.backend} judge: {len(verdicts)} verdicts for "
                         f"{len(trajectories)} rollouts")
    if stats.unjudged:
      log.warning("%s judge: %d of %d rollouts unjudged (%d failed requests)", self.backend,
                  stats.unjudged, stats.judged, stats.failed_requests)
    out, start = [], 0
    for group in groups:
      mine = verdicts[start:start + len(group.trajectories)]
      start += len(group.trajectories)
      out.append(GroupTags(tags=np.stack([v.tags for v in mine]).astype(np.float32),
                           unjudged=np.asarray([v.unjudged for v in mine], bool)))
    return out, stats


class LLMJudge(Judge):
  """A judge that asks a language model; subclasses say how prompts are answered."""

  def __init__(self, vocab: Vocabulary, model: str, template_path: str | None = None,
               max_turns: int = 40, max_chars: int = 600,
               describe_task: Callable[[Trajectory], str] | None = None,
               cache_size: int = 100_000):
    super().__init__(vocab)
    if not model:
      raise ValueError(f"{self.backend} judge: model name is empty")
    if cache_size < 0:
      raise ValueError(f"{self.backend} judge: cache_size={cache_size}; expected >= 0")
    self.model = model
    self.prompt = JudgePrompt(vocab, template_path, max_turns, max_chars, describe_task)
    self._cache: collections.OrderedDict[str, str] = collections.OrderedDict()
    self._cache_size = cache_size

  @abc.abstractmethod
  def _answer(self, prompts: list[str], stats: JudgeStats) -> list[Any]:
    """The model's raw answer to each prompt (any type: a model server may send a number
    where text belongs); None where no answer could be obtained."""

  def cache_key(self, prompt: str) -> str:
    return hashlib.sha256("\x00".join((self.backend, self.model, prompt)).encode()).hexdigest()

  def judge_trajectories(self, trajectories: Sequence[Trajectory]
                         ) -> tuple[list[Verdict], JudgeStats]:
    stats = JudgeStats(judged=len(trajectories))
    keys = []
    to_ask: dict[str, str] = {}   # key -> prompt, each distinct uncached prompt once
    for traj in trajectories:
      prompt = self.prompt.render(traj)
      key = self.cache_key(prompt)
      keys.append(key)
      if key in self._cache or key in to_ask:
        stats.cache_hits += 1
      else:
        to_ask[key] = prompt
    answers = dict(zip(to_ask, self._answer(list(to_ask.values()), stats), strict=True))
    verdicts = []
    for key in keys:
      if key in self._cache:
        self._cache.move_to_end(key)
        verdict = parse_verdict(self._cache[key], self.vocab)
      else:
        verdict = parse_verdict(answers[key], self.vocab)
        if not verdict.unjudged and self._cache_size:
          self._cache[key] = verdict.raw
          while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
      stats.unjudged += verdict.unjudged
      stats.unknown_tags += len(verdict.unknown_tags)
      verdicts.append(verdict)
    return verdicts, stats


TRANSIENT, FAILED, FATAL = "transient", "failed", "fatal"


class RemoteJudge(LLMJudge):
  """An LLM judge behind an HTTP API: concurrent requests, retries, key scrubbing."""

  def __init__(self, vocab: Vocabulary, model: str, api_key_env: Sequence[str] = (),
               max_concurrency: int = 8, max_retries: int = 3, backoff_s: float = 1.0,
               max_backoff_s: float = 30.0, **llm_options):
    super().__init__(vocab, model, **llm_options)
    if max_concurrency < 1:
      raise ValueError(f"{self.backend} judge: max_concurrency={max_concurrency}; expected >= 1")
    if max_retries < 0 or backoff_s < 0 or max_backoff_s < 0:
      raise ValueError(f"{self.backend} judge: max_retries={max_retries}, backoff_s={backoff_s}, "
                       f"max_backoff_s={max_backoff_s}; expected non-negative values")
    self.api_key_env = tuple(api_key_env)
    self.max_concurrency = max_concurrency
    self.retry_policy = http_retry.RetryPolicy(max_retries=max_retries, backoff_s=backoff_s,
                                               max_backoff_s=max_backoff_s)
    self._lock = threading.Lock()

  @abc.abstractmethod
  def _request(self, prompt: str) -> Any:
    """One attempt at answering `prompt`; raises the client's exception on failure."""

  @abc.abstractmethod
  def _classify(self, error: Exception) -> str:
    """TRANSIENT (retry), FAILED (untag this rollout) or FATAL (misconfiguration: raise)."""

  @property
  def endpoint(self) -> str:
    return ""

  def _api_key_from_env(self) -> str | None:
    """The first non-empty variable of `api_key_env`; read when needed, never stored."""
    for name in self.api_key_env:
      value = os.environ.get(name, "").strip()
      if value:
        return value
    return None

  def scrub(self, text: str) -> str:
    """`text` with the value of every API-key variable replaced by a marker."""
    for name in self.api_key_env:
      value = os.environ.get(name, "").strip()
      if len(value) >= 4:
        text = text.replace(value, "[REDACTED]")
    return text

  def __repr__(self) -> str:
    return (f"{type(self).__name__}(model={self.model!r}, endpoint={self.endpoint!r}, "
            f"max_concurrency={self.max_concurrency})")

  @staticmethod
  def _retry_after(error: BaseException) -> float | None:
    """The Retry-After of the HTTP response an SDK error carries (openai, google-genai)."""
    headers = getattr(getattr(error, "response", None), "headers", None)
    return http_retry.parse_retry_after(headers.get("retry-after")) if headers else None

  def _answer_one(self, prompt: str, stats: JudgeStats) -> Any:
    def on_retry(error: BaseException, wait_s: float) -> None:
      with self._lock:
        stats.retries += 1
      log.info("%s judge: transient error, retry in %.2fs: %s", self.backend, wait_s,
               self.scrub(f"{type(error).__name__}: {error}"))

    try:
      return http_retry.call_with_retry(
          lambda: self._request(prompt), self.retry_policy,
          is_transient=lambda e: isinstance(e, Exception) and self._classify(e) == TRANSIENT,
          retry_after=self._retry_after, on_retry=on_retry)
    except Exception as e:  # pylint: disable=broad-except  # the client's own error types
      message = self.scrub(f"{type(e).__name__}: {e}")
      if self._classify(e) == FATAL:
        raise JudgeError(f"{self.backend} judge (model {self.model!r}, endpoint "
                         f"{self.endpoint!r}) is misconfigured: {message}") from None
      log.warning("%s judge: request failed, rollout left unjudged: %s", self.backend, message)
      with self._lock:
        stats.failed_requests += 1
      return None

  def _answer(self, prompts: list[str], stats: JudgeStats) -> list[Any]:
    stats.requests += len(prompts)
    if not prompts:
      return []
    with concurrent.futures.ThreadPoolExecutor(self.max_concurrency) as pool:
      futures = [pool.submit(self._answer_one, p, stats) for p in prompts]
      try:
        return [f.result() for f in futures]
      except JudgeError:
        for f in futures:
          f.cancel()
        raise
