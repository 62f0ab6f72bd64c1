"""The one registry: how a name in a config becomes a component (class, function or data).

Every kind of named component has one `Registry`, created where its built-ins are defined:

  kind                     config key             group rised_jax.…  object
  environment              envs.names             envs               a class (envs.base.EnvironmentProtocol)
  vocabulary               judge.vocabulary       vocabularies       a Vocabulary, entry list, JSON path
                                                                     or a declared factory of one
  judge                    judge.backend          judges             a rubrics.Judge subclass
  criteria judge           rubric.judge.backend   criteria_judges    a rubrics.LLMJudge subclass
  selector                 select.name            selectors          a select.Selector subclass
  advantage estimator      advantage              advantages         a function (rewards, mask, **opts)
  loss aggregation         step.aggregation       loss_aggregations  a function (loss, mask, **opts)
  KL estimator             step.ref_kl_estimator  kl_estimators      a function (logp, ref_logp)
  distillation divergence  step.divergence        divergences        a function (student, teacher, **opts)

The real suites behind optional extras (babyai, scienceworld, ...) are built-in environments
named by import path, imported on first use. Entry points are declared by the installing
package (`importlib.metadata`), e.g. in pyproject.toml
`[project.entry-points."rised_jax.envs"] my_game = "my_pkg.games:MyGame"`.

A name is looked up in this order: the built-ins, the entry points of the kind's group, then,
when it contains ":", as an import path "package.module:Attribute" (the module must be
importable: installed, or on sys.path / PYTHONPATH). Built-in names win over entry points of
the same name. Every failure of `lookup` is a `PluginError` (a ValueError) that starts with the
config key and names the kind and the name; an unknown name always reads

  config.<key>: unknown <kind> '<name>'; known: [<names>]; or an entry point of group
  '<group>', or an import path 'package.module:Attribute'[; or <what else the caller takes>]

Built-ins are registered when their module is imported (the registry's `builtins` map; a config's
`envs.aliases` when the run's pipeline is built): nothing registers while a config is checked.

Nothing a name resolves to is called unless it is of the documented kind: a class (checked
against its protocol or base class first), a plain Python function for the function kinds, or
a function its module declared a factory of the kind with the `factory` decorator:

  @rised_jax.plugins.factory("vocabulary")
  def my_vocabulary():
    return [{"id": ..., "polarity": "+", "description": ...}, ...]

A name that resolves to any other callable (`os:abort`) is a PluginError, never called.

Options: `check_options(name, options)` checks a config's option keys against what the object
accepts (a class: the keyword parameters of its constructor, following `**kwargs` up the MRO;
a function: its keyword-only parameters, arrays being positional), `build` instantiates a class
with them and `bind` binds them to a function.
"""
from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
from typing import Any, Callable, Iterator, Mapping, MutableMapping

# kind -> entry-point group: the table above.
GROUPS = {"environment": "rised_jax.envs", "vocabulary": "rised_jax.vocabularies",
          "judge": "rised_jax.judges", "criteria judge": "rised_jax.criteria_judges",
          "selector": "rised_jax.selectors", "advantage estimator": "rised_jax.advantages",
          "loss aggregation": "rised_jax.loss_aggregations",
          "KL estimator": "rised_jax.kl_estimators",
          "distillation divergence": "rised_jax.divergences"}
IMPORT_PATH = "'package.module:Attribute'"


class PluginError(ValueError):
  """A named component could not be found, imported or does not fit its protocol."""


# kind -> the functions declared (`factory`) as building an object of that kind (the kinds
# whose registry calls a function it resolves to, rather than being one).
_FACTORIES: dict[str, set[Callable[[], Any]]] = {"vocabulary": set()}


def factory(kind: str) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
  """Decorator: declares a zero-argument function a factory of `kind` (module docstring), the
  only kind of function a registry of objects calls. Returns the function unchanged."""
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
    raise PluginError(f"{kind} {spec!r}: expected an import path {IMPORT_PATH}")
  try:
    target = importlib.import_module(module_name)
  except Exception as error:  # foreign code's import  # pylint: disable=broad-except
    raise PluginError(f"{kind} {spec!r}: importing module {module_name!r} failed: "
                      f"{type(error).__name__}: {error}") from error
  return _attribute(kind, spec, target)


def _attribute(kind: str, spec: str, module: Any) -> Any:
  module_name, _, attribute = spec.partition(":")
  target = module
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
  for registry in REGISTRIES.values():
    registry.resolved.clear()


def _load_entry_point(kind: str, ep: importlib.metadata.EntryPoint) -> Any:
  try:
    return ep.load()
  except Exception as error:  # pylint: disable=broad-except
    raise PluginError(f"{kind} {ep.name!r} (entry point {ep.value!r} of group {ep.group!r}): "
                      f"loading failed: {type(error).__name__}: {error}") from error


