"""SGLangEngine against a loopback fake of SGLang's HTTP API: payloads, parsing, faults,
retries, concurrency and weight sync. Fast: no model server, no accelerator."""
from __future__ import annotations

import concurrent.futures
import os
import time

import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
import transformers

from tests.helpers.fake_sglang_server import FakeSGLangServer
from tests.helpers.ports import free_port
from rised_jax import model as rised_model
from rised_jax import http_retry
from rised_jax.model import save_pretrained
from rised_jax.model.hf_io import export_manifest
from rised_jax.rollout.base import (EngineFaults, Generation, GenerationFailed,
                                    GenerationRequest, SamplingParams)
from rised_jax.rollout.sglang_engine import (VERSION_KEY, SGLangEngine, SGLangError,
                                             SGLangGenerationFailed,
                                             parse_generate_response, validate_request)

GREEDY = SamplingParams(max_new_tokens=4, temperature=0.0)


def fake_tokens(prompt: list[int], count: int, seed: int = 0, vocab: int = 1000) -> np.ndarray:
  """The fake server's rule, restated with numpy: token i = (Σprompt + 31(i+1) + seed) % vocab."""
  return (sum(prompt) + 31 * np.arange(1, count + 1) + seed) % vocab


def fake_logprobs(tokens: np.ndarray) -> np.ndarray:
  return -(tokens % 97) / 10 - 0.125 * np.arange(len(tokens))


@pytest.fixture(scope="module")
def server():
  with FakeSGLangServer() as fake:
    yield fake


@pytest.fixture
def fake(server):
  server.reset()
  server.generate_delay_s = 0.0
  server.logprob_snapshots = False
  server.has_weight_endpoint = True
  server.weight_loader = None
  server.retry_after = None
  server.drip_s = 0.05
  return server


@pytest.fixture
def engine(fake):
  with SGLangEngine(fake.url, timeout_s=5.0, max_retries=3, backoff_s=0.01) as client:
    yield client



# -- payloads and parsing -------------------------------------------------------------------

def test_generate_payload_is_the_documented_schema(engine, fake):
  params = SamplingParams(max_new_tokens=7, temperature=0.7, top_p=0.9, top_k=0,
                          stop_token_ids=(5, 9))
  engine.generate([GenerationRequest(prompt_ids=[3, 1, 4], params=params, seed=11),
                   GenerationRequest(prompt_ids=np.array([2, 7]),
                                     params=SamplingParams(max_new_tokens=2, top_k=40), seed=0)])
  # The two requests travel concurrently: tell them apart by their prompts.
  calls = {tuple(body["input_ids"]): body for body in fake.calls_to("/generate")}
  first, second = calls[(3, 1, 4)], calls[(2, 7)]
  assert first == {
      "input_ids": [3, 1, 4],
      "sampling_params": {"max_new_tokens": 7, "temperature": 0.7, "top_p": 0.9, "top_k": -1,
                          "stop_token_ids": [5, 9], "skip_special_tokens": False,
                          "no_stop_trim": True, "sampling_seed": 11},
      "return_logprob": True,
      "logprob_start_len": -1,
  }
  assert second["input_ids"] == [2, 7]
  assert second["sampling_params"]["top_k"] == 40
  assert second["sampling_params"]["temperature"] == 1.0


def test_outputs_and_logprobs_parsed_exactly(engine):
  # Hand-worked from the fake's rule: Σprompt = 6, tokens 6+31, 6+62, 6+93, 6+124.
  (result,) = engine.generate([GenerationRequest(prompt_ids=[1, 2, 3], params=GREEDY)])
  assert result.output_ids == [37, 68, 99, 130]
  assert result.logprobs == [-3.7, -6.8 - 0.125, -0.2 - 0.25, -3.3 - 0.375]
  assert result.finish_reason == "length"


def test_stop_token_kept_and_reported_as_stop(engine):
  params = SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=(99,))
  (result,) = engine.generate([GenerationRequest(prompt_ids=[1, 2, 3], params=params)])
  assert result.output_ids == [37, 68, 99]
  assert result.logprobs == [-3.7, -6.925, -0.45]
  assert result.finish_reason == "stop"


