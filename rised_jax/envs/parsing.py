"""Reading an action out of a model's free-text reply; shared by every environment.

Precedence:
  1. `<answer>…</answer>`: the content of the LAST complete pair wins (tags are matched
     case- and whitespace-insensitively; with nested tags the innermost pair counts). A reply
     whose last `<answer>` is never closed (generation stopped early) uses the text after it.
     When a reply has an answer, only the answer is read: a malformed answer is an invalid
     action even if some other line of the reply looks like one.
  2. Without any `<answer>` tag: the reply's non-empty lines, last first (a bare action line).

Each candidate is normalised (lower case, single spaces, wrapping quotes / markdown / trailing
punctuation and prefixes such as "action:" removed) before an environment's own parser sees it.
Nothing here raises on any string.
"""
from __future__ import annotations

import re
import unicodedata
from typing import Any

_OPEN_TAG = r"<\s*answer\s*>"
_CLOSE_TAG = r"<\s*/\s*answer\s*>"
# Innermost complete pairs: the content may not contain another opening tag.
_ANSWER_PAIR_RE = re.compile(_OPEN_TAG + r"((?:(?!" + _OPEN_TAG + r").)*?)" + _CLOSE_TAG,
                             re.IGNORECASE | re.DOTALL)
_OPEN_TAG_RE = re.compile(_OPEN_TAG, re.IGNORECASE)
_ANY_TAG_RE = re.compile(r"<\s*/?\s*answer\s*>", re.IGNORECASE)
_CLOSE_TAG_RE = re.compile(_CLOSE_TAG, re.IGNORECASE)
# Fallback lines looked at, last first: an action is the reply's conclusion, not its preamble.
_MAX_FALLBACK_LINES = 8
_WRAPPERS = "\"'`*_[](){}<>“”‘’«»"
_TRAILING = ".!?,;:"
# "move" is a verb of several games, so only "move:" counts as a prefix.
_PREFIX_RE = re.compile(
    r"^(?:(?:final answer|answer|action|my action|next action|command|guess|my guess|i choose|"
    r"i will|i'll|let's|lets)(?:\s+is)?(?:\s*[:=-]\s*|\s+)|(?:move|my move|next move)\s*:\s*)",
    re.IGNORECASE)
GIVE_UP_PHRASES = frozenset({"give up", "i give up", "quit", "surrender", "resign"})


def as_text(reply: Any) -> str:
  """Any reply (None, bytes, numbers, …) as a string; never raises."""
  if reply is None:
    return ""
  if isinstance(reply, bytes):
    return reply.decode("utf-8", errors="replace")
  if isinstance(reply, str):
    return reply
  try:
    return str(reply)
  except Exception:  # a hostile __str__ must not break the episode.  # pylint: disable=broad-except
    return ""


def extract_answer(text: str) -> str | None:
  """The content of the last `<answer>…</answer>` pair, or None when the reply has no tag."""
  if not _ANY_TAG_RE.search(text):
    return None
  last_pair = None
  for last_pair in _ANSWER_PAIR_RE.finditer(text):
    pass
  opens = list(_OPEN_TAG_RE.finditer(text))
  last_open = opens[-1] if opens else None
  # An opening tag after the last complete pair and never closed: a truncated answer.
  if last_open is not None and (last_pair is None or last_open.start() >= last_pair.end()):
    tail = text[last_open.end():]
    if not _CLOSE_TAG_RE.search(tail):
      return tail
  if last_pair is not None:
    return last_pair.group(1)
  return ""  # tags present but no usable pair (e.g. only closing tags): an empty answer.


def normalize(candidate: str) -> str:
  """Lower case, NFKC, single spaces; strips wrappers, trailing punctuation, "action:" prefixes."""
  text = unicodedata.normalize("NFKC", candidate)
  text = " ".join(text.split()).lower()
  for _ in range(3):  # a few rounds: "**Action: `up`.**" needs wrappers, prefix, wrappers.
    before = text
    text = text.strip(_WRAPPERS + " ").rstrip(_TRAILING + " ").strip(_WRAPPERS + " ")
    text = _PREFIX_RE.sub("", text)
    if text == before:
      break
  return text


def candidates(reply: Any) -> list[str]:
  """Normalised action candidates in the order an environment should try them."""
  text = as_text(reply)
  answer = extract_answer(text)
  if answer is not None:
    return [normalize(answer)]
  lines = [line for line in text.splitlines() if line.strip()]
  return [normalize(line) for line in reversed(lines[-_MAX_FALLBACK_LINES:])]


def shown(reply: Any, limit: int = 40) -> str:
  """A short, printable excerpt of what was read, for feedback messages."""
  text = as_text(reply)
  answer = extract_answer(text)
  if answer is None:
    lines = [line for line in text.splitlines() if line.strip()]
    answer = lines[-1] if lines else ""
  excerpt = "".join(c if c.isprintable() else " " for c in " ".join(answer.split()))
  return excerpt if len(excerpt) <= limit else excerpt[:limit - 3] + "..."


def format_answer(action: str) -> str:
  """Wraps an action text the way every environment asks the agent to answer."""
  return f"<answer>{action}</answer>"


_DIRECTION_WORDS = {
    "up": ("up", "north", "n", "u", "^", "↑"),
    "down": ("down", "south", "s", "d", "v", "↓"),
    "left": ("left", "west", "w", "l", "←"),
    "right": ("right", "east", "e", "r", "→"),
}
DIRECTION_SYNONYMS = {word: canon for canon, words in _DIRECTION_WORDS.items() for word in words}
_MOVE_VERB_RE = re.compile(
    r"^(?:move|go|walk|step|head|push|run|slide)(?: to the| to| towards| toward)?\s+")


def parse_direction(candidate: str) -> str | None:
  """'up' / 'north' / 'move north' / 'go up' … → one of up, down, left, right."""
  text = _MOVE_VERB_RE.sub("", candidate.strip())
  if text.endswith("wards"):
    text = text[:-5]
  elif text.endswith("ward"):
    text = text[:-4]
  return DIRECTION_SYNONYMS.get(text.strip())
