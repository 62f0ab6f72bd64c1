"""Loaders, statistics and plots over a run's logs (the files `rised_jax.runlog` writes).

    run = load_run(workdir)
    pass_rate_curves(run)      {env: PassRateCurve}   pass rate per env over steps (eval.jsonl)
    tag_frequencies(run)       {env: TagFrequency}    [steps × tags] per env (rollouts.jsonl)
    selection_stats(run)       {env: SelectionStats}  selected share; all-pass / all-fail / mixed
    before_after_table(run)    the before/after pass-rate table (summary.json, else eval.jsonl)
    metric_curves(run)         {name: MetricCurve}    every scalar of metrics.jsonl over steps

and `plot_pass_rates`, `plot_tag_heatmaps`, `plot_selection`, `plot_training_curves` (loss, KL
to the teacher, entropy, reward and success per env, skipped / dropped counts: the panels whose
metrics the run logged), `plot_comparison` (a `rised_jax.compare` table), which return
matplotlib Figures
(made without pyplot, so no global state and no GUI backend). `execute_notebook` runs an
analysis notebook on a workdir. Plain numpy + json; matplotlib and nbclient (the `notebooks`
extra) are imported only by the functions that need them.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Mapping, Sequence

import numpy as np

from rised_jax import runlog, stats
from rised_jax.checks import is_number

# Group kinds (SelectionStats field suffix, label, colour) and tag-label colours by polarity.
_GROUP_KINDS = (("all_pass", "all-pass", "#4c9a2a"), ("all_fail", "all-fail", "#b03a2e"),
                ("mixed", "mixed", "#3b6ea5"))
_POLARITY_COLOURS = {"+": "#2e7d32", "-": "#c62828"}


@dataclasses.dataclass
class Run:
  """A run's logs as loaded from its workdir."""

  workdir: str
  metrics: list[dict[str, Any]]
  evals: list[dict[str, Any]]
  rollouts: list[dict[str, Any]]
  vocabulary: list[dict[str, str]] | None   # entries {id, polarity, description}, if logged
  summary: dict[str, Any] | None            # summary.json, if written

  def describe(self) -> str:
    """One paragraph: what the run logged."""
    steps = [m["step"] for m in self.metrics if "step" in m]
    step_range = f" (steps {min(steps)}–{max(steps)})" if steps else ""
    envs = sorted({r["env"] for r in (*self.rollouts, *self.evals) if "env" in r})
    eval_steps = len({e.get("step") for e in self.evals})
    vocabulary = f"{len(self.vocabulary)} tags" if self.vocabulary else "not logged"
    return (f"{self.workdir}: {len(self.metrics)} metric lines{step_range}, "
            f"{len(self.rollouts)} rollouts, {len(self.evals)} evaluation lines over {eval_steps} "
            f"evaluation steps; environments {envs}; vocabulary: {vocabulary}; summary: "
            f"{'written' if self.summary else 'not written'}")


@dataclasses.dataclass(frozen=True)
class PassRateCurve:
  steps: np.ndarray       # [S] int, the evaluation steps
  pass_rate: np.ndarray   # [S]
  ci_low: np.ndarray      # [S]
  ci_high: np.ndarray     # [S]
  episodes: np.ndarray    # [S] int


@dataclasses.dataclass(frozen=True)
class TagFrequency:
  steps: np.ndarray       # [S] int, the steps with rollouts of this environment
  tags: list[str]         # [T] tag ids, in vocabulary order
  frequency: np.ndarray   # [S, T] share of the step's tagged rollouts with each tag (NaN: none)
  tagged: np.ndarray      # [S] int, tagged rollouts (judged, not unjudged)
  rollouts: np.ndarray    # [S] int, all rollouts


