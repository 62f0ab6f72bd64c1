"""LLM judge backends: Gemini (google-genai), OpenAI-compatible servers (SGLang), in-process.

All three render the same prompt, parse answers with the same lenient parser and share the
cache (see judge.py). The HTTP backends ask for JSON output constrained by a schema whose
tag items are the vocabulary's ids.

API keys are read from the environment only, at construction, and handed to the client;
this module keeps no copy and scrubs the value from any error text it logs or raises.

Both SDK clients send through `judge_http` (an httpx2 client handed to the SDK): each attempt
has an overall deadline (`timeout_s`), each reply a size cap (`max_reply_bytes`), and a
redirect is followed only within the endpoint's own scheme, host and port. A timeout is
retried, a reply over the cap leaves its rollout unjudged, and a redirect to another host is a
misconfiguration (JudgeError): the transcript is never sent there.

Options (besides those of `LLMJudge` / `RemoteJudge`: template_path, max_turns, max_chars,
describe_task, cache_size, max_concurrency, max_retries, backoff_s, max_backoff_s):

| backend        | option           | default                          | meaning |
| -------------- | ---------------- | -------------------------------- | ------- |
| genai          | model            | "gemini-2.5-flash"               | model name |
|                | base_url         | None (Google's endpoint)         | e.g. a proxy or a loopback test server |
|                | api_version      | "v1beta"                         | path prefix: /{api_version}/models/{model}:generateContent |
|                | api_key_env      | ("GEMINI_API_KEY", "GOOGLE_API_KEY") | variables tried in order |
|                | temperature      | 0.0                              | sampling temperature |
|                | generation_config| None                             | extra `GenerateContentConfig` fields (e.g. thinking_config) |
| openai         | model            | (required)                       | the served model's name |
|                | base_url         | "http://127.0.0.1:30000/v1"      | SGLang's default port |
|                | api_key_env      | ("OPENAI_API_KEY",)              | unset → "EMPTY" (SGLang without --api-key) |
|                | response_format  | "json_schema"                    | or "json_object", or "none" (prompt only) |
|                | temperature      | 0.0                              | |
|                | max_tokens       | 512                              | answer length cap |
| genai, openai  | timeout_s        | 60                               | deadline of one attempt as a whole: connect, send, the whole answer, redirects |
|                | max_reply_bytes  | 8 MiB (`judge_http`)             | largest reply read; a larger one leaves the rollout unjudged |
| inprocess      | generate_text    | (required)                       | callable list[str] → list[str] |
|                | model            | "in-process"                     | name used in the cache key |
|                | batch_size       | None (all prompts at once)       | prompts per call |
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Sequence

from rised_jax import http_retry
from rised_jax.rubrics.judge import (FAILED, FATAL, TRANSIENT, JudgeError, JudgeStats, LLMJudge,
                                     RemoteJudge)
from rised_jax.rubrics.vocabulary import Vocabulary

_FATAL_STATUS = frozenset({401, 403, 404})


def _guard_failure(error: BaseException) -> str | None:
  """How the judge treats a failure of the guarded transport (`judge_http`), None for others:
  a cross-host redirect is a misconfiguration, a reply refused for its size or encoding
  leaves the rollout unjudged."""
  from rised_jax.rubrics import judge_http  # pylint: disable=import-outside-toplevel
  if isinstance(error, judge_http.CrossHostRedirect):
    return FATAL
  if isinstance(error, http_retry.HTTPRequestError) and not error.retryable:
    return FAILED
  return None


def _classify_status(status: int | None) -> str:
  if status is not None and http_retry.is_retryable_status(status):
    return TRANSIENT
  if status in _FATAL_STATUS:
    return FATAL
  return FAILED


def _http_transport_errors() -> tuple[type[Exception], ...]:
  """Connection/timeout errors of httpx or its fork httpx2, whichever the client runs on."""
  errors = []
  for name in ("httpx", "httpx2"):
    try:
      errors.append(importlib.import_module(name).TransportError)
    except ImportError:
      continue
  return tuple(errors)


def _tags_schema(vocab: Vocabulary, upper_case_types: bool) -> dict[str, Any]:
  """JSON schema {"tags": [id, ...]} (Gemini spells types in upper case)."""
  def t(name: str) -> str:
    return name.upper() if upper_case_types else name
  return {"type": t("object"),
          "properties": {"tags": {"type": t("array"),
                                  "items": {"type": t("string"), "enum": vocab.ids}}},
          "required": ["tags"]}


class _GuardedJudge(RemoteJudge):
  """A remote judge whose SDK sends through `judge_http`'s guarded client."""

  def _guarded_client(self, timeout_s: float, max_reply_bytes: int | None):
    """The httpx2 client to hand the SDK; keeps its transport for the per-call deadline."""
    from rised_jax.rubrics import judge_http  # pylint: disable=import-outside-toplevel
    if not timeout_s > 0:
      raise ValueError(f"{self.backend} judge: timeout_s={timeout_s!r}; expected > 0 seconds")
    self.timeout_s = float(timeout_s)
    http_client, self._transport = judge_http.client(
        timeout_s=timeout_s, max_reply_bytes=(judge_http.DEFAULT_MAX_REPLY_BYTES
                                              if max_reply_bytes is None else max_reply_bytes))
    return http_client


