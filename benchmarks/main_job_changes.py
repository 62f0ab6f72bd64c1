"""The main job's time and stage shares before and after each speed change, in one run.

  JAX_PLATFORMS=cpu python3 benchmarks/main_job_changes.py
      # → benchmarks/results/main_job_changes.json (SmolLM2: about half an hour on 2 cores)

A short version of the main job (--config, default experiments/configs/smollm2_cpu.py, with
train.steps = --steps and eval.episodes_per_env = --eval-episodes, in a fresh temporary
workdir) runs once per configuration, each in its own process so that no compiled program or
kept cache carries over. The changes are switched on cumulatively, in the order they were
introduced:

  (a) all off          none of the changes below
  (b) + reuse_prefix   later turns prefill only what the environment added (d642a05)
  (c) + scan_layers    one lax.scan over the layers: compile time, step memory (34c6a81)
  (d) + shared_prefill a task's G rollouts prefill their shared first prompt once (cc3de7e)
  (e) + decode_chunk   decode in chunks of --decode-chunk steps: early exit, compaction (17501bf)

The configuration whose settings equal the config file's own is marked `shipped` (the SmolLM2
config ships (d): decode_chunk is off there). shared_prefill is not a config key (the agent
loop always offers it to the engine); "off" is JaxEngine declining it, patched in the child
process only, as `benchmarks/sampler.py --rollout` does with a wrapper.

Recorded per configuration: the engine's work summed over every generate call (prompt tokens
whose KV rows were copied from a shared prefill or kept from the previous call instead of
computed; decode row-steps: rows × decode steps run), wall and CPU seconds of the whole
process (start-up, imports and all) and of `trainer.train`, and each stage's seconds summed
over the steps from the time/* scalars in metrics.jsonl (rollout, judge, advantages, select,
teacher, batch, step, sync, eval), with its share of `trainer.train`'s wall time; `other` is
the rest of it (model load, the evaluation before training, checkpoints, logging). Ratios are
to (a) (to the first one run with --only).

No change is meant to change a token. Each configuration's rollouts (rollouts.jsonl: per
rollout its env, seed, group, turns, agent tokens, the actions' text, reward) and evaluation
episodes (eval_episodes.jsonl) are compared with the previous configuration's; a difference is
reported in the table and the JSON, never dropped. reuse_prefix, scan_layers and compaction
compute the same values in other shapes or programs (float reassociation), so a token can in
principle flip at a near tie; shared_prefill and decode_chunk are tested token-exact on the
tiny model (tests/rollout/test_shared_prefill.py).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402
from benchmarks.common import load_config  # noqa: E402

DEFAULT_CONFIG = common.REPO_ROOT / "experiments" / "configs" / "smollm2_cpu.py"
SHARED_PREFILL = "shared_prefill"   # not a config key: the engine accepts or declines it
# (name, setting it switches, value when off, value when on (None: --decode-chunk), commit).
CHANGES = (
    ("reuse_prefix", "rollout.reuse_prefix", False, True, "d642a05"),
    ("scan_layers", "model.scan_layers", False, True, "34c6a81"),
    ("shared_prefill", SHARED_PREFILL, False, True, "cc3de7e"),
    ("decode_chunk", "rollout.decode_chunk", 0, None, "17501bf"),
)
STAGES = ("rollout", "judge", "advantages", "select", "teacher", "batch", "step", "sync", "eval")
ROLLOUT_KEYS = ("step", "env", "seed", "group", "rollout", "num_turns", "agent_tokens",
                "actions", "reward")
EVAL_KEYS = ("step", "env", "instance", "seed", "sample", "turns", "actions", "success")


# ----------------------------------------------------------------------------- configurations


def set_dotted(config, dotted: str, value: Any) -> None:
  node = config
  *parents, leaf = dotted.split(".")
  for name in parents:
    node = node[name]
  if leaf not in node:
    raise KeyError(f"config has no key {dotted!r}")
  node[leaf] = value


def get_dotted(config, dotted: str) -> Any:
  node = config
  for name in dotted.split("."):
    node = node[name]
  return node


def configurations(decode_chunk: int) -> list[dict[str, Any]]:
  """(a) every change off, then each switched on cumulatively: [{name, label, settings}]."""
  settings = {key: off for _, key, off, _, _ in CHANGES}
  rows = [{"name": "a", "label": "all off", "adds": None, "settings": dict(settings)}]
  for i, (change, key, _, on, commit) in enumerate(CHANGES):
    settings[key] = decode_chunk if on is None else on
    rows.append({"name": chr(ord("b") + i), "label": f"+ {change}", "adds": change,
                 "commit": commit, "settings": dict(settings)})
  return rows


def shipped_settings(config) -> dict[str, Any]:
  """The config file's own values of the changes' settings (the agent loop always offers
  shared prefill)."""
  return {key: True if key == SHARED_PREFILL else get_dotted(config, key)
          for _, key, _, _, _ in CHANGES}


# ----------------------------------------------------------------------------- one run (child)


ENGINE_COUNTERS = ("shared_tokens", "reused_tokens", "row_steps")


def instrument_engine(accept_shared_prefill: bool) -> dict[str, int]:
  """Wraps JaxEngine.generate (in this process): it sums the engine's per-call work counters
  into the returned dict and, unless `accept_shared_prefill`, declines the shared prefill the
  agent loop asks for."""
  from rised_jax.rollout.jax_engine import JaxEngine  # noqa: PLC0415

  generate = JaxEngine.generate
  totals = dict.fromkeys(ENGINE_COUNTERS, 0) | {"calls": 0}

  def counted(self, requests, *, shared_prefill: bool = False, **options):
    results = generate(self, requests, shared_prefill=shared_prefill and accept_shared_prefill,
                       **options)
    for key in ENGINE_COUNTERS:
      totals[key] += getattr(self, f"last_{key}")
    totals["calls"] += 1
    return results

  JaxEngine.generate = counted
  return totals


def run_child(spec_path: Path) -> None:
  """Runs `trainer.train` on the spec's config; writes its wall and CPU seconds."""
  spec = json.loads(spec_path.read_text())
  from rised_jax import trainer  # noqa: PLC0415
  config = load_config(spec["config"])
  for dotted, value in spec["overrides"].items():
    set_dotted(config, dotted, value)
  settings = dict(spec["settings"])
  if config.rollout.engine != "jax":
    raise ValueError(f"the changes are JaxEngine's: needs rollout.engine=jax, got "
                     f"{config.rollout.engine!r}")
  engine_work = instrument_engine(settings.pop(SHARED_PREFILL))
  for dotted, value in settings.items():
    set_dotted(config, dotted, value)
  wall, cpu = time.perf_counter(), time.process_time()
  trainer.train(config, spec["workdir"])
  Path(spec["result"]).write_text(json.dumps({
      "train_s": time.perf_counter() - wall, "train_cpu_s": time.process_time() - cpu,
      "engine_work": engine_work}))


