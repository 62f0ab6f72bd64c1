"""setup.py keeps compatible ranges; requirements/lock.txt the exact versions make and CI install.
The two must agree: every locked version inside its range, every requirement locked."""
from __future__ import annotations

import ast
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
# Extras `make install-test` does not install (accelerators, buckets): not in the lock.
UNLOCKED_EXTRAS = {"tpu", "cuda", "gcs"}


def _setup_lists() -> tuple[list[str], dict[str, list[str]]]:
  """INSTALL_REQUIRES and EXTRAS_REQUIRE, read from setup.py's source (not by running it)."""
  tree = ast.parse((REPO / "setup.py").read_text())
  found = {}
  for node in tree.body:
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
      if node.targets[0].id in ("INSTALL_REQUIRES", "EXTRAS_REQUIRE"):
        found[node.targets[0].id] = ast.literal_eval(node.value)
  return found["INSTALL_REQUIRES"], found["EXTRAS_REQUIRE"]


def _lock() -> dict[str, Version]:
  pins = {}
  for number, line in enumerate((REPO / "requirements" / "lock.txt").read_text().splitlines(), 1):
    if not line.strip() or line.startswith("#"):
      continue
    name, sep, version = line.partition("==")
    assert sep and version.strip(), f"lock.txt line {number}: {line!r} is not an exact pin"
    pins[canonicalize_name(name)] = Version(version)
  return pins


def test_every_runtime_requirement_is_a_range_not_a_pin():
  runtime, _ = _setup_lists()
  for text in runtime:
    specs = Requirement(text).specifier
    assert not any(s.operator == "==" for s in specs), f"{text}: exact pin in setup.py"


def test_locked_versions_satisfy_setup_ranges():
  runtime, extras = _setup_lists()
  pins = _lock()
  required = list(runtime)
  for extra, items in extras.items():
    if extra not in UNLOCKED_EXTRAS:
      required += items
  for text in required:
    req = Requirement(text)
    name = canonicalize_name(req.name)
    assert name in pins, f"{req.name} (setup.py) is missing from requirements/lock.txt"
    assert req.specifier.contains(pins[name], prereleases=True), (
        f"lock.txt has {req.name}=={pins[name]}, outside setup.py's {req.specifier}")


def test_makefile_installs_from_the_lock():
  makefile = (REPO / "Makefile").read_text()
  assert "LOCK = requirements/lock.txt" in makefile
  assert "-c $(LOCK)" in makefile
