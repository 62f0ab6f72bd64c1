"""A run's logs: TensorBoard scalar events plus JSONL files, all in the workdir.

`workdir` is a local directory or a bucket URL (gs://…): every file goes through
`etils.epath`. In a local workdir every file is append-only and flushed after each call, so a
killed run keeps everything it logged. Object stores cannot append (rewriting the object per
line would cost O(N²) over a run): in a bucket workdir the JSONL lines are buffered and each
`flush` (the trainer calls it before every checkpoint; `close` too) writes them as one new
shard object per file, `<name>.parts/<index>.jsonl`, and closes the TensorBoard event file
(the next event opens a new one). `read_jsonl` reads a file and its shards as one, so readers
never see the difference; a killed run loses only what it logged after its last checkpoint,
which a resume discards anyway (`rewind`). Layout:

  metrics.jsonl     one line per `scalars` call: {"step", "time" (unix), "wall" (seconds of
                    run time), <tag>: value, …}
  rollouts.jsonl    one line per rollout: {"step", "task", "env", "seed", "group", "rollout",
                    "reward", "success", "truncated", "num_turns", "agent_tokens", "tags",
                    "unjudged", "selected", "teacher", "hint", "actions"} ("env" and "seed"
                    only for environment tasks; "task" is the task's key); "tags" is the list of
                    tag ids the judge set, or null when no tag judge ran; "unjudged" that the
                    judge gave no usable verdict; "actions" the text of each turn's action as
                    the environment read it
  eval.jsonl        one line per environment per evaluation: {"step", "time", "env",
                    "pass_rate", "ci_low", "ci_high", "episodes"}
  eval_episodes.jsonl  one line per evaluation episode: {"step", "env", "instance", "seed",
                    "sample", "success", "turns", "actions", "tags"} (`eval_episodes`)
  vocabulary.json   the rubric vocabulary the rollouts were tagged with (a vocabulary file:
                    `Vocabulary.load` reads it), written by the first `rollouts` call
  summary.json      the before/after pass-rate table (`write_summary`), also as results.md
  tensorboard/      TensorBoard event files (`tensorboard --logdir <workdir>/tensorboard`)
  *.discarded.jsonl what `rewind` moved out of the JSONL files above
  *.jsonl.parts/    (bucket workdirs) the shards of the file of that name, read in name order

TensorBoard events are written with tensorboard's own record writer and event protos (no
TensorFlow). Each `RunLog` opens, at its first event, a fresh event file whose name sorts after
every event file already there (a session that logs nothing leaves no file): TensorBoard reads a directory's files in name order, and `rewind` relies on its
SessionLog.START event being read after the events it purges.

Resuming: a resumed run calls `rewind(checkpoint_step)` before logging (`rewind(None)` when no
checkpoint committed: everything logged is forgotten). Everything logged for
later steps (the work a killed run did after its last checkpoint) moves to the side files, and
TensorBoard drops those events when it reads the START event at checkpoint_step + 1 (with
`purge_orphaned_data`, its default; checked with its Python loaders and its Rust data server),
so the logs read like those of an uninterrupted run. In a bucket, `rewind` writes the kept
lines back as the file itself and deletes its shards: a crash between the two leaves the kept
lines of the shards twice (the next resume's `rewind` does not remove them).

JSON values follow Python's `json` module: a non-finite scalar (a NaN loss) is written as NaN.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import time
from typing import Any, Iterable, Mapping, Sequence

from etils import epath
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from rised_jax.rubrics.vocabulary import Vocabulary
from rised_jax.stats import check_results, format_pass_rate_table, mean_pass_rate
from rised_jax.types import Group, Task
from rised_jax.checks import is_int

METRICS_FILE = "metrics.jsonl"
ROLLOUTS_FILE = "rollouts.jsonl"
EVAL_FILE = "eval.jsonl"
EVAL_EPISODES_FILE = "eval_episodes.jsonl"
VOCABULARY_FILE = "vocabulary.json"


@dataclasses.dataclass(frozen=True)
class GroupNotes:
  """What a step's stages decided about one group of the pool, as rollouts.jsonl records it.

  tags      [G, V] multi-hot rows of a tag judge, or None where no tag judge ran
  unjudged  [G] bool: the judge (tags or criteria) gave no usable verdict; () = all judged
  """

  selected: bool = False
  teacher: bool = False
  tags: Any = None
  unjudged: Sequence[bool] = ()
SUMMARY_FILE = "summary.json"
RESULTS_FILE = "results.md"
TENSORBOARD_DIR = "tensorboard"
JSONL_FILES = (METRICS_FILE, ROLLOUTS_FILE, EVAL_FILE, EVAL_EPISODES_FILE)
_RESERVED_METRIC_KEYS = ("step", "time", "wall")
_EVENT_FILE_PREFIX = "events.out.tfevents."
_EVENT_FILE_TIME = re.compile(r"^events\.out\.tfevents\.(\d+)\.")
SHARDS_SUFFIX = ".parts"
_SHARD_NAME = re.compile(r"^(\d{8})\.jsonl$")
_MAX_PENDING_BYTES = 32 << 20   # a bucket log flushes early past this much buffered text


def is_bucket(path: str | os.PathLike[str]) -> bool:
  """Whether `path` is in an object store (a URL), where files are written whole."""
  return "://" in os.fspath(path)


def shard_paths(path: str | os.PathLike[str]) -> list[epath.Path]:
  """The shards of the JSONL file `path`, in order ([] when none): a bucket log writes them;
  a local copy of a bucket's run (gsutil cp -r) has them too."""
  path = epath.Path(path)
  directory = path.parent / (path.name + SHARDS_SUFFIX)
  if not directory.exists():
    return []
  return sorted((p for p in directory.iterdir() if _SHARD_NAME.match(p.name)),
                key=lambda p: p.name)


