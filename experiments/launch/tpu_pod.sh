#!/usr/bin/env bash
# Train on a Cloud TPU pod slice: ship this checkout to every host, install it with JAX's TPU
# build, start the same rised-train command on every host, detached, and attach, check or stop it.
#
# Usage:
#   experiments/launch/tpu_pod.sh --tpu NAME --zone ZONE --config CONFIG --workdir gs://BUCKET/RUN \
#       [--project P] [--repo DIR] [--setup] [--model SOURCE] [--sglang-url URL --weight-dir DIR] \
#       [--attach | --status | --stop] [--dry-run] [-- extra rised-train flags]
#
#   --config      a config argument, e.g. experiments/configs/rised_qwen3_multienv.py:rised,4b,tpu
#   --workdir     a gs:// URL, kept verbatim: the hosts share no disk, a bucket is what all of them
#                 (and a resumed run) can reach; each host's log is copied to WORKDIR/logs/HOST.log
#   --repo        where the code lives on every host (default ~/rised_jax)
#   --setup       first ship the committed HEAD of this checkout (`git archive`; uncommitted
#                 changes are refused) to --repo on every host and install it there with the
#                 `tpu` extra (jax[tpu], libtpu) at the versions of requirements/lock.txt
#   --model       gs://BUCKET/DIR: copied to ~/models/DIR on every host (with --setup); or a hub
#                 id (org/name), which rised-train fetches into each host's Hugging Face cache;
#                 either way it becomes config.model.source
#   --sglang-url  the rollout server (rollout.sglang_url); --weight-dir a directory that this
#                 server reads at the same path (rollout.sglang.weight_dir: a shared mount, not
#                 the bucket), where process 0 writes each step's weights
#   (no action)   start the job on every host, detached (setsid nohup: a dropped ssh does not end
#                 it), logging to ~/rised_jax_logs/RUN.log; starting a run that has checkpoints
#                 resumes it; a job already running on a host is not started twice
#   --attach      follow worker 0's log (Ctrl-C detaches; the job goes on)
#   --status      each host: running or not, and its last log line
#   --stop        stop the job on every host (SIGTERM to its process group)
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
sglang_url="" weight_dir="" model="" action=start
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --tpu) tpu=${2:?--tpu needs a value}; shift 2 ;;
    --zone) zone=${2:?--zone needs a value}; shift 2 ;;
    --project) project=${2:?--project needs a value}; shift 2 ;;
    --config) config=${2:?--config needs a value}; shift 2 ;;
    --workdir) workdir=${2:?--workdir needs a value}; shift 2 ;;
    --repo) repo=${2:?--repo needs a value}; shift 2 ;;
    --model) model=${2:?--model needs a value}; shift 2 ;;
    --sglang-url) sglang_url=${2:?--sglang-url needs a value}; shift 2 ;;
    --weight-dir) weight_dir=${2:?--weight-dir needs a value}; shift 2 ;;
    --setup) setup=1; shift ;;
    --attach) action=attach; shift ;;
    --status) action=status; shift ;;
    --stop) action=stop; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$tpu" ] || die "--tpu NAME is required (the TPU VM slice)"
[ -n "$zone" ] || die "--zone ZONE is required"
case "$workdir" in
  gs://?*) ;;
  *) die "--workdir must be a gs:// URL that every host can reach, got '$workdir'" ;;
esac
name=$(basename "$workdir")
logs="~/rised_jax_logs"
log="$logs/$name.log" pidfile="$logs/$name.pid"
ssh=(gcloud compute tpus tpu-vm ssh "$tpu" "--zone=$zone")
[ -n "$project" ] && ssh+=("--project=$project")

