"""Per-criterion judges for rubric tasks (CriPO, docs/ALGORITHMS.md §3): r_ij ∈ {0, 1} for every
criterion j of the task of every answer i.

  judge = make_criteria_judge("checker")                                 # offline default
  judge = make_criteria_judge("openai", model="Qwen/Qwen3-32B", base_url="http://host:30001/v1")
  result = judge.judge(tasks, answers)        # one RubricTask and one answer text per rollout

`result.verdicts[i]` is float32 [C_i] in rubric order (for a pitfall, 1 means the answer commits
it). `result.unjudged[i]` is True when some verdict of answer i could not be obtained (its row
is then zeros); the caller leaves that rollout out of the group statistics. It is counted, never
guessed.

Backends:
  checker     `rubric_tasks.check`, the machine checks of the task file; never unjudged.
  genai, openai, inprocess (and plug-ins: `CRITERIA_JUDGES`, entry points of group
  rised_jax.criteria_judges or import paths to an `LLMJudge` subclass)
              the LLM judges of `rubrics.llm_judges`, asked one question per (answer, criterion);
              all questions of a call go out together (bounded concurrency for the HTTP
              backends, `generate_text` calls of `batch_size` for the in-process one). A question
              is the Jinja template rubrics/data/criteria_prompt.jinja (or `template_path`),
              which receives `question`, `answer`, `criterion` (its text), `pitfall` (True for a
              negative weight) and `reference` (the task's reference answer, or ""). The model
              answers with one tag of the two-entry vocabulary `VERDICTS` ("met" / "not_met"),
              so the backends' JSON schema, lenient parser, cache (keyed by the rendered
              question: an identical answer is not judged twice), retries and error
              classification apply unchanged. A question answered with neither or both tags,
              with garbage, or not at all (a failed request) leaves its answer unjudged. A misconfigured
              backend (bad key, unknown model or endpoint: HTTP 401/403/404) raises `JudgeError`
              as in RISED, since every later request would fail the same way.

Options of the LLM backends: those of `rubrics.llm_judges` (model, base_url, api_key_env,
temperature, max_concurrency, max_retries, cache_size, …) plus `template_path` and
`max_answer_chars` (longer answers keep their head and tail, default 16000 characters). The
options that shape RISED transcripts (max_turns, max_chars, describe_task) are refused.
"""
from __future__ import annotations

import abc
import dataclasses
import logging
import os
from typing import Any, Sequence

import jinja2
import numpy as np

from rised_jax import plugins, rubrics
from rised_jax.rubric_tasks import Criterion, RubricTask, check
from rised_jax.rubrics import judge as judge_lib
from rised_jax.rubrics import prompt as prompt_lib
from rised_jax.rubrics.vocabulary import RubricEntry, Vocabulary
from rised_jax.checks import is_int

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = "criteria_prompt.jinja"
VERDICTS = Vocabulary([RubricEntry("met", "+", "the answer meets the criterion"),
                       RubricEntry("not_met", "-", "the answer does not meet the criterion")],
                      source="criterion verdicts (built-in)")
_OWN_OPTIONS = ("template_path", "max_answer_chars")
_TRANSCRIPT_OPTIONS = ("max_turns", "max_chars", "describe_task")


@dataclasses.dataclass
class CriteriaStats:
  """Counters of one `judge` call."""

  answers: int = 0              # answers the judge was asked about
  unjudged_answers: int = 0     # answers with at least one question left without a verdict
  questions: int = 0            # (answer, criterion) pairs
  unjudged_questions: int = 0   # pairs without a usable verdict
  cache_hits: int = 0           # LLM: questions answered from the cache
  requests: int = 0             # LLM: questions sent to the model (first attempts)
  retries: int = 0              # LLM: extra attempts after transient errors
  failed_requests: int = 0      # LLM: questions that got no answer after all retries

  def as_dict(self) -> dict[str, int]:
    return dataclasses.asdict(self)


@dataclasses.dataclass
class CriteriaVerdicts:
  """A judge's answer for a list of answers (module docstring)."""

  verdicts: list[np.ndarray]    # per answer, float32 [C] (zeros where unjudged)
  unjudged: np.ndarray          # bool [answers]: no usable verdict for some criterion
  stats: CriteriaStats


@dataclasses.dataclass(frozen=True)
class CriterionQuestion:
  """One question for an LLM judge: does `answer` meet criterion `index` of `task`?"""

  task: RubricTask
  index: int
  answer: str

  @property
  def criterion(self) -> Criterion:
    return self.task.criteria[self.index]


