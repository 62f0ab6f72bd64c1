"""Plug-ins: what a config names is found in a built-in registry, an entry point or an import path.

Four kinds of component can come from outside the package, each with its own entry-point group
(`importlib.metadata`, declared by the installing package, e.g. in pyproject.toml
`[project.entry-points."rised_jax.envs"] my_game = "my_pkg.games:MyGame"`):

  kind         config key             entry-point group        object
  environment  envs.names             rised_jax.envs           a class (envs.base.EnvironmentProtocol)
  vocabulary   judge.vocabulary       rised_jax.vocabularies   a Vocabulary, entry list, JSON path
                                                               or a registered factory of one
  judge        judge.backend          rised_jax.judges         a rubrics.Judge subclass
  selector     select.name            rised_jax.selectors      a select.Selector subclass

A name is looked up in this order: the built-in registry, the entry points of the kind's group,
then, when it contains ":", as an import path "package.module:Attribute" (the module must be
importable: installed, or on sys.path / PYTHONPATH). Built-in names win over entry points of
the same name. Every failure is a `PluginError` (a ValueError) naming the kind, the name and
what went wrong (the module that did not import and why, the missing attribute, the protocol
member the object lacks).

Nothing a name resolves to is called unless it is of the documented kind: a class (checked
against its protocol or base class first), or a function its module registered as a factory of
the kind with the `factory` decorator:

  @rised_jax.plugins.factory("vocabulary")
  def my_vocabulary():
    return [{"id": ..., "polarity": "+", "description": ...}, ...]

A name that resolves to any other callable (`os:abort`) is a PluginError, never called.
"""
from __future__ import annotations

import functools
import importlib
import importlib.metadata
from typing import Any, Callable, Iterator, Mapping, MutableMapping

GROUPS = {"environment": "rised_jax.envs", "vocabulary": "rised_jax.vocabularies",
          "judge": "rised_jax.judges", "selector": "rised_jax.selectors"}


class PluginError(ValueError):
  """A named component could not be found, imported or does not fit its protocol."""


# kind -> the functions declared (`factory`) as building an object of that kind.
_FACTORIES: dict[str, set[Callable[[], Any]]] = {kind: set() for kind in GROUPS}


def factory(kind: str) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
  """Decorator: declares a zero-argument function a factory of `kind` (module docstring), the
  only kind of function a registry calls. Returns the function unchanged."""
  if kind not in _FACTORIES:
    raise ValueError(f"plugins.factory({kind!r}): expected one of {sorted(_FACTORIES)}")

  def register(fn: Callable[[], Any]) -> Callable[[], Any]:
    if not callable(fn) or isinstance(fn, type):
      raise TypeError(f"plugins.factory({kind!r}) decorates a function, got {fn!r:.80}")
    _FACTORIES[kind].add(fn)
    return fn
  return register


def is_factory(kind: str, obj: Any) -> bool:
  """Whether `obj` was declared a factory of `kind` with `factory`."""
  try:
    return obj in _FACTORIES[kind]
  except TypeError:   # unhashable: no function
    return False


def is_import_path(name: Any) -> bool:
  return isinstance(name, str) and ":" in name


def import_object(kind: str, spec: str) -> Any:
  """The object an import path "package.module:Attribute[.Nested]" names."""
  module_name, _, attribute = spec.partition(":")
  if not module_name or not attribute:
    raise PluginError(f"{kind} {spec!r}: expected an import path 'package.module:Attribute'")
  try:
    target = importlib.import_module(module_name)
  except Exception as error:  # any import-time failure of foreign code  # pylint: disable=broad-except
    raise PluginError(f"{kind} {spec!r}: importing module {module_name!r} failed: "
                      f"{type(error).__name__}: {error}") from error
  for part in attribute.split("."):
    try:
      target = getattr(target, part)
    except AttributeError:
      raise PluginError(f"{kind} {spec!r}: module {module_name!r} has no attribute "
                        f"{attribute!r}") from None
  return target


@functools.lru_cache(maxsize=None)
def entry_points(group: str) -> dict[str, importlib.metadata.EntryPoint]:
  """The installed entry points of `group` by name (read once per process; `refresh` rereads)."""
  return {ep.name: ep for ep in importlib.metadata.entry_points(group=group)}


def refresh() -> None:
  """Forgets the entry points and resolved objects read so far (after installing a plug-in)."""
  entry_points.cache_clear()
  for registry in Registry.instances:
    registry.resolved.clear()


def _load_entry_point(kind: str, ep: importlib.metadata.EntryPoint) -> Any:
  try:
    return ep.load()
  except Exception as error:  # pylint: disable=broad-except
    raise PluginError(f"{kind} {ep.name!r} (entry point {ep.value!r} of group {ep.group!r}): "
                      f"loading failed: {type(error).__name__}: {error}") from error


class Registry(Mapping[str, Any]):
  """A read-only name -> object map over `builtins` (values: objects, or import-path strings
  imported on first use), the entry points of `GROUPS[kind]` and import paths.

  Iteration lists the registered names (built-ins and entry points); import paths are found
  on lookup only. `check(obj, name)` validates each object once, raising PluginError.
  `builtins` is held by reference, so entries added to it later are seen.
  """

  instances: list["Registry"] = []

  def __init__(self, kind: str, builtins: MutableMapping[str, Any],
               check: Callable[[Any, str], None] | None = None):
    self.kind = kind
    self.group = GROUPS[kind]
    self.builtins = builtins
    self.check = check
    self.resolved: dict[str, Any] = {}
    Registry.instances.append(self)

  def names(self) -> list[str]:
    return sorted(set(self.builtins) | set(entry_points(self.group)))

  def __getitem__(self, name: str) -> Any:
    if not isinstance(name, str):
      raise KeyError(name)
    if name in self.resolved:
      return self.resolved[name]
    if name in self.builtins:
      value = self.builtins[name]
      found = import_object(self.kind, value) if isinstance(value, str) else value
    elif name in entry_points(self.group):
      found = _load_entry_point(self.kind, entry_points(self.group)[name])
    elif is_import_path(name):
      found = import_object(self.kind, name)
    else:
      raise KeyError(name)
    if self.check is not None:
      self.check(found, name)
    self.resolved[name] = found
    return found

  def __iter__(self) -> Iterator[str]:
    return iter(self.names())

  def __len__(self) -> int:
    return len(self.names())

  def unknown_message(self, name: Any) -> str:
    return (f"unknown {self.kind} {name!r}; expected one of {self.names()}, an entry point of "
            f"group {self.group!r}, or an import path 'package.module:Attribute'")

  def lookup(self, name: Any) -> Any:
    """`self[name]`, with an unknown name a PluginError listing the choices."""
    try:
      return self[name]
    except KeyError:
      raise PluginError(self.unknown_message(name)) from None


def check_subclass(base: type) -> Callable[[Any, str], None]:
  """A `Registry` check: the object is a concrete subclass of `base` (the pipeline relies on
  the base class's argument validation and state handling)."""
  def check(obj: Any, name: str) -> None:
    kind = base.__name__.lower()
    where = f"{base.__module__}.{base.__name__}"
    if not isinstance(obj, type) or not issubclass(obj, base):
      raise PluginError(f"{kind} {name!r} is {obj!r:.120}; expected a subclass of {where}")
    abstract = sorted(getattr(obj, "__abstractmethods__", ()))
    if abstract:
      raise PluginError(f"{kind} {name!r} ({obj.__module__}.{obj.__qualname__}) does not "
                        f"implement the abstract method(s) {abstract} of {where}")
  return check