class GeminiJudge(_GuardedJudge):
  """Gemini through the google-genai client, with JSON output and a response schema."""

  backend = "genai"

  def __init__(self, vocab: Vocabulary, model: str = "gemini-2.5-flash",
               base_url: str | None = None, api_version: str = "v1beta",
               api_key_env: Sequence[str] = ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
               temperature: float = 0.0, generation_config: dict[str, Any] | None = None,
               timeout_s: float = 60.0,
               max_reply_bytes: int | None = None, **remote_options):
    # Imported here: google-genai is an optional extra ("judge").
    from google import genai  # pylint: disable=import-outside-toplevel
    from google.genai import types as genai_types  # pylint: disable=import-outside-toplevel
    super().__init__(vocab, model, api_key_env=api_key_env, **remote_options)
    http_client = self._guarded_client(timeout_s, max_reply_bytes)
    api_key = self._api_key_from_env()
    if api_key is None:
      raise JudgeError(f"genai judge: no API key; set one of {list(api_key_env)} in the "
                       "environment")
    self.base_url = base_url
    self._api_error = genai.errors.APIError
    self._transport_errors = _http_transport_errors()
    self._config = genai_types.GenerateContentConfig(
        response_mime_type="application/json",
        response_schema=_tags_schema(vocab, upper_case_types=True),
        temperature=temperature,
        # No tools are given, so the client's automatic function calling has nothing to do.
        automatic_function_calling=genai_types.AutomaticFunctionCallingConfig(disable=True),
        **(generation_config or {}))
    self._client = genai.Client(
        api_key=api_key, vertexai=False,
        http_options=genai_types.HttpOptions(base_url=base_url, api_version=api_version,
                                             timeout=int(timeout_s * 1000),
                                             httpx_client=http_client))

  @property
  def endpoint(self) -> str:
    return self.base_url or "https://generativelanguage.googleapis.com"

  def _request(self, prompt: str) -> Any:
    with self._transport.deadline(self.timeout_s):
      response = self._client.models.generate_content(model=self.model, contents=prompt,
                                                      config=self._config)
    # .text is None when the answer was blocked or empty: parsed as unjudged.
    return response.text or ""

  def _classify(self, error: Exception) -> str:
    if guarded := _guard_failure(error):
      return guarded
    if isinstance(error, self._api_error):
      # Gemini answers a bad key with 400 INVALID_ARGUMENT, reason API_KEY_INVALID.
      if error.code == 400 and "API_KEY_INVALID" in str(error.details):
        return FATAL
      return _classify_status(error.code)
    if isinstance(error, self._transport_errors):
      return TRANSIENT
    return FAILED


