"""The compiled GRPO step's structure at several commits: HLO op counts of vs_tunix.py's step.

  JAX_PLATFORMS=cpu python3 benchmarks/step_structure.py --commits 67ee838^ 67ee838 fbaf492 HEAD

Each commit's tree (`git archive`, into a temporary directory) compiles the 2-layer d128 Qwen3
GRPO step of `vs_tunix.py` (8 rows × 256 columns, float32, chunk 256) in a child process, and
the optimized HLO's instructions are counted by opcode. No time is taken: the counts say what
a change added to the step (a machine shared with other jobs cannot time small differences),
and are the same on any machine of the same jax version. Writes JSON.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
OPCODES = ("convert", "dot", "fusion", "reduce", "select", "sort", "gather", "conditional",
           "while")


def count_ops() -> dict[str, Any]:
  """In the child: compile the step of the tree on sys.path; count its HLO opcodes."""
  from benchmarks import common, train_step as bench, vs_tunix  # noqa: PLC0415
  from rised_jax import parallel  # noqa: PLC0415
  from rised_jax.learn import train_step as step_lib  # noqa: PLC0415
  from rised_jax.model import from_config  # noqa: PLC0415
  cfg = common.model_config("qwen3-2l-d128")
  batch = bench.grpo_batch(cfg.vocab_size, 8, 64, 192, seed=0, behaviour=False)
  config = vs_tunix.grpo_step_config(256)
  trainable, state = step_lib.create(from_config(cfg, 0),
                                     step_lib.make_optimizer(vs_tunix.OPTIMIZER), config,
                                     parallel.make_mesh())
  text = trainable.step.lower(state, trainable.put_batch(batch)).compile().as_text()
  ops = collections.Counter(re.findall(r"= \S+ (\w[\w-]*)\(", text))
  return {"instructions": sum(ops.values()), **{name: ops[name] for name in OPCODES}}


def at_commit(commit: str) -> dict[str, Any]:
  with tempfile.TemporaryDirectory(prefix="step_structure_") as tree:
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", commit],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    env = {**os.environ, "PYTHONPATH": tree, "PYTHONDONTWRITEBYTECODE": "1",
           "JAX_PLATFORMS": "cpu"}
    # This script as the child, importing everything else from the commit's tree.
    done = subprocess.run([sys.executable, __file__, "--child"], cwd=tree, env=env,
                          capture_output=True, text=True, check=False)
  if done.returncode:
    raise RuntimeError(f"commit {commit}: the step did not compile:\n{done.stderr[-3000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--commits", nargs="+", default=["HEAD"])
  parser.add_argument("--out", default=str(REPO_ROOT / "benchmarks" / "results" /
                                           "step_structure.json"))
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    print(json.dumps(count_ops()))
    return {}
  for commit in args.commits:
    if subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--verify", "-q",
                       f"{commit}^{{commit}}"], capture_output=True).returncode:
      parser.error(f"--commits: {commit!r} is not a commit of {REPO_ROOT}")
  rows = []
  for commit in args.commits:
    print(f"{commit} ...", flush=True)
    rows.append({"commit": commit, **at_commit(commit)})
  print(f"{'commit':12s} " + " ".join(f"{k:>12s}" for k in ("instructions", *OPCODES)))
  for row in rows:
    print(f"{row['commit']:12s} " + " ".join(f"{row[k]:12d}" for k in ("instructions", *OPCODES)))
  out = Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps({"benchmark": "step_structure", "commits": rows}, indent=2) + "\n")
  print(f"wrote {out}")
  return {"commits": rows}


if __name__ == "__main__":
  main()
