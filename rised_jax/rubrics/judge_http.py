"""The HTTP transport of the SDK judges (openai, google-genai): an overall deadline, a reply-size
cap and same-host redirects, whatever the SDK would do on its own.

Both SDKs send through an httpx2 client, and both take one from the caller (`openai.OpenAI(
http_client=)`, `google.genai.types.HttpOptions(httpx_client=)`). `client(...)` builds that
client on `GuardedTransport`, which plays each exchange with `rised_jax.http_retry.exchange`
(the stdlib transport of the SGLang client and the remote environments):

  deadline   `deadline(seconds)` around one SDK call bounds all of it: connect, send, headers,
             body and every redirect hop (a timer shuts the socket down when it expires, so a
             server that drips one byte at a time cannot hold the call past it). The SDKs' own
             timeouts are per read, and a 1-byte drip renewed them for a minute.
  size cap   a body is read up to `max_reply_bytes`; past it the read stops
             (`http_retry.ReplyTooLarge`, naming the cap). The reply is asked uncompressed
             (Accept-Encoding: identity) and a compressed one is refused, so the cap bounds
             what is decoded too.
  redirects  followed by the SDK's client only within the same origin (scheme, host and
             port); a redirect anywhere else raises `CrossHostRedirect` before any request is
             sent there, so a transcript never leaves for a host the config did not name.

How the judge treats each (`llm_judges`): the deadline and transport failures are transient
(retried), a reply over the cap or compressed leaves the rollout unjudged, a cross-host redirect
is a misconfiguration (JudgeError). What this transport does not do: HTTP proxies from the
environment (HTTPS_PROXY) and connection reuse; TLS is verified against the system's CAs.
"""
from __future__ import annotations

import contextlib
import threading
import time
import urllib.parse
from typing import Iterator

import httpx2

from rised_jax import http_retry

# The largest judge reply read (an answer is a few lines of JSON in an SDK envelope).
DEFAULT_MAX_REPLY_BYTES = 8 << 20
# Request headers the stdlib connection sets itself (identity encoding, one exchange per
# connection, the length of the body it sends).
_DROPPED_REQUEST_HEADERS = frozenset({"accept-encoding", "connection", "content-length"})
# Reply headers that describe the wire, not the body handed to the SDK (already de-chunked).
_DROPPED_REPLY_HEADERS = frozenset({"transfer-encoding", "content-length", "connection"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


class CrossHostRedirect(RuntimeError):
  """The judge's server redirected to another origin; nothing was sent there."""


def origin(url: str) -> tuple[str, str, int | None]:
  """(scheme, host, port) of a URL, with the scheme's default port filled in."""
  parts = urllib.parse.urlsplit(url)
  scheme = parts.scheme.lower()
  return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme)


class GuardedTransport(httpx2.BaseTransport):
  """An httpx2 transport with an overall deadline, a size cap and same-origin redirects
  (module docstring). `timeout_s` is the deadline of an exchange made outside `deadline()`."""

  def __init__(self, *, timeout_s: float, max_reply_bytes: int):
    if not timeout_s > 0:
      raise ValueError(f"judge transport: timeout_s must be > 0, got {timeout_s!r}")
    self.timeout_s = float(timeout_s)
    self.max_reply_bytes = http_retry.check_max_reply_bytes("judge", max_reply_bytes)
    self._scope = threading.local()   # the deadline of the SDK call this thread is in

  @contextlib.contextmanager
  def deadline(self, seconds: float) -> Iterator[None]:
    """Every exchange inside (all hops of one SDK call) ends `seconds` from now at the latest."""
    outer = getattr(self._scope, "deadline", None)
    self._scope.deadline = (time.monotonic() + seconds, seconds)
    try:
      yield
    finally:
      self._scope.deadline = outer

  def _seconds_left(self) -> tuple[float, float]:
    """(seconds left, the whole deadline) of the call this thread is in."""
    scope = getattr(self._scope, "deadline", None)
    if scope is None:
      return self.timeout_s, self.timeout_s
    return scope[0] - time.monotonic(), scope[1]

  def handle_request(self, request: httpx2.Request) -> httpx2.Response:
    url = str(request.url)
    left, whole = self._seconds_left()
    late = (f"{request.method} {url}: no complete answer within the judge call's deadline of "
            f"{whole:g} s (redirects included)")
    if left <= 0:
      raise httpx2.ReadTimeout(late, request=request)
    headers = {k: v for k, v in request.headers.items()
               if k.lower() not in _DROPPED_REQUEST_HEADERS}
    try:
      reply = http_retry.exchange(request.method, url, request.read() or None, headers,
                                  timeout_s=left, max_reply_bytes=self.max_reply_bytes)
    except http_retry.ReplyTooLarge:
      raise
    except http_retry.DeadlineExceeded as error:
      raise httpx2.ReadTimeout(late, request=request) from error
    except http_retry.HTTPRequestError as error:
      raise httpx2.ConnectError(str(error), request=request) from error
    encoding = (reply.header("Content-Encoding") or "identity").strip().lower()
    if encoding != "identity":
      raise http_retry.HTTPRequestError(
          request.method, url, reply.status, f"the reply is compressed (Content-Encoding: "
          f"{encoding}) though identity was asked; refused, its decoded size is unbounded",
          retryable=False)
    location = reply.header("Location")
    if 300 <= reply.status < 400 and location:
      target = urllib.parse.urljoin(url, location)
      if origin(target) != origin(url):
        raise CrossHostRedirect(
            f"{request.method} {url} answered HTTP {reply.status} redirecting to {target}, "
            "another host: the judge follows redirects within the same scheme, host and port "
            "only, so the transcript was not sent there")
    return httpx2.Response(reply.status, request=request, content=reply.body,
                           headers=[(k, v) for k, v in reply.headers
                                    if k.lower() not in _DROPPED_REPLY_HEADERS])


def client(*, timeout_s: float, max_reply_bytes: int) -> tuple[httpx2.Client, GuardedTransport]:
  """An httpx2 client on a `GuardedTransport` (for an SDK's `http_client` / `httpx_client`),
  and the transport (for `deadline`)."""
  transport = GuardedTransport(timeout_s=timeout_s, max_reply_bytes=max_reply_bytes)
  # trust_env=False: the transport takes no proxy, so none is read from the environment.
  # follow_redirects: the SDKs' own clients follow them (openai asks per request, google-genai
  # only through its client's default); the transport refuses those to another origin.
  return httpx2.Client(transport=transport, timeout=timeout_s, trust_env=False,
                       follow_redirects=True), transport
