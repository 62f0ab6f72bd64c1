#!/usr/bin/env bash
# Train on a Cloud TPU pod slice: the same rised-train command on every host, started at once
# with `gcloud compute tpus tpu-vm ssh --worker=all`.
#
# Usage:
#   experiments/launch/tpu_pod.sh --tpu NAME --zone ZONE --config CONFIG --workdir gs://BUCKET/RUN \
#       [--project P] [--repo DIR] [--setup] [--sglang-url URL --weight-dir DIR] [--dry-run] \
#       [-- extra rised-train flags]
#
#   --config      a config argument, e.g. experiments/configs/rised_qwen3_multienv.py:rised,4b,tpu
#   --workdir     a gs:// URL, kept verbatim: the hosts share no disk, a bucket is what all of them
#                 (and a resumed run) can reach
#   --repo        the checkout on every host (default ~/rised_jax); --setup first runs
#                 `pip install -e .` there on every host
#   --sglang-url  the rollout server (rollout.sglang_url); --weight-dir a directory that this
#                 server reads at the same path (rollout.sglang.weight_dir: a shared mount, not
#                 the bucket), where process 0 writes each step's weights
#   --dry-run     print the commands, run nothing
#
# Every host runs `rised-train ... --distributed`: jax.distributed.initialize() finds the other
# hosts and the coordinator from the TPU metadata (rised_jax/parallel.py init_distributed), each
# host feeds its own rows of the global batch, and process 0 alone writes shared files (weight
# exports) and talks to the rollout server. The command has no per-host part, so it is the same
# string on every worker.
set -euo pipefail

source "$(dirname "$0")/lib.sh"

tpu="" zone="" project="" config="" workdir="" repo="~/rised_jax" setup=0 dry_run=0
sglang_url="" weight_dir=""
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --tpu) tpu=${2:?--tpu needs a value}; shift 2 ;;
    --zone) zone=${2:?--zone needs a value}; shift 2 ;;
    --project) project=${2:?--project needs a value}; shift 2 ;;
    --config) config=${2:?--config needs a value}; shift 2 ;;
    --workdir) workdir=${2:?--workdir needs a value}; shift 2 ;;
    --repo) repo=${2:?--repo needs a value}; shift 2 ;;
    --sglang-url) sglang_url=${2:?--sglang-url needs a value}; shift 2 ;;
    --weight-dir) weight_dir=${2:?--weight-dir needs a value}; shift 2 ;;
    --setup) setup=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$tpu" ] || die "--tpu NAME is required (the TPU VM slice)"
[ -n "$zone" ] || die "--zone ZONE is required"
[ -n "$config" ] || die "--config is required, e.g. experiments/configs/rised_qwen3_multienv.py:rised,4b,tpu"
case "$workdir" in
  gs://?*) ;;
  *) die "--workdir must be a gs:// URL that every host can reach, got '$workdir'" ;;
esac
if [ -n "$sglang_url" ] && [ -z "$weight_dir" ]; then
  die "--sglang-url needs --weight-dir: a directory the server reads (the bucket it cannot)"
fi
case "$weight_dir" in
  *://*) die "--weight-dir must be a filesystem path the SGLang server reads, got '$weight_dir'" ;;
esac

train=(rised-train "--config=$config" "--workdir=$workdir" --distributed)
if [ -n "$sglang_url" ]; then
  train+=("--config.rollout.engine=sglang" "--config.rollout.sglang_url=$sglang_url"
          "--config.rollout.sglang.weight_dir=$weight_dir")
fi
train+=("${extra[@]}")
# $repo stays unquoted so that a leading ~ is the remote home.
remote="cd $repo && $(quote "${train[@]}")"
ssh=(gcloud compute tpus tpu-vm ssh "$tpu" "--zone=$zone" --worker=all)
[ -n "$project" ] && ssh+=("--project=$project")

if [ "$setup" = 1 ]; then
  run "${ssh[@]}" "--command=cd $repo && python3 -m pip install -q -e ."
fi
run "${ssh[@]}" "--command=$remote"
