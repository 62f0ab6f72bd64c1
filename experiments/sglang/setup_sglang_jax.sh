#!/usr/bin/env bash
# Create the sglang-jax virtual environment used by tests/test_sglang_real.py and launch_server.sh.
#
# Usage: experiments/sglang/setup_sglang_jax.sh [VENV_DIR]     (default: .venv-sgljax at the repo root)
#
# sglang-jax 0.1.0rc0 is a real SGLang-API server (native /generate, /flush_cache, /health,
# /get_model_info) that runs on CPU; it needs Python >= 3.12 (rised_jax itself runs on 3.11), so it
# lives in its own venv and is never imported by rised_jax. ~2.5 min and ~1.8 GB on first run.
# Idempotent: does nothing when the venv already has that exact version installed.
set -euo pipefail

SGLANG_JAX_VERSION=0.1.0rc0
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

# Pick a Python >= 3.12: pyenv's 3.12.1 where pyenv has it, else any python3.12/python3.13 on PATH.
python_bin=""
if PYENV_VERSION=3.12.1 python3 -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
  python_bin="python3"
  export PYENV_VERSION=3.12.1
else
  for candidate in python3.12 python3.13; do
    if command -v "$candidate" >/dev/null 2>&1; then python_bin="$candidate"; break; fi
  done
fi
if [ -z "$python_bin" ]; then
  echo "error: sglang-jax needs Python >= 3.12; found neither pyenv 3.12.1 nor python3.12/python3.13 on PATH" >&2
  exit 1
fi

echo "creating $venv with $("$python_bin" --version)"
"$python_bin" -m venv "$venv"
"$venv/bin/python" -m pip install --disable-pip-version-check -q --upgrade pip
"$venv/bin/python" -m pip install --disable-pip-version-check -q "sglang-jax[cpu]==$SGLANG_JAX_VERSION"
echo "installed sglang-jax $(installed_version) in $venv"
