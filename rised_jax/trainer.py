"""The outer training loop: a short sequence of named stages, one call each.

    sample tasks → roll out → judge → rewards and advantages → select → teacher rows
    → fused step → weight sync → guidance update → evaluate → log → checkpoint

The trainer owns no algorithm: which selector, whether a teacher or guidance exists, and the
loss settings all come from the config (`rised_jax.config.apply_preset`). Everything a stage
needs is built once by `build()` into a `Components` record; everything that changes from step
to step (train state, task cursor, selector / teacher / guidance memories) is checkpointed, so
a killed run resumes exactly.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Sequence

import jax
import ml_collections
import numpy as np
import tqdm

from rised_jax import checkpoint, config as config_lib, evaluate, parallel, runlog
from rised_jax import envs, model as model_lib, rubrics, select, teach
from rised_jax.learn import advantages as advantages_lib
from rised_jax.learn import batching, train_step
from rised_jax.rollout.agent_loop import AgentLoop, make_env
from rised_jax.rollout.base import SamplingParams
from rised_jax.tasks import TaskStream
from rised_jax.types import Group

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
class Components:
  """What the stages use; built once per run."""

  config: ml_collections.ConfigDict
  tokenizer: model_lib.Tokenizer
  trainable: train_step.Trainable
  engine: Any
  loop: AgentLoop
  eval_loop: AgentLoop
  vocab: rubrics.Vocabulary
  judge: rubrics.Judge
  selector: select.Selector
  teacher: teach.PositiveTeacher | None
  guidance: teach.GuidanceMemory | None
  tasks: TaskStream
  checkpointer: checkpoint.Checkpointer
  log: runlog.RunLog
  state: train_step.TrainState
  history: "RunHistory"

  def host_state(self) -> dict[str, checkpoint.HostState]:
    state = {"tasks": self.tasks, "selector": self.selector, "history": self.history}
    if self.teacher is not None:
      state["teacher"] = self.teacher
    if self.guidance is not None:
      state["guidance"] = self.guidance
    return state


# ----------------------------------------------------------------------------- build


def _engine(config: ml_collections.ConfigDict, model, tokenizer):
  if config.rollout.engine == "jax":
    from rised_jax.rollout.jax_engine import JaxEngine  # noqa: PLC0415 - heavy, optional
    return JaxEngine(model, max_batch=config.rollout.max_batch,
                     pad_id=tokenizer.pad_token_id)
  from rised_jax.rollout.sglang_engine import SGLangEngine  # noqa: PLC0415
  return SGLangEngine(config.rollout.sglang_url, tokenizer=tokenizer,
                      weight_dir=os.path.join(config.workdir, "weights"))


def _sampling(config: ml_collections.ConfigDict, temperature: float) -> SamplingParams:
  return SamplingParams(max_new_tokens=config.rollout.max_new_tokens_per_turn,
                        temperature=temperature, top_p=config.rollout.top_p,
                        top_k=config.rollout.top_k)


def _agent_loop(config, engine, tokenizer, temperature: float) -> AgentLoop:
  return AgentLoop(engine, tokenizer,
                   max_turns=config.envs.max_turns or None,
                   max_new_tokens_per_turn=config.rollout.max_new_tokens_per_turn,
                   max_total_tokens=config.rollout.max_total_tokens,
                   sampling=_sampling(config, temperature))


def _check_workdir_config(workdir: Path, config: ml_collections.ConfigDict) -> None:
  """A workdir belongs to one config: resuming with a different one is an error."""
  path = workdir / "config.json"
  current = json.loads(config.to_json_best_effort(sort_keys=True))
  if path.exists():
    saved = json.loads(path.read_text())
    if saved != current:
      diff = sorted(k for k in set(_flat(saved)) | set(_flat(current))
                    if _flat(saved).get(k) != _flat(current).get(k))
      raise ValueError(f"{path} holds a different config (differs at {diff}); use a new "
                       f"--workdir or the same config to resume")
  else:
    path.write_text(json.dumps(current, indent=2, sort_keys=True))


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
  if isinstance(tree, dict):
    out = {}
    for k, v in tree.items():
      out.update(_flat(v, f"{prefix}{k}."))
    return out
  return {prefix[:-1]: tree}


def build(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> Components:
  """Validates the config, then loads the model and builds every stage."""
  config_lib.validate(config)
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
  vocab = rubrics.Vocabulary.load(config.judge.vocabulary or "agentic_v1")
  teacher = guidance = None
  if config.teacher.enabled:
    teacher = teach.PositiveTeacher(vocab, **config.teacher.options.to_dict())
  if config.guidance.enabled:
    guidance = teach.GuidanceMemory(vocab, **config.guidance.options.to_dict())
  return Components(
      config=config, tokenizer=tokenizer, trainable=trainable, engine=engine,
      loop=_agent_loop(config, engine, tokenizer, config.rollout.temperature),
      eval_loop=_agent_loop(config, engine, tokenizer, config.eval.temperature),
      vocab=vocab,
      judge=rubrics.make_judge(config.judge.backend, vocab, **config.judge.options.to_dict()),
      selector=select.make_selector(config.select.name, seed=config.seed,
                                    **config.select.options.to_dict()),
      teacher=teacher, guidance=guidance,
      tasks=TaskStream(config.envs.names, config.envs.difficulty.to_dict(), seed=config.seed,
                       eval_seed_offset=config.eval.seed_offset),
      checkpointer=checkpoint.Checkpointer(workdir / "checkpoints",
                                           keep=config.train.keep_checkpoints),
      log=runlog.RunLog(workdir, enabled=jax.process_index() == 0),
      state=state, history=RunHistory())


# ----------------------------------------------------------------------------- stages


def roll_out(c: Components, step: int) -> list[Group]:
  """Sample the step's candidate tasks and roll out G episodes of each, with guidance hints."""
  tasks = c.tasks.next(c.config.select.pool_groups)
  hints = None
  if c.guidance is not None:
    hints = {env: c.guidance.hint(env) for env in c.config.envs.names}
  return c.loop.run(tasks, c.config.rollout.group_size, hints=hints,
                    seed=c.config.seed * 1_000_003 + step)


