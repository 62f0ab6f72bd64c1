"""`rised-compare`: every (preset, seed) of a comparison, then one table across methods.

  rised-compare --config FILE[:ARGS] --presets rised,grpo,dapo --seeds 0,1,2 --workdir DIR \
      [--jobs N] [--config.key=value …]   runs what is not finished yet, then aggregates
  rised-compare … --list                  prints one command per unfinished run (for a scheduler);
                                          absolute paths, and it writes nothing
  rised-compare --aggregate DIR           aggregates the runs of DIR's plan (else every run in DIR)

Each run trains in its own sub-workdir DIR/<preset>/seed_<seed> through
`python -m rised_jax.main --config FILE:<preset>[,ARGS] --config.seed=<seed> …`: the preset is
the config file's `algorithm` key (every file in experiments/configs declares it first, with
rised_jax.config_args). Where ARGS already names an algorithm (`FILE:rised,easy`,
`FILE:algorithm=rised`) the preset replaces it; which item that is, is decided by the file's own
parse_arg declaration. Before any run starts every preset's config is built once from the file
and must come out with that preset as its algorithm, else rised-compare refuses and says how to
write the argument. A run is finished when its summary.json exists (the trainer writes it
last); an unfinished one is started again and resumes from its latest checkpoint. Each
sub-workdir records the arguments it ran with and refuses others (edits inside the config
file itself are caught by the trainer for unfinished runs only).

Runs are subprocesses, not calls into the trainer: each gets fresh JAX state (compile caches,
device memory, the distributed runtime) and a crashed run cannot take the others down; and a
local comparison runs exactly the commands that `--list` hands to a cluster scheduler.

Aggregation (pure functions over the runs' own logs, `aggregate`): per pipeline, the final
evaluation of each run (eval.jsonl at step config.train.steps) — pass rate per environment for
the agentic pipeline, mean rubric score per evaluation group (domain) for the rubric pipeline.
Per method and environment: the per-seed values, their mean and 95 % Student-t interval across
seeds; per environment the average rank of each method (1 = best, ties share the mean of their
places) and marks: "first" for the best mean (every tied one), "second" for the next distinct
mean only when one method alone is first. Then the unweighted mean over environments (per seed,
then across seeds, ranked the same way), the mean rank, the budget of each run (rollouts and
agent tokens from rollouts.jsonl; measured train and update seconds from metrics.jsonl,
`train_seconds`), and, paired by seed, the reference method (rised, cripo, or --reference)
against each other method: the exact one-sided sign-flip test (`stats.sign_flip_test`), the
paired Student-t interval (`stats.paired_t`) and the percentile bootstrap interval
(`stats.paired_bootstrap`, named as such). Outputs in DIR: comparison.md, comparison.json and
comparison.png (the last needs matplotlib, the `notebooks` extra).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import importlib.util
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from rised_jax import config_args, runlog, stats
from rised_jax.checks import is_number

METRICS = {"agentic": "pass_rate", "rubric": "score"}   # what a pipeline's table compares
REFERENCES = ("rised", "cripo")   # default reference method, the first one present
# Per pipeline, the baseline whose final score sets the "steps to reach" target (the CriPO
# paper's "reaches GRPO's final score in about half the steps").
TARGET_METHODS = {"agentic": "grpo", "rubric": "grpo_rubric"}
MEAN = "mean"                      # the column of the unweighted mean over environments
OUTPUTS = ("comparison.md", "comparison.json", "comparison.png")
# Per run: what it cost (RunResult fields; the budget table's columns).
BUDGET = ("steps", "rollouts", "agent_tokens", "train_seconds", "update_seconds")
COMMAND_FILE = "compare_command.json"   # in each sub-workdir: the arguments it was run with
PLAN_FILE = "compare_plan.json"         # in DIR: the presets and seeds, in the order given


# The --config text of a file without argument, or {preset: file argument}
# (`check_config_argument`).
ConfigArgument = str | Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class RunSpec:
  preset: str
  seed: int
  workdir: Path


def run_dir(root: str | os.PathLike, preset: str, seed: int) -> Path:
  return Path(root) / preset / f"seed_{seed}"


def plan(root: str | os.PathLike, presets: Sequence[str], seeds: Sequence[int]) -> list[RunSpec]:
  return [RunSpec(p, s, run_dir(root, p, s)) for p in presets for s in seeds]


def is_finished(workdir: str | os.PathLike) -> bool:
  """The trainer writes summary.json after the final evaluation, as its last log."""
  return (Path(workdir) / runlog.SUMMARY_FILE).exists()


class _Declared(Exception):
  """Carries the keys an experiment file's get_config passed to config_args.parse_arg."""

  def __init__(self, spec: dict[str, Any]):
    super().__init__("declared")
    self.spec = spec