def parameters(obj: Any) -> dict[str, bool]:
  """The options `obj` takes by keyword, in order, each mapped to whether it is required: a
  class's keyword-passable constructor parameters, following `**kwargs` forwarded up the MRO;
  a function's keyword-only parameters (its positional ones are its array arguments)."""
  found: dict[str, bool] = {}
  if not isinstance(obj, type):
    for p in inspect.signature(obj).parameters.values():
      if p.kind is p.KEYWORD_ONLY:
        found[p.name] = p.default is p.empty
    return found
  for klass in obj.__mro__:
    if "__init__" not in vars(klass):
      continue
    params = inspect.signature(vars(klass)["__init__"]).parameters.values()
    for p in params:
      if p.name != "self" and p.name not in found and p.kind in (p.KEYWORD_ONLY,
                                                                 p.POSITIONAL_OR_KEYWORD):
        found[p.name] = p.default is p.empty
    if not any(p.kind is p.VAR_KEYWORD for p in params):
      break
  return found


def check_options(kind: str, name: str, obj: Any, options: Mapping[str, Any], *,
                  positional: int = 0, supplied: tuple[str, ...] = ()) -> None:
  """Option keys `obj` (the component `name` of `kind`) does not take, and required ones
  missing, as a PluginError. `positional` arguments are passed by the caller (a judge's
  vocabulary); `supplied` names keyword options the caller adds itself."""
  params = list(parameters(obj).items())[positional:]
  accepted = [n for n, _ in params]
  unknown = sorted(set(options) - set(accepted))
  if unknown:
    raise PluginError(f"{kind} {name!r} has no option(s) {unknown}; accepted options: "
                      f"{accepted}")
  missing = [n for n, required in params if required and n not in options and n not in supplied]
  if missing:
    raise PluginError(f"{kind} {name!r} needs option(s) {missing}")


# kind -> its registry, in creation order (tests walk them all).
REGISTRIES: dict[str, "Registry"] = {}


class Registry(Mapping[str, Any]):
  """A read-only name -> object map over `builtins` (values: objects, or import-path strings
  imported on first use), the entry points of `GROUPS[kind]` and import paths.

  Iteration lists the registered names (built-ins and entry points); import paths are found on
  lookup only. `check(obj, name)` validates each object once, raising a ValueError. `key` is
  the config key that names components of this kind (its errors name it). `builtins` is held
  by reference.
  """

  def __init__(self, kind: str, key: str, builtins: MutableMapping[str, Any],
               check: Callable[[Any, str], None] | None = None):
    if kind in REGISTRIES:
      raise ValueError(f"plugins.Registry({kind!r}): a registry of this kind exists")
    self.kind = kind
    self.key = key
    self.group = GROUPS[kind]
    self.builtins = builtins
    self.check = check
    self.resolved: dict[str, Any] = {}
    REGISTRIES[kind] = self

  def names(self) -> list[str]:
    return sorted(set(self.builtins) | set(entry_points(self.group)))

  def __getitem__(self, name: str) -> Any:
    if not isinstance(name, str):
      raise KeyError(name)
    if name in self.resolved:
      return self.resolved[name]
    if name in self.builtins:
      value = self.builtins[name]
      if isinstance(value, str):   # a built-in's own import error (a missing extra) is its own
        found = _attribute(self.kind, value, importlib.import_module(value.partition(":")[0]))
      else:
        found = value
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

  def unknown_message(self, name: Any, also: str = "") -> str:
    """The one unknown-name error (module docstring); `also`: what else the caller accepts."""
    return (f"config.{self.key}: unknown {self.kind} {name!r}; known: {self.names()}; or an "
            f"entry point of group {self.group!r}, or an import path {IMPORT_PATH}"
            + (f"; or {also}" if also else ""))

  def lookup(self, name: Any) -> Any:
    """`self[name]`; every error a PluginError prefixed with the config key (`config.<key>: `):
    an unknown name lists the choices, a plug-in that fails to import or to pass the check
    says why. (A built-in's ImportError, a suite's missing extra, is raised as it is.)"""
    try:
      return self[name]
    except KeyError:
      raise PluginError(self.unknown_message(name)) from None
    except ValueError as error:
      raise PluginError(f"config.{self.key}: {error}") from error

  def check_options(self, name: str, options: Mapping[str, Any], *, positional: int = 0,
                    supplied: tuple[str, ...] = ()) -> None:
    """The errors of `build` / `bind` without building: the name (`lookup`), then the module
    function `check_options` on the object it names."""
    check_options(self.kind, name, self.lookup(name), options, positional=positional,
                  supplied=supplied)

  def build(self, name: str, *args: Any, **options: Any) -> Any:
    """`self[name](*args, **options)`, the name and option keys checked first."""
    self.check_options(name, options, positional=len(args))
    return self[name](*args, **options)

  def bind(self, name: str, **options: Any) -> Callable[..., Any]:
    """The function `name` with `options` bound as keyword arguments (checked first)."""
    self.check_options(name, options)
    fn = self[name]
    return functools.partial(fn, **options) if options else fn


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


def check_function(kind: str) -> Callable[[Any, str], None]:
  """A `Registry` check for the function kinds: the object is a plain Python function (the
  array functions are traced; a builtin such as `os:abort` is refused, never called)."""
  def check(obj: Any, name: str) -> None:
    if not inspect.isfunction(obj):
      raise PluginError(f"{kind} {name!r} is {obj!r:.120}; expected a Python function")
  return check