class CriterionPrompt:
  """Renders a `CriterionQuestion` through the template (what `LLMJudge` calls `prompt`).

  The template is tried on a probe question when loaded: it must render with the variables of
  the module docstring and show the question, the answer and the criterion.
  """

  def __init__(self, template_path: str | os.PathLike[str] | None = None,
               max_answer_chars: int = 16000):
    if not is_int(max_answer_chars) or \
        max_answer_chars < 40:
      raise ValueError(f"criteria judge: max_answer_chars={max_answer_chars!r}; expected an "
                       "integer >= 40")
    self.origin = os.fspath(template_path) if template_path else f"rubrics/data/{DEFAULT_TEMPLATE}"
    self.template = prompt_lib.load_template(template_path, DEFAULT_TEMPLATE)
    self.max_answer_chars = max_answer_chars
    self._check_template()

  def _check_template(self) -> None:
    probe = {"question": "PROBEQUESTION", "answer": "PROBEANSWER", "criterion": "PROBECRITERION"}
    try:
      text = self.template.render(**probe, pitfall=True, reference="PROBEREFERENCE")
    except jinja2.TemplateError as e:
      raise ValueError(f"criteria judge template {self.origin}: cannot render ({type(e).__name__}: "
                       f"{e}); it receives question, answer, criterion, pitfall and reference"
                       ) from None
    missing = [name for name, value in probe.items() if value not in text]
    if missing:
      raise ValueError(f"criteria judge template {self.origin} never shows {missing}; a question "
                       "to the judge needs the question, the answer and the criterion")

  def render(self, question: CriterionQuestion) -> str:
    criterion = question.criterion
    return self.template.render(
        question=question.task.prompt.strip(),
        answer=prompt_lib.clip_text(question.answer.strip(), self.max_answer_chars),
        criterion=criterion.text.strip(), pitfall=criterion.is_pitfall,
        reference=(question.task.reference or "").strip())


class CriteriaJudge(abc.ABC):
  """Gives every answer a binary verdict per criterion of its task."""

  backend: str = ""

  def judge(self, tasks: Sequence[RubricTask], answers: Sequence[str]) -> CriteriaVerdicts:
    """Verdicts for answers[i] against tasks[i], in order."""
    if len(tasks) != len(answers):
      raise ValueError(f"{self.backend} criteria judge: {len(tasks)} tasks for {len(answers)} "
                       "answers; expected one task per answer")
    for i, answer in enumerate(answers):
      if not isinstance(answer, str):
        raise ValueError(f"{self.backend} criteria judge: answers[{i}] is "
                         f"{type(answer).__name__}; expected str")
    result = self._judge(list(tasks), list(answers))
    # An unjudged answer's row is zeros whatever the backend left in it (module docstring).
    result = dataclasses.replace(result, verdicts=[
        np.zeros_like(row) if unjudged else row
        for row, unjudged in zip(result.verdicts, result.unjudged, strict=True)])
    if result.stats.unjudged_answers:
      log.warning("%s criteria judge: %d of %d answers unjudged (%d of %d questions; %d failed "
                  "requests)", self.backend, result.stats.unjudged_answers, result.stats.answers,
                  result.stats.unjudged_questions, result.stats.questions,
                  result.stats.failed_requests)
    return result

  @abc.abstractmethod
  def _judge(self, tasks: list[RubricTask], answers: list[str]) -> CriteriaVerdicts:
    """`judge` after its argument checks."""


class CheckerJudge(CriteriaJudge):
  """The deterministic checker of the task file (`rubric_tasks.check`)."""

  backend = "checker"

  def _judge(self, tasks: list[RubricTask], answers: list[str]) -> CriteriaVerdicts:
    verdicts = [check(task, answer) for task, answer in zip(tasks, answers)]
    stats = CriteriaStats(answers=len(answers), questions=sum(len(v) for v in verdicts))
    return CriteriaVerdicts(verdicts, np.zeros(len(answers), bool), stats)


def _check_backend(obj: Any, name: str) -> None:
  """A criteria judge backend is the checker or an LLM judge (asked one question per criterion)."""
  if obj is not CheckerJudge:
    plugins.check_subclass(judge_lib.LLMJudge)(obj, name)


# config.rubric.judge.backend: the checker and the tag judges' LLM backends.
CRITERIA_JUDGES = plugins.Registry("criteria judge", "rubric.judge.backend", {
    "checker": CheckerJudge,
    **{name: cls for name, cls in rubrics.JUDGES.builtins.items()
       if issubclass(cls, judge_lib.LLMJudge)}}, check=_check_backend)