def _load_config_module(path: str):
  spec = importlib.util.spec_from_file_location(f"_rised_compare_{Path(path).stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not callable(getattr(module, "get_config", None)):
    raise ValueError(f"--config {path}: the file defines no get_config(arg)")
  return module


def declared_keys(path: str, module=None) -> dict[str, Any]:
  """The keys (name -> default) the file's get_config declares with config_args.parse_arg.

  get_config is called with parse_arg replaced by a recorder that stops it at that call: the
  file's own declaration is read, nothing of the config is built. `module`: the file, loaded.
  """
  module = module or _load_config_module(path)

  def record(arg, /, **spec):
    raise _Declared(spec)

  original = config_args.parse_arg
  config_args.parse_arg = record
  try:
    module.get_config(None)
  except _Declared as declared:
    return declared.spec
  finally:
    config_args.parse_arg = original
  raise ValueError(f"--config {path}: get_config does not parse its argument with "
                   "rised_jax.config_args.parse_arg; rised-compare passes the preset as the "
                   "file's 'algorithm' key and needs that declaration")


_PROBE = "rised-compare-probe"   # a text no preset or setting is named


def _algorithm_item(items: Sequence[str], keys: Mapping[str, Any]) -> int | None:
  """Which comma-separated item of the file argument names the algorithm (None: none does).

  config_args.parse_arg decides which item fills the `algorithm` key: the item whose
  replacement by a probe text makes the parsed algorithm that text. It names an algorithm when
  it is `algorithm=…` or a preset's name; a bare word in that place that names no preset
  (`easy` in `FILE:easy`) is the rest of the argument, written after the preset.
  """
  from rised_jax import config as config_lib  # noqa: PLC0415 - the presets; light to import

  for i, item in enumerate(items):
    key, eq, _ = item.partition("=")
    if eq:
      if key == "algorithm":
        return i
      continue
    probe = [*items[:i], _PROBE, *items[i + 1:]]
    try:
      fills_algorithm = config_args.parse_arg(",".join(probe), **keys)["algorithm"] == _PROBE
    except ValueError:   # the item is a flag or a choice of another key
      continue
    if fills_algorithm:
      return i if item in config_lib.PRESETS else None
  return None


def config_argument(config: str, preset: str, keys: Mapping[str, Any] | None = None) -> str:
  """The file argument of one run: FILE -> FILE:preset; FILE:ARGS -> FILE:preset,ARGS, or,
  where ARGS already names an algorithm (`FILE:rised,easy`, `FILE:algorithm=rised`), ARGS
  with that item replaced by the preset. `keys`: the file's `declared_keys` (needed with ARGS)."""
  path, sep, args = config.partition(":")
  if not (sep and args):
    return f"{path}:{preset}"
  if keys is None:
    raise ValueError(f"--config {config}: the file's declared keys are needed to place the "
                     "preset in its argument")
  items = args.split(",")
  index = _algorithm_item(items, keys)
  if index is None:
    return f"{path}:{preset},{args}"
  items[index] = f"algorithm={preset}" if "=" in items[index] else preset
  return f"{path}:{','.join(items)}"


def check_config_argument(config: str, presets: Sequence[str]) -> dict[str, str]:
  """{preset: the file argument of its runs}, each checked by building the config with it:
  every preset must come out as the config's algorithm. Refuses (ValueError saying how to
  write the argument) before any run starts."""
  path = config.partition(":")[0]
  how = (f"write the file argument without the algorithm (--config {path}:SETTING) or with it "
         f"in the file's algorithm place (--config {path}:rised,SETTING): rised-compare puts "
         "each preset there")
  module = _load_config_module(path)
  keys = declared_keys(path, module)
  if "algorithm" not in keys:
    raise ValueError(f"--config {config}: get_config declares no 'algorithm' key (it declares "
                     f"{sorted(keys)}); rised-compare passes each preset as that key")
  arguments = {}
  for preset in presets:
    argument = config_argument(config, preset, keys)
    file_arg = argument.partition(":")[2]
    try:
      built = module.get_config(file_arg)
    except ValueError as e:
      raise ValueError(f"--config {config} with preset {preset!r} (argument {file_arg!r}): "
                       f"{e}; {how}") from None
    if built.algorithm != preset:
      raise ValueError(f"--config {config}: argument {file_arg!r} builds algorithm "
                       f"{built.algorithm!r}, not the preset {preset!r}; {how}")
    arguments[preset] = argument
  return arguments


def run_arguments(spec: RunSpec, config: ConfigArgument, overrides: Sequence[str]) -> list[str]:
  """The trainer's arguments for one run (recorded in its COMMAND_FILE); `config` is the
  --config text (a file without argument) or `check_config_argument`'s {preset: argument}."""
  argument = (config[spec.preset] if isinstance(config, Mapping)
              else config_argument(config, spec.preset))
  return [f"--config={argument}", f"--workdir={spec.workdir}", f"--config.seed={spec.seed}",
          *overrides]


def compile_cache_env(root: str | os.PathLike) -> dict[str, str]:
  """JAX's persistent compilation cache in DIR/jax_cache, shared by the runs (unless the caller
  set its own): every run of a comparison compiles the same shapes, and on CPU compiling is most
  of a short run (a tiny-config run: 90 s cold, 21 s warm on a loaded 2-core machine)."""
  env = {}
  if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    env["JAX_COMPILATION_CACHE_DIR"] = str(Path(root) / "jax_cache")
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"   # cache every executable
  return env


def run_command(spec: RunSpec, config: ConfigArgument, overrides: Sequence[str]) -> list[str]:
  """`env [cache settings] python -m rised_jax.main …`: runnable as is, here or by a scheduler
  (one cache directory on a shared file system serves every machine of one kind)."""
  root = spec.workdir.parent.parent
  env = [f"{k}={v}" for k, v in compile_cache_env(root).items()]
  return [*(["env", *env] if env else []), sys.executable, "-m", "rised_jax.main",
          *run_arguments(spec, config, overrides)]


def check_command(spec: RunSpec, config: ConfigArgument, overrides: Sequence[str]) -> None:
  """A sub-workdir belongs to one set of arguments: records them, or checks the record.

  The trainer refuses to resume with a different config, but a finished run is skipped before
  the trainer sees it; this check keeps a changed override from reusing an old result.
  """
  path = spec.workdir / COMMAND_FILE
  arguments = run_arguments(spec, config, overrides)
  if path.exists():
    recorded = json.loads(path.read_text())
    if recorded != arguments:
      raise ValueError(f"{spec.workdir} was run with {recorded}, not {arguments}; use a new "
                       "--workdir for different arguments")
    return
  spec.workdir.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(arguments))


