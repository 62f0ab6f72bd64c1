"""A loopback server speaking the Gemini API's wire format, for testing the google-genai judge.

`LoopbackServer` is a threaded stdlib HTTP server on 127.0.0.1, port 0, that records every
request and answers JSON from a subclass's `respond`. `FakeGenaiServer` implements
`POST /{api_version}/models/{model}:generateContent`: it checks the API-key header and the
JSON-output request fields as the real service does, and answers with the text a test's
`answer(prompt)` function returns, or with a Google-style error.
"""
from __future__ import annotations

import dataclasses
import http.server
import json
import re
import threading
from typing import Any, Callable

from tests.helpers.loopback import LoopbackHTTPServer


@dataclasses.dataclass
class Reply:
  """What the fake model answers: a text, or an HTTP error status with a message (and extra
  response headers, e.g. Retry-After). `text` may be any JSON value, to play a server that
  sends a number or an object where text belongs."""

  text: Any = ""
  status: int = 200
  message: str = ""
  headers: dict[str, str] = dataclasses.field(default_factory=dict)


Answer = Callable[[str], "Reply | str"]


@dataclasses.dataclass
class RecordedRequest:
  method: str
  path: str
  headers: dict[str, str]
  body: Any


class LoopbackServer:
  """Threaded HTTP server on an ephemeral loopback port; use as a context manager."""

  def __init__(self):
    self.requests: list[RecordedRequest] = []
    self._lock = threading.Lock()
    owner = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"
      disable_nagle_algorithm = True   # headers and body go out in separate writes

      def do_POST(self):  # pylint: disable=invalid-name  # the stdlib's naming
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
          body = json.loads(raw or b"null")
        except json.JSONDecodeError:
          body = raw.decode("utf-8", "replace")
        headers = {k.lower(): v for k, v in self.headers.items()}
        request = RecordedRequest("POST", self.path, headers, body)
        with owner._lock:
          owner.requests.append(request)
        status, payload, *extra = owner.respond(request)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (extra[0] if extra else {}).items():
          self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

      def log_message(self, *args):  # keep test output quiet
        del args

    self._server = LoopbackHTTPServer(Handler)
    # A short poll interval: shutdown() waits up to one interval.
    self._thread = threading.Thread(target=self._server.serve_forever, args=(0.01,),
                                    daemon=True)

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self._server.server_address[1]}"

  def respond(self, request: RecordedRequest) -> tuple[int, Any] | tuple[int, Any, dict]:
    """(status, JSON payload) or (status, JSON payload, extra headers)."""
    raise NotImplementedError

  def __enter__(self) -> "LoopbackServer":
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._server.shutdown()
    self._server.server_close()
    self._thread.join()


def as_reply(value: "Reply | str") -> Reply:
  return value if isinstance(value, Reply) else Reply(text=value)


class FakeGenaiServer(LoopbackServer):
  """Gemini's generateContent endpoint, answering with `answer(prompt)`."""

  def __init__(self, answer: Answer, api_key: str, api_version: str = "v1beta"):
    super().__init__()
    self.answer = answer
    self.api_key = api_key
    self._path = re.compile(rf"^/{re.escape(api_version)}/models/([^/:]+):generateContent$")

  @staticmethod
  def error(status: int, message: str, code_name: str, reason: str | None = None):
    error: dict[str, Any] = {"code": status, "message": message, "status": code_name}
    if reason:
      error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                           "reason": reason, "domain": "googleapis.com"}]
    return status, {"error": error}

  def respond(self, request: RecordedRequest) -> tuple[int, Any]:
    match = self._path.match(request.path)
    if not match:
      return self.error(404, f"Method not found: {request.path}", "NOT_FOUND")
    if request.headers.get("x-goog-api-key") != self.api_key:
      return self.error(400, "API key not valid. Please pass a valid API key.",
                        "INVALID_ARGUMENT", reason="API_KEY_INVALID")
    body = request.body if isinstance(request.body, dict) else {}
    config = body.get("generationConfig", {})
    if config.get("responseMimeType") != "application/json" or "responseSchema" not in config:
      return self.error(400, "expected JSON output with a response schema", "INVALID_ARGUMENT")
    try:
      prompt = "".join(p["text"] for p in body["contents"][-1]["parts"])
    except (KeyError, IndexError, TypeError):
      return self.error(400, "Invalid JSON payload: contents", "INVALID_ARGUMENT")
    reply = as_reply(self.answer(prompt))
    if reply.status != 200:
      names = {429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}
      return (*self.error(reply.status, reply.message or "error",
                          names.get(reply.status, "UNKNOWN")), reply.headers)
    return 200, {
        "candidates": [{"content": {"role": "model", "parts": [{"text": reply.text}]},
                        "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": len(prompt.split()),
                          "candidatesTokenCount": len(str(reply.text).split())},
        "modelVersion": match.group(1),
    }
