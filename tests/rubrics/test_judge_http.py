"""The SDK judges' guarded transport (issue 23 items 4, 5) through the real openai and
google-genai clients: an overall deadline per attempt (a 1-byte drip held the openai judge
59.6 s with timeout_s=2), a reply-size cap, and redirects followed within the same origin only
(a 307 to another host re-sent the transcript there). Loopback servers only: "another host" is
localhost where the judge was given 127.0.0.1."""
from __future__ import annotations

import json
import time

import pytest

from rised_jax.rubrics import GeminiJudge, JudgeError, OpenAICompatibleJudge
from rised_jax.rubrics import judge_http
from tests.helpers.fake_genai_server import FakeGenaiServer, RecordedRequest
from tests.helpers.fake_openai_server import FakeOpenAIServer
from tests.helpers.loopback import Loopback, QuietHandler
from tests.rubrics.test_llm_judges import (  # noqa: F401 - the fixtures, by name
    FAST_RETRY, MODEL, SECRET, all_unjudged, check_verdicts, gemini_key, make_groups,
    openai_key, scripted, vocab)

MIB = 1 << 20


class GuardProbe(Loopback):
  """A loopback judge server that answers as `fake` (the openai or genai fake) would, sent in
  the way `mode` says: "ok"; "drip" (the body one byte every `drip_s`), "drip_headers" (the
  status line and headers so); "huge" (the answer padded past 2 MiB); "redirect" (HTTP 307 to
  `location`, a URL template given this server's port). Counts the bytes it got out."""

  def __init__(self, fake, mode: str = "ok", drip_s: float = 0.05, location: str = ""):
    self.fake, self.mode, self.drip_s, self.location = fake, mode, drip_s, location
    self.requests: list[RecordedRequest] = []
    self.sent = 0
    self.total = 0
    probe = self

    class Handler(QuietHandler):
      def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        request = RecordedRequest("POST", self.path, {k.lower(): v for k, v in
                                                      self.headers.items()}, json.loads(raw))
        probe.requests.append(request)
        if probe.mode == "redirect" and not self.path.startswith("/moved"):
          target = probe.location.format(port=probe.port) + self.path
          self.wfile.write(f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {target}\r\n"
                           "Content-Length: 0\r\n\r\n".encode())
          return
        status, payload, *_ = probe.fake.respond(
            RecordedRequest("POST", self.path.removeprefix("/moved"), request.headers,
                            request.body))
        if probe.mode == "huge":
          payload = {**payload, "padding": "x" * (2 * MIB)}
        body = json.dumps(payload).encode()
        head = (f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        data = head + body
        probe.total = len(data)
        # What is dripped: the body ("drip") or the status line and headers ("drip_headers").
        slow = {"drip": (len(head), len(data)), "drip_headers": (0, len(head))}.get(
            probe.mode, (0, 0))
        try:
          self.wfile.write(data[:slow[0]])
          probe.sent = slow[0]
          for k in range(*slow):
            self.wfile.write(data[k:k + 1])
            self.wfile.flush()
            probe.sent = k + 1
            time.sleep(probe.drip_s)
          self.wfile.write(data[slow[1]:])
          probe.sent = len(data)
        except OSError:
          pass   # the client hung up

    super().__init__(Handler)


@pytest.fixture
def keys(gemini_key, openai_key):
  del gemini_key, openai_key   # both set (test_llm_judges' fixtures)


BACKENDS = {
    "openai": (lambda: FakeOpenAIServer(scripted, SECRET),
               lambda vocab, url, **kw: OpenAICompatibleJudge(vocab, model=MODEL,
                                                              base_url=url + "/v1", **kw)),
    "genai": (lambda: FakeGenaiServer(scripted, SECRET),
              lambda vocab, url, **kw: GeminiJudge(vocab, model=MODEL, base_url=url, **kw)),
}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_well_behaved_server_is_judged_through_the_guard(vocab, keys, backend):
  fake, judge = BACKENDS[backend]
  with GuardProbe(fake()) as probe:
    groups = make_groups([0, 1, 2, 3])
    tags, stats = judge(vocab, probe.url, **FAST_RETRY).judge(groups)
  check_verdicts(vocab, groups, tags, stats, [0, 1, 2, 3])
  assert probe.requests[0].headers["accept-encoding"] == "identity"


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("mode", ["drip", "drip_headers"])
def test_a_dripping_server_is_cut_at_the_deadline(vocab, keys, backend, mode):
  # ~600 bytes at one per 0.05 s is ~30 s; the attempt's deadline is 1 s, and every byte
  # renewed the SDKs' own per-read timeouts.
  fake, judge = BACKENDS[backend]
  with GuardProbe(fake(), mode=mode) as probe:
    groups = make_groups([0, 1])
    tags, stats = judge(vocab, probe.url, timeout_s=1.0, max_retries=0,
                        max_concurrency=1, **FAST_RETRY).judge(groups[:1])
    sent, total = probe.sent, probe.total
  assert all_unjudged(groups[:1], tags)
  assert stats.failed_requests == 2 and stats.retries == 0   # the group's two rollouts
  assert 0 < sent < total / 2   # the client hung up long before the drip ended


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_deadline_timeout_is_retried(vocab, keys, backend):
  fake, judge = BACKENDS[backend]
  with GuardProbe(fake(), mode="drip") as probe:
    _, stats = judge(vocab, probe.url, timeout_s=0.5, max_retries=1,
                     **FAST_RETRY).judge(make_groups([0]))
  assert (stats.retries, stats.failed_requests) == (1, 1) and len(probe.requests) == 2


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_reply_over_the_cap_leaves_the_rollout_unjudged_without_a_retry(vocab, keys, backend):
  fake, judge = BACKENDS[backend]
  with GuardProbe(fake(), mode="huge") as probe:
    groups = make_groups([0])
    tags, stats = judge(vocab, probe.url, max_reply_bytes=MIB, max_retries=3,
                        **FAST_RETRY).judge(groups)
  assert all_unjudged(groups, tags)
  assert (stats.failed_requests, stats.retries, len(probe.requests)) == (1, 0, 1)
  with GuardProbe(fake(), mode="huge") as probe:   # under a larger cap it is judged
    groups = make_groups([0, 1])
    tags, stats = judge(vocab, probe.url, max_reply_bytes=4 * MIB, **FAST_RETRY).judge(groups)
  check_verdicts(vocab, groups, tags, stats, [0, 1])


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_redirect_to_another_host_is_refused_and_nothing_is_sent_there(vocab, keys, backend):
  fake, judge = BACKENDS[backend]
  with GuardProbe(fake()) as elsewhere:
    target = elsewhere.url.replace("127.0.0.1", "localhost") + "/moved"
    with GuardProbe(fake(), mode="redirect", location=target) as probe:
      with pytest.raises(JudgeError, match=r"misconfigured: CrossHostRedirect: .*HTTP 307 "
                                           r"redirecting to http://localhost:\d+/moved.*another "
                                           r"host.*was not sent there"):
        judge(vocab, probe.url, **FAST_RETRY).judge(make_groups([0]))
    assert len(probe.requests) == 1
  assert elsewhere.requests == []


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_redirect_within_the_same_host_is_followed(vocab, keys, backend):
  fake, judge = BACKENDS[backend]
  with GuardProbe(fake(), mode="redirect", location="http://127.0.0.1:{port}/moved") as probe:
    groups = make_groups([0, 1])
    tags, stats = judge(vocab, probe.url, **FAST_RETRY).judge(groups)
  check_verdicts(vocab, groups, tags, stats, [0, 1])
  assert sorted(r.path.startswith("/moved") for r in probe.requests) == [False, False, True, True]


def test_origins_compare_scheme_host_and_default_port():
  assert judge_http.origin("https://API.example.com/v1") == ("https", "api.example.com", 443)
  assert judge_http.origin("http://127.0.0.1:8000/x") == ("http", "127.0.0.1", 8000)
  assert judge_http.origin("http://h/a") == judge_http.origin("http://h:80/b")
  assert judge_http.origin("http://h/a") != judge_http.origin("https://h/a")
