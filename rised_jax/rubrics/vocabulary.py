"""The rubric vocabulary: one list of tags shared by every environment (docs/ALGORITHMS.md §2.2).

A vocabulary is data: a JSON file holding a list of entries
`{"id": str, "polarity": "+" | "-", "description": str}`. The built-in `agentic_v1`
(rubrics/data/agentic_v1.json) is this project's own choice **[R-choice: the vocabulary]**;
a config may name any other file instead, or a plug-in: an entry point of group
`rised_jax.vocabularies` or an import path "package.module:ATTRIBUTE" whose object is a
`Vocabulary`, a list of entries, a path to a JSON file, or a function declared with
`@rised_jax.plugins.factory("vocabulary")` returning one of these (no other callable is called).

Tag vectors are multi-hot float32 arrays over the entries, in file order.
"""
from __future__ import annotations

import dataclasses
import importlib.resources
import json
import os
import re
from typing import Any, Iterable, Sequence

import numpy as np

from rised_jax import json_data, plugins

_ID_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
_REQUIRED_KEYS = ("id", "polarity", "description")


class VocabularyError(ValueError):
  """A vocabulary file or entry is malformed."""


@dataclasses.dataclass(frozen=True)
class RubricEntry:
  id: str
  polarity: str        # "+" or "-"
  description: str

  @property
  def positive(self) -> bool:
    return self.polarity == "+"


def normalize_tag_name(name: str) -> str:
  """Folds case, separators, list bullets and surrounding quotes/punctuation.

  So that "Valid_Syntax", "- valid syntax." and "uses valid action syntax on every turn"
  compare equal to the id or description they spell.
  """
  name = name.strip().strip("\"'`").strip()
  name = re.sub(r"^(?:[-*•+]\s*|\d+[.)]\s+)", "", name)
  name = name.lower().replace("_", " ").replace("-", " ")
  name = re.sub(r"\s+", " ", name)
  return name.strip(" .;:,!")


