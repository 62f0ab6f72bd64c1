"""Rubric vocabulary, judges and tag profiles (docs/ALGORITHMS.md §2.2–2.3).

`JUDGES` maps backend names to classes: the built-ins below, entry points of group
`rised_jax.judges`, and import paths "package.module:Class" (`rised_jax.plugins`); a plug-in is a
concrete `Judge` subclass constructed as `cls(vocab, **judge.options)`.
"""
from __future__ import annotations

from typing import Any

from rised_jax import plugins
from rised_jax.rubrics.judge import Judge, JudgeError, JudgeStats, LLMJudge, RemoteJudge
from rised_jax.rubrics.llm_judges import GeminiJudge, InProcessJudge, OpenAICompatibleJudge
from rised_jax.rubrics.parsing import parse_verdict
from rised_jax.rubrics.profiles import pool_profiles, tag_frequencies
from rised_jax.rubrics.prompt import JudgePrompt
from rised_jax.rubrics.rule_judge import RuleBasedJudge
from rised_jax.rubrics.vocabulary import RubricEntry, Vocabulary, VocabularyError

__all__ = [
    "GeminiJudge", "InProcessJudge", "JUDGES", "Judge", "JudgeError", "JudgePrompt",
    "JudgeStats", "LLMJudge", "OpenAICompatibleJudge", "RemoteJudge", "RubricEntry",
    "RuleBasedJudge", "Vocabulary", "VocabularyError", "make_judge", "parse_verdict",
    "pool_profiles", "tag_frequencies",
]

JUDGES = plugins.Registry("judge", "judge.backend", {
    cls.backend: cls for cls in (RuleBasedJudge, GeminiJudge, OpenAICompatibleJudge,
                                 InProcessJudge)
}, check=plugins.check_subclass(Judge))


def make_judge(name: str, vocab: Vocabulary, **options: Any) -> Judge:
  """A judge by backend name ("rules", "genai", "openai", "inprocess", an entry point or an
  import path) with its options."""
  return JUDGES.build(name, vocab, **options)