# ----------------------------------------------------------------------------- one run's logs


@dataclasses.dataclass(frozen=True)
class RunResult:
  """What the comparison reads from one finished run."""

  preset: str
  seed: int
  pipeline: str
  workdir: str
  values: dict[str, float]   # env (or evaluation group) -> the pipeline's metric, final eval
  steps: int
  rollouts: int
  agent_tokens: int
  train_seconds: float    # the step loop outside evaluation (`train_seconds`)
  update_seconds: float   # the fused train steps alone (time/step)
  # evaluated step -> the metric's unweighted mean over envs (every evaluation of the run,
  # step 0 and config.train.eval_every included): what `steps_to_reach` reads.
  history: Mapping[int, float] = dataclasses.field(default_factory=dict)


def _finite(value: Any, where: str) -> float:
  if not is_number(value):
    raise ValueError(f"{where} = {value!r}; expected a finite number")
  return float(value)


def train_seconds(records: Sequence[Mapping[str, Any]], steps: int,
                  where: str) -> tuple[float, float]:
  """(loop seconds, update seconds) of a run from its per-step metrics.jsonl records.

  Loop seconds: the sum over steps 1..steps of the stages the trainer times (time/<stage>, not
  the nested time/throughput/* rates and time/compile/* counters:
  roll-out, judge, advantages, select, teacher, batch, step, roll-out wait, weight sync),
  without evaluation (time/eval) and without a roll-out that ran in the background while the
  previous step trained (rollout/policy_lag = 1: its time overlaps the other stages). Update
  seconds: time/step alone, the fused forward and backward passes with the teacher's and the
  re-scoring forwards inside it (compile time included).
  """
  by_step = {}
  for record in records:
    if "time/step" in record:
      step = record.get("step")
      if step in by_step:
        raise ValueError(f"{where}: two step records for step {step}")
      by_step[step] = record
  missing = [s for s in range(1, steps + 1) if s not in by_step]
  if missing:
    raise ValueError(f"{where}: no time/step record for step(s) {missing[:5]} of 1..{steps}; "
                     "expected one per train step (a metrics.jsonl written by the trainer)")
  loop = update = 0.0
  for step in range(1, steps + 1):
    record = by_step[step]
    background = _finite(record.get("rollout/policy_lag", 0.0), f"{where}: step {step} "
                         "rollout/policy_lag") > 0
    for key, value in record.items():
      # Stage timers are time/<stage>; time/throughput/* and time/compile/* are rates and
      # counters, not seconds.
      if (not key.startswith("time/") or key.count("/") != 1 or key == "time/eval"
          or (background and key == "time/rollout")):
        continue
      loop += _finite(value, f"{where}: step {step} {key}")
    update += _finite(record["time/step"], f"{where}: step {step} time/step")
  return loop, update