def discarded_name(name: str) -> str:
  """metrics.jsonl -> metrics.discarded.jsonl: where `rewind` moves lines."""
  stem, ext = os.path.splitext(name)
  return f"{stem}.discarded{ext}"


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
  """The records of a JSONL file ([] if it does not exist).

  A malformed last line (a run killed while writing it) is skipped; a malformed line
  elsewhere is an error naming the file and line. In a bucket the file's shards follow it
  (module docstring); lines are numbered across them.
  """
  path = epath.Path(path)
  parts = ([path] if path.exists() else []) + shard_paths(path)
  if not parts:
    return []
  lines = "".join(p.read_text(encoding="utf-8") for p in parts).split("\n")
  while lines and not lines[-1].strip():
    lines.pop()
  records = []
  for number, text in enumerate(lines, start=1):
    try:
      record = json.loads(text)
    except json.JSONDecodeError as e:
      if number == len(lines):
        break
      raise ValueError(f"{path}: line {number} is not valid JSON ({e.msg}): {text[:200]!r}") from e
    if not isinstance(record, dict):
      raise ValueError(f"{path}: line {number} is {type(record).__name__}; expected a JSON object")
    records.append(record)
  return records


def _check_step(step: Any, method: str) -> int:
  if not is_int(step) or step < 0:
    raise ValueError(f"RunLog.{method}: step={step!r}; expected an int >= 0")
  return int(step)


def _scalar(value: Any, key: str) -> float:
  """float(value) for Python/numpy/JAX scalars (0-d arrays too); an error names the key."""
  if isinstance(value, (str, bytes)) or getattr(value, "ndim", 0) != 0:
    raise ValueError(f"RunLog.scalars: value of {key!r} is {type(value).__name__} {value!r:.100}; "
                     "expected a real scalar")
  try:
    return float(value)
  except (TypeError, ValueError):
    raise ValueError(f"RunLog.scalars: value of {key!r} is {type(value).__name__} {value!r:.100}; "
                     "expected a real scalar") from None


def _append_text(path: epath.Path, text: str) -> None:
  """Appends `text` to `path`: in place locally, as its next shard in a bucket (one object
  written, whatever the file's size)."""
  if not is_bucket(path):
    with path.open("a", encoding="utf-8") as f:
      f.write(text)
    return
  shards = shard_paths(path)
  index = int(_SHARD_NAME.match(shards[-1].name).group(1)) + 1 if shards else 0
  directory = path.parent / (path.name + SHARDS_SUFFIX)
  directory.mkdir(parents=True, exist_ok=True)
  (directory / f"{index:08d}.jsonl").write_text(text, encoding="utf-8")


def _vocabulary_entries(vocab: Vocabulary) -> list[dict[str, str]]:
  return [{"id": e.id, "polarity": e.polarity, "description": e.description}
          for e in vocab.entries]


