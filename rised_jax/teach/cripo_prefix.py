"""CriPO's two teacher contexts, rendered as chat messages from template files.

- Criterion injection (UC branch): the question, the group's best answer y* and the unexplored
  criteria, with an instruction to minimally revise the answer so it satisfies them. The teacher
  re-scores y*'s own tokens after this context (no generation).
- Counterfactual (SC branch): the question, a negative-advantage answer and the suppressed criteria
  it meets, with an instruction to modify or delete the parts that satisfy them.

The wording lives in `cripo_templates/*.jinja` [C-choice: template wording]; a config may name other
files. A template receives `question` (str), `answer` (str) and `criteria` (list of str) and must use
all three and nothing else, which is checked when it is loaded. The result is a list of
{role, content} messages (an optional system message, then one user message) for a tokenizer's
chat template with the generation prompt appended.
"""
from __future__ import annotations

import functools
import os
from typing import Sequence

import jinja2
import jinja2.meta

TEMPLATE_DIR = os.path.join(os.path.dirname(__file__), "cripo_templates")
INJECTION_TEMPLATE = os.path.join(TEMPLATE_DIR, "injection.jinja")
COUNTERFACTUAL_TEMPLATE = os.path.join(TEMPLATE_DIR, "counterfactual.jinja")
TEMPLATE_VARIABLES = frozenset({"question", "answer", "criteria"})

_ENVIRONMENT = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False,
                                  keep_trailing_newline=False)


@functools.lru_cache(maxsize=32)
def load_template(path: str) -> jinja2.Template:
  """Parses a template file; errors name the file and what is wrong with it."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"CriPO teacher template {path!r} does not exist")
  with open(path, encoding="utf-8") as f:
    source = f.read()
  try:
    variables = jinja2.meta.find_undeclared_variables(_ENVIRONMENT.parse(source))
  except jinja2.TemplateSyntaxError as e:
    raise ValueError(f"{path}:{e.lineno}: template syntax error: {e.message}") from None
  if variables != TEMPLATE_VARIABLES:
    raise ValueError(f"{path}: a CriPO template must use exactly {sorted(TEMPLATE_VARIABLES)}; it uses "
                     f"{sorted(variables)}")
  return _ENVIRONMENT.from_string(source)


def _checked_text(value: object, name: str) -> str:
  if not isinstance(value, str) or not value.strip():
    raise ValueError(f"{name} must be a non-empty string, got {value!r}")
  return value


def _messages(template_path: str, question: str, answer: str, criteria: Sequence[str],
              system_prompt: str | None) -> list[dict[str, str]]:
  if isinstance(criteria, str) or not criteria:
    raise ValueError(f"criteria must be a non-empty list of criterion texts, got {criteria!r}")
  criteria = [_checked_text(c, f"criteria[{i}]").strip() for i, c in enumerate(criteria)]
  content = load_template(template_path).render(
      question=_checked_text(question, "question").strip(),
      answer=_checked_text(answer, "answer").strip(), criteria=criteria)
  messages = [] if system_prompt is None else [
      {"role": "system", "content": _checked_text(system_prompt, "system_prompt")}]
  return messages + [{"role": "user", "content": content}]


def injection_messages(question: str, best_answer: str, uc_criteria: Sequence[str],
                       system_prompt: str | None = None,
                       template_path: str = INJECTION_TEMPLATE) -> list[dict[str, str]]:
  """Criterion-injection teacher context for y* and the group's unexplored criteria."""
  return _messages(template_path, question, best_answer, uc_criteria, system_prompt)


def counterfactual_messages(question: str, answer: str, sc_criteria: Sequence[str],
                            system_prompt: str | None = None,
                            template_path: str = COUNTERFACTUAL_TEMPLATE) -> list[dict[str, str]]:
  """Counterfactual teacher context for one rollout and the suppressed criteria it meets."""
  return _messages(template_path, question, answer, sc_criteria, system_prompt)
