"""Soak: a tiny training run against the loopback SGLang fake, which gives every training
request, at a fixed rate, a fault drawn from a random mix of kinds (issue 23).

  python -m benchmarks.soak_faults --steps 200 --rate 0.1 --out soak.json

What it checks, and prints as JSON:
  finished      the run ended normally after --steps steps;
  counters      the faults the server injected equal rollout/server_retries +
                rollout/failed_requests summed over the steps (every faulty attempt is retried
                once, or is its request's last and fails it); groups_dropped is logged beside;
  rss_mib       the process's resident memory sampled while it runs, by training step: the
                first and last tenth's medians, and the largest; flat means no reply, retry or
                dropped group leaves memory behind.
Evaluation replies (greedy) are not faulted, so the step counters hold every injected fault.
Hardware: CPU only; tests/integration/test_soak.py runs it at 4 steps.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from rised_jax import trainer  # noqa: E402
from rised_jax.model import tiny  # noqa: E402
from tests.helpers.fake_sglang_server import FakeSGLangServer  # noqa: E402
from tests.helpers.run_fixtures import TINY_CONFIG, load_config_file  # noqa: E402

# Every reply fault of the fake that is a fault whatever the reply, less those that merely
# wait (delay, drip: the deadline tests' business) and too_many (54 tokens asked for: a reply
# that meets a stop token within the real budget is sound). Each is retried except http400 and
# huge (a reply past the cap), which fail their request at once.
KINDS = ("http500", "http400", "http408", "http429", "http503", "drop", "truncate", "bad_json",
         "no_output_ids", "wrong_ids", "abort", "bad_token", "nan_logprob", "positive_logprob",
         "short_logprobs", "empty", "huge")
MAX_REPLY_BYTES = 1 << 20


def rss_mib() -> float:
  with open("/proc/self/status", encoding="ascii") as status:
    line = next(line for line in status if line.startswith("VmRSS:"))
  return int(line.split()[1]) / 1024


class RssSampler:
  """Samples (training steps logged so far, RSS) every `period_s` in a background thread."""

  def __init__(self, metrics: Path, period_s: float = 1.0):
    self.metrics, self.period_s = metrics, period_s
    self.samples: list[tuple[int, float]] = []
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def _steps(self) -> int:
    try:
      return self.metrics.read_text().count('"time/rollout"')
    except FileNotFoundError:
      return 0

  def _run(self) -> None:
    while not self._stop.wait(self.period_s):
      self.samples.append((self._steps(), rss_mib()))

  def __enter__(self) -> RssSampler:
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()


def rss_summary(samples: list[tuple[int, float]], steps: int) -> dict[str, float]:
  """Medians of the samples taken during the first and the last tenth of the steps (each at
  least one step), and the largest sample."""
  tenth = max(1, steps // 10)
  first = [rss for step, rss in samples if 1 <= step <= tenth] or [samples[0][1]]
  last = [rss for step, rss in samples if step >= steps - tenth] or [samples[-1][1]]
  return {"first_tenth_median": round(statistics.median(first), 1),
          "last_tenth_median": round(statistics.median(last), 1),
          "max": round(max(rss for _, rss in samples), 1), "samples": len(samples)}


def soak(steps: int, rate: float, seed: int, workdir: Path) -> dict:
  model_dir = tiny.write(workdir / "model", ["frozenlake", "maze"])
  tokenizer = tiny.build_tokenizer(tiny.environment_words(["frozenlake", "maze"]))
  config = load_config_file(TINY_CONFIG, "rised")
  config.model.source = str(model_dir)
  config.rollout.engine = "sglang"
  config.rollout.sglang.max_reply_bytes = MAX_REPLY_BYTES
  config.train.steps = steps
  config.train.eval_every = 0
  start = time.monotonic()
  with FakeSGLangServer(vocab_size=tokenizer.vocab_size, huge_bytes=2 * MAX_REPLY_BYTES) as server:
    server.chaos(rate, KINDS, seed, lambda body: body["sampling_params"]["temperature"] > 0)
    config.rollout.sglang_url = server.url
    run_dir = workdir / "run"
    with RssSampler(run_dir / "metrics.jsonl") as sampler:
      trainer.train(config, run_dir)
    injected = dict(sorted(server.injected.items()))
  lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
  lines = [line for line in lines if "time/rollout" in line]
  totals = {key: int(sum(line[f"rollout/{key}"] for line in lines))
            for key in ("server_retries", "failed_requests", "groups_dropped")}
  return {
      "steps": steps, "rate": rate, "seed": seed,
      "finished": [line["step"] for line in lines] == list(range(1, steps + 1)),
      "injected": injected, "injected_total": sum(injected.values()),
      "counted": totals,
      "counters_match": sum(injected.values()) == totals["server_retries"]
                        + totals["failed_requests"],
      "rss_mib": rss_summary(sampler.samples, steps),
      "wall_s": round(time.monotonic() - start, 1),
  }


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--rate", type=float, default=0.1, help="faulted share of requests")
  parser.add_argument("--seed", type=int, default=0, help="of the fault stream")
  parser.add_argument("--workdir", default="", help="kept when given; a temporary one if not")
  parser.add_argument("--out", default="", help="also write the JSON result here")
  args = parser.parse_args(argv)
  if args.workdir:
    result = soak(args.steps, args.rate, args.seed, Path(args.workdir))
  else:
    with tempfile.TemporaryDirectory() as tmp:
      result = soak(args.steps, args.rate, args.seed, Path(tmp))
  text = json.dumps(result, indent=1)
  print(text)
  if args.out:
    Path(args.out).write_text(text + "\n")
  return 0 if result["finished"] and result["counters_match"] else 1


if __name__ == "__main__":
  sys.exit(main())