@dataclasses.dataclass(frozen=True)
class SelectionStats:
  """Group counts over all steps. A group is all-pass / all-fail when every rollout of it
  succeeded / failed (zero success variance: no policy-gradient signal), else mixed."""

  candidates: int
  selected: int
  pool_all_pass: int
  pool_all_fail: int
  pool_mixed: int
  selected_all_pass: int
  selected_all_fail: int
  selected_mixed: int

  @property
  def share_selected(self) -> float:
    return self.selected / self.candidates if self.candidates else float("nan")

  @property
  def selected_zero_variance(self) -> int:
    return self.selected_all_pass + self.selected_all_fail


def load_run(workdir: str | os.PathLike[str]) -> Run:
  """Reads metrics.jsonl, eval.jsonl, rollouts.jsonl, vocabulary.json and summary.json."""
  workdir = os.fspath(workdir)
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f"load_run: workdir {workdir!r} is not a directory")
  names = (*runlog.JSONL_FILES, runlog.VOCABULARY_FILE, runlog.SUMMARY_FILE)
  # A JSONL log copied from a bucket may be its shards alone (`runlog.shard_paths`).
  if not any(os.path.exists(os.path.join(workdir, name + suffix)) for name in names
             for suffix in ("", runlog.SHARDS_SUFFIX)):
    raise FileNotFoundError(f"load_run: {workdir!r} holds none of the run logs {list(names)}; "
                            "expected the workdir of a rised_jax run")

  def read_json(name):
    path = os.path.join(workdir, name)
    if not os.path.exists(path):
      return None
    with open(path, encoding="utf-8") as f:
      try:
        return json.load(f)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: "
                         f"{e.msg}") from e

  return Run(
      workdir=workdir,
      metrics=runlog.read_jsonl(os.path.join(workdir, runlog.METRICS_FILE)),
      evals=runlog.read_jsonl(os.path.join(workdir, runlog.EVAL_FILE)),
      rollouts=runlog.read_jsonl(os.path.join(workdir, runlog.ROLLOUTS_FILE)),
      vocabulary=read_json(runlog.VOCABULARY_FILE),
      summary=read_json(runlog.SUMMARY_FILE))


def _fields(record: Mapping[str, Any], keys: Sequence[str], source: str, index: int) -> list[Any]:
  missing = [k for k in keys if k not in record]
  if missing:
    raise ValueError(f"{source}: record {index} lacks key(s) {missing}; expected {list(keys)}")
  return [record[k] for k in keys]


def pass_rate_curves(run: Run) -> dict[str, PassRateCurve]:
  """Pass rate (with its interval) per environment over the evaluation steps."""
  latest: dict[str, dict[int, tuple]] = {}
  for i, record in enumerate(run.evals):
    env, step, *values = _fields(record, ("env", "step", *stats.RESULT_KEYS),
                                 runlog.EVAL_FILE, i)
    latest.setdefault(env, {})[step] = tuple(values)   # a step evaluated twice: the last wins
  curves = {}
  for env in sorted(latest):
    steps = sorted(latest[env])
    values = np.asarray([latest[env][s] for s in steps], np.float64).reshape(len(steps), 4)
    curves[env] = PassRateCurve(np.asarray(steps, np.int64), values[:, 0], values[:, 1],
                                values[:, 2], values[:, 3].astype(np.int64))
  return curves


def mean_pass_rate_curve(curves: Mapping[str, PassRateCurve]) -> tuple[np.ndarray, np.ndarray]:
  """(steps, unweighted mean pass rate) over the steps at which every environment was evaluated."""
  if not curves:
    return np.zeros(0, np.int64), np.zeros(0)
  common = sorted(set.intersection(*(set(c.steps.tolist()) for c in curves.values())))
  means = [np.mean([c.pass_rate[np.searchsorted(c.steps, s)] for c in curves.values()])
           for s in common]
  return np.asarray(common, np.int64), np.asarray(means, np.float64)


def tag_ids(run: Run) -> list[str]:
  """The tag columns: the logged vocabulary's order, else the sorted ids seen in rollouts."""
  if run.vocabulary is not None:
    return [entry["id"] for entry in run.vocabulary]
  return sorted({t for r in run.rollouts for t in (r.get("tags") or [])})


