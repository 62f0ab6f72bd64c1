#!/usr/bin/env bash
# Create the sglang-jax virtual environment used by tests/rollout/test_sglang_real.py and launch_server.sh.
#
# Usage: experiments/sglang/setup_sglang_jax.sh [VENV_DIR]     (default: .venv-sgljax at the repo root)
#        experiments/sglang/setup_sglang_jax.sh --find-python  (print the Python it would use; exit 1 if none)
#
# sglang-jax 0.1.0rc0 is a real SGLang-API server (native /generate, /flush_cache, /health,
# /get_model_info) that runs on CPU; it needs Python >= 3.12 (rised_jax itself runs on 3.11), so it
# lives in its own venv and is never imported by rised_jax. ~2.5 min and ~1.8 GB on first run.
# Idempotent: does nothing when the venv already has that exact version installed.
set -euo pipefail
case "${1:-}" in   # the header comment above is the usage text (lib.sh prints it)
  -h|--help) source "$(dirname "$0")/../launch/lib.sh"; usage ;;
esac

SGLANG_JAX_VERSION=0.1.0rc0

# Candidate interpreters: pyenv's installed 3.12+, oldest first (by path, so no shim
# and no PYENV_VERSION is involved), then whatever python3.12/python3.13/python3 is on PATH.
python_candidates() {
  if command -v pyenv >/dev/null 2>&1; then
    local root; root="$(pyenv root 2>/dev/null || true)"
    if [ -n "$root" ]; then
      ls -d "$root"/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -V || true
    fi
  fi
  echo python3.12
  echo python3.13
  echo python3
}

# The interpreter path (sys.executable) of the first candidate that actually runs and reports
# >= 3.12. A name on PATH proves nothing: pyenv's shims exist for every installed version and
# exit 127 inside an activated venv.
find_python() {
  local candidate
  while read -r candidate; do
    if "$candidate" -c 'import sys; assert sys.version_info >= (3, 12); print(sys.executable)' \
        2>/dev/null; then
      return 0
    fi
  done < <(python_candidates)
  return 1
}

if [ "${1:-}" = "--find-python" ]; then
  find_python
  exit
fi

repo_root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${1:-$repo_root/.venv-sgljax}"

installed_version() {
  "$venv/bin/python" - <<'EOF' 2>/dev/null
import importlib.metadata
print(importlib.metadata.version("sglang-jax"))
EOF
}

if [ -x "$venv/bin/python" ] && [ "$(installed_version)" = "$SGLANG_JAX_VERSION" ]; then
  echo "sglang-jax $SGLANG_JAX_VERSION already installed in $venv"
  exit 0
fi

python_bin="$(find_python || true)"
if [ -z "$python_bin" ]; then
  echo "error: sglang-jax needs Python >= 3.12; no candidate ran (tried: $(python_candidates | tr '\n' ' '))" >&2
  exit 1
fi

echo "creating $venv with $("$python_bin" --version)"
"$python_bin" -m venv "$venv"
"$venv/bin/python" -m pip install --disable-pip-version-check -q --upgrade pip
"$venv/bin/python" -m pip install --disable-pip-version-check -q "sglang-jax[cpu]==$SGLANG_JAX_VERSION"
echo "installed sglang-jax $(installed_version) in $venv"