class _EventFile:
  """One TensorBoard event file, written synchronously with tensorboard's RecordWriter.

  TensorBoard's Python loader takes the first SessionLog.START of a run for the run's beginning
  and purges on every later one (its older loader and the Rust data server purge on every
  START). So the first file of a directory opens with START at step 0, which purges nothing,
  and a later file writes one only when told to (`rewind`): a session that just adds events
  (an evaluation of a finished run) purges nothing.
  """

  def __init__(self, directory: epath.Path):
    directory.mkdir(parents=True, exist_ok=True)
    # Name it after every event file already there (TensorBoard reads them in name order),
    # even when a previous writer started within the same second.
    stamps = [int(m.group(1)) for m in
              (_EVENT_FILE_TIME.match(p.name) for p in directory.iterdir()) if m]
    newest = max(stamps, default=-1)
    stamp = max(int(time.time()), newest + 1)
    path = directory / f"{_EVENT_FILE_PREFIX}{stamp:010d}.{socket.gethostname()}.{os.getpid()}"
    if path.exists():
      raise FileExistsError(f"TensorBoard event file {path} exists already")
    self.path = os.fspath(path)
    self._writer = RecordWriter(path.open("wb"))
    # File version 2 is what makes TensorBoard honour SessionLog.START purges.
    self.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
    self.first = not stamps   # the directory's first file: its START at 0 purges nothing
    if self.first:
      self.start_session(0)

  def start_session(self, step: int) -> None:
    """Writes SessionLog.START at `step`: TensorBoard drops earlier events at steps >= `step`."""
    self.write(event_pb2.Event(
        wall_time=time.time(), step=step,
        session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

  def write(self, event: event_pb2.Event) -> None:
    self._writer.write(event.SerializeToString())
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


class RunLog:
  """Writes a run's TensorBoard events and JSONL logs to `workdir` (a directory or bucket URL).

  With enabled=False (the non-zero processes of a multi-host run) every method validates its
  arguments and returns as usual but nothing is written. In a bucket workdir the JSONL lines
  and TensorBoard events reach the bucket at `flush` and `close` (module docstring).
  """

  def __init__(self, workdir: str | os.PathLike[str], *, enabled: bool = True,
               wandb: Any = None):
    workdir = epath.Path(workdir)
    if workdir.exists() and not workdir.is_dir():
      raise ValueError(f"RunLog: workdir={os.fspath(workdir)!r} exists and is not a directory")
    self.workdir = workdir
    self.enabled = bool(enabled)
    self._closed = False
    self._start = time.monotonic()
    self._wall_offset = 0.0
    self._next_group: dict[int, int] = {}   # step -> index of the next group logged at it
    self._events: _EventFile | None = None
    self._buffered = is_bucket(workdir)
    self._pending: dict[str, list[str]] = {}   # file name -> text not yet in the bucket
    self._pending_bytes = 0
    # A `wandb_log.WandbScalars` (train.wandb=True): gets every scalar TensorBoard gets.
    self._wandb = wandb if self.enabled else None
    if self.enabled:
      workdir.mkdir(parents=True, exist_ok=True)

  def path(self, name: str) -> epath.Path:
    return self.workdir / name

  def _event_writer(self) -> _EventFile:
    if self._events is None:
      self._events = _EventFile(self.path(TENSORBOARD_DIR))
    return self._events

  @property
  def event_file(self) -> str | None:
    """The TensorBoard event file this RunLog writes (None when disabled or nothing logged)."""
    return self._events.path if self._events else None

  def __enter__(self) -> "RunLog":
    return self

  def __exit__(self, *exc_info: Any) -> None:
    self.close()

  def flush(self) -> None:
    """Writes what a bucket log buffered: one shard per JSONL file, and the event file closed
    (so it is uploaded; the next event opens another). Nothing to do in a local workdir."""
    if not self._buffered:
      return
    pending, self._pending, self._pending_bytes = self._pending, {}, 0
    for name, texts in pending.items():
      _append_text(self.path(name), "".join(texts))
    if self._events is not None:
      self._events.close()
      self._events = None

  def close(self) -> None:
    self.flush()
    if self._events is not None:
      self._events.close()
      self._events = None
    if self._wandb is not None:
      self._wandb.close()
      self._wandb = None
    self._closed = True

  def _check_open(self, method: str) -> None:
    if self._closed:
      raise RuntimeError(f"RunLog.{method}: the log of {self.workdir!r} is closed")

  def _append(self, name: str, records: Iterable[Mapping[str, Any]]) -> None:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if not (self.enabled and text):
      return
    if not self._buffered:
      _append_text(self.path(name), text)
      return
    self._pending.setdefault(name, []).append(text)
    self._pending_bytes += len(text)
    if self._pending_bytes > _MAX_PENDING_BYTES:
      self.flush()

  def scalars(self, step: int, values: Mapping[str, Any], *, prefix: str = "") -> None:
    """Logs named scalars at `step`: TensorBoard tags and one metrics.jsonl line.

    The tag of key k is "{prefix}/{k}" (just k without a prefix).
    """
    self._check_open("scalars")
    step = _check_step(step, "scalars")
    if not isinstance(values, Mapping):
      raise ValueError(f"RunLog.scalars: values is {type(values).__name__}; expected a dict "
                       "{name: float}")
    prefix = prefix.strip("/")
    tagged = {}
    for key, value in values.items():
      if not isinstance(key, str) or not key:
        raise ValueError(f"RunLog.scalars: key {key!r}; expected a non-empty string")
      tag = f"{prefix}/{key}" if prefix else key
      if tag in _RESERVED_METRIC_KEYS:
        raise ValueError(f"RunLog.scalars: key {tag!r} is reserved for the line's own "
                         f"{list(_RESERVED_METRIC_KEYS)}; rename it")
      tagged[tag] = _scalar(value, tag)
    if not self.enabled:
      return
    now = time.time()
    wall = self._wall_offset + time.monotonic() - self._start
    self._append(METRICS_FILE, [{"step": step, "time": now, "wall": wall, **tagged}])
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)
                                         for tag, value in tagged.items()])
    self._event_writer().write(event_pb2.Event(wall_time=now, step=step, summary=summary))
    if self._wandb is not None:
      self._wandb.log(step, tagged)

  def rollouts(self, step: int, groups: Sequence[Group], notes: Sequence[GroupNotes],
               vocab: Vocabulary | None) -> None:
    """One rollouts.jsonl line per rollout of `groups` (the step's whole candidate pool), with
    the stages' `notes` on each group.

    Groups are numbered in order; a second call for the same step continues the numbering.
    `vocab` names the tags (None only when no note carries tags).
    """
    self._check_open("rollouts")
    step = _check_step(step, "rollouts")
    if len(notes) != len(groups):
      raise ValueError(f"RunLog.rollouts: {len(notes)} notes for {len(groups)} groups")
    first = self._next_group.get(step, 0)
    records = []
    for g, (group, note) in enumerate(zip(groups, notes)):
      if not isinstance(group, Group):
        raise ValueError(f"RunLog.rollouts: groups[{g}] is {type(group).__name__}; expected "
                         "rised_jax.types.Group")
      size = len(group.trajectories)
      unjudged = list(note.unjudged) or [False] * size
      if len(unjudged) != size or (note.tags is not None and len(note.tags) != size):
        raise ValueError(f"RunLog.rollouts: step {step}, group {g} ({group.task.key}) has "
                         f"{size} rollouts but its notes cover {len(unjudged)} (unjudged) and "
                         f"{None if note.tags is None else len(note.tags)} (tags)")
      where = ({"env": group.task.env, "seed": int(group.task.seed)}
               if isinstance(group.task, Task) else {})
      for r, traj in enumerate(group.trajectories):
        if note.tags is None:
          tags = None
        elif vocab is None:
          raise ValueError(f"RunLog.rollouts: step {step}, group {g} ({group.task.key}), rollout "
                           f"{r} has tags but no vocabulary was given to name them")
        else:
          try:
            tags = vocab.ids_of(note.tags[r])
          except ValueError as e:
            raise ValueError(f"RunLog.rollouts: step {step}, group {g} ({group.task.key}), "
                             f"rollout {r}: {e}") from None
        records.append({
            "step": step, "task": group.task.key, **where,
            "group": first + g, "rollout": r, "reward": float(traj.reward),
            "success": bool(traj.success), "truncated": bool(traj.truncated),
            "num_turns": len(traj.turns), "agent_tokens": traj.num_agent_tokens,
            "tags": tags, "unjudged": bool(unjudged[r]), "selected": note.selected,
            "teacher": note.teacher, "hint": traj.hint != "",
            "actions": [turn.action_text for turn in traj.turns]})
    if vocab is not None and self.enabled:
      self._record_vocabulary(vocab)
    self._next_group[step] = first + len(groups)
    self._append(ROLLOUTS_FILE, records)

  def _record_vocabulary(self, vocab: Vocabulary) -> None:
    path = self.path(VOCABULARY_FILE)
    entries = _vocabulary_entries(vocab)
    if path.exists():
      if json.loads(path.read_text(encoding="utf-8")) != entries:
        raise ValueError(f"RunLog.rollouts: {path} holds another vocabulary than {vocab!r}; one "
                         "run's rollouts must be tagged with one vocabulary")
      return
    path.write_text(json.dumps(entries, indent=1, ensure_ascii=False), encoding="utf-8")

  def evaluation(self, step: int, results: Mapping[str, Any]) -> None:
    """Logs pass rates {env: {pass_rate, ci_low, ci_high, episodes}} to eval.jsonl and as
    scalars eval/{env}/pass_rate and eval/mean_pass_rate."""
    self._check_open("evaluation")
    step = _check_step(step, "evaluation")
    results = check_results(results, "RunLog.evaluation: results")
    now = time.time()
    self._append(EVAL_FILE, [{"step": step, "time": now, "env": env, **result}
                             for env, result in sorted(results.items())])
    scalars = {f"eval/{env}/{key}": value for env, r in sorted(results.items())
               for key, value in r.items() if key not in ("ci_low", "ci_high", "episodes")}
    scalars["eval/mean_pass_rate"] = mean_pass_rate(results)
    self.scalars(step, scalars)

  def write_summary(self, before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """Writes the before/after pass-rate table to summary.json and results.md; returns it."""
    self._check_open("write_summary")
    table = format_pass_rate_table(before, after)
    before = check_results(before, "before")
    after = check_results(after, "after")
    if not self.enabled:
      return table
    envs = sorted(before)
    summary = {
        "environments": envs,
        "before": {env: before[env] for env in envs},
        "after": {env: after[env] for env in envs},
        "delta": {env: after[env]["pass_rate"] - before[env]["pass_rate"] for env in envs},
        "mean": {"before": mean_pass_rate(before), "after": mean_pass_rate(after),
                 "delta": mean_pass_rate(after) - mean_pass_rate(before)},
        "table": table,
    }
    self.path(SUMMARY_FILE).write_text(json.dumps(summary, indent=1, ensure_ascii=False),
                                       encoding="utf-8")
    self.path(RESULTS_FILE).write_text(
        "# Results\n\nPass rate per environment on held-out seeds, before and after training, "
        "with 95 % intervals; the last row is the unweighted mean across environments.\n\n"
        f"{table}\n", encoding="utf-8")
    return table

  def rewind(self, step: int | None) -> None:
    """Forgets what was logged for steps > `step` (call it on resume, before logging); `None`
    forgets everything (a run restarting from scratch after a kill).

    Later lines of the JSONL files move to their *.discarded.jsonl side files (lines that do
    not parse move there too, wrapped as {"unparsable_line": text}); TensorBoard is told to
    purge its events from step + 1 on by a SessionLog.START event at step + 1. The wall clock
    continues from the last kept metrics line.
    """
    self._check_open("rewind")
    step = -1 if step is None else _check_step(step, "rewind")
    if not self.enabled:
      return
    self.flush()
    for name in JSONL_FILES:
      kept_last = self._split_file(name, step)
      if name == METRICS_FILE and kept_last is not None:
        self._wall_offset = float(kept_last.get("wall", 0.0))
        self._start = time.monotonic()
    self._next_group = {s: n for s, n in self._next_group.items() if s <= step}
    events = self._event_writer()
    if not (events.first and step < 0):   # a first file's START at 0 already purges nothing
      events.start_session(step + 1)

  def _split_file(self, name: str, step: int) -> dict[str, Any] | None:
    """Moves the lines of `name` logged after `step` to the side file; returns the last kept."""
    path = self.path(name)
    shards = shard_paths(path)
    parts = ([path] if path.exists() else []) + shards
    if not parts:
      return None
    lines = [line for part in parts for line in part.read_text(encoding="utf-8").split("\n")
             if line.strip()]
    kept, moved, last = [], [], None
    for line in lines:
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        record = None
      line_step = record.get("step") if isinstance(record, dict) else None
      if not is_int(line_step):
        moved.append(json.dumps({"unparsable_line": line}, ensure_ascii=False))
        continue
      if line_step <= step:
        kept.append(line)
        last = record
      else:
        moved.append(line)
    if not moved:
      return last
    # Side file first, then an atomic replace: a crash in between duplicates, never loses.
    _append_text(self.path(discarded_name(name)), "".join(line + "\n" for line in moved))
    tmp = self.path(name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    tmp.replace(path)
    for shard in shards:   # their kept lines are in the file now
      shard.unlink()
    return last

  def eval_episodes(self, step: int, records: Sequence[Mapping[str, Any]]) -> None:
    """Appends one eval_episodes.jsonl line per evaluation episode, {"step": step, **record}
    (records from `rised_jax.evaluate.episode_records`)."""
    self._check_open("eval_episodes")
    step = _check_step(step, "eval_episodes")
    lines = []
    for i, record in enumerate(records):
      if not isinstance(record, Mapping) or "step" in record:
        raise ValueError(f"RunLog.eval_episodes: records[{i}] = {record!r:.200}; expected a dict "
                         "without a 'step' key")
      lines.append({"step": step, **record})
    self._append(EVAL_EPISODES_FILE, lines)
