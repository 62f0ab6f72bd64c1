"""One agentic or rubric pipeline step against an SGLang server, in a fresh process, for the
split-roll-out tests (tests/integration/test_multihost_rollouts.py):

  python tests/helpers/rollout_harness.py --pipeline agentic --sglang-url URL --out step.json
  (multi-host) ... --num-processes 2 --process-id 0 --coordinator 127.0.0.1:PORT

Runs roll_out → judge → advantages → select → teach → rows for `--steps` steps (observing each)
and writes, per step, the rows every process would train on (prefix and response ids,
advantage, behaviour log-probs) and the step's metrics, then (agentic) the evaluation's results
and episode records, as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def parse() -> argparse.Namespace:
  p = argparse.ArgumentParser()
  p.add_argument("--pipeline", choices=("agentic", "rubric"), default="agentic")
  p.add_argument("--sglang-url", required=True)
  p.add_argument("--out", required=True)
  p.add_argument("--steps", type=int, default=2)
  p.add_argument("--num-processes", type=int, default=1)
  p.add_argument("--process-id", type=int, default=0)
  p.add_argument("--coordinator", default="")
  p.add_argument("--fail-on-process", type=int, default=-1,
                 help="this process's roll-outs raise (an environment that cannot start)")
  return p.parse_args()


def pipeline_and_tokenizer(name: str):
  """The pipeline's config (tiny_cpu.py) and a tokenizer of its words (the fake server's
  vocabulary is the tokenizer's)."""
  # pylint: disable=import-outside-toplevel
  from rised_jax.model import tiny
  from tests.helpers.run_fixtures import load_config_file, TINY_CONFIG
  if name == "agentic":
    config = load_config_file(TINY_CONFIG, "rised,easy")
    config.select.pool_groups = 7     # 4 + 3 on two processes
    config.select.batch_groups = 3
    config.rollout.group_size = 4
    return config, tiny.build_tokenizer(tiny.environment_words(["maze"]))
  config = load_config_file(TINY_CONFIG, "cripo")
  config.select.batch_groups = 3
  config.rollout.group_size = 3
  return config, tiny.build_tokenizer(tiny.rubric_words())


def main() -> None:
  args = parse()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  # pylint: disable=import-outside-toplevel
  from rised_jax import parallel, pipelines
  from rised_jax.rollout.sglang_engine import SGLangEngine

  if args.num_processes > 1:
    parallel.init_distributed(args.coordinator, args.num_processes, args.process_id,
                              cpu_collectives="gloo")
  config, tokenizer = pipeline_and_tokenizer(args.pipeline)
  engine = SGLangEngine(args.sglang_url, vocab_size=tokenizer.vocab_size, timeout_s=30.0)
  pipeline = pipelines.make_pipeline(config, engine, tokenizer)
  if args.fail_on_process == args.process_id:
    def broken(*_, **__):
      raise RuntimeError("injected roll-out failure")
    if args.pipeline == "agentic":
      pipeline.loop.run = broken
    else:
      pipeline.engine.generate = broken
  steps = []
  for step in range(args.steps):
    record = pipeline.roll_out(step)
    for stage in (pipeline.judge, pipeline.advantages, pipeline.select, pipeline.teach):
      record = stage(record)
    rows = [{"prefix": list(map(int, r.prefix_ids)), "response": list(map(int, r.response_ids)),
             "advantage": float(r.advantage),
             "behaviour": [float(x) for x in r.response_behaviour_logprobs]}
            for r in pipeline.rows(record)]
    steps.append({"rows": rows, "chosen": list(record.chosen),
                  "metrics": pipeline.metrics(record)})
    pipeline.observe(record)
  evaluation = None
  if args.pipeline == "agentic":   # split across hosts too (the rubric one is not yet)
    evaluation = {"results": pipeline.evaluate(), "episodes": pipeline.eval_episodes}
  engine.close()
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump({"steps": steps, "evaluation": evaluation}, f)


if __name__ == "__main__":
  main()
