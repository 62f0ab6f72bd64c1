"""The outer training loop: a short sequence of named stages, one call each.

    roll out → judge → advantages → select → teacher contexts → batch assembly
    → fused step → weight sync → observe (guidance) → evaluate → log → checkpoint

The trainer owns no algorithm. The stages come from the config's pipeline
(`rised_jax.pipelines`: RISED and baselines on environments, CriPO on rubric tasks) and the
loss settings from `config.step`; the presets of `rised_jax.config` compose them. Everything
that changes from step to step (train state, task cursor, selector / teacher / guidance
memories, the "before" and final evaluations, the non-finite streak) is checkpointed, so a
killed run resumes exactly.

Exactly-once logs across restarts: everything logged at step s (its evaluation, metrics and
rollouts) precedes the checkpoint of step s, and a restart rewinds the logs to its checkpoint
(`RunLog.rewind`; to nothing when none committed). The final evaluation is logged and recorded
in the host state *before* the last checkpoint, so that checkpoint is the run's "finished"
marker: a rerun of a finished run prints its table and does nothing else.

One-step-async roll-outs (`rollout.async_rollouts`, off by default): right after step t's
judge, step t + 1's roll-out starts in a background thread with the weights of step t, while
step t's advantages, selection, teachers and update run; the weight sync waits for it. The
sampler then holds its own copy of the weights (the update donates the state's). Its rollouts
are one step stale: their behaviour log-probs (those of the policy that sampled them) feed the
truncated importance weight w = min(π_old/π_beh, C) of the step that trains on them, where
π_old is the trainer's policy at the start of that step; the PPO ratio of its
`train.num_iterations` updates is π_θ/π_old, never against the sampler's log-probs (the
step's `clip_frac_*` and `is_truncated_frac` measure the two apart), and the guidance hint they
carry is the one from before step t's observation. No roll-out is in flight across a
checkpoint (`may_prefetch`), so a resumed run repeats the uninterrupted one exactly. Logged:
rollout/policy_lag (1 for a background roll-out), time/rollout (its own duration) and
time/rollout_wait (how long the step waited for it).

Skipped steps: the step applies no update when its loss or gradient is not finite, or when
its update would move the parameters by more than `step.max_update_ratio` times their norm
(`train_step`); the trainer logs `train/skipped_nonfinite` and `train/skipped_large_update`
and stops with `NonFiniteTrainingError` after `train.max_nonfinite_steps` consecutive skipped
steps (of either kind), without checkpointing the failing step. A skipped step leaves the train
state as it was, so every checkpoint holds a state that passed both guards: the one the error
names is the state from before the fault.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import importlib.util
import json
import os
import time
import urllib.parse
import urllib.request
from typing import Any

import jax
import ml_collections
import numpy as np
import tqdm
from etils import epath
from flax import nnx

from rised_jax import checkpoint, config as config_lib, parallel, pipelines, runlog, stats
from rised_jax import model as model_lib
from rised_jax.learn import batching, flops, train_step
from rised_jax.pipelines import stages
from rised_jax.model.settings import ModelLoadConfig
from rised_jax.rollout import engines
from rised_jax.rollout.settings import RolloutConfig
from rised_jax.train_settings import TrainConfig


class NonFiniteTrainingError(RuntimeError):
  """Too many consecutive skipped steps (a non-finite loss or gradient, or an absurd update)."""


# Why the step skipped its update: its metrics `skipped_<reason>` (train_step.make_step_fn).
SKIP_REASONS = ("nonfinite", "large_update")


@dataclasses.dataclass
class RunHistory:
  """What a resumed run needs from before its restart: the "before" evaluation, the final
  one (non-empty once the run has finished) and the current run of skipped steps (non-finite
  or too large an update; `nonfinite_streak` keeps its checkpointed name)."""

  before: dict[str, Any] = dataclasses.field(default_factory=dict)
  after: dict[str, Any] = dataclasses.field(default_factory=dict)
  nonfinite_streak: int = 0

  def state_dict(self) -> dict[str, Any]:
    return {"before": self.before, "after": self.after, "nonfinite_streak": self.nonfinite_streak}

  def load_state_dict(self, state) -> None:
    self.before = dict(state["before"])
    self.after = dict(state.get("after", {}))   # absent in checkpoints of older versions
    self.nonfinite_streak = int(state.get("nonfinite_streak", 0))


@dataclasses.dataclass
class Run:
  """Everything one training run holds; built once by `build`."""

  config: ml_collections.ConfigDict
  settings: stages.StageConfigs   # the typed pieces of `config` (pipelines/stages.py)
  tokenizer: model_lib.Tokenizer
  trainable: train_step.Trainable
  state: train_step.TrainState
  engine: Any
  pipeline: pipelines.Pipeline
  checkpointer: checkpoint.Checkpointer
  log: runlog.RunLog
  history: RunHistory
  throughput: flops.Throughput

  def host_state(self) -> dict[str, checkpoint.HostState]:
    return {"history": self.history, **self.pipeline.host_state()}


def _say(message: str) -> None:
  """A line for the person watching (main.py keeps logging at WARNING); process 0 only."""
  if jax.process_index() == 0:
    tqdm.tqdm.write(message)


# URL schemes etils.epath reads and writes (through fsspec), each with the package that fsspec
# needs for it and the extra of this project that installs it (None: not packaged by us).
BUCKET_SCHEMES = ("gs", "s3", "az")
_BUCKET_BACKENDS = {"gs": ("gcsfs", "gcs"), "s3": ("s3fs", None), "az": ("adlfs", None)}


def _check_bucket_backend(scheme: str, workdir: str) -> None:
  """A bucket workdir fails at its first write when fsspec's backend for it is missing: say so
  before anything loads (`--dry_run` included)."""
  module, extra = _BUCKET_BACKENDS[scheme]
  if importlib.util.find_spec(module) is None:
    how = f"pip install 'rised_jax[{extra}]'" if extra else f"pip install {module}"
    raise ValueError(f"workdir {workdir!r}: {scheme}:// paths are written through the "
                     f"{module} package, which is not installed ({how})")


def resolve_workdir(workdir: str | os.PathLike) -> epath.Path:
  """The run directory, resolved once: a bucket URL (gs://…) verbatim, a local path absolute
  (orbax needs absolute paths, and `runs/x` and `$PWD/runs/x` must be the same run). A
  file:// URL names a local directory (epath has no file:// backend): its absolute path."""
  text = os.fspath(workdir)
  scheme, sep, rest = text.partition("://")
  if not sep:
    return epath.Path(os.path.abspath(os.path.expanduser(text)))
  if scheme == "file":
    parsed = urllib.parse.urlparse(text)
    if parsed.netloc not in ("", "localhost"):
      raise ValueError(f"workdir {text!r}: a file:// URL must name a local path "
                       f"(file:///abs/path), not the host {parsed.netloc!r}")
    return epath.Path(os.path.abspath(urllib.request.url2pathname(parsed.path)))
  if scheme not in BUCKET_SCHEMES or not rest:
    raise ValueError(f"workdir {text!r}: expected a local path, a file:// URL or a bucket URL "
                     f"({', '.join(s + '://bucket/path' for s in BUCKET_SCHEMES)})")
  _check_bucket_backend(scheme, text)
  return epath.Path(text)


def check_workdir(workdir: epath.Path) -> None:
  """A local workdir (resolved) is a directory or a path that can be made one: neither it nor
  a parent is an existing file (which would fail as a bare NotADirectoryError later). Bucket
  URLs are not checked here (that needs the bucket's credentials)."""
  if "://" in os.fspath(workdir):
    return
  path = workdir
  while not path.exists() and path.parent != path:
    path = path.parent
  if path.exists() and not path.is_dir():
    what = "is" if path == workdir else f"lies under {path}, which is"
    raise ValueError(f"--workdir {os.fspath(workdir)!r} {what} an existing file; expected a "
                     "directory (existing, or a path the run can create)")


def _engine(settings: stages.StageConfigs, workdir: str, model, tokenizer):
  """The rollout engine of `config.rollout` (its typed piece), sampling `model`."""
  rollout = settings.rollout
  return engines.make_engine(
      rollout, model, tokenizer,
      weight_dir=_weight_dir(rollout, workdir) if rollout.engine == "sglang" else "",
      export_dtype=settings.model.compute_dtype)


def _weight_dir(rollout: RolloutConfig, workdir: str) -> str:
  """The local directory the SGLang weight sync exports into (the server loads from a path)."""
  if rollout.sglang.weight_dir:
    return os.path.abspath(os.path.expanduser(rollout.sglang.weight_dir))
  if "://" in workdir:
    raise ValueError(f"config.rollout.sglang.weight_dir is empty and the workdir "
                     f"{workdir} is a bucket URL: SGLang loads the synced weights from a "
                     "directory on its host, so give a local or shared-filesystem path")
  return os.fspath(epath.Path(workdir) / "weights")


# Where the workdir (or the weight-sync scratch) is, is not part of what the run is (a moved or
# differently spelled workdir is the same run).
_CONFIG_KEYS_IGNORED = ("workdir", "rollout.sglang.weight_dir")


def _check_saved_config(workdir: epath.Path, config: ml_collections.ConfigDict) -> None:
  """A workdir belongs to one config: resuming with a different one is an error."""
  path = workdir / "config.json"
  if not path.exists():
    return
  current = _flat(json.loads(config.to_json_best_effort(sort_keys=True)))
  saved = _flat(json.loads(path.read_text()))
  diff = sorted(k for k in set(saved) | set(current)
                if saved.get(k) != current.get(k) and k not in _CONFIG_KEYS_IGNORED)
  if diff:
    raise ValueError(f"{path} holds a different config (differs at {diff}); use a new "
                     f"--workdir, or the same config to resume")


def _write_config(workdir: epath.Path, config: ml_collections.ConfigDict) -> None:
  """config.json, once the run has been built (a failed first attempt must not lock it)."""
  path = workdir / "config.json"
  if not path.exists() and jax.process_index() == 0:
    path.write_text(config.to_json_best_effort(indent=2, sort_keys=True))


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
  if isinstance(tree, dict):
    out = {}
    for k, v in tree.items():
      out.update(_flat(v, f"{prefix}{k}."))
    return out
  return {prefix[:-1]: tree}


def _prepare(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> epath.Path:
  """Validates the config (the only place a run does), resolves the workdir into
  `config.workdir` and checks that the workdir's saved config (if any) is this one: everything
  that fails before any loading."""
  pipelines.validate(config, num_devices=jax.device_count())
  settings = stages.stage_configs(config)
  problem = compilation_cache_problem(settings, jax.default_backend(), jax.device_count())
  if problem:
    _say(f"the persistent compilation cache is off for this run: {problem}")
  use_compilation_cache(dataclasses.replace(settings.train, compilation_cache="") if problem
                        else settings.train)
  workdir = resolve_workdir(workdir)
  check_workdir(workdir)
  with config.unlocked():
    config.workdir = os.fspath(workdir)
  if settings.rollout.engine == "sglang":
    _weight_dir(settings.rollout, config.workdir)
  _check_saved_config(workdir, config)
  return workdir


def compilation_cache_dir(train: TrainConfig) -> str | None:
  """Where compiled steps and samplers persist between runs (a resumed or repeated run loads
  them instead of compiling): `train.compilation_cache`, "auto" meaning JAX's own setting
  (JAX_COMPILATION_CACHE_DIR) if any, else $RISED_JAX_CACHE/jax (default
  ~/.cache/rised_jax/jax); None for no cache."""
  setting = train.compilation_cache
  if not setting:
    return None
  if setting == "auto":
    setting = jax.config.jax_compilation_cache_dir or os.path.join(
        os.environ.get("RISED_JAX_CACHE", "~/.cache/rised_jax"), "jax")
  return os.path.abspath(os.path.expanduser(setting))


def compilation_cache_problem(settings: stages.StageConfigs, backend: str,
                              devices: int) -> str | None:
  """Why this run must not use the persistent compilation cache, or None. On XLA:CPU (jax
  0.10.2) an executable of the shared-prefix step for several devices, loaded from the cache,
  deadlocks in a collective rendezvous (compiled afresh it runs; docs/performance.md)."""
  if (settings.batching.shared_prefix and backend == "cpu" and devices > 1
      and compilation_cache_dir(settings.train)):
    return (f"batching.shared_prefix on {devices} CPU devices (a cached executable of that "
            "step deadlocks in XLA:CPU's collectives)")
  return None


def use_compilation_cache(train: TrainConfig) -> None:
  """Points JAX's persistent compilation cache at `compilation_cache_dir` (re-initialising it
  when an earlier compile in this process fixed another directory, or none)."""
  from jax.experimental.compilation_cache import compilation_cache  # noqa: PLC0415
  directory = compilation_cache_dir(train)
  if (directory or None) != (jax.config.jax_compilation_cache_dir or None):
    compilation_cache.set_cache_dir(directory)
    compilation_cache.reset_cache()


def _load_model(m: ModelLoadConfig):
  _say(f"loading model {m.source} ({m.param_dtype} weights, {m.compute_dtype} compute)…")
  start = time.perf_counter()
  model, tokenizer = model_lib.from_pretrained(m.source, dtype=m.compute_dtype,
                                               param_dtype=m.param_dtype, remat=m.remat,
                                               scan_layers=m.scan_layers)
  params = jax.tree.leaves(nnx.state(model, nnx.Param))
  count = sum(int(np.prod(p.shape)) for p in params)
  size = sum(int(np.prod(p.shape)) * p.dtype.itemsize for p in params)
  _say(f"loaded {m.source}: {count / 1e6:.1f} M parameters, {size / 2**20:.0f} MiB, "
       f"in {time.perf_counter() - start:.1f} s")
  return model, tokenizer


def build(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> Run:
  """Validates the config, then loads the model and builds every stage; writes config.json
  into the workdir only once all of that has succeeded."""
  return _build(config, _prepare(config, workdir))


def _build(config: ml_collections.ConfigDict, workdir: epath.Path) -> Run:
  """`build` of a config that `_prepare` has validated."""
  settings = stages.stage_configs(config)
  model, tokenizer = _load_model(settings.model)
  mesh = parallel.make_mesh(settings.mesh)
  optimizer = train_step.make_optimizer(config_lib.optimizer_config(config),
                                        updates_per_step=settings.step.updates_per_step)
  trainable, state = train_step.create(model, optimizer, settings.step, mesh, seed=config.seed)
  # With async roll-outs the sampler's weights must be its own from the start: step 0 donates
  # the state's while step 1 rolls out.
  engine = _engine(settings, config.workdir,
                   trainable.compute_model(state, copy=settings.rollout.async_rollouts), tokenizer)
  throughput = flops.Throughput.for_devices(
      model.cfg, settings.model.compute_dtype, ref_kl=trainable.config.needs_ref_params,
      peak_flops_per_s=settings.train.peak_flops_per_s,
      num_iterations=trainable.config.num_iterations,
      old_policy_pass=trainable.config.fixed_per_batch,
      micro_batches=trainable.config.micro_batches)
  run = Run(config=config, settings=settings, tokenizer=tokenizer, trainable=trainable, state=state,
            engine=engine, pipeline=pipelines.make_pipeline(config, engine, tokenizer),
            checkpointer=_checkpointer(settings.train, workdir),
            log=runlog.RunLog(workdir, enabled=jax.process_index() == 0,
                              wandb=_wandb_scalars(settings.train, config, workdir)),
            history=RunHistory(), throughput=throughput)
  _write_config(workdir, config)
  return run


def _wandb_scalars(train: TrainConfig, config: ml_collections.ConfigDict,
                   workdir: str | os.PathLike):
  """train.wandb=True: the W&B run that mirrors the TensorBoard scalars (`wandb_log`), on the
  process that writes the logs (its run config: the whole `config`)."""
  if not train.wandb or jax.process_index() != 0:
    return None
  from rised_jax import wandb_log  # noqa: PLC0415  (imports the optional wandb package)
  return wandb_log.WandbScalars(workdir, config.to_dict())


def _checkpointer(train: TrainConfig, workdir: epath.Path) -> checkpoint.Checkpointer:
  return checkpoint.Checkpointer(workdir / "checkpoints", keep=train.keep_checkpoints)


# ----------------------------------------------------------------------------- stages


def assemble(run: Run, rows: list[batching.Row]):
  """Dense, bucketed arrays; a fixed row count so the step compiles once per bucket."""
  step_config = run.trainable.config
  return batching.assemble(
      rows, pad_id=run.tokenizer.pad_token_id,
      num_rows=run.settings.select.batch_groups * run.settings.rollout.group_size,
      with_distill=step_config.distills, with_counterfactual=step_config.flips.counterfactual,
      group_size=run.settings.rollout.group_size, **dataclasses.asdict(run.settings.batching))


def update(run: Run, batch, compiled_shapes: set | None = None) -> dict[str, float]:
  """One fused step, with its throughput (`flops.Throughput`, compile time excluded) and
  `time/compile/cache_hits`. With `compiled_shapes`, a batch shape not in it (the step
  compiles for it) is announced and the compile time JAX reports is printed."""
  # The step compiles per batch shape, and with shared-prefix groups per prefix width too.
  shape = tuple(np.shape(batch["input_ids"])) + (
      tuple(np.shape(batch["prefix_ids"])) if "prefix_ids" in batch else ())
  announce = compiled_shapes is not None and shape not in compiled_shapes
  if announce:
    shared = f" (prefixes of {shape[3]} columns shared by groups)" if len(shape) > 2 else ""
    _say(f"compiling the train step for a batch of {shape[0]} × {shape[1]} tokens{shared}…")
  with _compile_events() as compiles:
    start = time.perf_counter()
    run.state, metrics = run.trainable.step(run.state, run.trainable.put_batch(batch))
    metrics = {k: float(v) for k, v in metrics.items()}   # waits for the step
    seconds = time.perf_counter() - start
  if metrics.get("rollout/logprob_diff_tokens") == 0:
    # A mean over no compared token is undefined: a logged 0 would read as a sampler in sync.
    del metrics["rollout/logprob_diff"]
  if announce:
    compiled_shapes.add(shape)
    hit = " (from the compilation cache)" if compiles["cache_hits"] else ""
    _say(f"compiled the train step in {compiles['seconds']:.1f} s{hit}")
  metrics.update(run.throughput.step_metrics(batch, seconds - compiles["seconds"]))
  metrics["time/compile/cache_hits"] = float(compiles["cache_hits"])
  return metrics


@contextlib.contextmanager
def _compile_events():
  """Seconds JAX spends tracing, lowering and compiling (or loading from the persistent
  cache) inside the block, and its persistent-cache hits: {"seconds", "cache_hits"}."""
  counts = {"seconds": 0.0, "cache_hits": 0}

  def on_duration(event: str, duration: float, **_):
    if event.startswith("/jax/core/compile/"):
      counts["seconds"] += duration

  def on_event(event: str, **_):
    if event == "/jax/compilation_cache/cache_hits":
      counts["cache_hits"] += 1

  jax.monitoring.register_event_duration_secs_listener(on_duration)
  jax.monitoring.register_event_listener(on_event)
  try:
    yield counts
  finally:
    jax.monitoring.unregister_event_duration_listener(on_duration)
    jax.monitoring.unregister_event_listener(on_event)


def sync_weights(run: Run, version: int) -> dict[str, float]:
  """The sampler must see the new parameters (the step donated the old buffers), in the compute
  dtype: the in-process sampler holds them, the SGLang engine exports or sends them. With async
  rollouts the sampler holds its own copy: it samples step t + 1 while step t donates them.
  Returns sync/seconds and sync/bytes (`Engine.last_sync_bytes`)."""
  start = time.perf_counter()
  model = run.trainable.compute_model(run.state, copy=run.settings.rollout.async_rollouts)
  run.engine.update_weights(model, version)
  return {"sync/seconds": time.perf_counter() - start,
          "sync/bytes": float(run.engine.last_sync_bytes)}


def may_prefetch(settings: stages.StageConfigs, step: int) -> bool:
  """Whether step `step + 1`'s roll-out runs in the background while step `step` trains.

  Only with `rollout.async_rollouts`, never past the last step, and never across a checkpoint:
  the step after a checkpoint rolls out with the checkpointed weights, in the foreground, so a
  run resumed from that checkpoint repeats exactly what the uninterrupted run did.
  """
  done = step + 1
  return (settings.rollout.async_rollouts and done < settings.train.steps
          and not settings.train.checkpoints_at(done))


def _timed_roll_out(pipeline: pipelines.Pipeline, step: int):
  start = time.perf_counter()
  record = pipeline.roll_out(step)
  return record, time.perf_counter() - start


def run_evaluation(run: Run, step: int) -> dict[str, dict[str, float]]:
  results = run.pipeline.evaluate()
  run.log.evaluation(step, results)
  run.log.eval_episodes(step, run.pipeline.eval_episodes)
  return results


# ----------------------------------------------------------------------------- loop


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> dict[str, Any]:
  """Runs, resumes or (when finished) just reports a run; returns the before/after summary."""
  workdir = _prepare(config, workdir)
  train_config = TrainConfig.from_config(config.train)
  finished = _finished_history(train_config, workdir)
  if finished is not None:
    _say(f"{workdir} has finished all {train_config.steps} steps; its results:")
    return _report(runlog.RunLog(workdir, enabled=jax.process_index() == 0), finished)
  run = _build(config, workdir)
  start = resume(run)
  history, steps = run.history, train_config.steps
  if start == 0:
    history.before = run_evaluation(run, 0)
  # One worker: at most one roll-out runs in the background (the staleness bound of one step).
  background = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollout")
  try:
    _train_steps(run, start, background)
  except BaseException:
    run.checkpointer.close()   # commits the saves of the steps that finished
    run.log.flush()            # what a bucket log buffered since (shows where it failed)
    raise
  finally:
    background.shutdown(cancel_futures=True)   # no roll-out outlives the run
  if steps == 0:
    history.after = run_evaluation(run, 0)
    run.log.flush()
    run.checkpointer.save(0, run.state, run.host_state())
  run.checkpointer.close()
  return _report(run.log, history)


def _train_steps(run: Run, start: int, background: concurrent.futures.Executor) -> None:
  """Steps `start`..train.steps − 1 of `train`; `background` runs the async roll-outs."""
  settings, history, p = run.settings, run.history, run.pipeline
  train_config, steps = settings.train, settings.train.steps
  last_pass = stats.mean_pass_rate(history.before)
  compiled_shapes: set = set()
  bar = tqdm.trange(start, steps, initial=start, total=steps, desc="train",
                    disable=jax.process_index() != 0)
  prefetched = None   # (record, seconds) of this step, rolled out while the last step trained
  profiler = _Profiler(train_config.profile_steps, run.config.workdir, start)
  for step in bar:
    profiler.before(step)
    timer = _StageTimer()
    metrics: dict[str, float] = {"rollout/policy_lag": float(prefetched is not None)}
    if prefetched is None:
      with timer("rollout"):
        record = p.roll_out(step)
    else:
      record, timer.seconds["time/rollout"] = prefetched
    with timer("judge"):   # before the next roll-out starts: a judge may use the engine
      record = p.judge(record)
    future = (background.submit(_timed_roll_out, p, step + 1) if may_prefetch(settings, step)
              else None)
    with timer("advantages"):
      record = p.advantages(record)
    with timer("select"):
      record = p.select(record)
    with timer("teacher"):
      record = p.teach(record)
      # before the update: the policy the step distils under (teacher/valid_action_mass_ratio)
      metrics.update(p.teacher_metrics(record, run.trainable.compute_model(run.state)))
    with timer("batch"):
      batch = assemble(run, p.rows(record))
    with timer("step"):
      step_metrics = update(run, batch, compiled_shapes)
    prefetched = None
    if future is not None:
      with timer("rollout_wait"):   # the engine must be idle before it takes new weights
        prefetched = future.result()
    skipped = {reason: step_metrics.pop(f"skipped_{reason}") for reason in SKIP_REASONS}
    metrics.update(step_metrics)
    metrics.update({f"train/skipped_{reason}": v for reason, v in skipped.items()})
    history.nonfinite_streak = history.nonfinite_streak + 1 if any(skipped.values()) else 0
    with timer("sync"):
      metrics.update(sync_weights(run, step + 1))
    p.observe(record)
    done = step + 1
    failed = history.nonfinite_streak >= train_config.max_nonfinite_steps
    if not failed and train_config.evaluates_at(done):
      with timer("eval"):
        results = run_evaluation(run, done)
      last_pass = stats.mean_pass_rate(results)
      if done == steps:
        history.after = results   # recorded in the final checkpoint: the run is finished
    metrics.update(p.metrics(record))
    metrics.update(timer.seconds)
    run.log.scalars(done, metrics)
    p.log_rollouts(run.log, done, record)
    _say(step_line(done, steps, metrics))
    bar.set_postfix(loss=f"{metrics['loss']:.4g}", reward=f"{metrics['rollout/reward']:.3f}",
                    pass_rate=f"{last_pass:.3f}", refresh=False)
    profiler.after(done)
    if failed:
      profiler.after(steps)
      _stop_nonfinite(run, done)
    if train_config.checkpoints_at(done):
      run.log.flush()   # a bucket log's lines of this step precede its checkpoint
      run.checkpointer.save(done, run.state, run.host_state())


def _stop_nonfinite(run: Run, done: int) -> None:
  """Ends a run whose last `max_nonfinite_steps` steps were all skipped; nothing is saved."""
  limit = run.settings.train.max_nonfinite_steps
  run.checkpointer.close()   # finishes the saves of earlier (finite) steps
  run.log.close()
  last = run.checkpointer.latest_step()
  ratio = run.settings.step.max_update_ratio
  raise NonFiniteTrainingError(
      f"steps {done - limit + 1}..{done}: {limit} consecutive steps were skipped "
      f"(config.train.max_nonfinite_steps={limit}): the loss or gradient norm was not finite, "
      f"or the update was larger than config.step.max_update_ratio={ratio} times the "
      f"parameters' norm; no update was applied for them and the last good state is checkpoint "
      f"{last} in {run.checkpointer.directory}. Lower config.optim.learning_rate or check the "
      f"data; see 'loss', 'grad_norm', 'update_ratio' and 'train/skipped_*' in "
      f"{run.log.path(runlog.METRICS_FILE)}")


def _finished_history(train: TrainConfig, workdir: epath.Path) -> RunHistory | None:
  """The history of a finished run in `workdir` (its last checkpoint holds the final
  evaluation), else None. Opening the checkpoints also removes what a kill left behind."""
  if not (workdir / "checkpoints").exists():
    return None
  checkpointer = _checkpointer(train, workdir)
  try:
    step = checkpointer.latest_step()
    if step != train.steps:
      return None
    history = RunHistory()
    try:
      history.load_state_dict(checkpointer.restore_host(step)["history"])
    except checkpoint.CorruptCheckpointError:
      return None   # `resume` sets it aside, with a warning, and resumes from an intact one
    return history if history.after else None
  finally:
    checkpointer.close()


def _report(log: runlog.RunLog, history: RunHistory) -> dict[str, Any]:
  """Writes results.md / summary.json, prints the table; closes the log."""
  table = log.write_summary(history.before, history.after)
  log.close()
  if jax.process_index() == 0:
    print(table)
  return {"before": history.before, "after": history.after}


def resume(run: Run) -> int:
  """Restores the newest intact checkpoint, if any, and rewinds the logs to it (to nothing
  when no checkpoint committed: a fresh start); returns the step to continue from. A corrupt
  newer checkpoint is moved aside with a warning (`Checkpointer.restore_latest`); when every
  one is corrupt the run stops with CorruptCheckpointError rather than start from nothing."""
  step, state, set_aside = run.checkpointer.restore_latest(run.state, run.host_state())
  for problem in set_aside:
    _say(f"warning: {problem}; resuming from the previous intact checkpoint, step {step}")
  if step is None:
    run.log.rewind(None)
    return 0
  run.state = state
  sync_weights(run, step)
  run.log.rewind(step)
  _say(f"resumed from step {step} of {run.checkpointer.directory}")
  return step


def evaluate_checkpoint(config: ml_collections.ConfigDict, workdir: str | os.PathLike,
                        step: int | None = None) -> dict[str, dict[str, float]]:
  """Held-out results of a saved checkpoint (default: the latest)."""
  run = build(config, workdir)
  step = run.checkpointer.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {run.checkpointer.directory} to evaluate")
  run.state = run.checkpointer.restore(step, run.state, run.host_state())
  sync_weights(run, step)
  results = run.pipeline.evaluate()
  run.checkpointer.close()
  return results


class _Profiler:
  """`train.profile_steps = [first, last)`: a jax.profiler trace of those steps (TensorBoard's
  profile plugin or Perfetto read it) in <workdir>/profile. A run resumed inside the window
  traces from its first step."""

  def __init__(self, window: tuple[int, ...], workdir: str, start: int):
    self.window = window if window and window[1] > start else ()
    self.directory = os.fspath(epath.Path(workdir) / "profile")
    self.active = False

  def before(self, step: int) -> None:
    if self.window and not self.active and self.window[0] <= step < self.window[1]:
      jax.profiler.start_trace(self.directory)
      self.active = True

  def after(self, done: int) -> None:
    if self.active and done >= self.window[1]:
      jax.profiler.stop_trace()
      self.active = False


# (stage, its token count in the step's metrics, what the tokens are) of the per-step line.
_RATED_STAGES = (("rollout", "rollout/agent_tokens", "generated"),
                 ("step", "loss_tokens", "trained"))


def step_line(done: int, steps: int, metrics: dict[str, float]) -> str:
  """The line printed after each step: the roll-out's and the update's seconds with their
  tokens per second (where the pipeline counts them), the evaluation's, and the rest."""
  parts = [f"step {done}/{steps}"]
  for stage, tokens_key, what in _RATED_STAGES:
    seconds = metrics.get(f"time/{stage}")
    if seconds is None:
      continue
    tokens = metrics.get(tokens_key)
    rate = (f" ({tokens:,.0f} tokens {what}, {tokens / seconds:,.1f} tokens/s)"
            if tokens is not None and seconds > 0 else "")
    parts.append(f"{stage} {seconds:.1f} s{rate}")
  if "time/eval" in metrics:
    parts.append(f"eval {metrics['time/eval']:.1f} s")
  shown = {f"time/{stage}" for stage, _, _ in _RATED_STAGES} | {"time/eval"}
  # Stage seconds are time/<stage>; time/<group>/<name> are other wall-clock values (rates).
  rest = sum(v for k, v in metrics.items()
             if k.startswith("time/") and k.count("/") == 1 and k not in shown)
  parts.append(f"other stages {rest:.1f} s")
  return " | ".join(parts)


class _StageTimer:
  """Wall-clock seconds per stage, logged as time/<stage>."""

  def __init__(self):
    self.seconds: dict[str, float] = {}

  @contextlib.contextmanager
  def __call__(self, name: str):
    start = time.perf_counter()
    yield
    self.seconds[f"time/{name}"] = time.perf_counter() - start
