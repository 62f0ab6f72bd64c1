"""The outer training loop: a short sequence of named stages, one call each.

    roll out → judge → advantages → select → teacher contexts → batch assembly
    → fused step → weight sync → observe (guidance) → evaluate → log → checkpoint

The trainer owns no algorithm. The stages come from the config's pipeline
(`rised_jax.pipelines`: RISED and baselines on environments, CriPO on rubric tasks) and the
loss settings from `config.step`; the presets of `rised_jax.config` compose them. Everything
that changes from step to step (train state, task cursor, selector / teacher / guidance
memories, the "before" evaluation) is checkpointed, so a killed run resumes exactly.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import jax
import ml_collections
import tqdm

from rised_jax import checkpoint, config as config_lib, parallel, pipelines, runlog
from rised_jax import model as model_lib
from rised_jax.learn import batching, train_step

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RunHistory:
  """Results that a resumed run needs from before its restart (the "before" evaluation)."""

  before: dict[str, Any] = dataclasses.field(default_factory=dict)

  def state_dict(self) -> dict[str, Any]:
    return {"before": self.before}

  def load_state_dict(self, state) -> None:
    self.before = dict(state["before"])


@dataclasses.dataclass
class Run:
  """Everything one training run holds; built once by `build`."""

  config: ml_collections.ConfigDict
  tokenizer: model_lib.Tokenizer
  trainable: train_step.Trainable
  state: train_step.TrainState
  engine: Any
  pipeline: pipelines.Pipeline
  checkpointer: checkpoint.Checkpointer
  log: runlog.RunLog
  history: RunHistory

  def host_state(self) -> dict[str, checkpoint.HostState]:
    return {"history": self.history, **self.pipeline.host_state()}


def _engine(config: ml_collections.ConfigDict, model, tokenizer):
  if config.rollout.engine == "jax":
    from rised_jax.rollout.jax_engine import JaxEngine  # noqa: PLC0415 - optional stage
    return JaxEngine(model, max_batch=config.rollout.max_batch, pad_id=tokenizer.pad_token_id,
                     batch_buckets=tuple(config.rollout.batch_buckets) or None,
                     prompt_buckets=tuple(config.rollout.prompt_buckets),
                     max_new_tokens_buckets=tuple(config.rollout.new_token_buckets),
                     reuse_prefix=config.rollout.reuse_prefix)
  from rised_jax.rollout.sglang_engine import SGLangEngine  # noqa: PLC0415
  return SGLangEngine(config.rollout.sglang_url, tokenizer=tokenizer,
                      weight_dir=os.path.join(config.workdir, "weights"),
                      timeout_s=config.rollout.sglang.timeout_s,
                      max_retries=config.rollout.sglang.retries,
                      vocab_size=model.cfg.vocab_size)


def _check_workdir_config(workdir: Path, config: ml_collections.ConfigDict) -> None:
  """A workdir belongs to one config: resuming with a different one is an error."""
  path = workdir / "config.json"
  current = _flat(json.loads(config.to_json_best_effort(sort_keys=True)))
  if path.exists():
    saved = _flat(json.loads(path.read_text()))
    diff = sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))
    if diff:
      raise ValueError(f"{path} holds a different config (differs at {diff}); use a new "
                       f"--workdir, or the same config to resume")
  else:
    path.write_text(config.to_json_best_effort(indent=2, sort_keys=True))


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
  if isinstance(tree, dict):
    out = {}
    for k, v in tree.items():
      out.update(_flat(v, f"{prefix}{k}."))
    return out
  return {prefix[:-1]: tree}


def build(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> Run:
  """Validates the config, then loads the model and builds every stage."""
  config_lib.validate(config, num_devices=jax.device_count())
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  with config.unlocked():
    config.workdir = str(workdir)
  _check_workdir_config(workdir, config)

  model, tokenizer = model_lib.from_pretrained(config.model.source, dtype=config.model.dtype,
                                               remat=config.model.remat)
  mesh = parallel.make_mesh(parallel.MeshShape(**config.mesh.to_dict()))
  optimizer = train_step.make_optimizer(config_lib.optimizer_config(config))
  trainable, state = train_step.create(model, optimizer, config_lib.step_config(config), mesh,
                                       seed=config.seed)
  engine = _engine(config, trainable.model(state), tokenizer)
  return Run(config=config, tokenizer=tokenizer, trainable=trainable, state=state,
             engine=engine, pipeline=pipelines.make_pipeline(config, engine, tokenizer),
             checkpointer=checkpoint.Checkpointer(workdir / "checkpoints",
                                                  keep=config.train.keep_checkpoints),
             log=runlog.RunLog(workdir, enabled=jax.process_index() == 0),
             history=RunHistory())


# ----------------------------------------------------------------------------- stages


def assemble(run: Run, rows: list[batching.Row]):
  """Dense, bucketed arrays; a fixed row count so the step compiles once per bucket."""
  step_config = run.trainable.config
  return batching.assemble(
      rows, pad_id=run.tokenizer.pad_token_id,
      num_rows=run.config.select.batch_groups * run.config.rollout.group_size,
      with_distill=step_config.distills, with_counterfactual=step_config.counterfactual,
      **run.config.batching.to_dict())


def update(run: Run, batch) -> dict[str, float]:
  run.state, metrics = run.trainable.step(run.state, run.trainable.put_batch(batch))
  return {k: float(v) for k, v in metrics.items()}


def sync_weights(run: Run, version: int) -> None:
  """The sampler must see the new parameters (the step donated the old buffers)."""
  run.engine.update_weights(run.trainable.model(run.state), version)


def run_evaluation(run: Run, step: int) -> dict[str, dict[str, float]]:
  results = run.pipeline.evaluate()
  run.log.evaluation(step, results)
  run.log.eval_episodes(step, getattr(run.pipeline, "eval_episodes", ()))
  return results


# ----------------------------------------------------------------------------- loop


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> dict[str, Any]:
  """Runs (or resumes) training; returns the before/after evaluation summary."""
  run = build(config, workdir)
  start = resume(run)
  if start == 0:
    run.history.before = run_evaluation(run, 0)
  steps = config.train.steps
  p = run.pipeline
  for step in tqdm.trange(start, steps, initial=start, total=steps, desc="train",
                          disable=jax.process_index() != 0):
    timer = _StageTimer()
    metrics: dict[str, float] = {}
    with timer("rollout"):
      pool = p.roll_out(step)
    with timer("judge"):
      metrics.update(p.judge(pool))
    with timer("advantages"):
      p.advantages(pool)
    with timer("select"):
      selected = p.select(pool, step)
    with timer("teacher"):
      metrics.update(p.teach(selected, pool, step))
    with timer("batch"):
      batch = assemble(run, p.rows(selected))
    with timer("step"):
      metrics.update(update(run, batch))
    with timer("sync"):
      sync_weights(run, step + 1)
    p.observe(pool)
    done = step + 1
    if config.train.eval_every and done % config.train.eval_every == 0 and done < steps:
      with timer("eval"):
        run_evaluation(run, done)
    metrics.update(p.metrics(pool, selected))
    metrics.update(timer.seconds)
    run.log.scalars(done, metrics)
    run.log.rollouts(done, pool, getattr(p, "vocab", None))
    if done % config.train.checkpoint_every == 0 or done == steps:
      run.checkpointer.save(done, run.state, run.host_state())
  after = run_evaluation(run, steps)
  table = run.log.write_summary(run.history.before, after)
  run.checkpointer.close()
  run.log.close()
  if jax.process_index() == 0:
    print(table)
  return {"before": run.history.before, "after": after}


def resume(run: Run) -> int:
  """Restores the latest checkpoint, if any; returns the step to continue from."""
  step = run.checkpointer.latest_step()
  if step is None:
    return 0
  run.state = run.checkpointer.restore(step, run.state, run.host_state())
  sync_weights(run, step)
  run.log.rewind(step)
  log.info("resumed from step %d of %s", step, run.checkpointer.directory)
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


class _StageTimer:
  """Wall-clock seconds per stage, logged as time/<stage>."""

  def __init__(self):
    self.seconds: dict[str, float] = {}

  @contextlib.contextmanager
  def __call__(self, name: str):
    start = time.perf_counter()
    yield
    self.seconds[f"time/{name}"] = time.perf_counter() - start
