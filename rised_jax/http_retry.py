"""HTTP with an overall deadline per request, and the one retry policy of every client of a
model server (the SGLang engine and the LLM judges).

Transport: `request` / `request_json` send one JSON request with the standard library's
http.client, so no HTTP client has to be pinned. `timeout_s` is a deadline for the whole
exchange (connect, send, status line, headers, body), not for each socket read: a timer shuts
the socket down when it expires, so a server that drips one byte at a time cannot hold a
request past it.

Retries (`call_with_retry`, built on tenacity): a call is repeated while its error is
transient, at most `RetryPolicy.max_retries` times:

  retried:      connection refused/reset/dropped, deadline exceeded, HTTP 408, 429 and 5xx, a
                body that is not complete, valid JSON when JSON was expected (and whatever else
                the caller's `is_transient` accepts: the SGLang engine adds replies that break
                its contract, the judges their clients' transport errors)
  not retried:  any other 4xx (the request itself is wrong: retrying cannot help); the error
                carries the server's own message

The wait before retry i (0-based) is drawn uniformly from [0, min(backoff_s · 2^i,
max_backoff_s)] ("full jitter", so clients that failed together do not retry together), and is
at least the server's Retry-After when it sent one. A Retry-After above `max_backoff_s` ends
the retries at once: waiting less would be refused again. So one call lasts at most
(max_retries + 1) · timeout_s + max_retries · max_backoff_s.

Size cap: a reply body is read in chunks and the read stops once it would pass
`max_reply_bytes` (or at once when the announced Content-Length does): `ReplyTooLarge`, naming
the cap, and never retried (the same request gets the same reply). Whatever a server sends, a
request holds at most about that many bytes of it in memory.

Every failure is an `HTTPRequestError` naming the method, URL, status and the server's message.
"""
from __future__ import annotations

import dataclasses
import http.client
import json
import random
import socket
import threading
import time
import urllib.parse
from typing import Any, Callable, TypeVar

import tenacity
import urllib3.exceptions
import urllib3.util.retry

from rised_jax.checks import is_int

T = TypeVar("T")

# How much of an error body goes into an exception message.
_MAX_MESSAGE_CHARS = 2000
# The default cap on one reply body (SGLang's client and the remote environments set their own).
DEFAULT_MAX_REPLY_BYTES = 64 << 20
_CHUNK_BYTES = 1 << 16
_RETRY_AFTER = urllib3.util.retry.Retry(0)   # only its Retry-After parser (seconds or a date)


def is_retryable_status(status: int) -> bool:
  """HTTP statuses worth another attempt: timeout (408), rate limit (429), server errors."""
  return status in (408, 429) or 500 <= status <= 599


def parse_retry_after(value: str | None) -> float | None:
  """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date); None when
  absent or unreadable."""
  if value is None:
    return None
  try:
    return float(_RETRY_AFTER.parse_retry_after(value))
  except urllib3.exceptions.InvalidHeader:
    return None


class HTTPRequestError(RuntimeError):
  """A failed HTTP exchange. `status` is None when no HTTP response came back at all;
  `retry_after` is the server's Retry-After in seconds, if it sent one."""

  def __init__(self, method: str, url: str, status: int | None, message: str, *,
               retryable: bool, retry_after: float | None = None):
    self.method = method
    self.url = url
    self.status = status
    self.message = message
    self.retryable = retryable
    self.retry_after = retry_after
    where = f"{method} {url}"
    what = f"HTTP {status}" if status is not None else "no response"
    super().__init__(f"{where} failed ({what}): {message}")


class DeadlineExceeded(HTTPRequestError):
  """The exchange ran past its deadline (or a socket read past its timeout); retryable."""

  def __init__(self, method: str, url: str, message: str):
    super().__init__(method, url, None, message, retryable=True)


class ReplyTooLarge(HTTPRequestError):
  """A reply body above the caller's `max_reply_bytes`; never retried."""

  def __init__(self, method: str, url: str, status: int, cap: int, seen: str):
    super().__init__(method, url, status, f"the reply is larger than max_reply_bytes={cap} "
                     f"({seen}); the read stopped at the cap", retryable=False)
    self.cap = cap


def check_max_reply_bytes(where: str, value: Any) -> int:
  """`value` as a reply cap (an integer >= 1); ValueError naming `where` otherwise."""
  if not is_int(value) or value < 1:
    raise ValueError(f"{where}: max_reply_bytes must be an integer >= 1 (bytes), got {value!r}")
  return int(value)