def tag_frequencies(run: Run, *, selected_only: bool = False) -> dict[str, TagFrequency]:
  """Per environment and step, the share of tagged rollouts carrying each tag.

  Rollouts the judge did not tag (tags null, or unjudged) are left out of the share; a step
  with none tagged gets a NaN row. selected_only=True counts only the selected groups.
  """
  columns = tag_ids(run)
  index = {tag: i for i, tag in enumerate(columns)}
  # (env, step) -> [tag counts over tagged rollouts, tagged rollouts, all rollouts]
  cells: dict[tuple[str, int], list[Any]] = {}
  for i, record in enumerate(run.rollouts):
    env, step, tags, unjudged, selected = _fields(
        record, ("env", "step", "tags", "unjudged", "selected"), runlog.ROLLOUTS_FILE, i)
    if selected_only and not selected:
      continue
    cell = cells.setdefault((env, step), [np.zeros(len(columns)), 0, 0])
    cell[2] += 1
    if tags is None or unjudged:
      continue
    cell[1] += 1
    for tag in tags:
      if tag not in index:
        raise ValueError(f"{runlog.ROLLOUTS_FILE}: record {i} has tag {tag!r}, which is not in "
                         f"the run's vocabulary {columns}")
      cell[0][index[tag]] += 1
  result = {}
  for env in sorted({env for env, _ in cells}):
    steps = sorted(step for e, step in cells if e == env)
    sums = np.stack([cells[env, s][0] for s in steps]).reshape(len(steps), len(columns))
    num_tagged = np.asarray([cells[env, s][1] for s in steps], np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
      frequency = np.where(num_tagged[:, None] > 0, sums / num_tagged[:, None], np.nan)
    result[env] = TagFrequency(np.asarray(steps, np.int64), list(columns), frequency, num_tagged,
                               np.asarray([cells[env, s][2] for s in steps], np.int64))
  return result


def selection_stats(run: Run) -> dict[str, SelectionStats]:
  """Per environment: candidate and selected groups, split into all-pass / all-fail / mixed."""
  groups: dict[tuple[int, int], dict[str, Any]] = {}
  for i, record in enumerate(run.rollouts):
    step, group, env, seed, selected, success = _fields(
        record, ("step", "group", "env", "seed", "selected", "success"), runlog.ROLLOUTS_FILE, i)
    entry = groups.setdefault((step, group), {"env": env, "seed": seed, "selected": selected,
                                              "successes": []})
    if (entry["env"], entry["seed"], entry["selected"]) != (env, seed, selected):
      raise ValueError(f"{runlog.ROLLOUTS_FILE}: record {i} (step {step}, group {group}) has env "
                       f"{env!r}, seed {seed}, selected {selected}; an earlier rollout of the same "
                       f"group has {entry['env']!r}, {entry['seed']}, {entry['selected']}")
    entry["successes"].append(bool(success))
  tallies: dict[str, dict[str, int]] = {}
  for entry in groups.values():
    kind = ("all_pass" if all(entry["successes"]) else
            "all_fail" if not any(entry["successes"]) else "mixed")
    tally = tallies.setdefault(
        entry["env"], {f.name: 0 for f in dataclasses.fields(SelectionStats)})
    tally["candidates"] += 1
    tally[f"pool_{kind}"] += 1
    if entry["selected"]:
      tally["selected"] += 1
      tally[f"selected_{kind}"] += 1
  return {env: SelectionStats(**tallies[env]) for env in sorted(tallies)}


def format_selection_table(stats: Mapping[str, SelectionStats]) -> str:
  """A Markdown table of `selection_stats`, with a total row."""
  if not stats:
    return "no rollouts logged"
  total = SelectionStats(*(sum(getattr(s, f.name) for s in stats.values())
                           for f in dataclasses.fields(SelectionStats)))
  rows = [("env", "groups", "selected", "share", "selected all-pass", "selected all-fail",
           "selected mixed", "pool mixed")]
  for env, s in [*sorted(stats.items()), ("all", total)]:
    rows.append((env, str(s.candidates), str(s.selected), f"{s.share_selected:.3f}",
                 str(s.selected_all_pass), str(s.selected_all_fail), str(s.selected_mixed),
                 str(s.pool_mixed)))
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
  lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
  return "\n".join(lines)


def before_after(run: Run) -> tuple[dict[str, Any], dict[str, Any]] | None:
  """(before, after) pass rates per environment: summary.json's, else the first and last
  evaluation steps of eval.jsonl; None when neither exists."""
  if run.summary is not None:
    if not {"before", "after"} <= set(run.summary):
      raise ValueError(f"{os.path.join(run.workdir, runlog.SUMMARY_FILE)} lacks 'before' or "
                       f"'after' (keys: {sorted(run.summary)}); expected RunLog.write_summary's "
                       "output")
    return run.summary["before"], run.summary["after"]
  curves = pass_rate_curves(run)
  steps = sorted({int(s) for c in curves.values() for s in c.steps})
  if len(steps) < 2:
    return None

  def at(step):
    return {env: {"pass_rate": float(c.pass_rate[i]), "ci_low": float(c.ci_low[i]),
                  "ci_high": float(c.ci_high[i]), "episodes": int(c.episodes[i])}
            for env, c in curves.items() for i in np.flatnonzero(c.steps == step)}

  return at(steps[0]), at(steps[-1])


def before_after_table(run: Run) -> str:
  """The before/after table (`stats.format_pass_rate_table`), or why there is none."""
  pair = before_after(run)
  if pair is None:
    return (f"no before/after table: {run.workdir} has no {runlog.SUMMARY_FILE} and fewer than "
            "two evaluation steps")
  return stats.format_pass_rate_table(*pair)


@dataclasses.dataclass(frozen=True)
class MetricCurve:
  steps: np.ndarray    # [S] int, the steps at which the metric was logged
  values: np.ndarray   # [S]


_NOT_CURVES = ("step", "time", "wall")


def metric_curves(run: Run) -> dict[str, MetricCurve]:
  """Every numeric scalar of metrics.jsonl over the steps it was logged at (the last line of a
  step wins), names sorted."""
  points: dict[str, dict[int, float]] = {}
  for i, record in enumerate(run.metrics):
    (step,) = _fields(record, ("step",), runlog.METRICS_FILE, i)
    for name, value in record.items():
      if name in _NOT_CURVES or not is_number(value, finite=False):
        continue
      points.setdefault(name, {})[int(step)] = float(value)
  return {name: MetricCurve(np.asarray(sorted(p), np.int64),
                            np.asarray([p[s] for s in sorted(p)], np.float64))
          for name, p in sorted(points.items())}


# Training-curve panels: (title, a metric belongs to the panel when its name matches).
TRAINING_PANELS: tuple[tuple[str, str], ...] = (
    ("loss", r"^(loss|pg_loss)$"),
    ("KL to the teacher (distillation)", r"^(distill_loss|ref_kl)$"),
    ("entropy", r"^entropy$"),
    ("rollout reward", r"^rollout/reward$"),
    ("rollout success rate", r"^rollout/(.+/success|pass_rate)$"),
    # One quantity per axis: counts per step apart from shares of the step's rollouts.
    ("skipped / dropped (count per step)", r"^(?!time/).*(skipped|dropped|unusable|failed|"
                                           r"zero_variance).*$"),
    ("truncated / unjudged (share of rollouts)", r"^(?!time/).*(unjudged|truncated).*$"),
)


def training_panels(curves: Mapping[str, MetricCurve]) -> list[tuple[str, list[str]]]:
  """The panels of `TRAINING_PANELS` with the metric names each shows (empty panels dropped)."""
  panels = []
  for title, pattern in TRAINING_PANELS:
    names = [n for n in curves if re.match(pattern, n)]
    if names:
      panels.append((title, names))
  return panels


# --- plots ---------------------------------------------------------------------------------------

def _matplotlib():
  try:
    import matplotlib
    import matplotlib.figure
    import matplotlib.ticker
  except ImportError as e:
    raise ImportError("plots need matplotlib: pip install -e '.[notebooks]'") from e
  return matplotlib


def _figure(width: float, height: float):
  return _matplotlib().figure.Figure(figsize=(width, height), layout="constrained")


def _empty(fig, message: str):
  ax = fig.add_subplot()
  ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
  ax.set_axis_off()
  return fig


def plot_pass_rates(curves: Mapping[str, PassRateCurve], *, mean: bool = True):
  """Pass rate over steps, one panel per environment with its 95 % band (bands of several
  environments on one axis hide each other), and a last panel with the mean across them."""
  if not curves:
    return _empty(_figure(7, 4), "no evaluation logged")
  panels = list(curves) + (["mean"] if mean and len(curves) > 1 else [])
  columns = min(3, len(panels))
  rows = -(-len(panels) // columns)
  fig = _figure(3.6 * columns, 2.8 * rows)
  axes = fig.subplots(rows, columns, squeeze=False, sharey=True).ravel()
  for ax, name in zip(axes, panels):
    if name == "mean":
      steps, values = mean_pass_rate_curve(curves)
      ax.plot(steps, values, "k--", marker="s", label="mean")
      ax.set_title("mean over environments")
    else:
      curve = curves[name]
      (line,) = ax.plot(curve.steps, curve.pass_rate, marker="o", label=name)
      ax.fill_between(curve.steps, curve.ci_low, curve.ci_high, color=line.get_color(),
                      alpha=0.2)
      ax.set_title(f"{name} (95 % interval)")
    ax.set(xlabel="step", ylabel="pass rate", ylim=(-0.02, 1.02))
    _integer_steps(ax)
    ax.grid(alpha=0.3)
  for ax in axes[len(panels):]:
    ax.set_axis_off()
  return fig


def _integer_steps(ax) -> None:
  """Steps are whole numbers: no 0.5 ticks on a short run."""
  ax.xaxis.set_major_locator(_matplotlib().ticker.MaxNLocator(integer=True))


def plot_tag_heatmaps(frequencies: Mapping[str, TagFrequency],
                      vocabulary: Sequence[Mapping[str, str]] | None = None):
  """One heatmap per environment: tags (rows) × steps (columns), share of tagged rollouts.

  Tag labels are coloured by polarity when the vocabulary is given; grey cells: no tagged
  rollout at that step.
  """
  envs = [env for env, f in frequencies.items() if f.tags]
  if not envs:
    return _empty(_figure(6, 2), "no tagged rollouts logged")
  num_tags = len(frequencies[envs[0]].tags)
  fig = _figure(max(6.0, 2.5 + 0.25 * max(len(frequencies[e].steps) for e in envs)),
                (0.9 + 0.22 * num_tags) * len(envs))
  polarity = {e["id"]: e["polarity"] for e in vocabulary or ()}
  cmap = _matplotlib().colormaps["viridis"].with_extremes(bad="#d0d0d0")
  axes = fig.subplots(len(envs), 1, squeeze=False)[:, 0]
  for ax, env in zip(axes, envs):
    freq = frequencies[env]
    image = ax.imshow(np.ma.masked_invalid(freq.frequency.T), aspect="auto", vmin=0.0, vmax=1.0,
                      cmap=cmap, interpolation="nearest")
    tick_every = max(1, len(freq.steps) // 12)
    ticks = np.arange(0, len(freq.steps), tick_every)
    ax.set_xticks(ticks, [str(s) for s in freq.steps[ticks]])
    ax.set_yticks(np.arange(len(freq.tags)), freq.tags, fontsize="small")
    for label, tag in zip(ax.get_yticklabels(), freq.tags):
      if tag in polarity:
        label.set_color(_POLARITY_COLOURS[polarity[tag]])
    ax.set(title=f"{env}: share of tagged rollouts with each tag", xlabel="step")
    fig.colorbar(image, ax=ax, fraction=0.03)
  return fig


def plot_selection(stats: Mapping[str, SelectionStats]):
  """Left: share of candidate groups selected per environment. Right: the all-pass /
  all-fail / mixed make-up of the pool (left bar) and of the selected groups (right bar)."""
  fig = _figure(10, 4)
  if not stats:
    return _empty(fig, "no rollouts logged")
  envs = list(stats)
  x = np.arange(len(envs))
  share_ax, kind_ax = fig.subplots(1, 2)
  share_ax.bar(x, [stats[e].share_selected for e in envs], color="#555555")
  share_ax.set_xticks(x, envs, rotation=30, ha="right")
  share_ax.set(ylabel="selected / candidate groups", ylim=(0, 1.05), title="Share selected")
  for offset, source in ((-0.2, "pool"), (0.2, "selected")):
    bottom = np.zeros(len(envs))
    totals = np.asarray([stats[e].candidates if source == "pool" else stats[e].selected
                         for e in envs], np.float64)
    for kind, label, colour in _GROUP_KINDS:
      counts = np.asarray([getattr(stats[e], f"{source}_{kind}") for e in envs], np.float64)
      shares = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
      kind_ax.bar(x + offset, shares, width=0.38, bottom=bottom, color=colour,
                  label=label if source == "pool" else None,
                  hatch="//" if source == "pool" else None, edgecolor="white")
      bottom += shares
  kind_ax.set_xticks(x, envs, rotation=30, ha="right")
  kind_ax.set(ylabel="share of groups", ylim=(0, 1.05),
              title="Group kinds: pool (hatched) vs selected")
  kind_ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
  return fig


def _x_axis(curves: Mapping[str, MetricCurve], x: str) -> dict[int, float]:
  """step -> x value: the step itself, or a logged counter such as progress/rollouts."""
  if x == "step":
    return {}
  if x not in curves:
    raise ValueError(f"x={x!r} was not logged; logged counters: "
                     f"{[n for n in curves if n.startswith('progress/')]}")
  return dict(zip(curves[x].steps.tolist(), curves[x].values.tolist()))


def plot_training_curves(curves: Mapping[str, MetricCurve], *, x: str = "step"):
  """One panel per `training_panels` entry, metrics over `x` (the step, or a progress counter:
  "progress/rollouts", "progress/agent_tokens")."""
  panels = training_panels(curves)
  if not panels:
    return _empty(_figure(6, 2), "no training metrics logged")
  axis = _x_axis(curves, x)
  columns = min(3, len(panels))
  rows = -(-len(panels) // columns)
  fig = _figure(4.2 * columns, 3.2 * rows)
  axes = fig.subplots(rows, columns, squeeze=False).ravel()
  for ax, (title, names) in zip(axes, panels):
    for name in names:
      curve = curves[name]
      keep = [i for i, s in enumerate(curve.steps.tolist()) if not axis or s in axis]
      xs = curve.steps[keep] if not axis else [axis[int(curve.steps[i])] for i in keep]
      ax.plot(xs, curve.values[keep], marker=".", label=name)
    ax.set(title=title, xlabel=x)
    _integer_steps(ax)   # steps and the progress counters are whole numbers
    ax.legend(fontsize="x-small", loc="best")
    ax.grid(alpha=0.3)
  for ax in axes[len(panels):]:
    ax.set_axis_off()
  return fig


def load_comparison(directory: str | os.PathLike[str]) -> dict[str, Any]:
  """The comparison.json of a `rised-compare` directory."""
  path = os.path.join(os.fspath(directory), "comparison.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"load_comparison: {path} does not exist; expected the --workdir of "
                            "a finished rised-compare (or run rised-compare --aggregate on it)")
  with open(path, encoding="utf-8") as f:
    comparison = json.load(f)
  if not isinstance(comparison, dict) or "pipelines" not in comparison:
    raise ValueError(f"{path}: expected an object with key 'pipelines' (rised_jax.compare)")
  return comparison


def plot_comparison(comparison: Mapping[str, Any]):
  """Per pipeline of a `rised_jax.compare.aggregate` result: grouped bars (one per method) of
  the mean over seeds per environment and the mean, the 95 % t-interval as error bars, and the
  per-seed values as dots."""
  pipelines = comparison.get("pipelines") or {}
  if not pipelines:
    return _empty(_figure(6, 2), "no comparison")
  width_envs = max(len(t["envs"]) + 1 for t in pipelines.values())
  fig = _figure(max(6.0, 1.6 * width_envs), 3.6 * len(pipelines))
  axes = fig.subplots(len(pipelines), 1, squeeze=False)[:, 0]
  for ax, (pipeline, table) in zip(axes, pipelines.items()):
    columns = [*table["envs"], "mean"]
    methods = list(table["methods"])
    width = 0.8 / len(methods)
    for k, method in enumerate(methods):
      cells = [table["methods"][method]["per_env"][c] for c in columns]
      xs = np.arange(len(columns)) + (k - (len(methods) - 1) / 2) * width
      means = np.asarray([c["mean"] for c in cells], np.float64)
      low = np.asarray([np.nan if c["ci_low"] is None else c["ci_low"] for c in cells], np.float64)
      high = np.asarray([np.nan if c["ci_high"] is None else c["ci_high"] for c in cells],
                        np.float64)
      ax.bar(xs, means, width=width * 0.95, label=method)
      if np.all(np.isfinite(low)):
        ax.errorbar(xs, means, yerr=[means - low, high - means], fmt="none", ecolor="black",
                    capsize=2, linewidth=0.8)
      for x_pos, cell in zip(xs, cells):
        ax.plot([x_pos] * len(cell["values"]), cell["values"], "o", markersize=3,
                color="black", alpha=0.6)
    ax.set_xticks(np.arange(len(columns)), columns)
    if table["metric"] == "pass_rate":   # a t-interval over few seeds can reach past [0, 1]
      ax.set_ylim(-0.02, 1.02)
    ax.set(ylabel=table["metric"], title=f"{pipeline}: {table['metric']} over seeds "
           f"{table['seeds']} (95 % t-interval; dots: seeds)")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(alpha=0.3, axis="y")
  return fig


# --- notebooks -----------------------------------------------------------------------------------

def execute_notebook(path: str | os.PathLike[str], workdir: str | os.PathLike[str], *,
                     timeout: int = 600):
  """Executes the notebook at `path` on the run in `workdir`; returns the executed notebook.

  The kernel (python3, via ipykernel) runs in the notebook's directory with RISED_WORKDIR set
  to `workdir` and this rised_jax first on its PYTHONPATH, so it analyses with the same code as
  the caller. A failing cell raises nbclient's CellExecutionError (it carries the traceback).
  """
  path, workdir = os.path.abspath(path), os.path.abspath(workdir)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"execute_notebook: no notebook at {path!r}")
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f"execute_notebook: workdir {workdir!r} is not a directory")
  try:
    import nbclient
    import nbformat
  except ImportError as e:
    raise ImportError("executing notebooks needs nbclient, nbformat and ipykernel: "
                      "pip install -e '.[notebooks]'") from e
  notebook = nbformat.read(path, as_version=4)
  package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  python_path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
  env = {**os.environ, "RISED_WORKDIR": workdir, "PYTHONPATH": python_path}
  client = nbclient.NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                                   resources={"metadata": {"path": os.path.dirname(path)}})
  client.execute(env=env)
  return notebook


def figure_outputs(notebook) -> int:
  """How many image outputs (figures) an executed notebook holds."""
  return sum(1 for cell in notebook.cells if cell.cell_type == "code"
             for output in cell.get("outputs", [])
             if any(mime.startswith("image/") for mime in output.get("data", {})))


def error_outputs(notebook) -> list[str]:
  """The "ename: evalue" of every error output in an executed notebook."""
  return [f"{output.get('ename')}: {output.get('evalue')}" for cell in notebook.cells
          if cell.cell_type == "code" for output in cell.get("outputs", [])
          if output.get("output_type") == "error"]