def test_seeded_sampling_and_order_of_many_requests(engine):
  requests = [GenerationRequest(prompt_ids=[i, 2 * i + 1],
                                params=SamplingParams(max_new_tokens=3 + i % 4), seed=100 + i)
              for i in range(12)]
  results = engine.generate(requests)
  for i, result in enumerate(results):
    tokens = fake_tokens([i, 2 * i + 1], 3 + i % 4, seed=100 + i)
    assert result.output_ids == tokens.tolist()
    np.testing.assert_allclose(result.logprobs, fake_logprobs(tokens), rtol=0, atol=1e-12)


def test_repeated_logprob_snapshots_take_the_last_entries(engine, fake):
  fake.logprob_snapshots = True   # sglang-jax above 50 tokens: 50 stale entries, then all 80
  params = SamplingParams(max_new_tokens=80, temperature=0.0)
  (result,) = engine.generate([GenerationRequest(prompt_ids=[5, 5], params=params)])
  tokens = fake_tokens([5, 5], 80)
  assert result.output_ids == tokens.tolist()
  np.testing.assert_allclose(result.logprobs, fake_logprobs(tokens), rtol=0, atol=1e-12)


def test_special_tokens_kept_in_output_ids():
  # Token 37 is "special" on this server: it would vanish from output_ids had the client not
  # sent skip_special_tokens=false, and the client would then report a count mismatch.
  with FakeSGLangServer(special_token_ids=(37,)) as special:
    with SGLangEngine(special.url, backoff_s=0.01) as client:
      (result,) = client.generate([GenerationRequest(prompt_ids=[1, 2, 3], params=GREEDY)])
  assert result.output_ids == [37, 68, 99, 130]


def test_eos_of_the_model_stops_generation():
  with FakeSGLangServer(eos_token_id=68) as with_eos:
    with SGLangEngine(with_eos.url, backoff_s=0.01) as client:
      (result,) = client.generate([GenerationRequest(prompt_ids=[1, 2, 3], params=GREEDY)])
  assert (result.output_ids, result.finish_reason) == ([37, 68], "stop")


def response(output_ids, entries, completion_tokens=None, finish=None):
  return {"text": "", "output_ids": output_ids,
          "meta_info": {"finish_reason": finish or {"type": "length", "length": len(output_ids)},
                        "completion_tokens": (len(output_ids) if completion_tokens is None
                                              else completion_tokens),
                        "output_token_logprobs": entries}}


def test_parse_accepts_a_well_formed_response():
  parsed = parse_generate_response(
      response([4, 9], [[-0.5, 4, "a"], [-1.5, 9, "b"]],
               finish={"type": "stop", "matched": 9}))
  assert (parsed.output_ids, parsed.logprobs, parsed.finish_reason) == ([4, 9], [-0.5, -1.5],
                                                                       "stop")


@pytest.mark.parametrize("bad, message", [
    ({"meta_info": {}}, "no integer list 'output_ids'"),
    (response([4, 9], [[-0.5, 4, "a"], [-1.5, 8, "b"]]), "for token 8 but output_ids[1] is 9"),
    (response([4, 9], [[-0.5, 4, "a"]]), "has 1 entries for 2 output tokens"),
    (response([4, 9], [[-0.5, 4, "a"], [-1.5, 9, "b"]], completion_tokens=3),
     "completion_tokens=3 but output_ids has 2"),
    (response([4], [[None, 4, "a"]]), "expected [logprob, token_id, text]"),
    (response([4], [[-0.5, 4, "a"]], finish={"type": "abort", "message": "out of memory"}),
     "aborted the request: out of memory"),
    (response([4], [[-0.5, 4, "a"]], finish=None) | {"meta_info": {
        "completion_tokens": 1, "output_token_logprobs": [[-0.5, 4, "a"]]}},
     "finish_reason is None"),
    ([response([4], [[-0.5, 4, "a"]])], "expected a JSON object, got list"),
])
def test_parse_rejects_responses_that_break_the_schema(bad, message):
  with pytest.raises(SGLangError) as error:
    parse_generate_response(bad, "where")
  assert message in str(error.value)


