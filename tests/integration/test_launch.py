"""The launch scripts (experiments/launch): their dry runs print the right commands, and the
GPU-node script really starts a server, waits for /health, trains, and stops the server."""
from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TPU = REPO / "experiments" / "launch" / "tpu_pod.sh"
GPU = REPO / "experiments" / "launch" / "gpu_node_sglang.sh"
CONFIG = "experiments/configs/rised_qwen3_multienv.py:rised,4b,tpu"


def _run(script: Path, *args: str, env=None) -> subprocess.CompletedProcess:
  return subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                        timeout=60, cwd=REPO, env=env)


def _commands(stdout: str) -> list[list[str]]:
  """The dry run's '+ ' lines as argument lists."""
  return [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("+ ")]


def _flag(words: list[str], name: str) -> str:
  values = [w.split("=", 1)[1] for w in words if w.startswith(name + "=")]
  assert len(values) == 1, (name, words)
  return values[0]


def _tpu(*args: str) -> subprocess.CompletedProcess:
  return _run(TPU, "--dry-run", "--tpu", "v5p-64", "--zone", "us-east5-a", "--project", "p",
              "--workdir", "gs://bucket/runs/r1", *args)


def _remote(command: list[str]) -> str:
  return _flag(command, "--command")


def test_tpu_pod_dry_run_ships_installs_and_starts_detached():
  done = _tpu("--config", CONFIG, "--setup", "--model", "gs://bucket/models/Qwen3-4B",
              "--sglang-url", "http://10.0.0.2:30000", "--weight-dir", "/mnt/shared/weights",
              "--", "--config.train.steps=3", "--config.rollout.stop_strings=['1', ',']")
  assert done.returncode == 0, done.stderr
  archive, scp, install, start = _commands(done.stdout)
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=REPO, check=True).stdout.strip()
  tarball = archive[archive.index("archive") + 2].split("=", 1)[1]
  assert archive[:3] == ["git", "-C", str(REPO)] and archive[-1] == "HEAD"
  assert tarball.endswith(f"rised_jax-{commit}.tar.gz")
  assert scp[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "scp", tarball]
  assert "--worker=all" in scp
  for ssh in (install, start):
    # One ssh to all workers: the command string is the same on every host.
    assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "v5p-64"]
    assert "--worker=all" in ssh and "--zone=us-east5-a" in ssh and "--project=p" in ssh
  assert shlex.split(_remote(install)) == [
      "mkdir", "-p", "~/rised_jax", "&&", "tar", "-xzf", f"~/rised_jax-{commit}.tar.gz", "-C",
      "~/rised_jax", "&&", "cd", "~/rised_jax", "&&", "python3", "-m", "pip", "install", "-q",
      "-c", "requirements/lock.txt", "-e", ".[tpu]", "&&", "mkdir", "-p", "~/models", "&&",
      "gcloud", "storage", "cp", "-r", "gs://bucket/models/Qwen3-4B", "~/models/"]
  remote = _remote(start)
  assert "setsid nohup bash -c" in remote   # detached: a dropped ssh does not end the job
  job = shlex.split(remote.split("bash -c ", 1)[1].split(" > /dev/null")[0])[0]
  train = shlex.split(job.split("copier=$!; ", 1)[1].split(" > ", 1)[0])
  assert train == [
      "rised-train", f"--config={CONFIG}", "--workdir=gs://bucket/runs/r1", "--distributed",
      "--config.model.source=~/models/Qwen3-4B",
      "--config.rollout.engine=sglang", "--config.rollout.sglang_url=http://10.0.0.2:30000",
      "--config.rollout.sglang.weight_dir=/mnt/shared/weights", "--config.train.steps=3",
      "--config.rollout.stop_strings=['1', ',']"]
  assert not any("$" in word or "process_id" in word for word in train)   # nothing per host


def test_tpu_pod_hub_model_and_the_job_actions():
  done = _tpu("--config", CONFIG, "--model", "Qwen/Qwen3-4B")
  (start,) = _commands(done.stdout)      # no --setup: nothing shipped
  assert "--config.model.source=Qwen/Qwen3-4B" in _remote(start)
  for action, worker in (("--attach", "--worker=0"), ("--status", "--worker=all"),
                         ("--stop", "--worker=all")):
    done = _tpu(action)
    assert done.returncode == 0, done.stderr
    (ssh,) = _commands(done.stdout)
    assert worker in ssh and "~/rised_jax_logs/r1." in _remote(ssh)