def compute_advantages(c: Components, pool: Sequence[Group]) -> None:
  """Group advantages from the scalar rewards (success, optionally shaped)."""
  rewards = np.stack([g.rewards for g in pool])
  estimator = advantages_lib.ADVANTAGES[c.config.advantage]
  values = np.asarray(estimator(rewards))
  for group, adv in zip(pool, values):
    group.advantages = adv


def choose(c: Components, pool: list[Group], step: int) -> list[Group]:
  chosen = c.selector.select(pool, c.config.select.batch_groups, step)
  for i in chosen:
    pool[i].selected = True
  return [pool[i] for i in chosen]


def assign_teachers(c: Components, selected: Sequence[Group], pool: Sequence[Group],
                    step: int) -> dict[str, int]:
  if c.teacher is None:
    return {}
  return c.teacher.assign(selected, pool, lambda task: make_env(task).system_prompt, step)


def assemble_batch(c: Components, selected: Sequence[Group]) -> dict[str, np.ndarray]:
  """Student rows (hint-free prompt unless train_with_hint) and teacher rows, aligned."""
  rows = []
  chat = c.loop.chat
  for group in selected:
    env = make_env(group.task)
    first_observation = env.reset(group.task.seed)
    teacher_ids = (None if group.teacher_prefix is None
                   else chat.prompt_ids(group.teacher_prefix, first_observation))
    plain_prefix = chat.prompt_ids(env.system_prompt, first_observation)
    for traj, adv in zip(group.trajectories, group.advantages):
      prefix = (traj.token_ids[:traj.prompt_len] if c.config.guidance.train_with_hint
                else plain_prefix)
      rows.append(batching.Row(
          prefix_ids=prefix, response_ids=traj.token_ids[traj.prompt_len:],
          response_loss_mask=traj.loss_mask[traj.prompt_len:],
          response_behaviour_logprobs=traj.behaviour_logprobs[traj.prompt_len:],
          advantage=float(adv), teacher_prefix_ids=teacher_ids))
  step_config = c.trainable.config
  num_rows = c.config.select.batch_groups * c.config.rollout.group_size
  return batching.assemble(rows, pad_id=c.tokenizer.pad_token_id, num_rows=num_rows,
                           with_distill=step_config.distills,
                           **c.config.batching.to_dict())


def update(c: Components, batch: dict[str, np.ndarray]) -> dict[str, float]:
  c.state, metrics = c.trainable.step(c.state, c.trainable.put_batch(batch))
  return {k: float(v) for k, v in metrics.items()}


