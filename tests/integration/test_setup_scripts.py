"""The set-up scripts find their interpreter by running it, inside or outside a virtualenv."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import venv

REPO = pathlib.Path(__file__).resolve().parents[2]
SETUP = REPO / "experiments" / "sglang" / "setup_sglang_jax.sh"


def _find_python(env: dict[str, str]) -> subprocess.CompletedProcess:
  return subprocess.run(["bash", str(SETUP), "--find-python"], env=env, capture_output=True,
                        text=True, timeout=60)


def test_finder_inside_an_activated_venv_skips_shims_that_do_not_run(tmp_path):
  # An activated 3.11-style venv whose python3 is too old, plus a pyenv-like shim python3.12
  # first on PATH that exits 127 ("command not found"), as pyenv's does inside a venv.
  env_dir = tmp_path / "venv"
  venv.create(env_dir, with_pip=False, symlinks=True)
  shims = tmp_path / "shims"
  shims.mkdir()
  shim = shims / "python3.12"
  shim.write_text("#!/bin/sh\necho 'pyenv: python3.12: command not found' >&2\nexit 127\n")
  shim.chmod(0o755)
  env = dict(os.environ, VIRTUAL_ENV=str(env_dir),
             PATH=f"{env_dir / 'bin'}:{shims}:{os.environ['PATH']}")
  env.pop("PYENV_VERSION", None)
  found = _find_python(env)
  if found.returncode == 1:   # no Python >= 3.12 on this machine: the script must say so
    assert found.stdout == ""
    return
  assert found.returncode == 0, found.stderr
  python = found.stdout.strip()
  assert python and pathlib.Path(python).is_file() and not python.startswith(str(shims))
  version = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                           capture_output=True, text=True, check=True).stdout.split()
  assert tuple(map(int, version)) >= (3, 12)
  if sys.version_info < (3, 12):   # the venv's own interpreter is too old and must be skipped
    assert not python.startswith(str(env_dir))


def test_finder_reports_failure_when_nothing_runs(tmp_path):
  # Only the failing shim and a too-old python3 are reachable: exit 1, nothing printed.
  shims = tmp_path / "shims"
  shims.mkdir()
  for name, body in (("python3.12", "exit 127"), ("python3.13", "exit 127"),
                     ("python3", "exec " + sys.executable + ' -c "import sys; sys.exit(1)"')):
    (shims / name).write_text(f"#!/bin/sh\n{body}\n")
    (shims / name).chmod(0o755)
  tools = tmp_path / "tools"   # bash, ls, sort and tr, without any python or pyenv beside them
  tools.mkdir()
  for tool in ("ls", "sort", "tr", "bash"):
    src = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True,
                         check=True).stdout.strip()
    (tools / tool).symlink_to(src)
  env = {"PATH": f"{shims}:{tools}", "HOME": str(tmp_path)}
  found = subprocess.run([str(tools / "bash"), str(SETUP), "--find-python"], env=env,
                         capture_output=True, text=True, timeout=60)
  assert (found.returncode, found.stdout) == (1, "")