# Stand-ins run on "a host" (this machine, HOME in a tmp dir): rised-train prints its arguments
# and sleeps; gcloud's `storage cp SRC gs://bucket/PATH` copies into $FAKE_BUCKET/PATH.
FAKE_RISED_TRAIN = """\
#!/usr/bin/env bash
echo "args: $*"
sleep "${FAKE_TRAIN_SECONDS:-1}"
echo "finished"
"""
FAKE_GCLOUD = """\
#!/usr/bin/env bash
[ "$1 $2" = "storage cp" ] || exit 9
shift 2; [ "$1" = -q ] && shift
mkdir -p "$(dirname "$FAKE_BUCKET/${2#gs://bucket/}")"
cp "$1" "$FAKE_BUCKET/${2#gs://bucket/}"
"""


def test_tpu_pod_job_runs_detached_logs_to_the_bucket_and_stops(tmp_path):
  """The start, status and stop commands the dry run prints, run by bash on a stand-in host."""
  home, bin_dir, bucket = tmp_path / "home", tmp_path / "bin", tmp_path / "bucket"
  for directory in (home / "rised_jax", bin_dir, bucket):
    directory.mkdir(parents=True)
  for name, text in (("rised-train", FAKE_RISED_TRAIN), ("gcloud", FAKE_GCLOUD)):
    (bin_dir / name).write_text(text)
    (bin_dir / name).chmod(0o755)
  env = dict(os.environ, HOME=str(home), PATH=f"{bin_dir}:{os.environ['PATH']}",
             FAKE_BUCKET=str(bucket), FAKE_TRAIN_SECONDS="3")

  def on_host(action: str = "") -> str:
    (ssh,) = _commands(_tpu("--config", CONFIG, *([action] if action else [])).stdout)
    return subprocess.run(["bash", "-c", _remote(ssh)], env=env, capture_output=True,
                          text=True, timeout=30, cwd=home).stdout

  on_host()                                    # returns at once: the job is detached
  pid = int((home / "rised_jax_logs" / "r1.pid").read_text())
  os.kill(pid, 0)
  assert "already running" in on_host()        # not started twice
  assert ": running" in on_host("--status")
  deadline = time.monotonic() + 20
  while time.monotonic() < deadline and not list((bucket / "runs/r1/logs").glob("*.log")):
    time.sleep(0.2)
  (copied,) = (bucket / "runs" / "r1" / "logs").glob("*.log")
  assert copied.read_text().splitlines() == [
      f"args: --config={CONFIG} --workdir=gs://bucket/runs/r1 --distributed", "finished"]
  deadline = time.monotonic() + 10   # the job exits right after its last copy
  while time.monotonic() < deadline and ": not running" not in on_host("--status"):
    time.sleep(0.2)
  assert ": not running" in on_host("--status")

  env["FAKE_TRAIN_SECONDS"] = "60"
  on_host()
  pid = int((home / "rised_jax_logs" / "r1.pid").read_text())
  on_host("--stop")
  _wait_gone(pid, 10, "--stop left the job running")


@pytest.mark.parametrize("args, message", [
    (["--workdir", "runs/local"], "--workdir must be a gs:// URL"),
    (["--workdir", "gs://b/r", "--sglang-url", "http://h:1"], "--sglang-url needs --weight-dir"),
    (["--workdir", "gs://b/r", "--sglang-url", "http://h:1", "--weight-dir", "gs://b/w"],
     "--weight-dir must be a filesystem path"),
])
def test_tpu_pod_bad_arguments_are_named(args, message):
  done = _run(TPU, "--dry-run", "--tpu", "t", "--zone", "z", "--config", CONFIG, *args)
  assert done.returncode == 2 and message in done.stderr
  assert done.stdout == ""


