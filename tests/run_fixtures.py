"""Hand-made run directories, as the trainer leaves them, for the comparison and analysis tests."""
from __future__ import annotations

import json
from pathlib import Path

from rised_jax import compare


def write_run(root: Path, preset: str, seed: int, values: dict[str, float], *,
              pipeline: str = "agentic", steps: int = 2, rollouts: int = 8, tokens: int = 5,
              finished: bool = True) -> Path:
  """A run directory as the trainer leaves it, with the given final evaluation."""
  workdir = compare.run_dir(root, preset, seed)
  workdir.mkdir(parents=True)
  (workdir / "config.json").write_text(json.dumps(
      {"algorithm": preset, "seed": seed, "pipeline": pipeline, "train": {"steps": steps}}))
  metric = compare.METRICS[pipeline]
  with open(workdir / "eval.jsonl", "w") as f:
    for step, scale in ((0, 0.0), (steps, 1.0)):
      for env, value in values.items():
        f.write(json.dumps({"step": step, "env": env, metric: value * scale, "episodes": 8}) + "\n")
  with open(workdir / "rollouts.jsonl", "w") as f:
    for i in range(rollouts):
      f.write(json.dumps({"step": 1 + i % steps, "env": "maze", "agent_tokens": tokens}) + "\n")
  if finished:
    (workdir / "summary.json").write_text("{}")
  return workdir
