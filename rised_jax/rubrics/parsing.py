"""Lenient parsing of an LLM judge's answer into a `Verdict` (docs/ALGORITHMS.md §2.3).

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
| a non-empty list none of whose items is known       | unjudged                                 |
| empty text, no JSON, truncated JSON, no tags key, wrong type (number, null, bool) | unjudged   |
| not a string at all (None, a number, an object), or over `MAX_ANSWER_CHARS`  | unjudged   |
| JSON nested deeper than the decoder allows, or a number too long to convert | that candidate skipped |

Parse time is linear in the answer's length: at most `MAX_CANDIDATES` fenced blocks and
`MAX_CANDIDATES` embedded objects (each an opening `{"`) are decoded, and each decode is linear.
(Trying every `{` would be quadratic: a failed decode at offset k costs O(k) to locate its error.)

"Untagged" means the rollout's tags are unknown: no teacher or guidance statistic counts it,
so a failed judgement never reads as "all good". In RISED selection (`select/rised.py`) a
group's profile is the mean over its tagged rollouts only; a group with no tagged rollout has
no profile at all: it is left out of the pool composition, alignment, redundancy and history,
and chosen only when fewer than B groups have a profile, after all of them.
"""
from __future__ import annotations

import itertools
import json
import re
import reprlib
from typing import Any

import numpy as np

from rised_jax.rubrics.vocabulary import Vocabulary
from rised_jax.types import Verdict

_TAG_KEYS = ("tags", "rubrics", "labels", "applicable_tags")
_ITEM_KEYS = ("id", "tag", "name")
_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)
# Where an embedded JSON object may start: an object with a key (a tags object needs one).
_OBJECT_START = re.compile(r'\{\s*"')
MAX_ANSWER_CHARS = 1_000_000   # a longer answer is no verdict (a judge answers in a few lines)
MAX_CANDIDATES = 64            # fenced blocks, and embedded objects, decoded at most
# Unknown items are logged as a short, bounded summary (never a full repr of a deep value).
_SUMMARY = reprlib.Repr()
_SUMMARY.maxlevel, _SUMMARY.maxstring, _SUMMARY.maxother = 2, 60, 60
_SUMMARY.maxlist = _SUMMARY.maxdict = 4


def parse_verdict(text: Any, vocab: Vocabulary) -> Verdict:
  """Parses a judge answer; unusable answers (of any type) give `Verdict(unjudged=True)`."""
  if not isinstance(text, str):
    raw = "" if text is None else f"<not text: {_summary(text)}>"
    return Verdict(tags=np.zeros(len(vocab), np.float32), unjudged=True, raw=raw)
  raw = text
  unjudged = Verdict(tags=np.zeros(len(vocab), np.float32), unjudged=True, raw=raw)
  if len(raw) > MAX_ANSWER_CHARS:
    return unjudged
  items = _find_tag_items(raw)
  if items is None:
    return unjudged
  tags = np.zeros(len(vocab), np.float32)
  unknown = []
  for item in items:
    index = _resolve_item(item, vocab)
    if index is None:
      unknown.append(item[:_SUMMARY.maxstring] if isinstance(item, str) else _summary(item))
    else:
      tags[index] = 1.0
  if items and not tags.any():
    return Verdict(tags=tags, unjudged=True, unknown_tags=tuple(unknown), raw=raw)
  return Verdict(tags=tags, unjudged=False, unknown_tags=tuple(unknown), raw=raw)


def _summary(value: Any) -> str:
  """A short repr for the logs; the type's name where even that fails (an int of more digits
  than Python converts, an object whose repr raises)."""
  try:
    return _SUMMARY.repr(value)
  except Exception:  # pylint: disable=broad-except  # any repr may raise
    return f"<{type(value).__name__}>"


def _find_tag_items(text: str) -> list[Any] | None:
  """The list of tag items the answer gives, or None when it gives none usable."""
  stripped = text.strip()
  if not stripped:
    return None
  # Whole-answer candidates may be bare lists; embedded ones must be tagged objects, so that
  # a stray "[]" inside prose cannot read as "no tag applies".
  fenced = [m.group(1).strip() for m in itertools.islice(_FENCE.finditer(text), MAX_CANDIDATES)]
  for candidate in fenced + [stripped]:
    items = _items_from_json(_decode(json.loads, candidate), allow_list=True)
    if items is not None:
      return items
  decoder = json.JSONDecoder()
  for match in itertools.islice(_OBJECT_START.finditer(text), MAX_CANDIDATES):
    decoded = _decode(lambda s, start=match.start(): decoder.raw_decode(s, start)[0], text)
    items = _items_from_json(decoded, allow_list=False)
    if items is not None:
      return items
  return None


def _decode(decode, text: str) -> Any:
  """`decode(text)`, or None when it is no JSON the decoder can hold: malformed or truncated
  (JSONDecodeError), a number too long to convert (ValueError), nested too deep
  (RecursionError from the C decoder's depth guard)."""
  try:
    return decode(text)
  except (ValueError, RecursionError):
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
