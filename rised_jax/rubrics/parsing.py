"""Lenient parsing of an LLM judge's answer into a `Verdict` (ALGORITHMS.md §2.3).

Shared by every LLM backend. The parser never raises on the answer's content:

| answer                                              | verdict                                  |
| --------------------------------------------------- | ---------------------------------------- |
| `{"tags": [...]}` (also keys rubrics/labels/applicable_tags, any case) | tags found |
| the same inside a ```json fenced block or surrounded by prose | tags found                     |
| a bare JSON list `[...]` as the whole answer or a fenced block | tags found                    |
| `{"tags": "a, b"}` (one string)                     | split on commas / semicolons / newlines  |
| `{"tags": {"a": true, "b": false}}`                 | the keys with a truthy value             |
| items `{"id": ...}` / `{"tag": ...}` / `{"name": ...}` | that field                            |
| item spelling an id or a description (any case, `_`/`-`/space alike, bullets and quotes stripped) | that tag |
| item that is not in the vocabulary or not a string  | dropped, counted in `unknown_tags`       |
| `{"tags": []}`                                      | a valid verdict: no tag applies          |
| a non-empty list none of whose items is known       | untagged                                 |
| empty text, no JSON, truncated JSON, no tags key, wrong type (number, null, bool) | untagged   |

"Untagged" means the rollout's tags are unknown: no teacher or guidance statistic counts it,
so a failed judgement never reads as "all good". In RISED selection (`select/rised.py`) a
group's profile is the mean over its tagged rollouts only; a group with no tagged rollout has
no profile at all: it is left out of the pool composition, alignment, redundancy and history,
and chosen only when fewer than B groups have a profile, after all of them.
"""
from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from rised_jax.rubrics.vocabulary import Vocabulary
from rised_jax.types import Verdict

_TAG_KEYS = ("tags", "rubrics", "labels", "applicable_tags")
_ITEM_KEYS = ("id", "tag", "name")
_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)
_MAX_UNKNOWN_REPR = 80


def parse_verdict(text: str | None, vocab: Vocabulary) -> Verdict:
  """Parses a judge answer; unusable answers give `Verdict(untagged=True)`."""
  raw = text or ""
  untagged = Verdict(tags=np.zeros(len(vocab), np.float32), untagged=True, raw=raw)
  items = _find_tag_items(raw)
  if items is None:
    return untagged
  tags = np.zeros(len(vocab), np.float32)
  unknown = []
  for item in items:
    index = _resolve_item(item, vocab)
    if index is None:
      unknown.append(item if isinstance(item, str) else repr(item)[:_MAX_UNKNOWN_REPR])
    else:
      tags[index] = 1.0
  if items and not tags.any():
    return Verdict(tags=tags, untagged=True, unknown_tags=tuple(unknown), raw=raw)
  return Verdict(tags=tags, untagged=False, unknown_tags=tuple(unknown), raw=raw)


def _find_tag_items(text: str) -> list[Any] | None:
  """The list of tag items the answer gives, or None when it gives none usable."""
  stripped = text.strip()
  if not stripped:
    return None
  # Whole-answer candidates may be bare lists; embedded ones must be tagged objects, so that
  # a stray "[]" inside prose cannot read as "no tag applies".
  whole = [m.group(1).strip() for m in _FENCE.finditer(text)] + [stripped]
  for candidate in whole:
    items = _items_from_json(_decode(candidate), allow_list=True)
    if items is not None:
      return items
  decoder = json.JSONDecoder()
  for start in (m.start() for m in re.finditer(r"\{", text)):
    try:
      value, _ = decoder.raw_decode(text, start)
    except json.JSONDecodeError:
      continue
    items = _items_from_json(value, allow_list=False)
    if items is not None:
      return items
  return None


def _decode(candidate: str) -> Any:
  try:
    return json.loads(candidate)
  except json.JSONDecodeError:
    return None


def _items_from_json(value: Any, allow_list: bool) -> list[Any] | None:
  if isinstance(value, list):
    return value if allow_list else None
  if not isinstance(value, dict):
    return None
  folded = {k.lower(): v for k, v in value.items() if isinstance(k, str)}
  for key in _TAG_KEYS:
    if key not in folded:
      continue
    tags = folded[key]
    if isinstance(tags, list):
      return tags
    if isinstance(tags, str):
      return [part for part in re.split(r"[,;\n]", tags) if part.strip()]
    if isinstance(tags, dict):
      return [k for k, v in tags.items() if isinstance(v, (int, float)) and v > 0]
    return None
  return None


def _resolve_item(item: Any, vocab: Vocabulary) -> int | None:
  if isinstance(item, dict):
    folded = {k.lower(): v for k, v in item.items() if isinstance(k, str)}
    item = next((folded[k] for k in _ITEM_KEYS if k in folded), None)
  if not isinstance(item, str):
    return None
  return vocab.resolve(item)