def load_run(workdir: str | os.PathLike) -> RunResult:
  """The final evaluation and the rollout budget of a finished run (errors name the file)."""
  workdir = Path(workdir)
  config_path = workdir / "config.json"
  if not config_path.exists():
    raise FileNotFoundError(f"{config_path} does not exist: {workdir} is not a run directory")
  if not is_finished(workdir):
    raise ValueError(f"{workdir} is not finished ({runlog.SUMMARY_FILE} missing): rerun "
                     "rised-compare with the same arguments to finish it")
  config = json.loads(config_path.read_text())
  try:
    preset, seed, pipeline = config["algorithm"], config["seed"], config["pipeline"]
    steps = config["train"]["steps"]
  except (KeyError, TypeError) as e:
    raise ValueError(f"{config_path}: lacks {e}; expected a config written by the "
                     "trainer") from None
  if pipeline not in METRICS:
    raise ValueError(f"{config_path}: pipeline={pipeline!r}; expected one of {sorted(METRICS)}")
  metric = METRICS[pipeline]
  eval_path = workdir / runlog.EVAL_FILE
  final = [r for r in runlog.read_jsonl(eval_path) if r.get("step") == steps]
  if not final:
    raise ValueError(f"{eval_path} has no evaluation at the final step {steps}")
  values = {}
  for record in final:
    env = record.get("env")
    if env in values:
      raise ValueError(f"{eval_path}: two evaluations of {env!r} at step {steps}")
    values[env] = _finite(record.get(metric), f"{eval_path}: step {steps}, {env!r} {metric!r}")
  history = evaluation_history(runlog.read_jsonl(eval_path), metric, sorted(values),
                               str(eval_path))
  rollouts = runlog.read_jsonl(workdir / runlog.ROLLOUTS_FILE)
  tokens = sum(int(_finite(r.get("agent_tokens"), f"{workdir / runlog.ROLLOUTS_FILE}: "
                           f"step {r.get('step')} agent_tokens")) for r in rollouts)
  metrics_path = workdir / runlog.METRICS_FILE
  loop, update = train_seconds(runlog.read_jsonl(metrics_path), int(steps), str(metrics_path))
  return RunResult(preset=str(preset), seed=int(seed), pipeline=pipeline, workdir=str(workdir),
                   values=values, steps=int(steps), rollouts=len(rollouts), agent_tokens=tokens,
                   train_seconds=loop, update_seconds=update, history=history)


def evaluation_history(records: Sequence[Mapping[str, Any]], metric: str, envs: Sequence[str],
                       where: str) -> dict[int, float]:
  """step -> mean of `metric` over `envs`, for every step at which each of them was evaluated
  (a resumed run may repeat a step's evaluation: the last one counts)."""
  by_step: dict[int, dict[str, float]] = {}
  for record in records:
    if record.get("env") in envs and metric in record:
      step = int(record["step"])
      by_step.setdefault(step, {})[record["env"]] = _finite(
          record[metric], f"{where}: step {step}, {record['env']!r} {metric!r}")
  return {step: float(np.mean([v[e] for e in envs])) for step, v in sorted(by_step.items())
          if set(v) == set(envs)}


def find_runs(root: str | os.PathLike) -> list[Path]:
  """Every DIR/<preset>/seed_<n> directory holding a config.json."""
  return sorted(p.parent for p in Path(root).glob("*/seed_*/config.json"))


# ----------------------------------------------------------------------------- aggregation


def average_ranks(values: Mapping[str, float]) -> dict[str, float]:
  """1 = the largest value; tied values share the mean of the places they occupy."""
  names = list(values)
  # Round so that means equal up to float error tie (e.g. sums of the same pass rates).
  keyed = np.asarray([round(float(values[n]), 12) for n in names])
  ranks = {}
  for name, value in zip(names, keyed):
    better = int(np.sum(keyed > value))
    tied = int(np.sum(keyed == value))
    ranks[name] = better + (tied + 1) / 2
  return ranks


def marks(values: Mapping[str, float]) -> dict[str, str | None]:
  """"first" for the best value (every tied one); "second" for the next distinct value only
  when exactly one method is first (after a tie for first no method is second: the next one
  is third)."""
  keyed = {name: round(float(v), 12) for name, v in values.items()}
  distinct = sorted(set(keyed.values()), reverse=True)
  place = {distinct[0]: "first"}
  if len(distinct) > 1 and list(keyed.values()).count(distinct[0]) == 1:
    place[distinct[1]] = "second"
  return {name: place.get(value) for name, value in keyed.items()}


def _summary(values: Sequence[float]) -> dict[str, Any]:
  low, high = stats.t_interval(values)
  return {"values": [float(v) for v in values], "mean": float(np.mean(values)),
          "ci_low": low, "ci_high": high}


