"""Per-criterion judges (rised_jax.rubrics.criteria): the offline checker and the LLM backends.

The LLM backends run through the real google-genai / openai clients against loopback servers
whose "model" is an oracle: it reads the rendered question back (task, answer, criterion) and
answers with the deterministic checker's verdict, so a correct judge reproduces
`rubric_tasks.check` exactly. Answers carrying a marker "GARBAGE<k>" get scripted garbage
(or HTTP errors) instead, which must make exactly the expected answers unjudged and be counted.
"""
import re

import numpy as np
import pytest

from tests.helpers.fake_genai_server import FakeGenaiServer, Reply
from tests.helpers.fake_openai_server import FakeOpenAIServer
from rised_jax.rubric_tasks import builtin_task_set, check
from rised_jax.rubrics import JudgeError
from rised_jax.rubrics import criteria

SECRET = "sk-criteria-3c1f9a7e5d"
MODEL = "judge-model"
FAST_RETRY = {"backoff_s": 0.001, "max_backoff_s": 0.002}
TASKS = builtin_task_set()
BY_PROMPT = {t.prompt: t for t in TASKS.tasks}
SKY = TASKS.tasks[0]

# (scripted answer of the model, verdict it should give: 1.0, 0.0 or None for unjudged, and
#  whether the request fails at the HTTP level)
GARBAGE = [
    ('```json\n{"tags": ["MET"]}\n```', 1.0, False),        # lenient: fenced, any case
    ('["not_met"]', 0.0, False),                             # a bare list
    ('{"tags": ["the answer meets the criterion"]}', 1.0, False),   # the description
    ('{"tags": ["met", "not_met"]}', None, False),           # both: contradictory
    ('{"tags": []}', None, False),                           # neither
    ('{"verdict": "met"}', None, False),                     # no tags key
    ('{"tags": ["met"', None, False),                        # truncated JSON
    ("yes", None, False),
    ("", None, False),
    (Reply(status=500, message="overloaded"), None, True),   # retried, then failed
    (Reply(status=400, message="bad request"), None, True),  # failed at once
]


def parse_question(prompt):
  """(task, criterion index, answer) from a rendered default-template question."""
  question = prompt.split("## Question\n", 1)[1].split("\n\n## Answer\n", 1)[0]
  answer = prompt.split("## Answer\n", 1)[1].split("\n\n## ", 1)[0]
  criterion = prompt.split("## Criterion\n", 1)[1].split("\n", 1)[0]
  task = BY_PROMPT[question]
  index = [c.text for c in task.criteria].index(criterion)
  return task, index, answer


def oracle(prompt):
  task, index, answer = parse_question(prompt)
  marker = re.search(r"GARBAGE(\d+)", answer)
  if marker:
    return GARBAGE[int(marker.group(1))][0]
  return '{"tags": ["met"]}' if check(task, answer)[index] else '{"tags": ["not_met"]}'


def sample_answers():
  """(task, answer) pairs: references, first sentences, a non-answer, across 24 tasks."""
  pairs = []
  for task in TASKS.tasks[:24]:
    reference = task.reference or task.prompt
    pairs += [(task, reference), (task, reference.split(". ")[0] + "."), (task, "I do not know.")]
  return pairs


def expected_of(pairs):
  """Per answer: (expected verdicts or None when unjudged, failed requests it causes)."""
  out = []
  for task, answer in pairs:
    marker = re.search(r"GARBAGE(\d+)", answer)
    if not marker:
      out.append((check(task, answer), 0))
      continue
    _, value, fails = GARBAGE[int(marker.group(1))]
    n = len(task.criteria)
    out.append((None if value is None else np.full(n, value, np.float32), n if fails else 0))
  return out