def _verdict_value(verdict) -> float | None:
  """1.0 (met), 0.0 (not met) or None (unjudged: no answer, garbage, neither or both tags)."""
  if verdict.unjudged:
    return None
  met, not_met = bool(verdict.tags[0]), bool(verdict.tags[1])
  return float(met) if met != not_met else None


class LLMCriteriaJudge(CriteriaJudge):
  """One question per (answer, criterion) through an LLM judge of `rubrics.llm_judges`."""

  def __init__(self, llm: judge_lib.LLMJudge, template_path: str | None = None,
               max_answer_chars: int = 16000):
    if llm.vocab is not VERDICTS:
      raise ValueError(f"{llm.backend} criteria judge: the LLM judge must be built with the "
                       "VERDICTS vocabulary")
    self.backend = llm.backend
    self.llm = llm
    # The LLM judge renders each item it judges through `prompt`; ours renders questions.
    self.llm.prompt = CriterionPrompt(template_path, max_answer_chars)

  def _judge(self, tasks: list[RubricTask], answers: list[str]) -> CriteriaVerdicts:
    questions = [CriterionQuestion(task, j, answer)
                 for task, answer in zip(tasks, answers) for j in range(len(task.criteria))]
    replies, llm_stats = self.llm.judge_trajectories(questions)
    values = [_verdict_value(v) for v in replies]
    stats = CriteriaStats(answers=len(answers), questions=len(questions),
                          unjudged_questions=sum(v is None for v in values),
                          cache_hits=llm_stats.cache_hits, requests=llm_stats.requests,
                          retries=llm_stats.retries, failed_requests=llm_stats.failed_requests)
    verdicts, unjudged = [], np.zeros(len(answers), bool)
    start = 0
    for i, task in enumerate(tasks):
      mine = values[start:start + len(task.criteria)]
      start += len(task.criteria)
      unjudged[i] = any(v is None for v in mine)
      verdicts.append(np.asarray([0.0 if v is None else v for v in mine], np.float32))
    stats.unjudged_answers = int(unjudged.sum())
    return CriteriaVerdicts(verdicts, unjudged, stats)


def accepted_options(backend: str) -> list[str]:
  """The option names `make_criteria_judge(backend, ...)` takes."""
  cls = CRITERIA_JUDGES.lookup(backend)
  if cls is CheckerJudge:
    return []
  inherited = [name for name in plugins.parameters(cls)
               if name not in ("vocab", *_OWN_OPTIONS, *_TRANSCRIPT_OPTIONS)]
  return [*inherited, *_OWN_OPTIONS]


def check_options(backend: str, options: dict[str, Any], *, supplied: Sequence[str] = ()) -> None:
  """Raises ValueError for an unknown backend, an unknown option or a missing required one.

  `supplied` names options the caller adds itself (the pipeline's in-process `generate_text`).
  Cheap (only the question template is loaded and tried), so config validation calls it.
  """
  accepted = accepted_options(backend)
  unknown = sorted(set(options) - set(accepted))
  if unknown:
    hint = (f"; {sorted(set(unknown) & set(_TRANSCRIPT_OPTIONS))} shape RISED transcripts"
            if set(unknown) & set(_TRANSCRIPT_OPTIONS) else "")
    raise ValueError(f"criteria judge {backend!r} has no option(s) {unknown}{hint}; accepted "
                     f"options: {accepted}")
  # Required: the backend's constructor parameters without a default (`plugins.parameters`).
  cls = CRITERIA_JUDGES.lookup(backend)
  required = [] if cls is CheckerJudge else [
      name for name, needed in plugins.parameters(cls).items() if needed and name in accepted]
  missing = [name for name in required if name not in options and name not in supplied]
  if missing:
    raise ValueError(f"criteria judge {backend!r} needs option(s) {missing}")
  if cls is not CheckerJudge:
    CriterionPrompt(options.get("template_path"), options.get("max_answer_chars", 16000))


def make_criteria_judge(backend: str, **options: Any) -> CriteriaJudge:
  """A criteria judge by backend name (module docstring) with its options."""
  check_options(backend, options)
  if CRITERIA_JUDGES[backend] is CheckerJudge:
    return CheckerJudge()
  own = {name: options.pop(name) for name in _OWN_OPTIONS if name in options}
  llm = CRITERIA_JUDGES.build(backend, VERDICTS, **options)
  return LLMCriteriaJudge(llm, **own)