def test_gpu_node_dry_run_starts_waits_trains_and_stops(tmp_path):
  workdir = tmp_path / "run"
  done = _run(GPU, "--dry-run", "--model", "/models/Qwen3-4B", "--workdir", str(workdir),
              "--config", "experiments/configs/cripo_qwen3_4b.py:cripo",
              "--train-gpus", "1,2,3", "--judge-model", "/models/Qwen3-32B",
              "--server-args", "--mem-fraction-static 0.8", "--",
              "--config.mesh.data=1", "--config.mesh.fsdp=-1")
  assert done.returncode == 0, done.stderr
  lines = [line for line in done.stdout.splitlines() if line.startswith("+ ")]
  assert len(lines) == 7, done.stdout
  policy, judge = (shlex.split(line[2:].split(" > ")[0]) for line in lines[:2])
  assert policy == ["env", "CUDA_VISIBLE_DEVICES=0", "python3", "-m", "sglang.launch_server",
                    "--model-path", "/models/Qwen3-4B", "--host", "127.0.0.1", "--port", "30000",
                    "--enable-deterministic-inference", "--mem-fraction-static", "0.8"]
  assert lines[0].endswith(f"> {workdir}/sglang_policy.log 2>&1 &")
  assert judge[:2] == ["env", "CUDA_VISIBLE_DEVICES=4,5,6,7"]
  assert judge[judge.index("--port") + 1] == "30001" and judge[judge.index("--tp") + 1] == "4"
  assert "curl -sf http://127.0.0.1:30001/health" in lines[2]
  assert "curl -sf http://127.0.0.1:30000/health" in lines[3]
  assert shlex.split(lines[4][2:]) == [
      "env", "CUDA_VISIBLE_DEVICES=1,2,3", "rised-train",
      "--config=experiments/configs/cripo_qwen3_4b.py:cripo", f"--workdir={workdir}",
      "--config.model.source=/models/Qwen3-4B", "--config.rollout.engine=sglang",
      "--config.rollout.sglang_url=http://127.0.0.1:30000", "--config.mesh.data=1",
      "--config.mesh.fsdp=-1"]
  assert lines[5:] == ["+ kill $policy_server_pid", "+ kill $judge_server_pid"]
  assert not workdir.exists()   # a dry run creates nothing


@pytest.mark.parametrize("args, message", [
    (["--workdir", "gs://b/r"], "--workdir must be a local directory"),
    (["--workdir", "w", "--judge-model", "j"], "GPU 4 is given to two of"),
    (["--workdir", "w", "--port", "x"], "ports and --health-timeout are integers"),
])
def test_gpu_node_bad_arguments_are_named(args, message):
  done = _run(GPU, "--dry-run", "--model", "m", "--config", "c", *args)
  assert done.returncode == 2 and message in done.stderr


# A stand-in for `python -m sglang.launch_server`: serves GET /health on --port (after a
# short start-up), records its pid, and stops on SIGTERM.
FAKE_SERVER = """\
#!{python}
import http.server, os, signal, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
open(os.environ["FAKE_DIR"] + "/server.pid", "w").write(str(os.getpid()))
time.sleep(1.0)
class Health(http.server.BaseHTTPRequestHandler):
  def do_GET(self):
    self.send_response(200 if self.path == "/health" else 404)
    self.send_header("Content-Length", "0")
    self.end_headers()
  def log_message(self, *args):
    pass
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""
# A stand-in for rised-train: checks that the server is up, records its arguments, exits 3.
FAKE_TRAIN = """\
#!{python}
import os, sys, urllib.request
url = [a for a in sys.argv if a.startswith("--config.rollout.sglang_url=")][0].split("=", 1)[1]
urllib.request.urlopen(url + "/health", timeout=5)
open(os.environ["FAKE_DIR"] + "/train.args", "w").write("\\n".join(sys.argv[1:]))
sys.exit(3)
"""


def test_gpu_node_setup_and_detach_dry_runs():
  done = _run(GPU, "--dry-run", "--model", "/m", "--config", "c.py", "--workdir", "/w",
              "--setup", "--detach", "--", "--config.train.steps=1")
  assert done.returncode == 0, done.stderr
  (line,) = done.stdout.splitlines()
  assert line.endswith("> /w/launch.log 2>&1 < /dev/null &")
  assert shlex.split(line[2:].split(" > ")[0]) == [
      "setsid", "nohup", "bash", str(GPU), "--model", "/m", "--config", "c.py", "--workdir", "/w", "--setup",
      "--", "--config.train.steps=1"]
  done = _run(GPU, "--dry-run", "--model", "/m", "--config", "c.py", "--workdir", "/w",
              "--setup")
  install = _commands(done.stdout)[0]
  assert install == ["python3", "-m", "pip", "install", "-q", "-c",
                     str(REPO / "requirements" / "lock.txt"), "-e", f"{REPO}[cuda]"]


def _fake_node(tmp_path):
  """A stand-in GPU node: fake SGLang server and rised-train on PATH, an HF-layout model dir
  and a free port; the script's arguments for it."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for name, text in (("fake_python", FAKE_SERVER), ("rised-train", FAKE_TRAIN)):
    path = bin_dir / name
    path.write_text(textwrap.dedent(text).format(python=sys.executable))
    path.chmod(0o755)
  model = tmp_path / "model"
  model.mkdir()
  (model / "config.json").write_text("{}")
  import socket  # pylint: disable=import-outside-toplevel
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = dict(os.environ, FAKE_DIR=str(tmp_path), PATH=f"{bin_dir}:{os.environ['PATH']}")
  args = ["--model", str(model), "--config", "c.py", "--workdir", str(tmp_path / "run"),
          "--port", str(port), "--health-timeout", "30",
          "--sglang-python", str(bin_dir / "fake_python")]
  return env, args