def assert_result(result, pairs):
  expected = expected_of(pairs)
  for i, ((verdicts, _), got, failed) in enumerate(zip(expected, result.verdicts,
                                                         result.unjudged)):
    assert failed == (verdicts is None), (i, pairs[i][1][:60])
    np.testing.assert_array_equal(got, verdicts if verdicts is not None else np.zeros_like(got))
  unjudged = [i for i, (v, _) in enumerate(expected) if v is None]
  assert result.stats.answers == len(pairs)
  assert result.stats.unjudged_answers == len(unjudged)
  assert result.stats.unjudged_questions == sum(len(pairs[i][0].criteria) for i in unjudged)
  assert result.stats.questions == sum(len(t.criteria) for t, _ in pairs)
  assert result.stats.failed_requests == sum(f for _, f in expected)


@pytest.fixture
def keys(monkeypatch):
  monkeypatch.setenv("GEMINI_API_KEY", SECRET)
  monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
  monkeypatch.setenv("OPENAI_API_KEY", SECRET)


def make_llm_judge(backend, server, **options):
  if backend == "genai":
    return criteria.make_criteria_judge("genai", model=MODEL, base_url=server.url,
                                        **FAST_RETRY, **options)
  return criteria.make_criteria_judge("openai", model=MODEL, base_url=server.url + "/v1",
                                      **FAST_RETRY, **options)


SERVERS = {"genai": lambda answer: FakeGenaiServer(answer, SECRET),
           "openai": lambda answer: FakeOpenAIServer(answer, SECRET)}


def test_checker_equals_rubric_tasks_check():
  pairs = sample_answers()
  result = criteria.make_criteria_judge("checker").judge([t for t, _ in pairs],
                                                          [a for _, a in pairs])
  assert not result.unjudged.any() and result.stats.unjudged_answers == 0
  for (task, answer), verdicts in zip(pairs, result.verdicts):
    np.testing.assert_array_equal(verdicts, check(task, answer))
  # Hand-worked: scattering, shorter wavelengths, no violet, 2 sentences, no ocean myth; then
  # the myth stated (1 sentence); then the myth negated.
  worked = criteria.CheckerJudge().judge([SKY] * 3, [
      "Sunlight is scattered by air molecules. Shorter wavelengths scatter more, so blue wins.",
      "The sky reflects the ocean.",
      "It is a myth that the sky reflects the ocean. Air scatters light."])
  assert [c.id for c in SKY.criteria] == ["scattering", "wavelength", "violet", "length",
                                          "ocean-myth"]
  np.testing.assert_array_equal(np.stack(worked.verdicts), [[1, 1, 0, 1, 0], [0, 0, 0, 0, 1],
                                                            [1, 0, 0, 1, 0]])


@pytest.mark.parametrize("backend", sorted(SERVERS))
def test_llm_backend_reproduces_the_oracle_and_counts_garbage(keys, backend):
  pairs = sample_answers()[:12] + [(TASKS.tasks[k % 5], f"An answer. GARBAGE{k}")
                                   for k in range(len(GARBAGE))]
  with SERVERS[backend](oracle) as server:
    judge = make_llm_judge(backend, server, max_concurrency=6, max_retries=1)
    result = judge.judge([t for t, _ in pairs], [a for _, a in pairs])
  assert_result(result, pairs)
  assert judge.backend == backend
  assert result.stats.requests == result.stats.questions - result.stats.cache_hits
  # The HTTP 500 questions were retried once each.
  assert result.stats.retries == len(TASKS.tasks[9 % 5].criteria)


def test_wire_format_asks_for_one_verdict_tag(keys):
  with FakeOpenAIServer(oracle, SECRET) as server:
    make_llm_judge("openai", server).judge([SKY], ["The sky reflects the ocean."])
  assert len(server.requests) == len(SKY.criteria)
  body = server.requests[0].body
  assert body["response_format"]["json_schema"]["schema"]["properties"]["tags"]["items"][
      "enum"] == ["met", "not_met"]
  prompts = sorted(r.body["messages"][0]["content"] for r in server.requests)
  pitfall = [p for p in prompts if "describes a mistake" in p]
  assert len(pitfall) == 1 and SKY.criteria[4].text in pitfall[0]
  assert all("The sky reflects the ocean." in p and SKY.reference in p for p in prompts)