def paired_comparison(reference: Sequence[float], other: Sequence[float],
                      bootstrap_seed: int = 0) -> dict[str, Any]:
  """reference − other, paired by seed: the exact sign-flip p for "reference is better", the
  paired Student-t interval (and its one-sided p), and the percentile bootstrap interval."""
  diff = np.asarray(reference, np.float64) - np.asarray(other, np.float64)
  flip = stats.sign_flip_test(diff)
  t = stats.paired_t(reference, other)
  boot = stats.paired_bootstrap(reference, other, seed=bootstrap_seed)
  return {"mean_diff": flip.mean_diff, "sign_flip_p": flip.p_value, "sign_flip_min_p": flip.min_p,
          "sign_flip_exact": flip.exact, "t_ci_low": t.ci_low, "t_ci_high": t.ci_high,
          "t_p_greater": t.p_greater, "bootstrap_ci_low": boot.ci_low,
          "bootstrap_ci_high": boot.ci_high}


def steps_to_reach(history: Mapping[int, float], target: float) -> int | None:
  """The first evaluated step whose value is >= target (values equal to 12 decimals count as
  reached, as ties do in `average_ranks`); None when no evaluation reaches it."""
  for step in sorted(history):
    if round(float(history[step]), 12) >= round(float(target), 12):
      return int(step)
  return None


def steps_summary(steps: Sequence[int | None]) -> dict[str, Any]:
  """Per-seed steps to the target: how many seeds reach it and the median over all seeds, a
  seed that never reaches it counting as infinitely many steps (None when that is the median)."""
  median = float(np.median([math.inf if s is None else s for s in steps]))
  return {"values": list(steps), "reached": sum(s is not None for s in steps),
          "median": median if math.isfinite(median) else None}


def steps_to_target(per_seed_history: Mapping[str, Sequence[Mapping[int, float]]],
                    target_method: str, target_final: Sequence[float]) -> dict[str, Any]:
  """Steps each method's runs take to reach `target_method`'s mean final score, per seed, and
  the ratio of medians target_method / method (> 1: fewer steps than the target method)."""
  target = float(np.mean(target_final))
  methods = {m: steps_summary([steps_to_reach(h, target) for h in histories])
             for m, histories in per_seed_history.items()}
  base = methods[target_method]["median"]
  for summary in methods.values():
    summary["speedup"] = (base / summary["median"] if base is not None and summary["median"]
                          else None)
  return {"method": target_method, "target": target, "methods": methods}


def _pipeline_table(results: Sequence[RunResult], reference: str | None,
                    bootstrap_seed: int) -> dict[str, Any]:
  """The comparison of one pipeline's runs (every method on the same seeds and envs)."""
  methods = sorted({r.preset for r in results}, key=[r.preset for r in results].index)
  seeds = sorted({r.seed for r in results})
  by_key = {}
  for r in results:
    if (r.preset, r.seed) in by_key:
      raise ValueError(f"two runs of {r.preset} seed {r.seed}: {by_key[r.preset, r.seed].workdir} "
                       f"and {r.workdir}")
    by_key[r.preset, r.seed] = r
  missing = [f"{m} seed {s}" for m in methods for s in seeds if (m, s) not in by_key]
  if missing:
    raise ValueError(f"runs missing for {missing}: every method needs every seed to be paired")
  envs = sorted(results[0].values)
  for r in results:
    if sorted(r.values) != envs:
      raise ValueError(f"{r.workdir} evaluated {sorted(r.values)}; {results[0].workdir} "
                       f"evaluated {envs}; expected the same environments in every run")
  per_seed = {m: {e: [by_key[m, s].values[e] for s in seeds] for e in envs} for m in methods}
  for m in methods:
    per_seed[m][MEAN] = [float(np.mean([by_key[m, s].values[e] for e in envs])) for s in seeds]
  columns = [*envs, MEAN]
  table = {m: {"per_env": {}, **{key: [getattr(by_key[m, s], key) for s in seeds]
                                   for key in BUDGET}} for m in methods}
  for column in columns:
    means = {m: float(np.mean(per_seed[m][column])) for m in methods}
    ranks, places = average_ranks(means), marks(means)
    for m in methods:
      table[m]["per_env"][column] = {**_summary(per_seed[m][column]), "rank": ranks[m],
                                     "mark": places[m]}
  for m in methods:
    table[m]["mean_rank"] = float(np.mean([table[m]["per_env"][e]["rank"] for e in envs]))
  if reference is None:
    reference = next((r for r in REFERENCES if r in methods), methods[0])
  if reference not in methods:
    raise ValueError(f"reference method {reference!r} has no runs; methods: {methods}")
  table = {reference: table.pop(reference), **table}   # the reference method leads the table
  paired = {}
  if len(seeds) >= 2:
    for m in methods:
      if m != reference:
        paired[m] = {c: paired_comparison(per_seed[reference][c], per_seed[m][c],
                                          bootstrap_seed) for c in columns}
  target_method = TARGET_METHODS[results[0].pipeline]
  reach = (steps_to_target({m: [by_key[m, s].history for s in seeds] for m in methods},
                           target_method, per_seed[target_method][MEAN])
           if target_method in methods else None)
  return {"metric": METRICS[results[0].pipeline], "reference": reference, "seeds": seeds,
          "envs": envs, "methods": table, "paired": paired, "steps_to_target": reach,
          "runs": [{"preset": r.preset, "seed": r.seed, "workdir": r.workdir} for r in results]}


