"""Imports point down: rised_jax's import graph, read with `ast` (nothing is imported), against
the declared layer order (docs/architecture.md, "Layers").

A module may import a module of its own layer or of a layer below; an import of a layer above
fails, and so does any cycle between modules. Every import counts, at the top of a file or inside
a function: a lazy import hides a dependency from the reader, not from the layering. A new module
must be placed in a layer (a unit of `LAYERS`), so the order stays complete.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rised_jax"

# Bottom to top. A unit is a module or a package (its modules); the longest matching unit wins.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("rised_jax", "rised_jax.checks", "rised_jax.types", "rised_jax.json_data",
                    "rised_jax.parallel", "rised_jax.plugins", "rised_jax.stats",
                    "rised_jax.http_retry", "rised_jax.checkpoint",
                    "rised_jax.checkpoint_convert", "rised_jax.wandb_log",
                    "rised_jax.config_docs", "rised_jax.train_settings")),
    ("model", ("rised_jax.model",)),
    ("environments and criteria tasks", ("rised_jax.envs", "rised_jax.rubric_tasks")),
    ("rollout", ("rised_jax.rollout",)),
    ("judges", ("rised_jax.rubrics",)),
    ("stages", ("rised_jax.teach", "rised_jax.select", "rised_jax.learn", "rised_jax.tasks",
                "rised_jax.evaluate", "rised_jax.runlog", "rised_jax.analysis")),
    ("config", ("rised_jax.config", "rised_jax.config_args")),
    # model.tiny writes the test model from every environment's and teacher's words; it stays
    # under model/ because the learning test imports it by that path (its seeds hash the path).
    ("pipelines and tools", ("rised_jax.pipelines", "rised_jax.recipes", "rised_jax.compare",
                             "rised_jax.config_reference", "rised_jax.demo",
                             "rised_jax.warmstart", "rised_jax.warmstart_cripo",
                             "rised_jax.mechanisms",
                             "rised_jax.model.tiny")),
    ("trainer", ("rised_jax.trainer",)),
    ("entry points", ("rised_jax.main",)),
)


def module_name(path: Path, root: Path) -> str:
  parts = path.relative_to(root.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(root: Path) -> dict[str, Path]:
  """Every module of the package under `root`, by dotted name."""
  return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
  """The package's modules that module `name` imports: `from A import b` names A.b where that is
  a module, else A; relative imports are resolved against `name`'s package."""
  is_package = path.name == "__init__.py"
  found = set()
  for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
    if isinstance(node, ast.Import):
      targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = name.split(".") if is_package else name.split(".")[:-1]
        anchor = anchor[:len(anchor) - node.level + 1]
        base = ".".join(anchor + ([node.module] if node.module else []))
      targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                 for alias in node.names]
    else:
      continue
    for target in targets:
      while target and target not in modules:   # `import a.b.c` where c is a name, not a file
        target = target.rpartition(".")[0]
      if target and target != name:
        found.add(target)
  return found


def layer_of(module: str, layers=LAYERS) -> int | None:
  """The index of the layer whose longest unit contains `module` (None: placed nowhere). The
  package itself ("rised_jax", its __init__) holds none of its modules: each is placed."""
  best, best_len = None, -1
  for index, (_, units) in enumerate(layers):
    for unit in units:
      inside = module.startswith(unit + ".") and "." in unit
      if (module == unit or inside) and len(unit) > best_len:
        best, best_len = index, len(unit)
  return best


def upward_imports(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
  """'a (layer) imports b (higher layer)' for each import of a layer above the importer's."""
  found = []
  for module, targets in sorted(graph.items()):
    for target in sorted(targets):
      low, high = layer_of(module, layers), layer_of(target, layers)
      if high > low:
        found.append(f"{module} ({layers[low][0]}) imports {target} ({layers[high][0]})")
  return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan), each sorted."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  on_stack: set[str] = set()
  found = []

  def visit(node: str) -> None:
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for target in graph.get(node, ()):
      if target not in index:
        visit(target)
        low[node] = min(low[node], low[target])
      elif target in on_stack:
        low[node] = min(low[node], index[target])
    if low[node] == index[node]:
      component = []
      while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == node:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for node in sorted(graph):
    if node not in index:
      visit(node)
  return sorted(found)


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
  modules = package_modules(root)
  return {name: imported_modules(name, path, modules) for name, path in modules.items()}


GRAPH = import_graph()


def test_every_module_is_placed_in_a_layer():
  assert [m for m in sorted(GRAPH) if layer_of(m) is None] == []


def test_no_module_imports_a_layer_above_its_own():
  assert upward_imports(GRAPH) == []


def test_the_import_graph_has_no_cycle():
  assert cycles(GRAPH) == []


def test_the_graph_sees_every_kind_of_import():
  """Hand-read modules: their top-level, lazy and `from package import module` imports."""
  assert GRAPH["rised_jax.envs.babyai"] == {"rised_jax.envs.base", "rised_jax.envs.suite_events",
                                             "rised_jax.envs.suites"}
  # parallel, model and model.hf_io are imported inside functions.
  assert GRAPH["rised_jax.rollout.sglang_engine"] == {
      "rised_jax.http_retry", "rised_jax.rollout.base", "rised_jax.checks", "rised_jax.parallel",
      "rised_jax.model", "rised_jax.model.hf_io", "rised_jax.rollout.tensor_payload"}


@pytest.fixture
def toy_package(tmp_path):
  """A package written here: low.py, mid/ (a package with a relative import) and high.py."""
  root = tmp_path / "toy"
  (root / "mid").mkdir(parents=True)
  (root / "__init__.py").write_text("")
  (root / "low.py").write_text("import os\n")
  (root / "mid" / "__init__.py").write_text("from . import part\n")
  (root / "mid" / "part.py").write_text("from toy.low import thing\n"
                                        "def late():\n  from toy import high\n")
  (root / "high.py").write_text("from toy.mid.part import late\nimport toy.low\n")
  return root


def test_an_upward_lazy_import_and_its_cycle_are_found(toy_package):
  layers = (("base", ("toy", "toy.low")), ("middle", ("toy.mid",)), ("top", ("toy.high",)))
  graph = import_graph(toy_package)
  assert graph == {"toy": set(), "toy.low": set(), "toy.mid": {"toy.mid.part"},
                   "toy.mid.part": {"toy.low", "toy.high"},
                   "toy.high": {"toy.mid.part", "toy.low"}}
  assert upward_imports(graph, layers) == ["toy.mid.part (middle) imports toy.high (top)"]
  assert cycles(graph) == [["toy.high", "toy.mid.part"]]
  # Without the lazy import the package is layered and acyclic.
  (toy_package / "mid" / "part.py").write_text("from toy.low import thing\n")
  graph = import_graph(toy_package)
  assert upward_imports(graph, layers) == [] and cycles(graph) == []