# ----------------------------------------------------------------------------- measuring


def read_jsonl(path: Path) -> list[dict[str, Any]]:
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stage_seconds(metrics: list[dict[str, Any]]) -> dict[str, float]:
  """Each time/<stage> scalar summed over the logged steps (stages in the trainer's order,
  then any the trainer logs that STAGES does not name)."""
  totals: dict[str, float] = {}
  for line in metrics:
    for key, value in line.items():
      if key.startswith("time/"):
        totals[key[len("time/"):]] = totals.get(key[len("time/"):], 0.0) + float(value)
  order = [s for s in STAGES if s in totals] + sorted(set(totals) - set(STAGES))
  return {s: totals[s] for s in order}


def fingerprints(workdir: Path) -> dict[str, list[list[Any]]]:
  """What each rollout and evaluation episode did, in logged order."""
  return {"rollouts": [[r.get(k) for k in ROLLOUT_KEYS] for r in read_jsonl(
              workdir / "rollouts.jsonl")],
          "eval_episodes": [[e.get(k) for k in EVAL_KEYS] for e in read_jsonl(
              workdir / "eval_episodes.jsonl")]}


def compare_runs(now: dict[str, list], before: dict[str, list]) -> dict[str, Any]:
  """Per file: equal or not, how many records differ and the first differing record's step."""
  out: dict[str, Any] = {}
  for name in ("rollouts", "eval_episodes"):
    a, b = now[name], before[name]
    differ = [i for i in range(min(len(a), len(b))) if a[i] != b[i]]
    first = differ[0] if differ else None
    out[name] = {"same": a == b, "records": [len(a), len(b)], "differing": len(differ),
                 "first_differing_step": a[first][0] if first is not None else None}
  out["same"] = all(out[name]["same"] for name in ("rollouts", "eval_episodes"))
  return out