def read_capped(read: Callable[[int], bytes], cap: int, announced: int | None,
                too_large: Callable[[str], Exception]) -> bytes:
  """The whole body from `read(n)` (at most n bytes a call, b"" at the end), stopping with
  `too_large(what was seen)` as soon as it would pass `cap` bytes or the announced length does."""
  if announced is not None and announced > cap:
    raise too_large(f"Content-Length {announced}")
  chunks, size = [], 0
  while chunk := read(min(_CHUNK_BYTES, cap + 1 - size)):
    chunks.append(chunk)
    size += len(chunk)
    if size > cap:
      raise too_large(f"more than {cap} bytes sent")
  return b"".join(chunks)


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
  """Attempts = 1 + max_retries; waits as in the module docstring."""

  max_retries: int = 3
  backoff_s: float = 0.5
  max_backoff_s: float = 30.0

  def __post_init__(self):
    if not is_int(self.max_retries) or \
        self.max_retries < 0:
      raise ValueError(f"RetryPolicy.max_retries must be >= 0 (an integer), got "
                       f"{self.max_retries!r}")
    if not (self.backoff_s >= 0 and self.max_backoff_s >= 0):   # also rejects NaN
      raise ValueError(f"RetryPolicy backoff must be >= 0, got backoff_s={self.backoff_s}, "
                       f"max_backoff_s={self.max_backoff_s}")

  def wait_cap(self, retry: int) -> float:
    """The upper end of the jittered wait before retry `retry` (0-based)."""
    return min(self.backoff_s * 2.0**retry, self.max_backoff_s)


def _http_transient(error: BaseException) -> bool:
  return isinstance(error, HTTPRequestError) and error.retryable


def _http_retry_after(error: BaseException) -> float | None:
  return error.retry_after if isinstance(error, HTTPRequestError) else None


def call_with_retry(call: Callable[[], T], policy: RetryPolicy, *,
                    is_transient: Callable[[BaseException], bool] = _http_transient,
                    retry_after: Callable[[BaseException], float | None] = _http_retry_after,
                    on_retry: Callable[[BaseException, float], None] | None = None,
                    sleep: Callable[[float], None] = time.sleep,
                    uniform: Callable[[float, float], float] | None = None) -> T:
  """Runs `call`, retrying it while it raises an error that `is_transient` accepts.

  `on_retry(error, wait_s)` is called before each wait (for counters and logs). When the
  retries are spent (or a Retry-After is too long), an `HTTPRequestError` is raised again with
  the attempt count added to its message, any other error as it is; an error that is not
  transient is raised at once. `sleep` and `uniform` (the jitter's random draw) are for tests.
  """
  draw = uniform or random.uniform

  def wait(state: tenacity.RetryCallState) -> float:
    error = state.outcome.exception()
    jittered = draw(0.0, policy.wait_cap(state.attempt_number - 1))
    return max(jittered, retry_after(error) or 0.0)

  def stop(state: tenacity.RetryCallState) -> bool:
    return (state.attempt_number > policy.max_retries or
            state.upcoming_sleep > policy.max_backoff_s)

  def before_sleep(state: tenacity.RetryCallState) -> None:
    if on_retry is not None:
      on_retry(state.outcome.exception(), state.upcoming_sleep)

  retrying = tenacity.Retrying(sleep=sleep, wait=wait, stop=stop,
                               retry=tenacity.retry_if_exception(is_transient),
                               before_sleep=before_sleep)
  try:
    return retrying(call)
  except tenacity.RetryError as gave_up:
    last = gave_up.last_attempt
    error = last.exception()
    if not isinstance(error, HTTPRequestError):
      raise error from None
    asked = retry_after(error)
    why = (f"the server asked to retry after {asked:g} s, more than max_backoff_s="
           f"{policy.max_backoff_s:g}; " if asked is not None and asked > policy.max_backoff_s
           else "")
    raise HTTPRequestError(
        error.method, error.url, error.status,
        f"{error.message} ({why}gave up after {last.attempt_number} attempts)",
        retryable=True, retry_after=error.retry_after) from error


def _error_message(body: bytes) -> str:
  """The server's message from an error body: SGLang/FastAPI JSON shapes, else the raw text."""
  text = body.decode("utf-8", errors="replace").strip()
  try:
    parsed = json.loads(text)
  except (ValueError, RecursionError):
    return text[:_MAX_MESSAGE_CHARS] or "(empty body)"
  if isinstance(parsed, dict):
    error = parsed.get("error")
    if isinstance(error, dict) and "message" in error:
      return str(error["message"])[:_MAX_MESSAGE_CHARS]
    for key in ("message", "detail", "error"):
      if key in parsed:
        return str(parsed[key])[:_MAX_MESSAGE_CHARS]
  return text[:_MAX_MESSAGE_CHARS]


class _Deadline:
  """Shuts a connection's socket down when `seconds` have passed since `start`: a blocked
  read then returns at once, whatever the server is (slowly) sending."""

  def __init__(self, connection: http.client.HTTPConnection, start: float, seconds: float):
    self.expired = False
    self._connection = connection
    self._lock = threading.Lock()
    self._timer = threading.Timer(max(0.0, start + seconds - time.monotonic()), self._expire)
    self._timer.daemon = True
    self._timer.start()

  def _expire(self) -> None:
    with self._lock:
      self.expired = True
      sock = self._connection.sock
      if sock is not None:
        try:
          sock.shutdown(socket.SHUT_RDWR)
        except OSError:
          pass   # already closed

  def cancel(self) -> bool:
    """Stops the timer; True when the deadline had already expired."""
    self._timer.cancel()
    with self._lock:
      return self.expired


