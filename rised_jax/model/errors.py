"""Errors raised by the model package.

Every error names the file (or source) and the key, tensor or value at fault and says what
was expected, so a bad checkpoint fails before any long compile. They subclass the builtin
exception a caller would naturally catch (`ValueError`, `FileNotFoundError`, ...).
"""
from __future__ import annotations


class ModelError(Exception):
  """Base class of every error raised by `rised_jax.model`."""


class ModelConfigError(ModelError, ValueError):
  """A config.json (or a config dict) this package cannot turn into a `ModelConfig`."""


class WeightError(ModelError, ValueError):
  """Tensors that do not fit the model: missing, unexpected or of the wrong shape."""


class WeightFileError(WeightError):
  """A weights file that cannot be read: truncated, corrupt, or an inconsistent index."""


class ModelFileNotFoundError(ModelError, FileNotFoundError):
  """A file or directory the loader needs is absent."""


class ExportError(ModelError, FileExistsError):
  """An export that would overwrite files this package did not write."""


class TokenizerError(ModelError, ValueError):
  """A tokenizer that cannot do what was asked (e.g. no chat template)."""