def run_configuration(row: dict[str, Any], args: argparse.Namespace, root: Path
                      ) -> dict[str, Any]:
  """One configuration in a fresh process and workdir; its times and what it rolled out."""
  workdir = root / row["name"]
  if workdir.exists():   # the trainer would resume it
    raise FileExistsError(f"{workdir} exists: --keep needs a directory without earlier runs")
  spec = {"config": args.config, "workdir": str(workdir),
          "result": str(root / f"{row['name']}.json"), "settings": row["settings"], "overrides": {
              "train.steps": args.steps, "eval.episodes_per_env": args.eval_episodes,
              **args.set}}
  spec_path = root / f"{row['name']}.spec.json"
  spec_path.write_text(json.dumps(spec))
  command = [sys.executable, str(Path(__file__).resolve()), "--child", str(spec_path)]
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  start = time.perf_counter()
  with open(root / f"{row['name']}.log", "w") as log:
    done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
  process_s = time.perf_counter() - start
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  if done.returncode:
    tail = (root / f"{row['name']}.log").read_text()[-4000:]
    raise RuntimeError(f"configuration ({row['name']}) {row['label']} failed "
                       f"(exit {done.returncode}): {' '.join(command)}\n{tail}")
  timed = json.loads(Path(spec["result"]).read_text())
  stages = stage_seconds(read_jsonl(workdir / "metrics.jsonl"))
  stages["other"] = timed["train_s"] - sum(stages.values())
  return {**row, "process_s": process_s,
          "process_cpu_s": (after.ru_utime + after.ru_stime) - (usage.ru_utime + usage.ru_stime),
          **timed, "stage_s": stages,
          "stage_share": {s: v / timed["train_s"] for s, v in stages.items()},
          "load_average_after": list(os.getloadavg()), "_fingerprints": fingerprints(workdir)}


def summarize(rows: list[dict[str, Any]], shipped: dict[str, Any]) -> None:
  """Ratios to the first configuration run ((a) unless --only leaves it out), comparisons
  with the previous one run, the shipped mark (in place)."""
  base = rows[0]
  for i, row in enumerate(rows):
    row["shipped"] = row["settings"] == shipped
    row["ratio_to_first"] = {"train_s": row["train_s"] / base["train_s"],
                         "train_cpu_s": row["train_cpu_s"] / base["train_cpu_s"],
                         "rollout_s": row["stage_s"]["rollout"] / base["stage_s"]["rollout"]}
    if i:
      row["vs_previous"] = compare_runs(row["_fingerprints"], rows[i - 1]["_fingerprints"])
  for row in rows:
    del row["_fingerprints"]


