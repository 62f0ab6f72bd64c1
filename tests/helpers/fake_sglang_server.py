"""A loopback stand-in for an SGLang server's native HTTP API, with fault injection.

Follows the request/response schema of SGLang's `/generate` (GenerateReqInput, SamplingParams),
`/update_weights_from_disk`, `/update_weights_from_tensor` (UpdateWeightsFromTensorReqInput:
one base64 text entry per TP rank; `tensor_loader` gets the decoded bytes of the first),
`/flush_cache`, `/health` and `/get_model_info` (as listed in
shared/peers/README.md and checked against sglang-jax 0.1.0rc0), and is strict about it:
unknown keys and invalid values are answered with HTTP 400 and SGLang's error shape
{"error": {"message": …}}, so a client that sends a wrong payload fails here.

Its "model" is a deterministic rule, so tests can assert exact outputs:
  output token i (0-based) = (sum(input_ids) + 31 * (i + 1) + sampling_seed) % vocab_size
  its log-prob            = -(token % 97) / 10 - 0.125 * i
Generation stops after a token in stop_token_ids or equal to eos_token_id ("stop"), else
after max_new_tokens ("length"). `no_stop_trim` and `skip_special_tokens` act on output_ids as
in SGLang. With `logprob_snapshots=True` it reproduces sglang-jax's quirk: above 50 output
tokens, output_token_logprobs = the first 50 entries followed by all of them.

Faults (`inject(path, fault, times)`) apply to the next `times` calls of that path; a rule
(`poison(fault, predicate)`) applies that fault to every /generate call whose JSON body the
predicate accepts, for as long as the server runs (until `reset`); `chaos(rate, kinds, seed,
predicate)` gives each accepted /generate call, with probability `rate`, a fault drawn
uniformly from `kinds` (a seeded stream), counting each in `injected`:
  "http500", "http400"   an error status with an SGLang-style message
  "drop"                 close the connection without answering
  "delay"                answer after `delay_s` seconds (meant to exceed the client's timeout)
  "truncate"             announce the full Content-Length, send half the body, close
  "bad_json"             a complete response whose body is not JSON
  "no_output_ids"        omit output_ids;  "wrong_ids": shift the ids in output_token_logprobs
  "abort"                finish_reason {"type": "abort", …}
  "http429", "http408", "http503"   that status, with `Retry-After: retry_after` when it is set
  "drip"                 a valid answer sent one byte every `drip_s` seconds
Replies that follow the schema but are impossible (the client must reject them):
  "bad_token"            the first token id is 10**6 (in output_ids and its log-prob entry)
  "nan_logprob", "positive_logprob"   the first log-prob is NaN (JSON NaN) or +50
  "too_many"             54 tokens, whatever max_new_tokens asked for (counts consistent)
  "short_logprobs"       one output_token_logprobs entry fewer than output_ids
  "empty"                no token at all, finish_reason "stop" (issue 23: impossible with
                         no_stop_trim, which keeps the stop token)
A reply too large to read (the client must stop at its cap):
  "huge"                 a valid reply padded with `huge_bytes` bytes of text
"""
from __future__ import annotations

import base64
import collections
import http.server
import json
import os
import random
import threading
import time
from typing import Any, Callable

from tests.helpers.loopback import LoopbackHTTPServer

# GenerateReqInput fields (sglang / sglang-jax io_struct.py) that a client may send.
GENERATE_KEYS = frozenset({
    "text", "input_ids", "input_embeds", "image_data", "sampling_params", "rid", "stream",
    "return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob",
    "return_text_in_logprobs", "lora_path", "return_hidden_states",
})
# SamplingParams.__init__ arguments (sampling_params.py).
SAMPLING_KEYS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n",
    "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias",
    "sampling_seed",
})
# UpdateWeightFromDiskReqInput fields.
UPDATE_WEIGHTS_KEYS = frozenset({
    "model_path", "load_format", "flush_cache", "abort_all_requests", "weight_version",
    "is_async", "torch_empty_cache", "keep_pause",
})
# UpdateWeightsFromTensorReqInput fields.
UPDATE_TENSOR_KEYS = frozenset({
    "serialized_named_tensors", "load_format", "flush_cache", "abort_all_requests",
    "weight_version", "disable_draft_model", "torch_empty_cache",
})
FAULTS = frozenset({"http500", "http400", "drop", "delay", "truncate", "bad_json",
                    "no_output_ids", "wrong_ids", "abort", "http429", "http408", "http503",
                    "drip", "bad_token", "nan_logprob", "positive_logprob", "too_many",
                    "short_logprobs", "empty", "huge"})
