#!/usr/bin/env bash
# Train on one GPU node with CUDA SGLang rollouts: start the policy's SGLang server (and
# optionally a judge server), wait for GET /health, run rised-train against it, and stop the
# servers when training ends, fails or is interrupted.
#
# Usage:
#   experiments/launch/gpu_node_sglang.sh --model DIR --config CONFIG --workdir DIR \
#       [--server-gpus 0] [--train-gpus 1,2,3,4,5,6,7] [--port 30000] [--server-args "ARGS"] \
#       [--judge-model DIR --judge-gpus 4,5,6,7 [--judge-port 30001]] \
#       [--sglang-python python3] [--health-timeout 1800] [--setup] [--detach | --attach | --stop] \
#       [--dry-run] [-- extra rised-train flags]
#
#   --model        the policy checkpoint (HF layout); the server starts on it and rised-train
#                  loads it (config.model.source)
#   --config       e.g. experiments/configs/rised_qwen3_multienv.py:rised,4b or
#                  experiments/configs/cripo_qwen3_1p7b.py:cripo
#   --workdir      a local directory: each step the trainer exports the weights to
#                  WORKDIR/weights/v<step> and POSTs /update_weights_from_disk, so the server
#                  must read it at the same path (same machine)
#   --server-gpus, --train-gpus   CUDA_VISIBLE_DEVICES of the server and of training (the
#                  training mesh must fit the training GPUs, e.g. --config.mesh.data=1
#                  --config.mesh.fsdp=-1)
#   --judge-model  also start an SGLang judge server (CriPO's Qwen3-32B) with tensor parallelism
#                  over --judge-gpus, port --judge-port; the config's judge base_url must point
#                  at it (the CriPO configs use http://127.0.0.1:30001/v1)
#   --server-args  extra flags for the policy server (e.g. "--mem-fraction-static 0.8")
#   --setup        first install this checkout with the `cuda` extra (jax[cuda12]) at the versions
#                  of requirements/lock.txt (SGLang itself lives in --sglang-python's environment)
#   --detach       run all of the above in the background (setsid nohup: the job outlives the
#                  shell), logging to WORKDIR/launch.log; --attach follows that log, --stop ends
#                  the job (servers included); rerunning the same command resumes the run
#   --dry-run      print the commands, start nothing
#
# Server flags, and why: --enable-deterministic-inference honours the per-request sampling_seed
# that the client sends (rised_jax/rollout/sglang_engine.py); --host 127.0.0.1 keeps the server
# on the node. Logs: WORKDIR/sglang_policy.log (and sglang_judge.log).
set -euo pipefail

source "$(dirname "$0")/lib.sh"

model="" config="" workdir="" server_gpus=0 train_gpus=1,2,3,4,5,6,7 port=30000 server_args=""
judge_model="" judge_gpus=4,5,6,7 judge_port=30001 python=python3 health_timeout=1800 dry_run=0
setup=0 action=run
all_args=("$@")
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=${2:?--model needs a value}; shift 2 ;;
    --config) config=${2:?--config needs a value}; shift 2 ;;
    --workdir) workdir=${2:?--workdir needs a value}; shift 2 ;;
    --server-gpus) server_gpus=${2:?--server-gpus needs a value}; shift 2 ;;
    --train-gpus) train_gpus=${2:?--train-gpus needs a value}; shift 2 ;;
    --port) port=${2:?--port needs a value}; shift 2 ;;
    --server-args) server_args=${2?--server-args needs a value}; shift 2 ;;
    --judge-model) judge_model=${2:?--judge-model needs a value}; shift 2 ;;
    --judge-gpus) judge_gpus=${2:?--judge-gpus needs a value}; shift 2 ;;
    --judge-port) judge_port=${2:?--judge-port needs a value}; shift 2 ;;
    --sglang-python) python=${2:?--sglang-python needs a value}; shift 2 ;;
    --health-timeout) health_timeout=${2:?--health-timeout needs a value}; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --setup) setup=1; shift ;;
    --detach) action=detach; shift ;;
    --attach) action=attach; shift ;;
    --stop) action=stop; shift ;;
    -h|--help) usage ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$workdir" ] || die "--workdir DIR is required"
case "$action" in
  attach) run tail -n 100 -F "$workdir/launch.log"; exit ;;
  stop)
    [ "$dry_run" = 1 ] || [ -f "$workdir/launch.pid" ] || die "no $workdir/launch.pid: nothing was started with --detach"
    run kill -TERM -- "-$(cat "$workdir/launch.pid" 2>/dev/null || echo PID)"; exit ;;
  detach)
    # The same command without --detach (or --dry-run), as its own session; --setup runs in it.
    again=()
    for arg in "${all_args[@]}"; do
      case "$arg" in --detach|--dry-run) ;; *) again+=("$arg") ;; esac
    done
    [ "$dry_run" = 1 ] || mkdir -p "$workdir"
    if [ "$dry_run" = 1 ]; then
      echo "+ setsid nohup $(quote bash "$0" "${again[@]}") > $(quote "$workdir/launch.log") 2>&1 < /dev/null &"
    else
      setsid nohup bash "$0" "${again[@]}" > "$workdir/launch.log" 2>&1 < /dev/null &
      echo $! > "$workdir/launch.pid"
      echo "started in the background (pid $!); log: $workdir/launch.log (--attach follows it, --stop ends it)"
    fi
    exit ;;