@pytest.mark.parametrize("fault, message", [
    ("no_output_ids", "no integer list 'output_ids'"),
    ("wrong_ids", "the server's outputs disagree"),
    ("abort", "aborted the request: injected abort"),
])
def test_schema_faults_are_clear_errors_naming_the_request(engine, fake, fault, message):
  # Issue 9: a reply that breaks the schema is asked for again (1 + max_retries=3 attempts).
  fake.inject("/generate", fault, times=4)
  with pytest.raises(SGLangError) as error:
    engine.generate([GenerationRequest(prompt_ids=[1, 2, 3], params=GREEDY)])
  text = str(error.value)
  assert message in text and "request 0" in text and "gave up after 4 attempts" in text
  assert len(fake.calls_to("/generate")) == 4


# -- impossible replies (issue 9): validated, retried, then reported per request --------------

VOCAB = 124   # the tiny model's vocabulary


@pytest.fixture(scope="module")
def small_server():
  with FakeSGLangServer(vocab_size=VOCAB) as fake:
    yield fake


@pytest.fixture
def small(small_server):
  small_server.reset()
  return small_server


IMPOSSIBLE = [
    ("bad_token", f"output_ids[0]=1000000 outside the vocabulary [0, {VOCAB})"),
    ("nan_logprob", "output_token_logprobs[0] is nan; a log-probability is finite and <= 0"),
    ("positive_logprob", "output_token_logprobs[0] is 50.0; a log-probability is finite"),
    ("too_many", "54 output tokens for max_new_tokens=4"),
    ("short_logprobs", "has 3 entries for 4 output tokens"),
    # Issue 23: passed validation, then raised in the agent loop and ended the run.
    ("empty", "output_ids is empty; a reply holds at least one token"),
]


@pytest.mark.parametrize("fault, message", IMPOSSIBLE)
def test_impossible_replies_are_retried_then_fail_naming_the_request(small, fault, message):
  request = GenerationRequest(prompt_ids=[1, 2, 3], params=GREEDY)
  with SGLangEngine(small.url, vocab_size=VOCAB, max_retries=2, backoff_s=0.001) as client:
    small.inject("/generate", fault, times=3)
    with pytest.raises(SGLangError) as error:
      client.generate([request])
    # The same faults met through generate_counted: no error, the call's own counts.
    small.inject("/generate", fault, times=3)
    assert client.generate_counted([request]) == Generation(
        (None,), EngineFaults(server_retries=2, failed_requests=1))
  text = str(error.value)
  assert message in text and "request 0" in text and "gave up after 3 attempts" in text
  assert len(small.calls_to("/generate")) == 6


@pytest.mark.parametrize("fault", [fault for fault, _ in IMPOSSIBLE])
def test_one_impossible_reply_is_replaced_by_the_retry(small, fault):
  small.inject("/generate", fault)
  with SGLangEngine(small.url, vocab_size=VOCAB, max_retries=2, backoff_s=0.001) as client:
    generation = client.generate_counted([GenerationRequest(prompt_ids=[1, 2, 3], params=GREEDY)])
    assert generation.faults == EngineFaults(server_retries=1, failed_requests=0)
  (result,) = generation.results
  tokens = fake_tokens([1, 2, 3], 4, vocab=VOCAB)
  assert result.output_ids == tokens.tolist()
  np.testing.assert_allclose(result.logprobs, fake_logprobs(tokens), rtol=0, atol=1e-12)


def test_a_failed_request_leaves_the_others_results(small):
  # One request at a time, so request 0 meets all three faulty replies.
  small.inject("/generate", "bad_token", times=3)
  requests = [GenerationRequest(prompt_ids=[i + 1], params=GREEDY) for i in range(3)]
  with SGLangEngine(small.url, vocab_size=VOCAB, max_concurrency=1, max_retries=2,
                    backoff_s=0.001) as client:
    with pytest.raises(SGLangGenerationFailed, match="1 of 3 SGLang requests failed") as error:
      client.generate(requests)
  assert isinstance(error.value, GenerationFailed)
  assert error.value.results[0] is None
  assert [r.output_ids for r in error.value.results[1:]] == [
      fake_tokens([i + 1], 4, vocab=VOCAB).tolist() for i in (1, 2)]


