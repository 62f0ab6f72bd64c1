"""The judge prompt: task, transcript and vocabulary rendered through a Jinja template.

The default template is rubrics/data/judge_prompt.jinja; a config may name another file. It
receives: `env`, `seed`, `details` (the task's difficulty settings, "k=v, ..."), `description`
(optional text about the task, e.g. the environment's instructions), `turns` (dicts with
`index`, `action`, `observation` and `omitted`: 0, or the number of turns cut out
at that place), `success`,
`truncated`, `num_turns` and `vocabulary` (the entries: `id`, `polarity`, `description`).

Long transcripts are cut so a prompt stays bounded: each action and observation keeps its head
and tail (`max_chars` in all), and beyond `max_turns` turns only the first and last halves are
kept, with a marker for the turns in between.
"""
from __future__ import annotations

import functools
import importlib.resources
import os
from typing import Callable

import jinja2

from rised_jax.rubrics.vocabulary import Vocabulary
from rised_jax.types import Trajectory

DEFAULT_TEMPLATE = "judge_prompt.jinja"


def load_template(path: str | os.PathLike[str] | None, default_name: str,
                  package: str = "rised_jax.rubrics") -> jinja2.Template:
  """Compiles a Jinja template from `path`, or the packaged `data/<default_name>` (compiled
  once per process: callers that render per row need not keep it)."""
  if path is None:
    return _packaged_template(package, default_name)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"template {os.fspath(path)!r}: no such file")
  with open(path, encoding="utf-8") as f:
    return _compile(f.read(), os.fspath(path))


@functools.cache
def _packaged_template(package: str, name: str) -> jinja2.Template:
  source = (importlib.resources.files(package) / "data" / name).read_text("utf-8")
  return _compile(source, f"{package}/data/{name}")


def _compile(source: str, origin: str) -> jinja2.Template:
  # StrictUndefined: a template naming a variable we do not pass fails loudly, not silently.
  env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                           autoescape=False)
  try:
    return env.from_string(source)
  except jinja2.TemplateSyntaxError as e:
    raise ValueError(f"template {origin}: syntax error at line {e.lineno}: {e.message}") from e


def clip_text(text: str, max_chars: int) -> str:
  """Keeps the head and tail of `text` within `max_chars`, marking the cut."""
  if len(text) <= max_chars:
    return text
  omitted = len(text) - max_chars
  while True:  # the marker's own length depends on the count it states
    marker = f" [...{omitted} chars omitted...] "
    keep = max(max_chars - len(marker), 0)
    if len(text) - keep == omitted:
      break
    omitted = len(text) - keep
  head = keep // 2
  return text[:head] + marker + text[len(text) - (keep - head):]


class JudgePrompt:
  """Renders the judge prompt for one trajectory."""

  def __init__(self, vocab: Vocabulary, template_path: str | None = None,
               max_turns: int = 40, max_chars: int = 600,
               describe_task: Callable[[Trajectory], str] | None = None):
    if max_turns < 2:
      raise ValueError(f"judge prompt max_turns={max_turns}; expected >= 2")
    if max_chars < 40:
      raise ValueError(f"judge prompt max_chars={max_chars}; expected >= 40")
    self.vocab = vocab
    self.template = load_template(template_path, DEFAULT_TEMPLATE)
    self.max_turns = max_turns
    self.max_chars = max_chars
    self.describe_task = describe_task

  def render(self, traj: Trajectory) -> str:
    turns = [{"index": i + 1, "action": clip_text(t.action_text.strip(), self.max_chars),
              "observation": clip_text(t.observation.strip(), self.max_chars), "omitted": 0}
             for i, t in enumerate(traj.turns)]
    if len(turns) > self.max_turns:
      head = self.max_turns // 2
      tail = self.max_turns - head
      turns = turns[:head] + [{"omitted": len(turns) - self.max_turns}] + turns[-tail:]
    details = ", ".join(f"{k}={v}" for k, v in sorted(traj.task.difficulty.items()))
    return self.template.render(
        env=traj.task.env, seed=traj.task.seed, details=details,
        description=self.describe_task(traj) if self.describe_task else "",
        turns=turns, success=traj.success, truncated=traj.truncated,
        num_turns=len(traj.turns), vocabulary=self.vocab.entries)