def request(method: str, url: str, payload: Any = None, *, timeout_s: float,
            max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES) -> bytes:
  """One HTTP request (JSON body when `payload` is not None); returns the 2xx response body.

  `timeout_s` bounds the whole exchange and `max_reply_bytes` the body read (module
  docstring). Raises HTTPRequestError: retryable for transport failures, the deadline,
  408/429/5xx and incomplete bodies; not retryable for the other statuses and a body over
  the cap (`ReplyTooLarge`).
  """
  return _send(method, url, payload, timeout_s, max_reply_bytes)[1]


def _read_body(response: http.client.HTTPResponse, method: str, url: str, cap: int) -> bytes:
  """The response body, read up to `cap` bytes (`read_capped`); a body the server announced
  and then cut short is an IncompleteRead, as http.client's whole-body read reports it."""
  announced = response.length   # Content-Length (None when chunked or absent)
  body = read_capped(response.read, cap, announced,
                     lambda seen: ReplyTooLarge(method, url, response.status, cap, seen))
  if announced is not None and len(body) < announced:
    raise http.client.IncompleteRead(body, announced - len(body))
  return body


@dataclasses.dataclass(frozen=True)
class Reply:
  """What one exchange got back: the status, the headers (in order) and the whole body."""

  status: int
  headers: list[tuple[str, str]]
  body: bytes

  def header(self, name: str) -> str | None:
    return next((v for k, v in self.headers if k.lower() == name.lower()), None)


def exchange(method: str, url: str, body: bytes | None, headers: dict[str, str], *,
             timeout_s: float, max_reply_bytes: int) -> Reply:
  """One HTTP exchange under the deadline and the size cap (module docstring), whatever the
  status it answers; no redirect is followed. For clients that bring their own status
  handling (the judges' SDKs, through `rubrics.judge_http`). Raises HTTPRequestError
  (retryable) for transport failures, the deadline and cut bodies, `ReplyTooLarge` over
  the cap."""
  parts = urllib.parse.urlsplit(url)
  target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
  kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
  start = time.monotonic()
  connection = kind(parts.hostname, parts.port, timeout=timeout_s)
  deadline = None
  late = DeadlineExceeded(method, url, f"timed out after {timeout_s:g} s (the deadline of the "
                          "whole request)")
  try:
    connection.connect()
    deadline = _Deadline(connection, start, timeout_s)
    connection.request(method, target, body=body, headers=headers)
    response = connection.getresponse()
    reply = Reply(response.status, response.getheaders(),
                  _read_body(response, method, url, max_reply_bytes))
  except http.client.IncompleteRead as error:
    if deadline is not None and deadline.cancel():
      raise late from error
    raise HTTPRequestError(
        method, url, None,
        f"response body cut short ({len(error.partial)} bytes read)", retryable=True) from error
  except (TimeoutError, socket.timeout) as error:
    raise DeadlineExceeded(method, url, f"timed out after {timeout_s:g} s") from error
  except (ConnectionError, http.client.HTTPException, OSError) as error:
    # Refused, DNS failure, the peer dropped the connection mid-exchange, or our deadline.
    if deadline is not None and deadline.cancel():
      raise late from error
    what = "connection failed" if deadline is None else "connection error"
    raise HTTPRequestError(method, url, None, f"{what}: {error!r}", retryable=True) from error
  finally:
    if deadline is not None:
      deadline.cancel()
    connection.close()
  if deadline.cancel():
    raise late   # the body may have been cut at the deadline without an error
  return reply


def _send(method: str, url: str, payload: Any, timeout_s: float,
          max_reply_bytes: int) -> tuple[int, bytes]:
  """`request`, also returning the status code."""
  data = None if payload is None else json.dumps(payload).encode("utf-8")
  headers = {"Content-Type": "application/json"} if data is not None else {}
  reply = exchange(method, url, data, headers, timeout_s=timeout_s,
                   max_reply_bytes=max_reply_bytes)
  if not 200 <= reply.status < 300:
    raise HTTPRequestError(method, url, reply.status, _error_message(reply.body),
                           retryable=is_retryable_status(reply.status),
                           retry_after=parse_retry_after(reply.header("Retry-After")))
  return reply.status, reply.body


def request_json(method: str, url: str, payload: Any = None, *, timeout_s: float,
                 max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES) -> Any:
  """`request`, then parses the body as JSON; a body that does not parse is retryable
  (a truncated or garbled response), with the start of the body in the message."""
  status, body = _send(method, url, payload, timeout_s, max_reply_bytes)
  try:
    return json.loads(body)
  except (ValueError, RecursionError) as error:
    preview = body[:200].decode("utf-8", errors="replace")
    raise HTTPRequestError(method, url, status,
                           f"response is not valid JSON ({error}); body starts {preview!r}",
                           retryable=True) from error