def print_table(rows: list[dict[str, Any]]) -> None:
  stages = [s for s in rows[0]["stage_s"]]
  head = f"{'config':22s} {'train s':>8s} {'cpu s':>8s} {'x 1st':>5s}"
  print("\n" + head + "".join(f" {s[:8]:>13s}" for s in stages)
        + f" {'shared':>8s} {'reused':>8s} {'row-steps':>9s}  same as previous")
  for row in rows:
    label = f"({row['name']}) {row['label']}" + (" *" if row["shipped"] else "")
    line = (f"{label:22s} {row['train_s']:8.1f} {row['train_cpu_s']:8.1f} "
            f"{row['ratio_to_first']['train_s']:5.2f}")
    line += "".join(f" {row['stage_s'].get(s, 0.0):6.1f} ({row['stage_share'].get(s, 0.0):3.0%})"
                    for s in stages)
    work = row["engine_work"]
    line += f" {work['shared_tokens']:8d} {work['reused_tokens']:8d} {work['row_steps']:9d}"
    if "vs_previous" in row:
      v = row["vs_previous"]
      line += ("  yes" if v["same"] else
               f"  NO: {v['rollouts']['differing']} rollouts, {v['eval_episodes']['differing']} "
               f"eval episodes differ")
    print(line)
  print("* = the config file's own settings; stage: seconds summed over the steps (share of "
        "trainer.train); other = model load, first evaluation, checkpoints, logging; shared / "
        "reused: prompt tokens not prefilled; row-steps: decode rows x steps")


# ----------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="path[:arg] of a config")
  parser.add_argument("--steps", type=int, default=2, help="train.steps of each run")
  parser.add_argument("--eval-episodes", type=int, default=2,
                      help="eval.episodes_per_env of each run (before and after training)")
  parser.add_argument("--decode-chunk", type=int, default=4, help="rollout.decode_chunk in (e)")
  parser.add_argument("--only", default="",
                      help="comma-separated configuration names to run (default: all, a-e)")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="a further override for every run (a Python literal, else a string)")
  parser.add_argument("--keep", type=Path, default=None,
                      help="keep the workdirs and logs here (default: a deleted temporary dir)")
  parser.add_argument("--out", default=str(common.RESULTS_DIR / "main_job_changes.json"))
  parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child is not None:
    return args
  for key in ("steps", "eval_episodes", "decode_chunk"):
    if getattr(args, key) < 1:
      parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
  if not Path(args.config.partition(":")[0]).is_file():
    parser.error(f"--config {args.config}: no such file")
  names = [row["name"] for row in configurations(args.decode_chunk)]
  args.only = [n.strip() for n in args.only.split(",") if n.strip()] or names
  if set(args.only) - set(names):
    parser.error(f"--only: unknown configurations {sorted(set(args.only) - set(names))}; "
                 f"expected some of {names}")
  overrides = {}
  for item in args.set:
    key, sep, text = item.partition("=")
    if not sep or not key:
      parser.error(f"--set {item!r}: expected KEY=VALUE")
    overrides[key] = _literal(text)
  args.set = overrides
  return args


def _literal(text: str) -> Any:
  import ast  # noqa: PLC0415
  try:
    return ast.literal_eval(text)
  except (SyntaxError, ValueError):
    return text


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
  args = parse_args(argv)
  if args.child is not None:
    run_child(args.child)
    return None
  config = load_config(args.config)
  for dotted, value in args.set.items():   # fails here, by name, before any run
    set_dotted(config, dotted, value)
  rows = [row for row in configurations(args.decode_chunk) if row["name"] in args.only]
  limits = common.probe_machine()
  with tempfile.TemporaryDirectory(prefix="main_job_changes_") as tmp:
    root = args.keep or Path(tmp)
    root.mkdir(parents=True, exist_ok=True)
    measured = []
    for row in rows:
      print(f"({row['name']}) {row['label']} ...", flush=True)
      measured.append(run_configuration(row, args, root))
  summarize(measured, shipped_settings(config))
  print_table(measured)
  differing = [r["name"] for r in measured if not r.get("vs_previous", {"same": True})["same"]]
  if differing:
    print(f"ROLLOUTS DIFFER from the previous configuration in ({', '.join(differing)}): see "
          f"vs_previous in the JSON", file=sys.stderr)
  result = {"machine": common.machine_record(limits), "config": args.config, "steps": args.steps, "eval_episodes": args.eval_episodes,
            "overrides": args.set, "configurations": measured}
  path = common.write_json(args.out, result)
  print(f"wrote {path}")
  return result


if __name__ == "__main__":
  main()
