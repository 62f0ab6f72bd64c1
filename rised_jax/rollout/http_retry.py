"""JSON over HTTP with timeouts and retries, for clients of model servers (SGLang, judges).

Standard library only (urllib), so no client library has to be pinned. One call = one request
with a timeout; `call_with_retry` repeats a call on *transient* failures with exponential backoff:

  retried:      connection refused/reset/dropped, timeouts, HTTP 5xx, a body that is not
                complete, valid JSON when JSON was expected
  not retried:  HTTP 4xx (the request itself is wrong: retrying cannot help); the error carries
                the server's own message

Every failure is an `HTTPRequestError` naming the method, URL, status and the server's message.
"""
from __future__ import annotations

import dataclasses
import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Callable, TypeVar

T = TypeVar("T")

# How much of an error body goes into an exception message.
_MAX_MESSAGE_CHARS = 2000


class HTTPRequestError(RuntimeError):
  """A failed HTTP exchange. `status` is None when no HTTP response came back at all."""

  def __init__(self, method: str, url: str, status: int | None, message: str, *,
               retryable: bool):
    self.method = method
    self.url = url
    self.status = status
    self.message = message
    self.retryable = retryable
    where = f"{method} {url}"
    what = f"HTTP {status}" if status is not None else "no response"
    super().__init__(f"{where} failed ({what}): {message}")


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
  """Attempts = 1 + max_retries; the wait before retry i (0-based) is
  min(backoff_s * multiplier**i, max_backoff_s)."""

  max_retries: int = 3
  backoff_s: float = 0.5
  multiplier: float = 2.0
  max_backoff_s: float = 30.0

  def __post_init__(self):
    if self.max_retries < 0:
      raise ValueError(f"RetryPolicy.max_retries must be >= 0, got {self.max_retries}")
    if self.backoff_s < 0 or self.max_backoff_s < 0:
      raise ValueError(f"RetryPolicy backoff must be >= 0, got backoff_s={self.backoff_s}, "
                       f"max_backoff_s={self.max_backoff_s}")
    if self.multiplier < 1:
      raise ValueError(f"RetryPolicy.multiplier must be >= 1, got {self.multiplier}")

  def delays(self) -> list[float]:
    """The waits before each retry, in order."""
    return [min(self.backoff_s * self.multiplier**i, self.max_backoff_s)
            for i in range(self.max_retries)]


def call_with_retry(call: Callable[[], T], policy: RetryPolicy, *,
                    sleep: Callable[[float], None] = time.sleep) -> T:
  """Runs `call`, retrying it while it raises a retryable `HTTPRequestError`.

  When the retries are spent, the last error is raised again with the attempt count added
  to its message; a non-retryable error is raised at once.
  """
  delays = policy.delays()
  for attempt in range(len(delays) + 1):
    try:
      return call()
    except HTTPRequestError as error:
      if not error.retryable:
        raise
      if attempt == len(delays):
        raise HTTPRequestError(
            error.method, error.url, error.status,
            f"{error.message} (gave up after {attempt + 1} attempts)",
            retryable=True) from error
      sleep(delays[attempt])
  raise AssertionError("unreachable: the loop returns or raises")


def _error_message(body: bytes) -> str:
  """The server's message from an error body: SGLang/FastAPI JSON shapes, else the raw text."""
  text = body.decode("utf-8", errors="replace").strip()
  try:
    parsed = json.loads(text)
  except ValueError:
    return text[:_MAX_MESSAGE_CHARS] or "(empty body)"
  if isinstance(parsed, dict):
    error = parsed.get("error")
    if isinstance(error, dict) and "message" in error:
      return str(error["message"])[:_MAX_MESSAGE_CHARS]
    for key in ("message", "detail", "error"):
      if key in parsed:
        return str(parsed[key])[:_MAX_MESSAGE_CHARS]
  return text[:_MAX_MESSAGE_CHARS]


def request(method: str, url: str, payload: Any = None, *, timeout_s: float) -> bytes:
  """One HTTP request (JSON body when `payload` is not None); returns the 2xx response body.

  `timeout_s` bounds each blocking socket operation (connect, each read), as in urllib.
  Raises HTTPRequestError: retryable for transport failures, timeouts, 5xx and incomplete
  bodies; not retryable for 4xx.
  """
  return _send(method, url, payload, timeout_s)[1]


def _send(method: str, url: str, payload: Any, timeout_s: float) -> tuple[int, bytes]:
  """`request`, also returning the status code."""
  data = None if payload is None else json.dumps(payload).encode("utf-8")
  headers = {"Content-Type": "application/json"} if data is not None else {}
  req = urllib.request.Request(url, data=data, method=method, headers=headers)
  try:
    with urllib.request.urlopen(req, timeout=timeout_s) as response:
      return response.status, response.read()
  except urllib.error.HTTPError as error:
    body = error.read() if error.fp is not None else b""
    raise HTTPRequestError(method, url, error.code, _error_message(body),
                           retryable=error.code >= 500) from error
  except http.client.IncompleteRead as error:
    raise HTTPRequestError(
        method, url, None,
        f"response body cut short ({len(error.partial)} bytes read)", retryable=True) from error
  except (TimeoutError, socket.timeout) as error:
    raise HTTPRequestError(method, url, None, f"timed out after {timeout_s:g} s",
                           retryable=True) from error
  except urllib.error.URLError as error:
    # Connection refused, DNS failure, a timeout while connecting.
    raise HTTPRequestError(method, url, None, f"connection failed: {error.reason}",
                           retryable=True) from error
  except (ConnectionError, http.client.HTTPException, OSError) as error:
    # The peer dropped the connection mid-exchange (RemoteDisconnected, reset, bad status line).
    raise HTTPRequestError(method, url, None, f"connection error: {error!r}",
                           retryable=True) from error


def request_json(method: str, url: str, payload: Any = None, *, timeout_s: float) -> Any:
  """`request`, then parses the body as JSON; a body that does not parse is retryable
  (a truncated or garbled response), with the start of the body in the message."""
  status, body = _send(method, url, payload, timeout_s)
  try:
    return json.loads(body)
  except ValueError as error:
    preview = body[:200].decode("utf-8", errors="replace")
    raise HTTPRequestError(method, url, status,
                           f"response is not valid JSON ({error}); body starts {preview!r}",
                           retryable=True) from error