def test_each_call_counts_only_its_own_faults(small):
  # Two calls at once on one client: every request whose prompt starts with 7 meets a faulty
  # reply on each attempt (3 attempts: 2 retries, then given up on); the other call's are clean.
  small.poison("bad_token", lambda body: body["input_ids"][0] == 7)
  faulty = [GenerationRequest(prompt_ids=[7, i], params=GREEDY) for i in range(3)]
  clean = [GenerationRequest(prompt_ids=[1, i], params=GREEDY) for i in range(4)]
  with SGLangEngine(small.url, vocab_size=VOCAB, max_concurrency=4, max_retries=2,
                    backoff_s=0.001) as client:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
      calls = [pool.submit(client.generate_counted, requests) for requests in (faulty, clean)]
      spoilt, kept = (call.result() for call in calls)
    assert spoilt == Generation((None,) * 3, EngineFaults(server_retries=6, failed_requests=3))
    assert kept.faults == EngineFaults() and all(r is not None for r in kept.results)
    # A later call starts from nothing: counts are per call, not since construction.
    assert client.generate_counted(clean[:1]).faults == EngineFaults()
  assert len([b for b in small.calls_to("/generate") if b["input_ids"][0] == 7]) == 9


def test_parse_bounds_are_optional_but_negative_ids_never_pass():
  entries = [[-0.5, 300, "a"]]
  assert parse_generate_response(response([300], entries)).output_ids == [300]
  with pytest.raises(SGLangError, match=r"output_ids\[0\]=300 outside the vocabulary"):
    parse_generate_response(response([300], entries), vocab_size=VOCAB)
  with pytest.raises(SGLangError, match=r"output_ids\[0\]=-1 outside"):
    parse_generate_response(response([-1], [[-0.5, -1, "a"]]))
  # Rounding above 0 within LOGPROB_SLACK is a log-prob; more is not.
  assert parse_generate_response(response([3], [[5e-5, 3, "a"]])).logprobs == [5e-5]
  with pytest.raises(SGLangError, match="is 0.001; a log-probability"):
    parse_generate_response(response([3], [[1e-3, 3, "a"]]))


# -- faults and retries ---------------------------------------------------------------------

@pytest.mark.parametrize("fault", ["http429", "http408", "http503"])
def test_rate_limits_and_timeouts_are_retried_after_retry_after(fake, fault):
  fake.retry_after = "1"   # seconds; the client's own backoff here is at most 0.01 s
  fake.inject("/generate", fault)
  with SGLangEngine(fake.url, timeout_s=5.0, max_retries=2, backoff_s=0.01) as client:
    start = time.monotonic()
    generation = client.generate_counted([GenerationRequest(prompt_ids=[1, 2, 3], params=GREEDY)])
    waited = time.monotonic() - start
    assert generation.faults == EngineFaults(server_retries=1)
  (result,) = generation.results
  assert result.output_ids == [37, 68, 99, 130]
  assert len(fake.calls_to("/generate")) == 2
  assert 1.0 <= waited < 4.0


def test_retry_after_beyond_the_longest_wait_gives_up_at_once(fake):
  fake.retry_after = "120"
  fake.inject("/generate", "http429")
  with SGLangEngine(fake.url, max_retries=3, backoff_s=0.01, max_backoff_s=30.0) as client:
    start = time.monotonic()
    with pytest.raises(SGLangError, match=r"HTTP 429.*asked to retry after 120 s, more than "
                                          r"max_backoff_s=30; gave up after 1 attempts"):
      client.generate([GenerationRequest(prompt_ids=[1], params=GREEDY)])
  assert time.monotonic() - start < 2.0 and len(fake.calls_to("/generate")) == 1


