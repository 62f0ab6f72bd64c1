"""The rubric pipeline's held-out evaluation: one answer per held-out criteria task (greedy by
default), judged per criterion, reported per evaluation group of domains
(`rubric_tasks.split.eval_group_of`):

  pass_rate       tasks passed (every positive criterion met, no pitfall), with its Wilson 95 %
                  interval (ci_low, ci_high) over the `episodes` judged answers;
  score           mean weighted score R = Σ ω_j r_j / Z, with a Student-t 95 % interval
                  (score_ci_low, score_ci_high);
  criteria_met    the fraction of positive criteria met; pitfall_rate the answers with a pitfall;
  unjudged        answers the judge could not judge: left out of everything above, counted.

The run log's eval.jsonl keeps the pass rates; `trainer.train` and `rised-eval` return everything.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from rised_jax.learn import cripo
from rised_jax.rollout.base import GenerationRequest, SamplingParams
from rised_jax.rubric_tasks import RubricTask, passes
from rised_jax.rubric_tasks.split import OTHER_DOMAINS
from rised_jax.stats import t_interval, wilson_interval


def evaluate(engine, judge, tasks: Sequence[RubricTask], prompt_ids: Sequence[Sequence[int]],
             seeds: Sequence[int], sampling: SamplingParams,
             answer_text: Callable[[Sequence[int]], str], group_of: Mapping[str, str],
             normalizer: str) -> dict[str, dict[str, float]]:
  """{evaluation group: results} (module docstring) of one answer per task, `prompt_ids[i]` and
  `seeds[i]` being `tasks[i]`'s; `judge` a criteria judge (`rubrics.criteria`)."""
  requests = [GenerationRequest(ids, sampling, seed=seed) for ids, seed in zip(prompt_ids, seeds)]
  answers = [answer_text(r.output_ids) for r in engine.generate(requests)]
  judged = judge.judge(tasks, answers)
  records: dict[str, list[tuple[bool, float, float, bool]]] = {}
  unjudged: dict[str, int] = {}
  for task, verdicts, failed in zip(tasks, judged.verdicts, judged.unjudged):
    group = group_of.get(task.domain or "", OTHER_DOMAINS)
    if failed:
      unjudged[group] = unjudged.get(group, 0) + 1
      continue
    score = float(cripo.weighted_rewards(verdicts[None, None], task.weights[None], None,
                                         normalizer)[0, 0])
    positive = task.weights > 0
    records.setdefault(group, []).append((
        passes(verdicts, task.weights), score, float(verdicts[positive].mean()),
        bool((verdicts[task.weights < 0] > 0).any())))
  if not records:
    raise RuntimeError(f"evaluation: the {judge.backend} criteria judge gave no "
                       f"usable verdicts for any of the {len(tasks)} held-out answers")
  results = {}
  for group, rows in sorted(records.items()):
    passed, scores, met, pitfalls = (list(column) for column in zip(*rows))
    low, high = wilson_interval(sum(passed), len(passed))
    score_low, score_high = t_interval(scores)
    results[group] = {
        "pass_rate": sum(passed) / len(passed), "ci_low": low, "ci_high": high,
        "episodes": len(passed), "score": float(np.mean(scores)), "score_ci_low": score_low,
        "score_ci_high": score_high, "criteria_met": float(np.mean(met)),
        "pitfall_rate": float(np.mean(pitfalls)), "unjudged": unjudged.get(group, 0)}
  return results