# On each host: whether the job (its process group, named by the pid file) still runs.
running="[ -f $pidfile ] && kill -0 \$(cat $pidfile) 2>/dev/null"
status="if $running; then echo \"\$(hostname): running\"; else"
status+=" echo \"\$(hostname): not running\"; fi; tail -n 1 $log 2>/dev/null || true"
stop="if [ -f $pidfile ]; then kill -TERM -- -\$(cat $pidfile) 2>/dev/null || true;"
stop+=" rm -f $pidfile; fi"
case "$action" in
  attach) run "${ssh[@]}" --worker=0 "--command=tail -n 100 -F $log"; exit ;;
  status) run "${ssh[@]}" --worker=all "--command=$status"; exit ;;
  stop) run "${ssh[@]}" --worker=all "--command=$stop"; exit ;;
esac

[ -n "$config" ] || die "--config is required, e.g. experiments/configs/rised_qwen3_multienv.py:rised,4b,tpu"
if [ -n "$sglang_url" ] && [ -z "$weight_dir" ]; then
  die "--sglang-url needs --weight-dir: a directory the server reads (the bucket it cannot)"
fi
case "$weight_dir" in
  *://*) die "--weight-dir must be a filesystem path the SGLang server reads, got '$weight_dir'" ;;
esac
model_source=""
case "$model" in
  "") ;;
  gs://?*) model_source="~/models/$(basename "$model")" ;;
  *://*|/*|.*|~*) die "--model must be a gs:// directory or a hub id (org/name), got '$model'" ;;
  */*) model_source=$model ;;
  *) die "--model must be a gs:// directory or a hub id (org/name), got '$model'" ;;
esac

if [ "$setup" = 1 ]; then
  root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
  if [ "$dry_run" = 0 ] && [ -n "$(git -C "$root" status --porcelain --untracked-files=no)" ]; then
    die "$root has uncommitted changes; --setup ships the committed HEAD, so commit them first"
  fi
  commit=$(git -C "$root" rev-parse --short HEAD)
  tarball="${TMPDIR:-/tmp}/rised_jax-$commit.tar.gz"
  run git -C "$root" archive --format=tar.gz "--output=$tarball" HEAD
  scp=(gcloud compute tpus tpu-vm scp "$tarball" "$tpu:rised_jax-$commit.tar.gz" "--zone=$zone"
       --worker=all)
  [ -n "$project" ] && scp+=("--project=$project")
  run "${scp[@]}"
  install="mkdir -p $repo && tar -xzf ~/rised_jax-$commit.tar.gz -C $repo && cd $repo"
  install+=" && python3 -m pip install -q -c requirements/lock.txt -e '.[tpu]'"
  if [[ $model == gs://* ]]; then
    install+=" && mkdir -p ~/models && gcloud storage cp -r $(quote "$model") ~/models/"
  fi
  run "${ssh[@]}" --worker=all "--command=$install"
fi

train=(rised-train "--config=$config" "--workdir=$workdir" --distributed)
[ -n "$model_source" ] && train+=("--config.model.source=$model_source")
if [ -n "$sglang_url" ]; then
  train+=("--config.rollout.engine=sglang" "--config.rollout.sglang_url=$sglang_url"
          "--config.rollout.sglang.weight_dir=$weight_dir")
fi
train+=("${extra[@]}")
# The job, as one script for a detached bash on each host: train, copying the log to the bucket
# every minute and once more at the end; the job's exit status is the training's.
copy="gcloud storage cp -q $log $workdir/logs/\$(hostname).log"
job="cd $repo || exit 1; ( while sleep 60; do $copy; done ) & copier=\$!; "
job+="$(quote "${train[@]}") > $log 2>&1; status=\$?; kill \$copier; $copy; exit \$status"
# $repo and ~ stay unquoted so that they are the remote home.
start="mkdir -p $logs && if $running; then"
start+=" echo \"\$(hostname): already running\"; else"
start+=" setsid nohup bash -c $(quote "$job") > /dev/null 2>&1 < /dev/null & echo \$! > $pidfile; fi"
run "${ssh[@]}" --worker=all "--command=$start"
echo "started on every host of $tpu; logs: $workdir/logs/ (follow worker 0: $0 --tpu $tpu --zone $zone --workdir $workdir --attach)" >&2