def test_retry_after_sets_the_least_wait():
  policy = http_retry.RetryPolicy(max_retries=2, backoff_s=0.5, max_backoff_s=30.0)
  errors = [http_retry.HTTPRequestError("POST", "u", 429, "slow down", retryable=True,
                                        retry_after=7.0),
            http_retry.HTTPRequestError("POST", "u", 503, "busy", retryable=True)]
  slept = []

  def flaky():
    if errors:
      raise errors.pop(0)
    return "ok"

  assert http_retry.call_with_retry(flaky, policy, sleep=slept.append,
                                    uniform=lambda low, high: high) == "ok"
  assert slept == [7.0, 1.0]   # Retry-After, then the jitter's top for retry 1
  assert http_retry.parse_retry_after("3") == 3.0
  assert http_retry.parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0   # past
  assert http_retry.parse_retry_after("soon") is None and http_retry.parse_retry_after(None) is None


@pytest.mark.parametrize("retries", [0, 1])
def test_the_deadline_bounds_a_server_that_drips_its_answer(fake, retries):
  # ~300 bytes at one per 0.05 s would take ~15 s; each attempt must end at its 0.5 s deadline.
  fake.inject("/generate", "drip", times=retries + 1)
  with SGLangEngine(fake.url, timeout_s=0.5, max_retries=retries, backoff_s=0.01) as client:
    start = time.monotonic()
    with pytest.raises(SGLangError, match=r"timed out after 0.5 s \(the deadline of the whole "
                                          rf"request\).*gave up after {retries + 1} attempts"):
      client.generate([GenerationRequest(prompt_ids=[1, 2, 3], params=GREEDY)])
    elapsed = time.monotonic() - start
  assert elapsed < 0.5 * (retries + 1) + 1.0
  assert len(fake.calls_to("/generate")) == retries + 1


def test_a_dripping_answer_within_the_deadline_is_read_whole(fake):
  fake.drip_s = 0.0005
  fake.inject("/generate", "drip")
  with SGLangEngine(fake.url, timeout_s=5.0, max_retries=0) as client:
    (result,) = client.generate([GenerationRequest(prompt_ids=[1, 2, 3], params=GREEDY)])
  assert result.output_ids == [37, 68, 99, 130]


@pytest.mark.parametrize("fault", ["http500", "drop", "delay", "truncate", "bad_json"])
def test_transient_faults_are_retried_then_succeed(fake, fault):
  fake.delay_s = 1.0
  fake.inject("/generate", fault, times=2)
  with SGLangEngine(fake.url, timeout_s=0.3, max_retries=2, backoff_s=0.01) as client:
    (result,) = client.generate([GenerationRequest(prompt_ids=[1, 2, 3], params=GREEDY)])
  assert result.output_ids == [37, 68, 99, 130]
  assert len(fake.calls_to("/generate")) == 3


@pytest.mark.parametrize("fault, message", [
    ("http500", "HTTP 500): injected http500"),
    ("drop", "no response): connection error"),
    ("delay", "no response): timed out after 0.3 s"),
    ("truncate", "body cut short"),
    ("bad_json", "not valid JSON"),
])
def test_transient_faults_fail_clearly_after_max_retries(fake, fault, message):
  fake.delay_s = 1.0
  fake.inject("/generate", fault, times=3)
  with SGLangEngine(fake.url, timeout_s=0.3, max_retries=2, backoff_s=0.01) as client:
    with pytest.raises(SGLangError) as error:
      client.generate([GenerationRequest(prompt_ids=[1, 2, 3], params=GREEDY)])
  text = str(error.value)
  assert message in text and "gave up after 3 attempts" in text and "/generate" in text
  assert len(fake.calls_to("/generate")) == 3


def test_client_errors_are_not_retried_and_carry_the_server_message(engine, fake):
  fake.inject("/generate", "http400")
  with pytest.raises(SGLangError, match=r"HTTP 400\): injected http400") as error:
    engine.generate([GenerationRequest(prompt_ids=[1, 2, 3], params=GREEDY)])
  assert "gave up" not in str(error.value)
  assert len(fake.calls_to("/generate")) == 1


def test_server_side_validation_error_surfaces(engine, fake):
  # A stop id outside the fake's vocabulary: the server (not the client) rejects it.
  params = SamplingParams(max_new_tokens=2, stop_token_ids=(5000,))
  with pytest.raises(SGLangError, match="stop token id 5000 is not in the vocabulary"):
    engine.generate([GenerationRequest(prompt_ids=[1], params=params)])
  assert len(fake.calls_to("/generate")) == 1