esac
[ -n "$model" ] || die "--model DIR is required (the policy checkpoint, HF layout)"
[ -n "$config" ] || die "--config is required, e.g. experiments/configs/rised_qwen3_multienv.py:rised,4b"
case "$workdir" in
  *://*) die "--workdir must be a local directory the SGLang server reads, got '$workdir'" ;;
esac
for value in "$port" "$judge_port" "$health_timeout"; do
  [[ $value =~ ^[0-9]+$ ]] || die "ports and --health-timeout are integers, got '$value'"
done
if [ "$dry_run" = 0 ]; then
  [ -f "$model/config.json" ] || die "$model/config.json not found; --model must be an HF-layout checkpoint"
  mkdir -p "$workdir"
fi
case "$workdir" in /*) ;; *) workdir="$PWD/$workdir" ;; esac   # the server's path to it
used_gpus=",$server_gpus,$train_gpus,"
[ -n "$judge_model" ] && used_gpus="$used_gpus$judge_gpus,"
for gpu in ${used_gpus//,/ }; do
  [ "$(grep -o ",$gpu," <<< "${used_gpus//,/,,}" | wc -l)" = 1 ] ||
    die "GPU $gpu is given to two of --server-gpus, --train-gpus, --judge-gpus"
done

if [ "$setup" = 1 ]; then
  root=$(cd "$(dirname "$0")/../.." && pwd)
  run python3 -m pip install -q -c "$root/requirements/lock.txt" -e "$root[cuda]"
fi

servers=()            # names, in start order
declare -A server_pid
stop_servers() {
  local name
  for name in "${servers[@]}"; do
    if [ "$dry_run" = 1 ]; then echo "+ kill \$${name}_server_pid"
    else kill "${server_pid[$name]}" 2>/dev/null || true; fi
  done
  if [ "$dry_run" = 0 ]; then wait 2>/dev/null || true; fi
}
trap stop_servers EXIT
trap 'exit 130' INT TERM

# start_server NAME GPUS PORT MODEL [server flags...]: in the background, logged to the workdir.
start_server() {
  local name=$1 gpus=$2 server_port=$3 server_model=$4; shift 4
  local cmd=(env "CUDA_VISIBLE_DEVICES=$gpus" "$python" -m sglang.launch_server
             --model-path "$server_model" --host 127.0.0.1 --port "$server_port" "$@")
  servers+=("$name")
  if [ "$dry_run" = 1 ]; then
    echo "+ $(quote "${cmd[@]}") > $(quote "$workdir/sglang_$name.log") 2>&1 &"
  else
    "${cmd[@]}" > "$workdir/sglang_$name.log" 2>&1 &
    server_pid[$name]=$!
  fi
}

# wait_healthy NAME PORT: polls GET /health until 200; fails when the server dies or times out.
wait_healthy() {
  local name=$1 server_port=$2
  local url="http://127.0.0.1:$server_port/health"
  if [ "$dry_run" = 1 ]; then
    echo "+ until curl -sf $url; do sleep 5; done   # at most ${health_timeout} s"
    return
  fi
  local deadline=$((SECONDS + health_timeout))
  until curl -sf -o /dev/null "$url"; do
    if ! kill -0 "${server_pid[$name]}" 2>/dev/null; then
      tail -n 30 "$workdir/sglang_$name.log" >&2
      die "the $name SGLang server exited before answering $url (log above)"
    fi
    [ $SECONDS -lt $deadline ] || die "the $name SGLang server did not answer $url in ${health_timeout} s"
    sleep 5
  done
  echo "the $name SGLang server is healthy at http://127.0.0.1:$server_port"
}

read -r -a policy_args <<< "$server_args"
start_server policy "$server_gpus" "$port" "$model" --enable-deterministic-inference \
  "${policy_args[@]}"
if [ -n "$judge_model" ]; then
  judge_tp=$(awk -F, '{print NF}' <<< "$judge_gpus")
  start_server judge "$judge_gpus" "$judge_port" "$judge_model" --tp "$judge_tp"
  wait_healthy judge "$judge_port"
fi
wait_healthy policy "$port"

run env "CUDA_VISIBLE_DEVICES=$train_gpus" rised-train "--config=$config" "--workdir=$workdir" \
  "--config.model.source=$model" --config.rollout.engine=sglang \
  "--config.rollout.sglang_url=http://127.0.0.1:$port" "${extra[@]}"
