"""A loopback server speaking the OpenAI chat-completions wire format (as SGLang serves it).

`POST /v1/chat/completions`: checks the bearer key (when one is configured) and that JSON
output was requested, then answers with the text a test's `answer(prompt)` returns, or with
an OpenAI-style error. Built on `LoopbackServer` from fake_genai_server.py.
"""
from __future__ import annotations

import time
from typing import Any

from tests.helpers.fake_genai_server import Answer, LoopbackServer, RecordedRequest, as_reply


class FakeOpenAIServer(LoopbackServer):
  """An OpenAI-compatible /v1/chat/completions endpoint, answering with `answer(prompt)`."""

  def __init__(self, answer: Answer, api_key: str | None = None):
    super().__init__()
    self.answer = answer
    self.api_key = api_key

  @staticmethod
  def error(status: int, message: str, kind: str, code: str | None = None):
    return status, {"error": {"message": message, "type": kind, "param": None, "code": code}}

  def respond(self, request: RecordedRequest) -> tuple[int, Any]:
    if request.path != "/v1/chat/completions":
      return self.error(404, f"Not Found: {request.path}", "not_found_error")
    if self.api_key is not None:
      given = request.headers.get("authorization", "")
      if given != f"Bearer {self.api_key}":
        # Quotes the key it got, as some servers do: the judge must scrub it.
        return self.error(401, f"Incorrect API key provided: {given.removeprefix('Bearer ')}",
                          "invalid_request_error", "invalid_api_key")
    body = request.body if isinstance(request.body, dict) else {}
    if body.get("response_format", {}).get("type") not in ("json_schema", "json_object"):
      return self.error(400, "expected response_format json_schema or json_object",
                        "invalid_request_error")
    try:
      prompt = "".join(m["content"] for m in body["messages"] if m["role"] == "user")
    except (KeyError, TypeError):
      return self.error(400, "messages: expected a list of {role, content}",
                        "invalid_request_error")
    reply = as_reply(self.answer(prompt))
    if reply.status != 200:
      return (*self.error(reply.status, reply.message or "error", "server_error"), reply.headers)
    return 200, {
        "id": f"chatcmpl-{len(self.requests)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", ""),
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": reply.text}}],
        "usage": {"prompt_tokens": len(prompt.split()),
                  "completion_tokens": len(str(reply.text).split()),
                  "total_tokens": len(prompt.split()) + len(str(reply.text).split())},
    }