def aggregate(results: Sequence[RunResult], reference: str | None = None,
              bootstrap_seed: int = 0) -> dict[str, Any]:
  """{"pipelines": {pipeline: table}}: one table per pipeline present (module docstring)."""
  if not results:
    raise ValueError("no finished runs to aggregate")
  pipelines = {}
  for name in sorted({r.pipeline for r in results}):
    group = [r for r in results if r.pipeline == name]
    ref = reference if reference in {r.preset for r in group} else None
    pipelines[name] = _pipeline_table(group, ref, bootstrap_seed)
  return {"pipelines": pipelines}


# ----------------------------------------------------------------------------- outputs


def _number(x: float) -> str:
  return "n/a" if x is None or not math.isfinite(x) else f"{x:.3f}"


def _cell(summary: Mapping[str, Any]) -> str:
  text = f"{_number(summary['mean'])} [{_number(summary['ci_low'])}, {_number(summary['ci_high'])}]"
  mark = {"first": "**", "second": "_"}.get(summary["mark"], "")
  return f"{mark}{text}{mark} ({summary['rank']:g})"


def _markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
  return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
          *("| " + " | ".join(row) + " |" for row in rows)]


def format_markdown(comparison: Mapping[str, Any]) -> str:
  lines = ["# Comparison", ""]
  for pipeline, t in comparison["pipelines"].items():
    methods, columns = list(t["methods"]), [*t["envs"], MEAN]
    seeds = ", ".join(map(str, t["seeds"]))
    lines += [f"## {pipeline} pipeline: {t['metric']} (final held-out evaluation)", "",
              f"Mean over seeds {seeds} [95 % Student-t interval across seeds] (average rank "
              "among the methods; 1 = best). **Bold**: first, _italic_: second (only when one method "
              "alone is first). `mean` is the "
              "unweighted mean over environments, per seed.", ""]
    rows = [[m, *(_cell(t["methods"][m]["per_env"][c]) for c in columns),
             f"{t['methods'][m]['mean_rank']:.2f}"] for m in methods]
    lines += _markdown_table(["method", *columns, "mean rank"], rows) + [""]
    lines += ["Per-seed values:", ""]
    rows = [[m, c, *(_number(v) for v in t["methods"][m]["per_env"][c]["values"])]
            for m in methods for c in columns]
    lines += _markdown_table(["method", "env", *(f"seed {s}" for s in t["seeds"])], rows) + [""]
    lines += ["Budget per run (mean over seeds). Compute is measured train seconds, not "
              "counted tokens (the logs hold no prompt or teacher token counts): `train s` is "
              "the step loop outside evaluation (metrics.jsonl time/*: roll-outs with their "
              "hinted prompts, judge, teacher, batch, update, weight sync; a background "
              "roll-out's overlap not counted twice), `update s` the fused train steps alone "
              "(forward and backward, the teacher's and hint-free re-scoring forwards; compile "
              "time included). Rollouts and agent (generated) tokens are rollouts.jsonl's.", ""]
    rows = [[m, *(f"{np.mean(t['methods'][m][key]):.4g}" for key in BUDGET)] for m in methods]
    lines += _markdown_table(["method", "steps", "rollouts", "agent tokens", "train s",
                              "update s"], rows) + [""]
    if t["paired"]:
      lines += [f"Paired by seed, {t['reference']} − method: mean difference; p = exact "
                "one-sided sign-flip test of \"the difference is > 0\" over the 2^n sign "
                "patterns (smallest reachable p: 1/2^n for n non-zero differences, 0.125 at 3 "
                "seeds); t = 95 % paired Student-t interval; boot = 95 % percentile bootstrap "
                "interval (anti-conservative at few seeds, shown for reference).", ""]
      rows = [[m, *(f"{_number(p[c]['mean_diff'])}, p={p[c]['sign_flip_p']:.3f}, "
                    f"t [{_number(p[c]['t_ci_low'])}, {_number(p[c]['t_ci_high'])}], "
                    f"boot [{_number(p[c]['bootstrap_ci_low'])}, "
                    f"{_number(p[c]['bootstrap_ci_high'])}]" for c in columns)]
              for m, p in t["paired"].items()]
      lines += _markdown_table(["method", *columns], rows) + [""]
    else:
      lines += ["No paired tests: they need at least two seeds.", ""]
    if t.get("steps_to_target"):
      lines += _steps_lines(t["steps_to_target"], t["seeds"])
  return "\n".join(lines)