def test_backoff_is_exponential_capped_and_jittered():
  # Issue 9: the waits are drawn from [0, min(backoff_s * 2**i, max_backoff_s)] (full jitter).
  policy = http_retry.RetryPolicy(max_retries=5, backoff_s=0.5, max_backoff_s=3.0)
  assert [policy.wait_cap(i) for i in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
  slept, attempts, draws = [], [], []

  def flaky():
    attempts.append(1)
    if len(attempts) < 4:
      raise http_retry.HTTPRequestError("POST", "u", 503, "busy", retryable=True)
    return "ok"

  def top_of_range(low, high):
    draws.append((low, high))
    return high

  assert http_retry.call_with_retry(flaky, policy, sleep=slept.append,
                                    uniform=top_of_range) == "ok"
  assert draws == [(0.0, 0.5), (0.0, 1.0), (0.0, 2.0)] and slept == [0.5, 1.0, 2.0]
  # With the real random source every wait stays in its range and they are not all equal.
  slept.clear()
  for _ in range(20):
    attempts.clear()
    http_retry.call_with_retry(flaky, policy, sleep=slept.append)
  caps = [0.5, 1.0, 2.0] * 20
  assert all(0 <= wait <= cap for wait, cap in zip(slept, caps)) and len(set(slept)) > 50


def test_connection_refused_is_retried_then_reported(fake):
  url = f"http://127.0.0.1:{free_port()}"
  with SGLangEngine(url, timeout_s=1.0, max_retries=1, backoff_s=0.01) as client:
    with pytest.raises(SGLangError, match="connection failed.*gave up after 2 attempts"):
      client.generate([GenerationRequest(prompt_ids=[1], params=GREEDY)])


# -- concurrency ------------------------------------------------------------------------------

def test_concurrency_bound_is_respected_and_used(fake):
  fake.generate_delay_s = 0.15
  requests = [GenerationRequest(prompt_ids=[i + 1], params=GREEDY) for i in range(10)]
  with SGLangEngine(fake.url, max_concurrency=3, backoff_s=0.01) as client:
    results = client.generate(requests)
  assert fake.max_in_flight == 3
  assert [r.output_ids for r in results] == [fake_tokens([i + 1], 4).tolist() for i in range(10)]


# -- input validation -----------------------------------------------------------------------

@pytest.mark.parametrize("request_, message", [
    (GenerationRequest(prompt_ids=[], params=GREEDY), "prompt_ids is empty"),
    (GenerationRequest(prompt_ids=[1, -2], params=GREEDY), "non-negative integers, got [-2]"),
    (GenerationRequest(prompt_ids=[1, 2.5], params=GREEDY), "non-negative integers, got [2.5]"),
    (GenerationRequest(prompt_ids=[1], params=SamplingParams(max_new_tokens=0)),
     "max_new_tokens must be an integer >= 1, got 0"),
    (GenerationRequest(prompt_ids=[1], params=SamplingParams(4, temperature=-1.0)),
     "temperature must be finite and >= 0"),
    (GenerationRequest(prompt_ids=[1], params=SamplingParams(4, top_p=0.0)),
     "top_p must be in (0, 1], got 0.0"),
    (GenerationRequest(prompt_ids=[1], params=SamplingParams(4, top_k=-3)),
     "top_k must be >= 0"),
    (GenerationRequest(prompt_ids=[1], params=SamplingParams(4, stop_token_ids=(-1,))),
     "stop_token_ids must be non-negative"),
    (GenerationRequest(prompt_ids=[1], params=GREEDY, seed=2**40), "seed must fit in int32"),
])
def test_bad_requests_fail_before_anything_is_sent(engine, fake, request_, message):
  good = GenerationRequest(prompt_ids=[1], params=GREEDY)
  with pytest.raises(ValueError) as error:
    engine.generate([good, request_])
  assert message in str(error.value) and "generation request 1" in str(error.value)
  assert fake.calls_to("/generate") == []
  validate_request(good)


@pytest.mark.parametrize("kwargs, message", [
    ({"base_url": "localhost:30000"}, "base_url must look like http://HOST:PORT"),
    ({"base_url": "http://h:1", "max_concurrency": 0}, "max_concurrency must be >= 1"),
    ({"base_url": "http://h:1", "timeout_s": 0}, "timeout_s must be > 0"),
    ({"base_url": "http://h:1", "keep_versions": 0}, "keep_versions must be >= 1"),
    ({"base_url": "http://h:1", "max_retries": -1}, "max_retries must be >= 0"),
])
def test_bad_engine_arguments(kwargs, message):
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
    SGLangEngine(**kwargs)


# -- server state -----------------------------------------------------------------------------

def test_health_flush_and_model_info(engine, fake):
  assert engine.health() is True
  engine.wait_until_healthy(timeout_s=1.0)
  engine.flush_cache()
  assert engine.model_info() == {"model_path": "/fake/model", "tokenizer_path": "/fake/model",
                                 "is_generation": True, "preferred_sampling_params": None}
  assert [(m, p) for m, p, _ in fake.calls] == [
      ("GET", "/health"), ("GET", "/health"), ("POST", "/flush_cache"), ("GET", "/get_model_info")]


def test_health_is_false_and_wait_times_out_when_nothing_listens():
  with SGLangEngine(f"http://127.0.0.1:{free_port()}") as client:
    assert client.health() is False
    with pytest.raises(SGLangError, match=r"not healthy after 0.2 s"):
      client.wait_until_healthy(timeout_s=0.2, poll_s=0.05)


def test_flush_refused_while_busy_is_a_clear_error(engine, fake):
  fake.in_flight = 1   # the fake refuses like SGLang does while a request runs
  try:
    with pytest.raises(SGLangError, match="did not flush.*HTTP 400.*requests are running"):
      engine.flush_cache()
  finally:
    fake.in_flight = 0
  assert len(fake.calls_to("/flush_cache")) == 1


# -- weight sync ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_model():
  """A tiny random Qwen3 and a word-level tokenizer, for the exporter."""
  vocab = {"<unk>": 0, "<|endoftext|>": 1, **{f"w{i}": i + 2 for i in range(30)}}
  backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
  backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  tokenizer = rised_model.Tokenizer(transformers.PreTrainedTokenizerFast(
      tokenizer_object=backend, unk_token="<unk>", eos_token="<|endoftext|>"))
  cfg = rised_model.ModelConfig.from_hf({
      "model_type": "qwen3", "vocab_size": len(vocab), "hidden_size": 16,
      "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
      "num_key_value_heads": 1, "head_dim": 8, "eos_token_id": 1}, source="tiny_model")
  return rised_model.from_config(cfg, seed=3), tokenizer


def weight_engine(fake, tmp_path, tokenizer, **kwargs) -> SGLangEngine:
  return SGLangEngine(fake.url, timeout_s=5.0, backoff_s=0.01, weight_dir=str(tmp_path / "w"),
                      tokenizer=tokenizer, **kwargs)


def test_weight_sync_posts_the_version_and_the_export_loads(fake, tmp_path, tiny_model):
  model, tokenizer = tiny_model
  with weight_engine(fake, tmp_path, tokenizer) as client:
    client.update_weights(model, version=3)
    assert client.weight_version == 3
  exported = tmp_path / "w" / "v3"
  assert fake.calls_to("/update_weights_from_disk") == [{
      "model_path": str(exported), "load_format": "auto", "flush_cache": True,
      "abort_all_requests": False, "weight_version": "3"}]
  assert (fake.model_path, fake.weight_version) == (str(exported), "3")
  reloaded, reloaded_tokenizer = rised_model.from_pretrained(exported)
  ids = jnp.asarray([[2, 9, 4, 17]], jnp.int32)
  np.testing.assert_array_equal(np.asarray(reloaded(ids)), np.asarray(model(ids)))
  assert reloaded_tokenizer.encode("w0 w7") == [2, 9]


def test_weight_sync_keeps_the_last_versions_only(fake, tmp_path, tiny_model):
  model, tokenizer = tiny_model
  with weight_engine(fake, tmp_path, tokenizer, keep_versions=2) as client:
    for version in (1, 2, 3, 4):
      client.update_weights(model, version)
  assert sorted(os.listdir(tmp_path / "w")) == ["v3", "v4"]
  assert [c["weight_version"] for c in fake.calls_to("/update_weights_from_disk")] == [
      "1", "2", "3", "4"]


def test_weight_sync_prunes_only_the_folders_it_wrote(fake, tmp_path, tiny_model):
  # Issue 23: pruning deleted every v<N> in weight_dir, whoever had put it there.
  model, tokenizer = tiny_model
  foreign = tmp_path / "w" / "v1"
  foreign.mkdir(parents=True)
  (foreign / "model.safetensors").write_bytes(b"someone else's weights")
  # A user's own export (a manifest, but no weight-sync version in it) is not the sync's either.
  users = save_pretrained(model, tokenizer, tmp_path / "w" / "v0")
  with weight_engine(fake, tmp_path, tokenizer, keep_versions=1) as client:
    for version in (2, 3, 4):
      client.update_weights(model, version)
  assert sorted(os.listdir(tmp_path / "w")) == ["v0", "v1", "v4"]
  assert (foreign / "model.safetensors").read_bytes() == b"someone else's weights"
  assert VERSION_KEY not in export_manifest(users)
  assert export_manifest(tmp_path / "w" / "v4")[VERSION_KEY] == 4


def test_weight_sync_never_overwrites_a_version_folder_it_did_not_write(fake, tmp_path,
                                                                        tiny_model):
  model, tokenizer = tiny_model
  foreign = tmp_path / "w" / "v2"
  foreign.mkdir(parents=True)
  (foreign / "notes.txt").write_text("keep me")
  with weight_engine(fake, tmp_path, tokenizer) as client:
    with pytest.raises(SGLangError, match=r"w/v2 exists and was not written by a weight sync "
                                          r"\(its export manifest names no weight_sync_version\)"):
      client.update_weights(model, version=2)
    client.update_weights(model, version=3)   # a version of its own is exported as usual
  assert (foreign / "notes.txt").read_text() == "keep me"
  assert sorted(os.listdir(tmp_path / "w")) == ["v2", "v3"]
  assert fake.calls_to("/update_weights_from_disk")[-1]["weight_version"] == "3"


def test_weight_sync_failure_on_the_server_is_reported_and_cleaned_up(fake, tmp_path,
                                                                       tiny_model):
  model, tokenizer = tiny_model

  def refuse(path):
    raise RuntimeError(f"shape mismatch in {os.path.basename(path)}")

  with weight_engine(fake, tmp_path, tokenizer) as client:
    client.update_weights(model, version=1)
    fake.weight_loader = refuse
    with pytest.raises(SGLangError, match=r"did not load weights version 2 .*HTTP 400.*"
                                          r"Failed to update weights: shape mismatch in v2"):
      client.update_weights(model, version=2)
    assert client.weight_version == 1
  assert sorted(os.listdir(tmp_path / "w")) == ["v1"]


def test_weight_sync_without_the_endpoint_is_a_clear_error(fake, tmp_path, tiny_model):
  model, tokenizer = tiny_model
  fake.has_weight_endpoint = False
  with weight_engine(fake, tmp_path, tokenizer) as client:
    with pytest.raises(SGLangError) as error:
      client.update_weights(model, version=7)
    text = str(error.value)
    assert "no POST /update_weights_from_disk (HTTP 404)" in text and "sglang-jax" in text
    assert str(tmp_path / "w" / "v7") in text
    with pytest.raises(SGLangError, match="update_weights_from_disk"):
      client.update_weights(model, version=8)   # fails at once: no second export or POST
  assert len(fake.calls_to("/update_weights_from_disk")) == 1
  assert sorted(os.listdir(tmp_path / "w")) == ["v7"]


def test_weight_sync_needs_a_directory_and_a_tokenizer(fake, tiny_model):
  model, _ = tiny_model
  with SGLangEngine(fake.url) as client:
    with pytest.raises(SGLangError, match="needs weight_dir= and tokenizer="):
      client.update_weights(model, version=1)
  assert fake.calls_to("/update_weights_from_disk") == []
