"""The README stays a front door: short, no dated measurements (they live on
docs/performance.md), every link resolving, and its two set-up commands real Makefile targets."""
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def test_short_and_without_dated_measurements():
  assert len(README.splitlines()) <= 200
  assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", README)
  assert not re.findall(r"\d+ min \d+ s|\d\.\d+ s\b|\d+(\.\d+)?×", README)


def test_every_relative_link_resolves():
  links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
  assert links
  missing = [link for link in links if "://" not in link and not (REPO / link).exists()]
  assert not missing


def test_the_set_up_commands_are_makefile_targets():
  targets = set(re.findall(r"^([a-z-]+):", (REPO / "Makefile").read_text(), re.M))
  assert {"demo", "test", "docs"} <= targets
  assert "make demo" in README and "make test" in README