class OpenAICompatibleJudge(_GuardedJudge):
  """Any OpenAI-compatible chat server (an SGLang server's /v1) through the openai client."""

  backend = "openai"
  RESPONSE_FORMATS = ("json_schema", "json_object", "none")

  def __init__(self, vocab: Vocabulary, model: str,
               base_url: str = "http://127.0.0.1:30000/v1",
               api_key_env: Sequence[str] = ("OPENAI_API_KEY",),
               response_format: str = "json_schema", temperature: float = 0.0,
               max_tokens: int = 512, timeout_s: float = 60.0,
               max_reply_bytes: int | None = None, **remote_options):
    import openai  # pylint: disable=import-outside-toplevel  # optional extra ("judge")
    if response_format not in self.RESPONSE_FORMATS:
      raise ValueError(f"openai judge: response_format={response_format!r}; expected one of "
                       f"{list(self.RESPONSE_FORMATS)}")
    super().__init__(vocab, model, api_key_env=api_key_env, **remote_options)
    self.base_url = base_url
    self._openai = openai
    self._request_options: dict[str, Any] = {"temperature": temperature,
                                             "max_tokens": max_tokens}
    if response_format == "json_schema":
      self._request_options["response_format"] = {
          "type": "json_schema",
          "json_schema": {"name": "rubric_tags", "strict": True,
                          "schema": {**_tags_schema(vocab, upper_case_types=False),
                                     "additionalProperties": False}}}
    elif response_format == "json_object":
      self._request_options["response_format"] = {"type": "json_object"}
    # Retries are ours (with the shared accounting), so the client's own are off.
    self._client = openai.OpenAI(api_key=self._api_key_from_env() or "EMPTY", base_url=base_url,
                                 max_retries=0, timeout=timeout_s,
                                 http_client=self._guarded_client(timeout_s, max_reply_bytes))

  @property
  def endpoint(self) -> str:
    return self.base_url

  def _request(self, prompt: str) -> Any:
    with self._transport.deadline(self.timeout_s):
      completion = self._client.chat.completions.create(
          model=self.model, messages=[{"role": "user", "content": prompt}],
          **self._request_options)
    if not completion.choices:
      return ""
    # The client does not validate the reply: `content` is whatever JSON value the server
    # sent (a number, an object, NaN); the parser makes any non-text answer unjudged.
    return completion.choices[0].message.content

  def _classify(self, error: Exception) -> str:
    if guarded := _guard_failure(error):
      return guarded
    if isinstance(error, self._openai.APIConnectionError):   # includes timeouts
      return TRANSIENT
    if isinstance(error, self._openai.APIStatusError):
      return _classify_status(error.status_code)
    return FAILED


class InProcessJudge(LLMJudge):
  """A judge answered by an in-process model: any `generate_text(prompts) -> answers`.

  The callable runs in this process, so its exceptions are bugs and propagate; only the
  content of its answers is treated leniently.
  """

  backend = "inprocess"

  def __init__(self, vocab: Vocabulary, generate_text: Callable[[list[str]], list[str]],
               model: str = "in-process", batch_size: int | None = None, **llm_options):
    super().__init__(vocab, model, **llm_options)
    if not callable(generate_text):
      raise TypeError(f"inprocess judge: generate_text={generate_text!r} is not callable")
    if batch_size is not None and batch_size < 1:
      raise ValueError(f"inprocess judge: batch_size={batch_size}; expected >= 1 or None")
    self.generate_text = generate_text
    self.batch_size = batch_size

  def _answer(self, prompts: list[str], stats: JudgeStats) -> list[Any]:
    step = self.batch_size or max(len(prompts), 1)
    answers: list[Any] = []
    for start in range(0, len(prompts), step):
      chunk = prompts[start:start + step]
      stats.requests += len(chunk)
      out = list(self.generate_text(chunk))
      if len(out) != len(chunk):
        raise ValueError(f"inprocess judge: generate_text returned {len(out)} answers for "
                         f"{len(chunk)} prompts; expected one per prompt")
      answers += out   # non-text answers are unjudged by the parser
    return answers
