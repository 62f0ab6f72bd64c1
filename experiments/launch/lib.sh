# Helpers shared by the launch scripts (sourced, not run). `dry_run=1` makes `run` print.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "experiments/launch/lib.sh: helpers the launch scripts source; see gpu_node_sglang.sh --help"
  echo "and tpu_pod.sh --help"
  exit 0
fi

die() { echo "error: $*" >&2; exit 2; }

# The header comment of the calling script (its usage text), for --help: stdout, exit 0.
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0; }

# Shell words, single-quoted where needed (readable, and what shlex.split reads back).
quote() {
  local out=() word
  for word in "$@"; do
    if [[ $word =~ ^[A-Za-z0-9_./:=,@%+~-]+$ ]]; then out+=("$word")
    else out+=("'${word//\'/\'\\\'\'}'"); fi
  done
  echo "${out[*]}"
}

# Runs a command, or under --dry-run prints it as "+ WORDS".
run() {
  if [ "${dry_run:-0}" = 1 ]; then echo "+ $(quote "$@")"; else "$@"; fi
}