def _steps_lines(reach: Mapping[str, Any], seeds: Sequence[int]) -> list[str]:
  lines = [f"Steps to reach {reach['method']}'s final `mean` ({_number(reach['target'])}, its "
           "mean over seeds): the first evaluated step (step 0 and every "
           "config.train.eval_every) whose held-out `mean` is at least that; `-`: never. Median "
           "over seeds, a seed that never reaches it counting as infinitely many steps; speed-up "
           f"= {reach['method']}'s median / the method's.", ""]
  rows = [[m, *("-" if v is None else str(v) for v in r["values"]), f"{r['reached']}/{len(seeds)}",
           "-" if r["median"] is None else f"{r['median']:g}",
           "n/a" if r["speedup"] is None else f"{r['speedup']:.2f}"]
          for m, r in reach["methods"].items()]
  return lines + _markdown_table(["method", *(f"seed {s}" for s in seeds), "reached", "median",
                                  "speed-up"], rows) + [""]


def _json_safe(tree: Any) -> Any:
  """NaN and infinities become null (strict JSON)."""
  if isinstance(tree, dict):
    return {k: _json_safe(v) for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return [_json_safe(v) for v in tree]
  if isinstance(tree, float) and not math.isfinite(tree):
    return None
  return tree


def write_outputs(root: str | os.PathLike, comparison: Mapping[str, Any]) -> list[Path]:
  """comparison.md, comparison.json and (with matplotlib) comparison.png in `root`."""
  root = Path(root)
  written = [root / OUTPUTS[0], root / OUTPUTS[1]]
  written[0].write_text(format_markdown(comparison))
  written[1].write_text(json.dumps(_json_safe(comparison), indent=1, allow_nan=False))
  try:
    from rised_jax import analysis  # noqa: PLC0415 - matplotlib is optional
    figure = analysis.plot_comparison(comparison)
  except ImportError as e:
    print(f"rised-compare: {OUTPUTS[2]} not written: {e} (install the notebooks extra: "
          "pip install -e '.[notebooks]')", file=sys.stderr)
    return written
  figure.savefig(root / OUTPUTS[2], dpi=120, bbox_inches="tight")
  return [*written, root / OUTPUTS[2]]


def write_plan(root: str | os.PathLike, presets: Sequence[str], seeds: Sequence[int]) -> None:
  """Records the presets and seeds of the latest invocation in DIR: `--aggregate DIR` reads
  the same runs in the same order (runs of earlier invocations stay on disk, unread)."""
  Path(root).mkdir(parents=True, exist_ok=True)
  (Path(root) / PLAN_FILE).write_text(json.dumps({"presets": list(presets), "seeds": list(seeds)}))


def read_plan(root: str | os.PathLike) -> list[RunSpec]:
  """The runs PLAN_FILE names ([] when there is none: runs are then discovered)."""
  path = Path(root) / PLAN_FILE
  if not path.exists():
    return []
  doc = json.loads(path.read_text())
  return plan(root, doc["presets"], doc["seeds"])


def aggregate_dir(root: str | os.PathLike, reference: str | None = None) -> dict[str, Any]:
  """Loads the runs of the plan in `root` (without one: every run directory under it),
  aggregates, writes the outputs and returns the comparison."""
  paths = [s.workdir for s in read_plan(root)] or find_runs(root)
  if not paths:
    raise ValueError(f"no runs under {root}: expected {root}/<preset>/seed_<n>/config.json")
  results = []
  for path in paths:
    result = load_run(path)
    if (path.parent.name, path.name) != (result.preset, f"seed_{result.seed}"):
      raise ValueError(f"{path} holds a run of {result.preset} seed {result.seed} "
                       f"(config.json); expected <preset>/seed_<seed> to match it")
    results.append(result)
  comparison = aggregate(results, reference)
  write_outputs(root, comparison)
  return comparison


# ----------------------------------------------------------------------------- command line


def _int_list(text: str) -> list[int]:
  try:
    values = [int(x) for x in text.split(",") if x.strip()]
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None
  if not values or len(set(values)) != len(values) or min(values) < 0:
    raise argparse.ArgumentTypeError(f"{text!r}: expected distinct integers >= 0")
  return values


def _name_list(text: str) -> list[str]:
  values = [x.strip() for x in text.split(",") if x.strip()]
  if not values or len(set(values)) != len(values):
    raise argparse.ArgumentTypeError(f"{text!r}: expected distinct comma-separated names")
  return values


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
  parser = argparse.ArgumentParser(
      prog="rised-compare", description=__doc__.split("\n\n")[0],
      epilog="Other arguments must be --config.key=value overrides; each run receives them.")
  parser.add_argument("--config", help="experiment config file, FILE or FILE:ARGS")
  parser.add_argument("--presets", type=_name_list, help="comma-separated presets")
  parser.add_argument("--seeds", type=_int_list, help="comma-separated seeds")
  parser.add_argument("--workdir", help="comparison directory (one sub-workdir per run)")
  parser.add_argument("--list", action="store_true", help="print the unfinished runs' commands")
  parser.add_argument("--aggregate", metavar="DIR", help="only aggregate the runs under DIR")
  parser.add_argument("--reference", help="the method the paired tests compare against")
  parser.add_argument("--jobs", type=int, default=1,
                      help="runs at a time on this machine (default 1)")
  args, rest = parser.parse_known_args(argv)
  bad = [a for a in rest if not a.startswith("--config.")]
  if bad:
    parser.error(f"unrecognised arguments {bad}; expected --config.key=value overrides")
  if any(a.startswith("--config.seed") for a in rest):
    parser.error("--config.seed is set per run from --seeds; remove it")
  if args.aggregate is None:
    missing = [f"--{k}" for k in ("config", "presets", "seeds", "workdir") if not getattr(args, k)]
    if missing:
      parser.error(f"{', '.join(missing)} required (or --aggregate DIR)")
  elif rest or args.list:
    parser.error("--aggregate DIR takes no overrides and no --list")
  if args.jobs < 1:
    parser.error(f"--jobs {args.jobs}: expected >= 1")
  if args.config:
    path, sep, file_arg = args.config.partition(":")
    if not Path(path).is_file():
      parser.error(f"--config {args.config}: {path} is not a file")
    # Absolute: the commands run (and are listed for a scheduler) from any directory.
    args.config = os.path.abspath(path) + sep + file_arg
  if args.workdir:
    args.workdir = os.path.abspath(args.workdir)
  return args, rest


def _run_one(spec: RunSpec, config: ConfigArgument, overrides: Sequence[str]) -> str | None:
  """Runs one unfinished spec; returns why it failed (None when it finished)."""
  log_path = spec.workdir / "compare.log"
  start = time.monotonic()
  with open(log_path, "a", encoding="utf-8") as log:
    code = subprocess.call(run_command(spec, config, overrides), stdout=log,
                           stderr=subprocess.STDOUT)
  if code != 0 or not is_finished(spec.workdir):
    failure = f"{spec.preset} seed {spec.seed}: exit {code} (log: {log_path})"
    print(f"rised-compare: FAILED {failure}", flush=True)
    return failure
  print(f"rised-compare: {spec.preset} seed {spec.seed}: done in "
        f"{time.monotonic() - start:.0f} s", flush=True)
  return None


def run_all(specs: Sequence[RunSpec], config: ConfigArgument, overrides: Sequence[str],
            jobs: int = 1) -> list[str]:
  """Runs the unfinished specs, `jobs` at a time; returns the failures (with their logs)."""
  todo = []
  for spec in specs:
    check_command(spec, config, overrides)
    if is_finished(spec.workdir):
      print(f"rised-compare: {spec.preset} seed {spec.seed}: finished, skipped", flush=True)
    else:
      todo.append(spec)
  with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
    outcomes = list(pool.map(lambda spec: _run_one(spec, config, overrides), todo))
  return [failure for failure in outcomes if failure]


def main(argv: Sequence[str] | None = None) -> int:
  args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
  if args.aggregate is not None:
    comparison = aggregate_dir(args.aggregate, args.reference)
  else:
    try:
      config = check_config_argument(args.config, args.presets)
    except ValueError as e:
      print(f"rised-compare: {e}", file=sys.stderr)
      return 2
    specs = plan(args.workdir, args.presets, args.seeds)
    if args.list:   # prints only: no plan, no sub-workdir (a scheduler runs the commands)
      for spec in specs:
        if not is_finished(spec.workdir):
          print(shlex.join(run_command(spec, config, overrides)))
      return 0
    write_plan(args.workdir, args.presets, args.seeds)
    failures = run_all(specs, config, overrides, args.jobs)
    if failures:
      print("rised-compare: no comparison written; failed runs:\n  " + "\n  ".join(failures),
            file=sys.stderr)
      return 1
    comparison = aggregate_dir(args.workdir, args.reference)
  root = args.aggregate or args.workdir
  print(format_markdown(comparison))
  print(f"rised-compare: wrote {', '.join(OUTPUTS)} in {root}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
