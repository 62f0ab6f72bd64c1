#!/usr/bin/env bash
# Accelerator check (benchmarks/device_check.py): model parity on the device, a Qwen3-0.6B-shaped
# bf16 train step (MFU, peak memory) and the sampler's decode tokens/s against the measured
# bandwidth, in one JSON file. Under 8 minutes on one GPU; the run is cut at 8 minutes.
#
# Usage: benchmarks/device_check.sh [--dry-run] [--out FILE]
#   --dry-run   CPU, tiny shapes, a few seconds (CI runs it)
set -euo pipefail
case "${1:-}" in   # the header comment above is the usage text (lib.sh prints it)
  -h|--help) source "$(dirname "$0")/../experiments/launch/lib.sh"; usage ;;
esac
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 480 "${PYTHON:-python3}" -m benchmarks.device_check "$@"