ERROR_FAULTS = {"http500": 500, "http400": 400, "http429": 429, "http408": 408, "http503": 503}
TOO_MANY = 54
SNAPSHOT_LEN = 50


class BadRequest(ValueError):
  """The request breaks SGLang's schema: answered with HTTP 400."""


def fake_generation(input_ids: list[int], sampling: dict[str, Any], vocab_size: int,
                    eos_token_id: int | None) -> tuple[list[int], list[float], dict[str, Any]]:
  """The fake model's tokens (before stop trimming), log-probs and finish_reason."""
  stops = set(sampling.get("stop_token_ids") or ())
  if eos_token_id is not None and not sampling.get("ignore_eos", False):
    stops.add(eos_token_id)
  base = sum(input_ids) + int(sampling.get("sampling_seed") or 0)
  tokens, logprobs = [], []
  for i in range(int(sampling.get("max_new_tokens", 128))):
    token = (base + 31 * (i + 1)) % vocab_size
    tokens.append(token)
    logprobs.append(-(token % 97) / 10 - 0.125 * i)
    if token in stops:
      return tokens, logprobs, {"type": "stop", "matched": token}
  return tokens, logprobs, {"type": "length", "length": len(tokens)}


def _check_generate_request(body: Any, vocab_size: int) -> None:
  if not isinstance(body, dict):
    raise BadRequest("the body must be a JSON object")
  unknown = set(body) - GENERATE_KEYS
  if unknown:
    raise BadRequest(f"unexpected GenerateReqInput fields {sorted(unknown)}")
  if (body.get("text") is None) == (body.get("input_ids") is None):
    raise BadRequest("exactly one of text or input_ids must be given")
  ids = body.get("input_ids")
  if not isinstance(ids, list) or not ids or not all(
      isinstance(t, int) and not isinstance(t, bool) for t in ids):
    raise BadRequest("this fake serves single, non-empty input_ids lists only")
  sampling = body.get("sampling_params", {})
  if not isinstance(sampling, dict):
    raise BadRequest("sampling_params must be an object")
  unknown = set(sampling) - SAMPLING_KEYS
  if unknown:
    raise BadRequest(
        f"SamplingParams.__init__() got unexpected keyword arguments {sorted(unknown)}")
  temperature = sampling.get("temperature", 1.0)
  top_k = sampling.get("top_k", -1)
  top_p = sampling.get("top_p", 1.0)
  if not isinstance(temperature, (int, float)) or temperature < 0:
    raise BadRequest(f"temperature must be non-negative, got {temperature}.")
  if not 0 < top_p <= 1:
    raise BadRequest(f"top_p must be in (0, 1], got {top_p}.")
  if temperature > 1e-6 and (top_k < 1 and top_k != -1):
    raise BadRequest(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
  if int(sampling.get("max_new_tokens", 128)) < 0:
    raise BadRequest("max_new_tokens must be at least 0")
  for token in sampling.get("stop_token_ids") or ():
    if not isinstance(token, int) or not 0 <= token < vocab_size:
      raise BadRequest(f"stop token id {token!r} is not in the vocabulary")


class FakeSGLangServer:
  """A threaded loopback server on a free port; use as a context manager."""

  def __init__(self, *, vocab_size: int = 1000, eos_token_id: int | None = None,
               special_token_ids: tuple[int, ...] = (), generate_delay_s: float = 0.0,
               delay_s: float = 2.0, logprob_snapshots: bool = False, drip_s: float = 0.05,
               retry_after: str | None = None, huge_bytes: int = 1 << 20,
               has_weight_endpoint: bool = True,
               weight_loader: Callable[[str], None] | None = None,
               has_tensor_endpoint: bool = True,
               tensor_loader: Callable[[bytes], None] | None = None):
    self.vocab_size = vocab_size
    self.eos_token_id = eos_token_id
    self.special_token_ids = frozenset(special_token_ids)
    self.generate_delay_s = generate_delay_s
    self.delay_s = delay_s
    self.logprob_snapshots = logprob_snapshots
    self.drip_s = drip_s
    self.retry_after = retry_after   # Retry-After header of injected 429/408/503 answers
    self.huge_bytes = huge_bytes     # padding of an injected "huge" reply
    self.has_weight_endpoint = has_weight_endpoint
    self.weight_loader = weight_loader   # called with model_path; raising = a failed load
    self.has_tensor_endpoint = has_tensor_endpoint
    self.tensor_loader = tensor_loader   # called with one entry's pickle bytes; raising = failed
    self.model_path = "/fake/model"
    self.weight_version: str | None = None
    self.calls: list[tuple[str, str, Any]] = []   # (method, path, parsed JSON body or None)
    self.in_flight = 0              # /generate requests being answered
    self.max_in_flight = 0
    self._active_handlers = 0       # requests of any kind being handled
    self._faults: dict[str, collections.deque[str]] = collections.defaultdict(collections.deque)
    self._rules: list[tuple[str, Callable[[Any], bool]]] = []
    self._chaos: tuple[float, tuple[str, ...], random.Random, Callable[[Any], bool]] | None = None
    self.injected: collections.Counter[str] = collections.Counter()   # chaos faults sent
    self._lock = threading.Lock()
    self._httpd = LoopbackHTTPServer(self._handler_class())
    self._thread: threading.Thread | None = None

  @property
  def url(self) -> str:
    host, port = self._httpd.server_address[:2]
    return f"http://{host}:{port}"

  def start(self) -> FakeSGLangServer:
    # A short poll interval makes stop() quick.
    self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)
    self._thread.start()
    return self

  def stop(self) -> None:
    self._httpd.shutdown()
    self._httpd.server_close()
    if self._thread is not None:
      self._thread.join(timeout=5)

  def __enter__(self) -> FakeSGLangServer:
    return self.start()

  def __exit__(self, *exc_info) -> None:
    self.stop()

  def inject(self, path: str, fault: str, times: int = 1) -> None:
    if fault not in FAULTS:
      raise ValueError(f"unknown fault {fault!r}; known: {sorted(FAULTS)}")
    with self._lock:
      self._faults[path].extend([fault] * times)

  def poison(self, fault: str, predicate: Callable[[Any], bool]) -> None:
    if fault not in FAULTS:
      raise ValueError(f"unknown fault {fault!r}; known: {sorted(FAULTS)}")
    with self._lock:
      self._rules.append((fault, predicate))

  def chaos(self, rate: float, kinds: tuple[str, ...], seed: int,
            predicate: Callable[[Any], bool] = lambda body: True) -> None:
    if unknown := set(kinds) - FAULTS:
      raise ValueError(f"unknown faults {sorted(unknown)}; known: {sorted(FAULTS)}")
    with self._lock:
      self._chaos = (rate, tuple(kinds), random.Random(seed), predicate)

  def calls_to(self, path: str) -> list[Any]:
    """The JSON bodies of the calls to `path`, in order."""
    with self._lock:
      return [body for _, p, body in self.calls if p == path]

  def reset(self, idle_timeout_s: float = 10.0) -> None:
    """Forgets calls and faults, after waiting for handlers still busy from earlier tests
    (a delayed answer the client stopped waiting for) so that they cannot count later."""
    deadline = time.monotonic() + idle_timeout_s
    while self._active_handlers and time.monotonic() < deadline:
      time.sleep(0.01)
    with self._lock:
      self.calls.clear()
      self._faults.clear()
      self._rules.clear()
      self._chaos = None
      self.injected.clear()
      self.max_in_flight = 0

  # -- responses ----------------------------------------------------------------------------

  def _next_fault(self, path: str, body: Any) -> str | None:
    with self._lock:
      queue = self._faults[path]
      if queue:
        return queue.popleft()
      if path != "/generate":
        return None
      fault = next((fault for fault, accepts in self._rules if accepts(body)), None)
      if fault is None and self._chaos is not None:
        rate, kinds, rng, accepts = self._chaos
        if accepts(body) and rng.random() < rate:
          fault = rng.choice(kinds)
          self.injected[fault] += 1
      return fault

  def _generate(self, body: Any, fault: str | None) -> dict[str, Any]:
    _check_generate_request(body, self.vocab_size)
    sampling = body.get("sampling_params", {})
    if sampling.get("temperature", 1.0) <= 1e-6:
      sampling = {**sampling, "sampling_seed": 0}   # greedy: the seed plays no part
    if fault == "too_many":
      sampling = {**sampling, "max_new_tokens": TOO_MANY}
    ids, logprobs, finish = fake_generation(body["input_ids"], sampling, self.vocab_size,
                                            self.eos_token_id)
    if fault == "bad_token":
      ids[0] = 10**6
    if fault in ("nan_logprob", "positive_logprob"):
      logprobs[0] = float("nan") if fault == "nan_logprob" else 50.0
    completion_tokens = len(ids)
    entries = [[lp, t, f"<{t}>"] for lp, t in zip(logprobs, ids)]
    output_ids = list(ids)
    if finish["type"] == "stop" and not sampling.get("no_stop_trim", False):
      output_ids = output_ids[:-1]
    if sampling.get("skip_special_tokens", True):
      output_ids = [t for t in output_ids if t not in self.special_token_ids]
    if self.logprob_snapshots and len(entries) > SNAPSHOT_LEN:
      entries = entries[:SNAPSHOT_LEN] + entries
    if fault == "short_logprobs":
      entries = entries[:-1]
    if fault == "wrong_ids":
      entries = [[lp, (t + 1) % self.vocab_size, s] for lp, t, s in entries]
    if fault == "abort":
      finish = {"type": "abort", "message": "injected abort", "status_code": 503,
                "err_type": None}
    meta_info: dict[str, Any] = {
        "id": f"fake-{len(self.calls)}", "finish_reason": finish,
        "prompt_tokens": len(body["input_ids"]), "completion_tokens": completion_tokens,
        "cached_tokens": 0,
    }
    if body.get("return_logprob"):
      meta_info["output_token_logprobs"] = entries
      start = body.get("logprob_start_len", -1)
      if start is not None and start >= 0:
        meta_info["input_token_logprobs"] = [
            [None if i == 0 else -1.0, t, f"<{t}>"] for i, t in enumerate(body["input_ids"])
            if i >= start]
    response: dict[str, Any] = {"text": " ".join(f"<{t}>" for t in output_ids),
                                "output_ids": output_ids, "meta_info": meta_info}
    if fault == "no_output_ids":
      del response["output_ids"]
    if fault == "empty":
      response["output_ids"], response["text"] = [], ""
      meta_info.update(completion_tokens=0, output_token_logprobs=[],
                       finish_reason={"type": "stop", "matched": None})
    if fault == "huge":
      response["text"] = "x" * self.huge_bytes
    return response

  def _update_weights(self, body: Any) -> tuple[int, dict[str, Any]]:
    if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
      raise BadRequest("model_path (a string) is required")
    unknown = set(body) - UPDATE_WEIGHTS_KEYS
    if unknown:
      raise BadRequest(f"unexpected UpdateWeightFromDiskReqInput fields {sorted(unknown)}")
    path = body["model_path"]
    try:
      if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"no config.json in {path}")
      if self.weight_loader is not None:
        self.weight_loader(path)
    except Exception as error:  # the server reports any load failure as success=false
      return 400, {"success": False, "message": f"Failed to update weights: {error}",
                   "num_paused_requests": 0}
    self.model_path = path
    self.weight_version = body.get("weight_version")
    return 200, {"success": True, "message": "Succeeded to update model weights.",
                 "num_paused_requests": 0}

  def _update_tensors(self, body: Any) -> tuple[int, dict[str, Any]]:
    if not isinstance(body, dict):
      raise BadRequest("the body must be a JSON object")
    unknown = set(body) - UPDATE_TENSOR_KEYS
    if unknown:
      raise BadRequest(f"unexpected UpdateWeightsFromTensorReqInput fields {sorted(unknown)}")
    entries = body.get("serialized_named_tensors")
    if not isinstance(entries, list) or not entries or not all(
        isinstance(e, str) for e in entries):
      raise BadRequest("serialized_named_tensors must be a non-empty list of base64 strings")
    try:
      data = base64.b64decode(entries[0], validate=True)
      if self.tensor_loader is not None:
        self.tensor_loader(data)
    except Exception as error:  # the server reports any load failure as success=false
      return 400, {"success": False, "message": f"Failed to update weights: {error}"}
    if body.get("weight_version") is not None:
      self.weight_version = body["weight_version"]
    return 200, {"success": True, "message": "Succeeded to update model weights."}

  def _handler_class(self) -> type[http.server.BaseHTTPRequestHandler]:
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"

      def log_message(self, *args: Any) -> None:   # keep test output clean
        pass

      def _send(self, status: int, body: bytes, content_type: str = "application/json",
                declared_length: int | None = None, headers: dict[str, str] | None = None,
                drip: bool = False) -> None:
        try:
          self.send_response(status)
          self.send_header("Content-Type", content_type)
          self.send_header("Content-Length", str(declared_length or len(body)))
          for name, value in (headers or {}).items():
            self.send_header(name, value)
          self.end_headers()
          if drip:
            for k in range(len(body)):
              self.wfile.write(body[k:k + 1])
              self.wfile.flush()
              time.sleep(server.drip_s)
          self.wfile.write(b"" if drip else body)
          self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
          pass   # the client gave up (timeout): nothing to answer

      def _send_json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode())

      def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else None

      def do_GET(self) -> None:
        self._dispatch("GET")

      def do_POST(self) -> None:
        self._dispatch("POST")

      def _dispatch(self, method: str) -> None:
        with server._lock:
          server._active_handlers += 1
        try:
          self._handle(method)
        finally:
          with server._lock:
            server._active_handlers -= 1

      def _handle(self, method: str) -> None:
        self.close_connection = True
        try:
          body = self._read_body()
        except ValueError:
          self._send_json(400, {"error": {"message": "the body is not valid JSON"}})
          return
        path = self.path
        with server._lock:
          server.calls.append((method, path, body))
        fault = server._next_fault(path, body)
        if fault == "drop":
          return   # no answer; the connection closes when the handler returns
        if fault == "delay":
          time.sleep(server.delay_s)
        if fault in ERROR_FAULTS:
          status = ERROR_FAULTS[fault]
          headers = ({"Retry-After": server.retry_after}
                     if server.retry_after is not None and status in (408, 429, 503) else None)
          self._send(status, json.dumps({"error": {"message": f"injected {fault}"}}).encode(),
                     headers=headers)
          return
        try:
          status, payload = self._route(method, path, body, fault)
        except BadRequest as error:
          self._send_json(400, {"error": {"message": str(error)}})
          return
        if isinstance(payload, str):
          self._send(status, payload.encode(), "text/plain; charset=utf-8")
          return
        raw = json.dumps(payload).encode()
        if fault == "truncate":
          self._send(status, raw[:len(raw) // 2], declared_length=len(raw))
        elif fault == "bad_json":
          self._send(status, raw[:len(raw) // 2])
        elif fault == "drip":
          self._send(status, raw, drip=True)
        else:
          self._send(status, raw)

      def _route(self, method: str, path: str, body: Any, fault: str | None) -> tuple[int, Any]:
        if (method, path) == ("GET", "/health"):
          return 200, ""
        if (method, path) == ("GET", "/get_model_info"):
          return 200, {"model_path": server.model_path, "tokenizer_path": server.model_path,
                       "is_generation": True, "preferred_sampling_params": None}
        if path == "/flush_cache":
          if server.in_flight:
            return 400, "Cache not flushed. Reason: requests are running or waiting.\n"
          return 200, "Cache flushed.\n"
        if (method, path) == ("POST", "/generate"):
          with server._lock:
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
          try:
            time.sleep(server.generate_delay_s)
            return 200, server._generate(body, fault)
          finally:
            with server._lock:
              server.in_flight -= 1
        if (method, path) == ("POST", "/update_weights_from_disk") and server.has_weight_endpoint:
          return server._update_weights(body)
        if (method, path) == ("POST", "/update_weights_from_tensor") and server.has_tensor_endpoint:
          return server._update_tensors(body)
        return 404, {"detail": "Not Found"}

    return Handler