def _wait_gone(pid: int, seconds: float, what: str) -> None:
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return
    time.sleep(0.1)
  os.kill(pid, 9)
  pytest.fail(what)


def test_gpu_node_script_stops_the_server_when_training_fails(tmp_path):
  env, args = _fake_node(tmp_path)
  done = _run(GPU, *args, "--", "--config.train.steps=1", env=env)
  assert done.returncode == 3, done.stdout + done.stderr   # training's failure is the result
  assert "healthy at" in done.stdout
  assert (tmp_path / "train.args").read_text().splitlines()[-1] == "--config.train.steps=1"
  _wait_gone(int((tmp_path / "server.pid").read_text()), 10,
             "the SGLang server outlived the launch script")


def test_gpu_node_detached_job_runs_on_after_the_script_returns(tmp_path):
  env, args = _fake_node(tmp_path)
  done = _run(GPU, *args, "--detach", "--", "--config.train.steps=1", env=env)
  assert done.returncode == 0 and "started in the background" in done.stdout, done.stderr
  job = int((tmp_path / "run" / "launch.pid").read_text())
  _wait_gone(job, 30, "the detached job did not finish")
  log = (tmp_path / "run" / "launch.log").read_text()
  assert "healthy at" in log   # the job's own output went to the workdir's log
  assert (tmp_path / "train.args").read_text().splitlines()[-1] == "--config.train.steps=1"
  _wait_gone(int((tmp_path / "server.pid").read_text()), 10,
             "the SGLang server outlived the detached job")


# ----------------------------------------------------------------------------- device check

DEVICE_CHECK = REPO / "benchmarks" / "device_check.sh"


def _device_check(*args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHON=sys.executable)
  env.pop("JAX_PLATFORMS", None)
  return subprocess.run(["bash", str(DEVICE_CHECK), *args], capture_output=True, text=True,
                        timeout=600, cwd=REPO, env=env)


def test_device_check_dry_run_reports_consistent_numbers(tmp_path):
  out = tmp_path / "device_check.json"
  done = _device_check("--dry-run", "--out", str(out))
  assert done.returncode == 0, done.stdout + done.stderr
  result = json.loads(out.read_text())
  assert result["dry_run"] and result["ok"] and result["machine"]["device"] == "cpu"
  parity = result["parity"]
  assert parity["reference"].startswith("transformers")   # torch is in the test extra
  assert 0 <= parity["max_abs_diff"] <= parity["atol"] == 1e-4

  step = result["train_step"]
  # The tiny preset (qwen3-2l-d128), 2 rows of 8 + 16 columns, fused: student forward +
  # backward (3 F) plus one teacher forward (F); F counted by hand.
  layers, d, heads, kv, hd, f, vocab, rows, cols = 2, 128, 4, 2, 32, 512, 512, 2, 24
  n = layers * (d * hd * (2 * heads + 2 * kv) + 3 * d * f)
  forward = (2 * n * rows * cols + 4 * layers * rows * cols**2 * heads * hd
             + 2 * d * vocab * rows * (cols - 1))
  assert step["model_flops"]["total"] == 4 * forward
  assert step["matmul"]["size"] == 128 and step["matmul_dtype"] == "bfloat16"
  assert math.isclose(step["mfu"], 4 * forward / step["step"]["median_s"]
                      / step["matmul"]["flops_per_s"], rel_tol=1e-9)
  assert step["compute_dtype"] == "bfloat16" and step["param_dtype"] == "float32"
  assert step["device_peak_bytes_in_use"] is None     # the CPU backend keeps no such stat
  assert math.isfinite(step["final_loss"])

  decode = result["decode"]
  assert decode["greedy_tokens_agree"]
  assert decode["kv_cache_bytes"] == 2 * layers * 2 * (8 + 4) * kv * hd * 2   # bf16 K and V
  assert math.isclose(decode["fraction_of_measured_bandwidth"],
                      decode["bytes_per_decode_step"] / decode["cached_decode_step_s"]
                      / decode["measured_read_bytes_per_s"], rel_tol=1e-9)
  assert math.isclose(result["seconds"]["total"],
                      sum(v for k, v in result["seconds"].items() if k != "total"))


def test_device_check_without_an_accelerator_refuses():
  done = _device_check("--out", "/dev/null")
  assert done.returncode == 1 and "JAX sees no accelerator" in done.stderr