class Vocabulary:
  """An ordered, validated list of rubric entries with index lookups."""

  def __init__(self, entries: Sequence[RubricEntry], source: str = "<memory>"):
    if not entries:
      raise VocabularyError(f"vocabulary {source}: no entries; expected a non-empty list")
    self.source = source
    self.entries: tuple[RubricEntry, ...] = tuple(entries)
    self._index: dict[str, int] = {}
    self._by_name: dict[str, int] = {}
    for i, entry in enumerate(self.entries):
      _check_entry_fields(entry, i, source)
      if entry.id in self._index:
        raise VocabularyError(
            f"vocabulary {source}: entry {i} repeats id {entry.id!r} (first at entry "
            f"{self._index[entry.id]}); ids must be unique")
      self._index[entry.id] = i
      # Ids and descriptions share one case-insensitive namespace: judges may answer with either.
      for name in (entry.id, entry.description):
        key = normalize_tag_name(name)
        other = self._by_name.get(key)
        if other is not None and other != i:
          raise VocabularyError(
              f"vocabulary {source}: entry {i} ({entry.id!r}) is ambiguous with entry {other} "
              f"({self.entries[other].id!r}): both read as {key!r} ignoring case and separators")
        self._by_name[key] = i
    polarities = np.asarray([e.positive for e in self.entries])
    self.positive_mask: np.ndarray = polarities
    self.negative_mask: np.ndarray = ~polarities

  @classmethod
  def from_json_data(cls, data: Any, source: str) -> "Vocabulary":
    """Builds a vocabulary from decoded JSON, naming `source` in every error."""
    if not isinstance(data, list):
      raise VocabularyError(
          f"vocabulary {source}: top level is {type(data).__name__}; expected a list of "
          "{id, polarity, description} objects")
    entries = []
    for i, item in enumerate(data):
      if not isinstance(item, dict):
        raise VocabularyError(
            f"vocabulary {source}: entry {i} is {type(item).__name__} ({item!r}); expected an "
            "object with keys id, polarity, description")
      missing = [k for k in _REQUIRED_KEYS if k not in item]
      if missing:
        raise VocabularyError(
            f"vocabulary {source}: entry {i} ({item.get('id', '?')!r}) lacks key(s) {missing}; "
            f"expected keys {list(_REQUIRED_KEYS)}")
      extra = sorted(set(item) - set(_REQUIRED_KEYS))
      if extra:
        raise VocabularyError(
            f"vocabulary {source}: entry {i} ({item['id']!r}) has unknown key(s) {extra}; "
            f"expected exactly {list(_REQUIRED_KEYS)}")
      entries.append(RubricEntry(item["id"], item["polarity"], item["description"]))
    return cls(entries, source)

  @classmethod
  def load(cls, name_or_path: str | os.PathLike[str]) -> "Vocabulary":
    """A vocabulary by name (`VOCABULARIES`: "agentic_v1", an entry point, an import path) or a
    JSON file by path."""
    name = os.fspath(name_or_path)
    if name not in VOCABULARIES.builtins and os.path.isfile(name):
      with open(name, "rb") as f:
        return cls.from_text(json_data.decode_utf8(f.read(), f"vocabulary {name}",
                                                   VocabularyError), name)
    if not plugins.is_import_path(name) and name not in VOCABULARIES.names():
      raise VocabularyError(VOCABULARIES.unknown_message(name, "a JSON file path (no such file)"))
    return cls._from_plugin(name, VOCABULARIES.lookup(name))

  @classmethod
  def from_text(cls, text: str, source: str) -> "Vocabulary":
    """A vocabulary from the text of its JSON file, naming `source` in every error."""
    json_data.check_shape(text, f"vocabulary {source}", VocabularyError)
    try:
      data = json.loads(text)
    except json.JSONDecodeError as e:
      raise VocabularyError(
          f"vocabulary {source}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from e
    return cls.from_json_data(data, source)

  @classmethod
  def _from_plugin(cls, name: str, found: Any) -> "Vocabulary":
    """The vocabulary a registered object makes (module docstring; `_check_plugin` passed)."""
    if callable(found) and not isinstance(found, type):
      try:
        found = found()
      except Exception as error:  # foreign code  # pylint: disable=broad-except
        raise VocabularyError(f"vocabulary {name!r}: loading the plug-in failed: "
                              f"{type(error).__name__}: {error}") from error
    if isinstance(found, cls):
      return found
    if isinstance(found, list):
      return cls.from_json_data(found, f"{name} (plug-in)")
    if isinstance(found, (str, os.PathLike)) and os.path.isfile(found):
      return cls.load(found)
    raise VocabularyError(f"vocabulary {name!r}: the plug-in is {type(found).__name__}; expected a "
                          "Vocabulary, a list of {id, polarity, description} entries, a JSON file "
                          "path or a registered factory (plugins.factory) returning one")

  def __len__(self) -> int:
    return len(self.entries)

  def __repr__(self) -> str:
    return f"Vocabulary({self.source}, {len(self)} entries)"

  @property
  def ids(self) -> list[str]:
    return [e.id for e in self.entries]

  @property
  def positive_ids(self) -> list[str]:
    return [e.id for e in self.entries if e.positive]

  @property
  def negative_ids(self) -> list[str]:
    return [e.id for e in self.entries if not e.positive]

  def index(self, tag_id: str) -> int:
    """The position of `tag_id`; KeyError naming the vocabulary if absent."""
    try:
      return self._index[tag_id]
    except KeyError:
      raise KeyError(f"tag {tag_id!r} is not in vocabulary {self.source}; known ids: "
                     f"{self.ids}") from None

  def entry(self, tag_id: str) -> RubricEntry:
    return self.entries[self.index(tag_id)]

  def resolve(self, name: str) -> int | None:
    """Index of the entry whose id or description `name` spells (leniently), else None."""
    return self._by_name.get(normalize_tag_name(name))

  def multi_hot(self, tag_ids: Iterable[str]) -> np.ndarray:
    vector = np.zeros(len(self), np.float32)
    for tag_id in tag_ids:
      vector[self.index(tag_id)] = 1.0
    return vector

  def ids_of(self, tags: np.ndarray) -> list[str]:
    """The ids set (> 0.5) in a multi-hot vector, in vocabulary order."""
    tags = np.asarray(tags)
    if tags.shape != (len(self),):
      raise ValueError(f"tag vector has shape {tags.shape}; vocabulary {self.source} expects "
                       f"({len(self)},)")
    return [self.entries[i].id for i in np.flatnonzero(tags > 0.5)]


def _check_entry_fields(entry: RubricEntry, i: int, source: str) -> None:
  if not isinstance(entry.id, str) or not _ID_PATTERN.match(entry.id):
    raise VocabularyError(
        f"vocabulary {source}: entry {i} has id {entry.id!r}; expected a string of letters, "
        "digits, '_', '.', '-' starting with a letter")
  if entry.polarity not in ("+", "-"):
    raise VocabularyError(
        f"vocabulary {source}: entry {i} ({entry.id!r}) has polarity {entry.polarity!r}; "
        "expected \"+\" or \"-\"")
  if not isinstance(entry.description, str) or not entry.description.strip():
    raise VocabularyError(
        f"vocabulary {source}: entry {i} ({entry.id!r}) has description "
        f"{entry.description!r}; expected a non-empty string")


def _check_plugin(found: Any, name: str) -> None:
  """A `VOCABULARIES` check: only a function declared a vocabulary factory is ever called."""
  if callable(found) and not isinstance(found, type) and \
      not plugins.is_factory("vocabulary", found):
    raise VocabularyError(
        f"vocabulary {name!r} is the callable {found!r:.80}, not declared a vocabulary "
        "factory, so it is not called; expected a Vocabulary, a list of {id, polarity, "
        "description} entries, a JSON file path or a function decorated with "
        "@rised_jax.plugins.factory('vocabulary')")


def _packaged(name: str) -> Vocabulary:
  resource = importlib.resources.files("rised_jax.rubrics") / "data" / f"{name}.json"
  return Vocabulary.from_text(resource.read_text(encoding="utf-8"), f"{name} (built-in)")


@plugins.factory("vocabulary")
def agentic_v1() -> Vocabulary:
  """rubrics/data/agentic_v1.json, read on first use."""
  return _packaged("agentic_v1")


VOCABULARIES = plugins.Registry("vocabulary", "judge.vocabulary", {"agentic_v1": agentic_v1},
                                check=_check_plugin)
BUILTIN_VOCABULARIES = tuple(VOCABULARIES.builtins)
