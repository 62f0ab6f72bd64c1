"""LLM judges through the real google-genai and openai clients against loopback servers.

Each test trajectory carries a marker "CASE-<n>" in its action text; the fake servers look it
up in the prompt and answer with that case's scripted text (or HTTP error).
"""
import logging
import random
import re
import string
import threading
import time

import pytest

from tests.helpers.fake_genai_server import FakeGenaiServer, Reply
from tests.helpers.fake_openai_server import FakeOpenAIServer
from rised_jax.rubrics import (GeminiJudge, InProcessJudge, JudgeError, OpenAICompatibleJudge,
                               Vocabulary, make_judge)
from rised_jax.types import Group, Task, Trajectory, Turn

SECRET = "sk-test-7f3a9c1e5b2d4a6f8e0c"
MODEL = "judge-model"
FAST_RETRY = {"backoff_s": 0.001, "max_backoff_s": 0.002}


def fuzz_cases():
  """(answer, expected tags or None for unjudged, expected unknown-tag count)."""
  cases = [
      ('{"tags": ["valid_syntax", "gave_up"]}', {"valid_syntax", "gave_up"}, 0),
      ('Verdict:\n```json\n{"tags": ["EFFICIENT", "makes progress"]}\n```',
       {"efficient", "makes_progress"}, 0),
      ('{"tags": ["issues invalid or malformed actions"]}', {"malformed_action"}, 0),
      ('{"tags": ["valid_syntax", "teleports"]}', {"valid_syntax"}, 1),
      ('{"tags": []}', set(), 0),
      ('{"tags": ["teleports", "flies"]}', None, 2),
      ('{"tags": [3, {"x": 1}]}', None, 2),
      ('{"tags": "valid_syntax"', None, 0),
      ('{"tags": ["valid_syntax", "gave', None, 0),
      ('{"tags": 12}', None, 0),
      ('{"tags": null}', None, 0),
      ("[1, 2]", None, 2),
      ("true", None, 0),
      ("{}", None, 0),
      ("", None, 0),
      ("   \n ", None, 0),
  ]
  rng = random.Random(1234)
  alphabet = string.ascii_letters + string.digits + ' {}[]":,\n'
  cases += [("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 200))), None, 0)
            for _ in range(24)]
  return cases


CASES = fuzz_cases()


def case_of(prompt: str) -> int:
  return int(re.search(r"CASE-(\d+)", prompt).group(1))


def make_groups(case_ids, duplicate_first=False):
  """One group per 2 cases; `duplicate_first` repeats case 0's transcript in one more group."""
  trajs = []
  for i in case_ids:
    turns = [Turn(f"CASE-{i} push box", "The box moved.", 0.0, False, False, ["progress"])]
    trajs.append(Trajectory(Task("sokoban", i), [], [], [], 0, turns, success=False,
                            reward=0.0, truncated=True))
  if duplicate_first:
    first = trajs[0]
    trajs.append(Trajectory(first.task, [], [], [], 0, list(first.turns), False, 0.0, True))
  return [Group(t.task, trajs[k:k + 2]) for k, t in enumerate(trajs) if k % 2 == 0]


def rows_of(groups, tags):
  """The judge's (tag row, unjudged) per rollout, in the groups' order; checks that `tags` has
  one GroupTags per group and one row per rollout."""
  assert [len(t.unjudged) for t in tags] == [len(g.trajectories) for g in groups]
  assert [len(t.tags) for t in tags] == [len(g.trajectories) for g in groups]
  return [(row, bool(flag)) for t in tags for row, flag in zip(t.tags, t.unjudged)]


def check_verdicts(vocab, groups, tags, stats, case_ids):
  rows = rows_of(groups, tags)
  assert len(rows) == len(case_ids)
  for (row, unjudged), i in zip(rows, case_ids):
    _, expected, _ = CASES[i]
    assert unjudged == (expected is None), (i, CASES[i][0])
    assert set(vocab.ids_of(row)) == (expected or set()), (i, CASES[i][0])
  assert stats.judged == len(case_ids)
  assert stats.unjudged == sum(CASES[i][1] is None for i in case_ids)
  assert stats.unknown_tags == sum(CASES[i][2] for i in case_ids)


def all_unjudged(groups, tags):
  """Every rollout of `groups` is unjudged, with a zero tag row."""
  return all(unjudged and not row.any() for row, unjudged in rows_of(groups, tags))


@pytest.fixture(scope="module")
def vocab():
  return Vocabulary.load("agentic_v1")


@pytest.fixture
def gemini_key(monkeypatch):
  monkeypatch.setenv("GEMINI_API_KEY", SECRET)
  monkeypatch.delenv("GOOGLE_API_KEY", raising=False)


@pytest.fixture
def openai_key(monkeypatch):
  monkeypatch.setenv("OPENAI_API_KEY", SECRET)


def scripted(prompt):
  return CASES[case_of(prompt)][0]


def gemini_judge(vocab, server, **options):
  return GeminiJudge(vocab, model=MODEL, base_url=server.url, **{**FAST_RETRY, **options})


def openai_judge(vocab, server, **options):
  return OpenAICompatibleJudge(vocab, model=MODEL, base_url=server.url + "/v1",
                               **{**FAST_RETRY, **options})


BACKENDS = {
    "genai": (lambda answer: FakeGenaiServer(answer, SECRET), gemini_judge),
    "openai": (lambda answer: FakeOpenAIServer(answer, SECRET), openai_judge),
}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_fuzzed_answers_never_crash_and_are_counted(vocab, gemini_key, openai_key, backend):
  make_server, make = BACKENDS[backend]
  case_ids = list(range(len(CASES)))
  with make_server(scripted) as server:
    groups = make_groups(case_ids)
    tags, stats = make(vocab, server, max_concurrency=4).judge(groups)
  check_verdicts(vocab, groups, tags, stats, case_ids)
  assert stats.requests == len(CASES) and stats.failed_requests == 0 and stats.retries == 0


def test_in_process_fuzzed_answers(vocab):
  calls = []

  def generate_text(prompts):
    calls.append(len(prompts))
    return [scripted(p) for p in prompts]

  case_ids = list(range(len(CASES)))
  groups = make_groups(case_ids)
  judge = make_judge("inprocess", vocab, generate_text=generate_text, batch_size=16)
  tags, stats = judge.judge(groups)
  check_verdicts(vocab, groups, tags, stats, case_ids)
  assert calls == [16, 16, 8]


def test_gemini_wire_format(vocab, gemini_key):
  with FakeGenaiServer(scripted, SECRET) as server:
    gemini_judge(vocab, server, temperature=0.25).judge(make_groups([0]))
  (request,) = server.requests
  assert request.path == f"/v1beta/models/{MODEL}:generateContent"
  assert request.headers["x-goog-api-key"] == SECRET
  config = request.body["generationConfig"]
  assert config["responseMimeType"] == "application/json"
  assert config["temperature"] == 0.25
  tag_items = config["responseSchema"]["properties"]["tags"]["items"]
  assert tag_items["enum"] == vocab.ids
  prompt = request.body["contents"][0]["parts"][0]["text"]
  assert "CASE-0 push box" in prompt and "- gave_up (-):" in prompt


def test_openai_wire_format(vocab, openai_key):
  with FakeOpenAIServer(scripted, SECRET) as server:
    openai_judge(vocab, server).judge(make_groups([0]))
    OpenAICompatibleJudge(vocab, model=MODEL, base_url=server.url + "/v1",
                          response_format="json_object").judge(make_groups([1]))
  first, second = server.requests
  assert first.path == "/v1/chat/completions"
  assert first.headers["authorization"] == f"Bearer {SECRET}"
  assert first.body["model"] == MODEL and first.body["temperature"] == 0.0
  schema = first.body["response_format"]["json_schema"]["schema"]
  assert first.body["response_format"]["type"] == "json_schema"
  assert schema["properties"]["tags"]["items"]["enum"] == vocab.ids
  assert "CASE-0 push box" in first.body["messages"][0]["content"]
  assert second.body["response_format"] == {"type": "json_object"}


def test_openai_without_key_or_json_mode(vocab, monkeypatch):
  monkeypatch.delenv("OPENAI_API_KEY", raising=False)
  with FakeOpenAIServer(scripted) as server:
    _, ok = openai_judge(vocab, server).judge(make_groups([0]))
    # "none" sends no response_format; this server insists on JSON mode and answers 400.
    _, refused = openai_judge(vocab, server, response_format="none").judge(make_groups([0]))
  assert server.requests[0].headers["authorization"] == "Bearer EMPTY"
  assert "response_format" not in server.requests[1].body
  assert ok.unjudged == 0 and refused.unjudged == 1 and refused.failed_requests == 1


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_cache_avoids_judging_identical_transcripts_twice(vocab, gemini_key, openai_key, backend):
  make_server, make = BACKENDS[backend]
  case_ids = [0, 1, 5, 14]   # two usable answers, two unjudged
  with make_server(scripted) as server:
    judge = make(vocab, server)
    groups = make_groups(case_ids, duplicate_first=True)
    tags, stats = judge.judge(groups)
    assert stats.requests == 4 and stats.cache_hits == 1   # the duplicate transcript
    assert len(server.requests) == 4
    check_verdicts(vocab, groups, tags, stats, case_ids + [0])
    regroups = make_groups(case_ids)
    again_tags, again = judge.judge(regroups)
  # Usable answers come from the cache; unusable ones are asked again.
  assert again.cache_hits == 2 and again.requests == 2 and len(server.requests) == 6
  check_verdicts(vocab, regroups, again_tags, again, case_ids)


def test_cache_key_distinguishes_backend_model_and_prompt(vocab):
  a = InProcessJudge(vocab, generate_text=list, model="m1")
  b = InProcessJudge(vocab, generate_text=list, model="m2")
  assert a.cache_key("p") != b.cache_key("p") != b.cache_key("q")
  assert a.cache_key("p") == InProcessJudge(vocab, generate_text=list, model="m1").cache_key("p")


class Flaky:
  """Fails each prompt with `status` for its first `failures` requests, then answers."""

  def __init__(self, failures, status=503):
    self.failures, self.status = failures, status
    self.seen = {}
    self.lock = threading.Lock()

  def __call__(self, prompt):
    i = case_of(prompt)
    with self.lock:
      self.seen[i] = self.seen.get(i, 0) + 1
      attempt = self.seen[i]
    if attempt <= self.failures:
      return Reply(status=self.status, message="try again later")
    return scripted(prompt)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("status", [429, 503])
def test_transient_errors_are_retried(vocab, gemini_key, openai_key, backend, status):
  make_server, make = BACKENDS[backend]
  with make_server(Flaky(failures=2, status=status)) as server:
    groups = make_groups([0, 1])
    tags, stats = make(vocab, server, max_retries=3).judge(groups)
  check_verdicts(vocab, groups, tags, stats, [0, 1])
  assert stats.retries == 4 and stats.failed_requests == 0 and len(server.requests) == 6


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_exhausted_retries_and_bad_requests_leave_rollouts_unjudged(vocab, gemini_key,
                                                                    openai_key, backend):
  make_server, make = BACKENDS[backend]
  with make_server(Flaky(failures=5)) as server:
    groups = make_groups([0, 1])
    tags, stats = make(vocab, server, max_retries=1).judge(groups)
  assert all_unjudged(groups, tags)
  assert stats.unjudged == 2 and stats.failed_requests == 2 and stats.retries == 2
  with make_server(Flaky(failures=5, status=400)) as server:   # not retried
    _, stats = make(vocab, server, max_retries=3).judge(make_groups([0]))
  assert stats.unjudged == 1 and stats.failed_requests == 1 and stats.retries == 0
  assert len(server.requests) == 1


def test_unreachable_server_is_transient_then_unjudged(vocab, gemini_key):
  with FakeGenaiServer(scripted, SECRET) as server:
    url = server.url
  judge = GeminiJudge(vocab, model=MODEL, base_url=url, max_retries=1, **FAST_RETRY)
  _, stats = judge.judge(make_groups([0]))
  assert stats.unjudged == 1 and stats.retries == 1 and stats.failed_requests == 1


def test_bounded_concurrency(vocab, openai_key):
  barrier = threading.Barrier(3, timeout=10)
  lock = threading.Lock()
  in_flight = {"now": 0, "peak": 0, "met": 0}

  def answer(prompt):
    with lock:
      in_flight["now"] += 1
      in_flight["peak"] = max(in_flight["peak"], in_flight["now"])
    try:
      barrier.wait()   # passes only once 3 requests are in flight together
      with lock:
        in_flight["met"] += 1
    except threading.BrokenBarrierError:
      pass
    with lock:
      in_flight["now"] -= 1
    return scripted(prompt)

  with FakeOpenAIServer(answer, SECRET) as server:
    _, stats = openai_judge(vocab, server, max_concurrency=3).judge(make_groups(range(6)))
  assert in_flight["peak"] == 3 and in_flight["met"] == 6
  assert stats.judged == 6 and stats.failed_requests == 0


def test_gemini_misconfiguration_raises_without_leaking_the_key(vocab, monkeypatch, caplog):
  caplog.set_level(logging.DEBUG)
  monkeypatch.setenv("GEMINI_API_KEY", SECRET)
  with FakeGenaiServer(scripted, api_key="the-right-key") as server:
    judge = gemini_judge(vocab, server)
    with pytest.raises(JudgeError, match="misconfigured.*API key not valid") as err:
      judge.judge(make_groups([0]))
  assert SECRET not in str(err.value) and SECRET not in repr(err.value)
  assert SECRET not in repr(judge) and SECRET not in repr(vars(judge))
  assert SECRET not in caplog.text
  monkeypatch.delenv("GEMINI_API_KEY")
  monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
  with pytest.raises(JudgeError, match=r"no API key; set one of \['GEMINI_API_KEY', "
                     r"'GOOGLE_API_KEY'\]"):
    GeminiJudge(vocab, model=MODEL)
  monkeypatch.setenv("GOOGLE_API_KEY", SECRET)
  assert GeminiJudge(vocab, model=MODEL, base_url="http://127.0.0.1:9").model == MODEL


def test_unknown_model_path_is_a_misconfiguration(vocab, gemini_key):
  with FakeGenaiServer(scripted, SECRET, api_version="v1") as server:
    with pytest.raises(JudgeError, match="404"):
      gemini_judge(vocab, server).judge(make_groups([0]))


def test_openai_key_is_scrubbed_from_errors_and_logs(vocab, monkeypatch, caplog):
  caplog.set_level(logging.DEBUG)
  monkeypatch.setenv("OPENAI_API_KEY", SECRET)
  # The server rejects the key and quotes it back; the judge must not repeat it.
  with FakeOpenAIServer(scripted, api_key="another-key") as server:
    judge = openai_judge(vocab, server)
    with pytest.raises(JudgeError, match=r"AuthenticationError.*\[REDACTED\]") as err:
      judge.judge(make_groups([0]))
  assert SECRET not in str(err.value) and SECRET not in repr(judge)
  assert SECRET not in repr(vars(judge))
  # Transient failures are logged: scrubbed too.
  with FakeOpenAIServer(lambda p: Reply(status=503, message=f"overloaded, key {SECRET}"),
                        SECRET) as server:
    _, stats = openai_judge(vocab, server, max_retries=1).judge(make_groups([0]))
  assert stats.failed_requests == 1
  assert "overloaded" in caplog.text and "[REDACTED]" in caplog.text
  assert SECRET not in caplog.text


def test_in_process_judge_contract(vocab):
  with pytest.raises(ValueError, match="returned 1 answers for 2 prompts"):
    InProcessJudge(vocab, generate_text=lambda ps: ["{}"]).judge(make_groups([0, 1]))
  with pytest.raises(TypeError, match="not callable"):
    InProcessJudge(vocab, generate_text="model")
  # Non-string answers are unusable, not a crash.
  _, stats = InProcessJudge(vocab, generate_text=lambda ps: [None] * len(ps)).judge(
      make_groups([0, 1]))
  assert stats.unjudged == 2
  with pytest.raises(ValueError, match=r"response_format='xml'"):
    OpenAICompatibleJudge(vocab, model=MODEL, response_format="xml")


# -- issue 9: any answer is a verdict or unjudged; one retry policy with Retry-After ----------

NON_TEXT = [5, float("nan"), {"tags": ["valid_syntax"]}, None, [1, 2], True, 1e308]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_non_text_answers_are_unjudged_never_a_crash(vocab, gemini_key, openai_key, backend):
  make_server, make = BACKENDS[backend]
  answers = {i: value for i, value in enumerate(NON_TEXT)}
  with make_server(lambda prompt: Reply(text=answers[case_of(prompt)])) as server:
    groups = make_groups(range(len(NON_TEXT)))
    tags, stats = make(vocab, server, max_retries=0).judge(groups)
  assert all_unjudged(groups, tags)
  assert stats.judged == stats.unjudged == len(NON_TEXT)
  assert len(server.requests) == len(NON_TEXT)   # a wrong answer is not a transient error


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_retry_after_is_honoured(vocab, gemini_key, openai_key, backend):
  make_server, make = BACKENDS[backend]
  attempts = []

  def answer(prompt):
    attempts.append(prompt)
    if len(attempts) == 1:
      return Reply(status=429, message="slow down", headers={"Retry-After": "1"})
    return scripted(prompt)

  with make_server(answer) as server:
    groups = make_groups([0])
    start = time.monotonic()
    # Its own waits are at most 0.001 s; waits up to max_backoff_s are allowed.
    tags, stats = make(vocab, server, max_retries=2, max_backoff_s=5.0).judge(groups)
    waited = time.monotonic() - start
  check_verdicts(vocab, groups, tags, stats, [0])
  assert stats.retries == 1 and len(server.requests) == 2
  assert 1.0 <= waited < 4.0


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_retry_after_beyond_the_longest_wait_fails_the_request(vocab, gemini_key, openai_key,
                                                               backend):
  make_server, make = BACKENDS[backend]
  with make_server(lambda p: Reply(status=503, message="down for maintenance",
                                   headers={"Retry-After": "3600"})) as server:
    start = time.monotonic()
    _, stats = make(vocab, server, max_retries=3).judge(make_groups([0]))
  assert time.monotonic() - start < 2.0
  assert stats.unjudged == 1 and stats.failed_requests == 1 and stats.retries == 0
  assert len(server.requests) == 1
