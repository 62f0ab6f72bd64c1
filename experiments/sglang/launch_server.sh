#!/usr/bin/env bash
# Start an SGLang-API rollout server for rised_jax on a model directory (HF layout: config.json,
# *.safetensors, tokenizer.json), in the foreground. Poll GET /health until it answers 200.
#
# Usage: experiments/sglang/launch_server.sh MODEL_DIR PORT [extra server flags]
#
# Server: sglang-jax 0.1.0rc0 on CPU from the venv made by setup_sglang_jax.sh (override with
# SGLANG_JAX_PY=/path/to/python). Talk to it with rised_jax.rollout.sglang_engine.SGLangEngine.
# Flags, and why:
#   --device cpu --attention-backend native --dtype float32   the CPU path; float32 so that the
#       server's log-probs match the trainer's (behaviour = old policy up to rounding)
#   --max-total-tokens 4096 --mem-fraction-static 0.02   a large default KV pool makes CPU decoding slow
#   --page-size 1 --context-length 1024 --max-running-requests 16   small, CPU-sized batches
#   --enable-deterministic-sampling   honours the per-request `sampling_seed` that the client sends
#       (without it the server ignores the seed and draws from its own RNG stream)
#   --random-seed 0 --grammar-backend none   reproducible, and no grammar compiler to load
#   --disable-overlap-schedule   with sglang-jax 0.1.0rc0's overlap scheduler on CPU, requests
#       batched together intermittently get wrong prefill logits (greedy first tokens that are
#       not the model's argmax; one seed, two samples): 2 of 7 server starts, and CI once;
#       0 of 9 with this flag
# Extra flags are appended and override these (argparse keeps the last value). sglang-jax has no
# /update_weights_from_disk: to sync weights with it, restart the server on the new directory.
set -euo pipefail
case "${1:-}" in   # the header comment above is the usage text (lib.sh prints it)
  -h|--help) source "$(dirname "$0")/../launch/lib.sh"; usage ;;
esac

if [ $# -lt 2 ]; then
  echo "usage: $0 MODEL_DIR PORT [extra server flags]" >&2
  exit 2
fi
model_dir=$1; port=$2; shift 2
repo_root="$(cd "$(dirname "$0")/../.." && pwd)"
python_bin="${SGLANG_JAX_PY:-$repo_root/.venv-sgljax/bin/python}"

if [ ! -x "$python_bin" ]; then
  echo "error: no sglang-jax python at $python_bin; run experiments/sglang/setup_sglang_jax.sh" \
    "or set SGLANG_JAX_PY" >&2
  exit 1
fi
for required in config.json tokenizer.json; do
  if [ ! -f "$model_dir/$required" ]; then
    echo "error: $model_dir/$required not found; MODEL_DIR must be an HF-layout checkpoint" \
      "(config.json, *.safetensors, tokenizer.json)" >&2
    exit 1
  fi
done
if ! ls "$model_dir"/*.safetensors >/dev/null 2>&1; then
  echo "error: no *.safetensors file in $model_dir" >&2
  exit 1
fi
if ! [[ "$port" =~ ^[0-9]+$ ]] || [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
  echo "error: PORT must be an integer in 1..65535, got '$port'" >&2
  exit 1
fi

export JAX_PLATFORMS=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# The server's IPC sockets go under TMPDIR; a private one keeps parallel servers apart.
export TMPDIR="${TMPDIR:-$(mktemp -d)}"
exec "$python_bin" -m sgl_jax.launch_server \
  --model-path "$model_dir" --host 127.0.0.1 --port "$port" \
  --device cpu --attention-backend native --dtype float32 \
  --mem-fraction-static 0.02 --max-running-requests 16 --context-length 1024 \
  --max-total-tokens 4096 --page-size 1 --random-seed 0 --grammar-backend none \
  --enable-deterministic-sampling --disable-overlap-schedule "$@"