def test_in_process_backend_batches_and_caches():
  calls = []

  def generate_text(prompts):
    calls.append(len(prompts))
    return [oracle(p) for p in prompts]

  judge = criteria.make_criteria_judge("inprocess", generate_text=generate_text, batch_size=16)
  pairs = sample_answers()[:9] + [(SKY, "GARBAGE7 x"), (SKY, "GARBAGE0 y")]
  result = judge.judge([t for t, _ in pairs], [a for _, a in pairs])
  assert_result(result, pairs)
  questions = result.stats.questions
  assert sum(calls) == questions and max(calls) == 16
  # Again: usable verdicts come from the cache; the questions of the answer that got no
  # parsable verdict ("yes") are asked again.
  calls.clear()
  again = judge.judge([t for t, _ in pairs], [a for _, a in pairs])
  assert_result(again, pairs)
  assert sum(calls) == len(SKY.criteria) and again.stats.cache_hits == questions - len(
      SKY.criteria)


def test_identical_answers_in_one_call_are_asked_once(keys):
  with FakeOpenAIServer(oracle, SECRET) as server:
    result = make_llm_judge("openai", server).judge([SKY] * 3, ["Air scatters light."] * 3)
  assert len(server.requests) == len(SKY.criteria)
  assert result.stats.cache_hits == 2 * len(SKY.criteria) and not result.unjudged.any()


def test_misconfigured_server_raises_instead_of_marking_everything_unusable(keys):
  with FakeOpenAIServer(oracle, api_key="another-key") as server:
    with pytest.raises(JudgeError, match="misconfigured") as error:
      make_llm_judge("openai", server).judge([SKY], ["Air scatters light."])
  assert SECRET not in str(error.value)


def test_question_rendering():
  prompt = criteria.CriterionPrompt(max_answer_chars=100)
  long_answer = "Air scatters light. " * 20
  text = prompt.render(criteria.CriterionQuestion(SKY, 0, long_answer))
  assert SKY.prompt in text and SKY.criteria[0].text in text and SKY.reference in text
  assert "describes a mistake" not in text and "chars omitted" in text
  assert parse_question(text)[:2] == (SKY, 0)


def test_bad_backends_options_and_templates(tmp_path):
  with pytest.raises(ValueError, match=r"^config\.rubric\.judge\.backend: unknown criteria judge "
                     r"'rules'; known: \['checker', 'genai', 'inprocess', 'openai'\]"):
    criteria.make_criteria_judge("rules")
  with pytest.raises(ValueError, match=r"no option\(s\) \['max_turns'\].*RISED transcripts"):
    criteria.make_criteria_judge("inprocess", generate_text=list, max_turns=3)
  with pytest.raises(ValueError, match=r"needs option\(s\) \['model'\]"):
    criteria.make_criteria_judge("openai")
  with pytest.raises(ValueError, match=r"checker' has no option\(s\) \['model'\]"):
    criteria.make_criteria_judge("checker", model="x")
  with pytest.raises(FileNotFoundError, match="nope.jinja"):
    criteria.make_criteria_judge("inprocess", generate_text=list,
                                 template_path=str(tmp_path / "nope.jinja"))
  blind = tmp_path / "blind.jinja"
  blind.write_text("Question: {{ question }}\nCriterion: {{ criterion }}\n")
  with pytest.raises(ValueError, match=r"blind.jinja never shows \['answer'\]"):
    criteria.check_options("inprocess", {"template_path": str(blind)}, supplied=["generate_text"])
  unknown = tmp_path / "unknown.jinja"
  unknown.write_text("{{ question }} {{ answer }} {{ criterion }} {{ rubric }}")
  with pytest.raises(ValueError, match="unknown.jinja: cannot render"):
    criteria.CriterionPrompt(str(unknown))
  with pytest.raises(ValueError, match="2 tasks for 1 answers"):
    criteria.CheckerJudge().judge([SKY, SKY], ["a"])
