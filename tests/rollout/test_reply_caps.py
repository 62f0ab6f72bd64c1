"""Reply-size caps of every client that reads a server's reply through `http_retry` (issue 23
item 4): the SGLang engine and the remote environments. A 512 MB reply used to be read whole
(1.56 GB peak); now the read stops at the cap, with an error that names it, and is not retried.
Loopback servers only."""
from __future__ import annotations

import pytest

from rised_jax.envs.remote import RemoteEnvironment
from rised_jax import http_retry
from rised_jax.rollout.base import EngineFaults, GenerationRequest, SamplingParams
from rised_jax.rollout.sglang_engine import SGLangEngine, SGLangError
from tests.helpers.fake_sglang_server import FakeSGLangServer
from tests.helpers.loopback import Loopback, QuietHandler

MIB = 1 << 20
GREEDY = SamplingParams(max_new_tokens=4, temperature=0.0)


class FloodServer(Loopback):
  """Answers every POST with one JSON string of `total` bytes: announced (Content-Length) or
  chunked without a length; counts the bytes it got out before the client hung up."""

  def __init__(self, total: int, announce: bool):
    self.total, self.announce, self.sent = total, announce, 0
    server = self

    class Handler(QuietHandler):
      def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if server.announce:
          self.send_header("Content-Length", str(server.total))
        else:
          self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
          while server.sent < server.total:   # one JSON string: '"xxx…x"'
            part = bytearray(b"x" * min(MIB, server.total - server.sent))
            if server.sent == 0:
              part[0] = ord('"')
            if server.sent + len(part) == server.total:
              part[-1] = ord('"')
            self.wfile.write(part if server.announce else b"%x\r\n%s\r\n" % (len(part), part))
            server.sent += len(part)
          if not server.announce:
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
          pass   # the client stopped reading at its cap
        self.close_connection = True

    super().__init__(Handler)


def test_read_capped_stops_reading_at_the_cap():
  asked = []

  def endless(n: int) -> bytes:   # a server that never stops sending
    asked.append(n)
    return b"x" * n

  with pytest.raises(ValueError, match="more than 1000 bytes sent"):
    http_retry.read_capped(endless, 1000, None, ValueError)
  assert sum(asked) == 1001   # one byte past the cap tells it is over, no more is read
  pieces = iter([b"ab", b"cd", b""])
  assert http_retry.read_capped(lambda n: next(pieces), 4, None, ValueError) == b"abcd"
  with pytest.raises(ValueError, match="Content-Length 5"):
    http_retry.read_capped(endless, 4, 5, ValueError)


@pytest.mark.parametrize("announce", [True, False])
def test_a_flood_stops_at_the_cap_with_an_error_naming_it(announce):
  # 512 MB announced: refused before reading; 64 MiB chunked: the read stops after ~1 MiB.
  total = 512_000_000 if announce else 64 * MIB
  with FloodServer(total, announce) as flood:
    with pytest.raises(http_retry.ReplyTooLarge,
                       match=r"HTTP 200\): the reply is larger than max_reply_bytes=1048576 "
                             r"\((Content-Length 512000000|more than 1048576 bytes sent)\)") as err:
      http_retry.request_json("POST", flood.url + "/generate", {}, timeout_s=30.0,
                              max_reply_bytes=MIB)
  assert err.value.retryable is False and err.value.cap == MIB
  assert flood.sent < 16 * MIB   # what the socket buffers took before the client hung up


def test_a_reply_at_the_cap_is_read_whole():
  with FloodServer(MIB, announce=False) as flood:
    reply = http_retry.request_json("POST", flood.url, {}, timeout_s=30.0, max_reply_bytes=MIB)
  assert reply == "x" * (MIB - 2)


@pytest.fixture(scope="module")
def sglang():
  with FakeSGLangServer(huge_bytes=2 * MIB) as fake:
    yield fake


def test_sglang_a_reply_over_the_cap_fails_its_request_without_a_retry(sglang):
  sglang.reset()
  sglang.inject("/generate", "huge")
  with SGLangEngine(sglang.url, max_retries=3, backoff_s=0.001, max_reply_bytes=MIB) as client:
    with pytest.raises(SGLangError, match=r"request 0\) failed: .*larger than max_reply_bytes="
                                          r"1048576"):
      client.generate([GenerationRequest(prompt_ids=[1, 2, 3], params=GREEDY)])
    sglang.inject("/generate", "huge")
    generation = client.generate_counted([GenerationRequest(prompt_ids=[1, 2, 3], params=GREEDY)])
    assert generation.results == (None,)
    assert generation.faults == EngineFaults(server_retries=0, failed_requests=1)
  assert len(sglang.calls_to("/generate")) == 2


def test_sglang_a_large_reply_under_the_cap_is_used(sglang):
  sglang.reset()
  sglang.inject("/generate", "huge")
  with SGLangEngine(sglang.url, max_reply_bytes=4 * MIB) as client:
    (result,) = client.generate([GenerationRequest(prompt_ids=[1, 2, 3], params=GREEDY)])
  assert result.output_ids == [37, 68, 99, 130]   # the fake's rule: (6 + 31(i+1)) % 1000


@pytest.mark.parametrize("cap", [0, -1, 1.5, "1M"])
def test_the_cap_must_be_a_positive_integer(cap):
  with pytest.raises(ValueError, match=r"SGLangEngine: max_reply_bytes must be an integer >= 1"):
    SGLangEngine("http://127.0.0.1:1", max_reply_bytes=cap)
  with pytest.raises(ValueError, match=r"max_reply_bytes must be an integer in \[1, "):
    RemoteEnvironment(url="http://127.0.0.1:1", items=1, max_reply_bytes=cap)


def test_remote_environment_reply_over_the_cap_is_an_error_naming_it():
  with FloodServer(4 * MIB, announce=False) as flood:
    env = RemoteEnvironment(url=flood.url, items=3, retries=2, backoff_s=0.0,
                            max_reply_bytes=MIB)
    with pytest.raises(http_retry.ReplyTooLarge, match=r"POST http://127.0.0.1:\d+/create failed "
                                                       r".*max_reply_bytes=1048576"):
      env.reset(0)