def sync_weights(c: Components, step: int) -> None:
  """The sampler must see the new parameters (the step donated the old buffers)."""
  c.engine.update_weights(c.trainable.model(c.state), step + 1)


def run_evaluation(c: Components, step: int) -> dict[str, dict[str, float]]:
  results = evaluate.evaluate(c.eval_loop, c.config.envs.names,
                              c.config.envs.difficulty.to_dict(),
                              episodes=c.config.eval.episodes_per_env,
                              seed_offset=c.config.eval.seed_offset, seed=c.config.seed)
  c.log.evaluation(step, results)
  return results


def rollout_metrics(pool: Sequence[Group], selected: Sequence[Group]) -> dict[str, float]:
  metrics = {}
  for env in sorted({g.task.env for g in pool}):
    groups = [g for g in pool if g.task.env == env]
    metrics[f"rollout/{env}/success"] = float(np.mean([g.successes.mean() for g in groups]))
  flat = [g for g in selected if np.ptp(g.rewards) == 0]
  metrics["select/zero_variance_groups"] = float(len(flat))
  metrics["rollout/agent_tokens"] = float(sum(t.num_agent_tokens for g in pool
                                              for t in g.trajectories))
  metrics["rollout/truncated"] = float(np.mean([t.truncated for g in pool
                                                for t in g.trajectories]))
  return metrics


# ----------------------------------------------------------------------------- loop


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> dict[str, Any]:
  """Runs (or resumes) training; returns the before/after evaluation summary."""
  c = build(config, workdir)
  start = resume(c)
  if start == 0:
    c.history.before = run_evaluation(c, 0)
  steps = config.train.steps
  for step in tqdm.trange(start, steps, initial=start, total=steps, desc="train",
                          disable=jax.process_index() != 0):
    timer = _StageTimer()
    with timer("rollout"):
      pool = roll_out(c, step)
    with timer("judge"):
      judge_stats = c.judge.judge(pool)
    with timer("advantages"):
      compute_advantages(c, pool)
    with timer("select"):
      selected = choose(c, pool, step)
    with timer("teacher"):
      teacher_sources = assign_teachers(c, selected, pool, step)
    with timer("batch"):
      batch = assemble_batch(c, selected)
    with timer("step"):
      metrics = update(c, batch)
    with timer("sync"):
      sync_weights(c, step)
    if c.guidance is not None:
      c.guidance.update(pool)
    done = step + 1
    if config.train.eval_every and done % config.train.eval_every == 0 and done < steps:
      with timer("eval"):
        run_evaluation(c, done)
    metrics.update(rollout_metrics(pool, selected))
    metrics.update({f"judge/{k}": float(v) for k, v in judge_stats.as_dict().items()})
    metrics.update({f"teacher/{k}": float(v) for k, v in teacher_sources.items()})
    metrics.update(timer.seconds)
    c.log.scalars(done, metrics)
    c.log.rollouts(done, pool, c.vocab)
    if done % config.train.checkpoint_every == 0 or done == steps:
      c.checkpointer.save(done, c.state, c.host_state())
  after = run_evaluation(c, steps)
  table = c.log.write_summary(c.history.before, after)
  c.checkpointer.close()
  c.log.close()
  if jax.process_index() == 0:
    print(table)
  return {"before": c.history.before, "after": after}


def resume(c: Components) -> int:
  """Restores the latest checkpoint, if any; returns the step to continue from."""
  step = c.checkpointer.latest_step()
  if step is None:
    return 0
  c.state = c.checkpointer.restore(step, c.state, c.host_state())
  sync_weights(c, step - 1)
  c.log.rewind(step)
  log.info("resumed from step %d of %s", step, c.checkpointer.directory)
  return step


def evaluate_checkpoint(config: ml_collections.ConfigDict, workdir: str | os.PathLike,
                        step: int | None = None) -> dict[str, dict[str, float]]:
  """Pass rates of a saved checkpoint (default: the latest) on the held-out seeds."""
  c = build(config, workdir)
  step = c.checkpointer.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {c.checkpointer.directory} to evaluate")
  c.state = c.checkpointer.restore(step, c.state, c.host_state())
  sync_weights(c, step - 1)
  results = evaluate.evaluate(c.eval_loop, config.envs.names, config.envs.difficulty.to_dict(),
                              episodes=config.eval.episodes_per_env,
                              seed_offset=config.eval.seed_offset, seed=config.seed)
  c.checkpointer.close()
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
