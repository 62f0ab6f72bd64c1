"""RISED and its baselines on multi-turn environments (docs/ALGORITHMS.md §2).

Stages, each a component chosen by the config:
  roll out   `TaskStream` tasks, G episodes each through the `AgentLoop`, with the guidance
             memory's "Avoid: …" hint in the rollout prompt when one is active (§2.6);
  judge      rubric tags per rollout (`rubrics.make_judge`; rule-based by default);
  advantages group advantages of the success reward (`learn.advantages`);
  select     `select.make_selector` (RISED profile selection or a baseline, §2.4, §2.7);
  teach      the positive-rubric teacher prefix of each selected group (§2.5);
  rows       student rows on the hint-free prompt (default; `train_with_hint` keeps the hint),
             behaviour log-probs from the sampler for the truncated importance weight (§2.6),
             teacher rows = teacher prefix ⊕ the same response;
  observe    the guidance memory folds in the pool's negative tags.

Besides rollout success per env, `metrics` logs judge/{env}/success_from_tags: the accuracy
of the best rule that predicts a rollout's success from its tag vector (exact definition in
`rubrics.rule_judge.success_predictability`), beside judge/{env}/success_base_rate, what
predicting the majority outcome reaches: profiles carry information of their own only where
the first stays well below 1.

A rollout group spoilt by a failed engine request or an environment error is dropped from the
pool (`AgentLoop`); the step's metrics count it with the engine's retries, the errored episodes
and the rollouts the judge left unjudged (`rollout/groups_dropped`, `rollout/server_retries`,
`rollout/env_errors`, `judge/failed`).
"""
from __future__ import annotations

import logging
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

from rised_jax import envs, evaluate, rubrics, runlog, select, tasks, teach
from rised_jax.config import step_config
from rised_jax.learn import advantages as advantages_lib
from rised_jax.learn.batching import Row
from rised_jax.rollout import engines
from rised_jax.rollout.agent_loop import AgentLoop, make_env
from rised_jax.rollout.base import SamplingParams
from rised_jax.rollout.text import judge_options
from rised_jax.rubrics import rule_judge
from rised_jax.rubrics.profiles import is_tagged
from rised_jax.types import Group

log = logging.getLogger(__name__)


def agent_loop(config, engine, tokenizer, temperature: float) -> AgentLoop:
  return AgentLoop(engine, tokenizer,
                   max_turns=config.envs.max_turns or None,
                   max_new_tokens_per_turn=config.rollout.max_new_tokens_per_turn,
                   max_total_tokens=config.rollout.max_total_tokens,
                   sampling=SamplingParams(max_new_tokens=config.rollout.max_new_tokens_per_turn,
                                           temperature=temperature, top_p=config.rollout.top_p,
                                           top_k=config.rollout.top_k),
                   reply_prefix=config.rollout.reply_prefix,
                   stop_strings=list(config.rollout.stop_strings))


class Progress:
  """Cumulative rollouts and agent tokens since step 0: the x-axis of budget-matched plots
  (logged as progress/rollouts, progress/agent_tokens; checkpointed, so a resumed run counts on)."""

  def __init__(self):
    self.rollouts = 0
    self.agent_tokens = 0

  def add(self, pool: Sequence[Group]) -> dict[str, float]:
    trajectories = [t for g in pool for t in g.trajectories]
    self.rollouts += len(trajectories)
    self.agent_tokens += sum(int(t.num_agent_tokens) for t in trajectories)
    return {"progress/rollouts": float(self.rollouts),
            "progress/agent_tokens": float(self.agent_tokens)}

  def state_dict(self) -> dict[str, Any]:
    return {"rollouts": self.rollouts, "agent_tokens": self.agent_tokens}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    if set(state) != {"rollouts", "agent_tokens"}:
      raise ValueError(f"progress: state has keys {sorted(state)}; expected ['agent_tokens', "
                       "'rollouts']")
    self.rollouts, self.agent_tokens = int(state["rollouts"]), int(state["agent_tokens"])


def check_config(config) -> None:
  """The agentic pipeline's stages: selector, tag judge, teacher and guidance, environments,
  engine (each stage's own `check_config`)."""
  select.check_config(config)
  rubrics.check_config(config)
  teach.check_config(config, step_config(config).distills)
  envs.check_config(config)
  engines.check_config(config)


class AgenticPipeline:

  def __init__(self, config, engine, tokenizer):
    self.config = config
    self.loop = agent_loop(config, engine, tokenizer, config.rollout.temperature)
    self.eval_loop = agent_loop(config, engine, tokenizer, config.eval.temperature)
    self.vocab = rubrics.Vocabulary.load(config.judge.vocabulary or "agentic_v1")
    self.judge_backend = rubrics.make_judge(config.judge.backend, self.vocab,
                                            **judge_options(config.judge, engine, tokenizer))
    self.selector = select.make_selector(config.select.name, seed=config.seed,
                                         **config.select.options.to_dict())
    self.teacher = (teach.PositiveTeacher(self.vocab, **config.teacher.options.to_dict())
                    if config.teacher.enabled else None)
    self.guidance = (teach.GuidanceMemory(self.vocab, **config.guidance.options.to_dict())
                     if config.guidance.enabled else None)
    difficulty = config.envs.difficulty.to_dict()
    self.eval_samples = evaluate.check_sampling(config.eval.pass_at_k, config.eval.temperature)
    held_out = evaluate.eval_tasks(config.envs.names, difficulty, config.eval.episodes_per_env,
                                   config.eval.seed_offset)
    self.tasks = tasks.TaskStream(config.envs.names, difficulty, seed=config.seed,
                                  eval_seed_offset=config.eval.seed_offset,
                                  exclude=evaluate.instance_keys(held_out))
    for message in tasks.repeat_warnings(self.tasks,
                                         config.train.steps * config.select.pool_groups):
      warnings.warn(message, stacklevel=2)
    self.eval_episodes: list[dict[str, Any]] = []   # the last evaluation's episode records
    self.faults: dict[str, float] = {}   # the last roll-out's fault counters
    self.progress = Progress()

  def roll_out(self, step: int) -> list[Group]:
    tasks = self.tasks.next(self.config.select.pool_groups)
    hints = None
    if self.guidance is not None:
      hints = {env: self.guidance.hint(env) for env in self.config.envs.names}
    retries = self.loop.engine.server_retries
    pool = self.loop.run(tasks, self.config.rollout.group_size, hints=hints,
                         seed=self.config.seed * 1_000_003 + step)
    self.faults = {"rollout/server_retries": float(self.loop.engine.server_retries - retries),
                   "rollout/groups_dropped": float(self.loop.groups_dropped),
                   "rollout/env_errors": float(len(self.loop.env_errors))}
    if not pool:
      raise RuntimeError(f"step {step}: every one of the {len(tasks)} rollout groups was "
                         "dropped because engine requests failed after their retries (see the "
                         "log for the server's errors)")
    return pool

  def judge(self, pool: list[Group]) -> dict[str, float]:
    stats = self.judge_backend.judge(pool)
    return {f"judge/{k}": float(v) for k, v in stats.as_dict().items()}

  def advantages(self, pool: list[Group]) -> None:
    estimator = advantages_lib.ADVANTAGES[self.config.advantage]
    values = np.asarray(estimator(np.stack([g.rewards for g in pool])))
    for group, adv in zip(pool, values):
      group.advantages = adv

  def select(self, pool: list[Group], step: int) -> list[Group]:
    chosen = self.selector.select(pool, self.config.select.batch_groups, step)
    for i in chosen:
      pool[i].selected = True
    return [pool[i] for i in chosen]

  def teach(self, selected: Sequence[Group], pool: Sequence[Group],
            step: int) -> dict[str, float]:
    if self.teacher is None:
      return {}
    sources = self.teacher.assign(selected, pool, lambda task: make_env(task).system_prompt,
                                  step)
    return {f"teacher/{k}": float(v) for k, v in sources.items()}

  def rows(self, selected: Sequence[Group]) -> list[Row]:
    rows = []
    chat = self.loop.chat
    for group in selected:
      env = self.loop.envs.acquire(group.task)   # the rollouts' instances (a remote session)
      first_observation = env.reset(group.task.seed)
      self.loop.envs.release(group.task, env)
      teacher_ids = (None if group.teacher_prefix is None
                     else chat.prompt_ids(group.teacher_prefix, first_observation))
      plain_prefix = chat.prompt_ids(env.system_prompt, first_observation)
      for traj, adv in zip(group.trajectories, group.advantages):
        prefix = (traj.token_ids[:traj.prompt_len] if self.config.guidance.train_with_hint
                  else plain_prefix)
        rows.append(Row(
            prefix_ids=prefix, response_ids=traj.token_ids[traj.prompt_len:],
            response_loss_mask=traj.loss_mask[traj.prompt_len:],
            response_behaviour_logprobs=traj.behaviour_logprobs[traj.prompt_len:],
            advantage=float(adv), teacher_prefix_ids=teacher_ids))
    return rows

  def observe(self, pool: Sequence[Group]) -> None:
    if self.guidance is not None:
      self.guidance.update(pool)

  def evaluate(self) -> dict[str, dict[str, float]]:
    """Pass rates; the episodes' records (tags from the rule judge only: an LLM judge would
    cost requests per evaluation) are kept in `eval_episodes`."""
    judge = self.judge_backend if self.config.judge.backend == "rules" else None
    results, groups = evaluate.evaluate(
        self.eval_loop, self.config.envs.names, self.config.envs.difficulty.to_dict(),
        episodes=self.config.eval.episodes_per_env, seed_offset=self.config.eval.seed_offset,
        seed=self.config.seed, samples=self.eval_samples, judge=judge)
    self.eval_episodes = evaluate.episode_records(groups, self.vocab)
    if self.eval_loop.groups_dropped:   # the results' episode counts show which envs lost them
      log.warning("evaluation: %d instances dropped (failed engine requests or environment "
                  "errors; see eval/{env}/env_errors)",
                  self.eval_loop.groups_dropped)
    return results

  def metrics(self, pool: Sequence[Group], selected: Sequence[Group]) -> dict[str, float]:
    metrics = {}
    for env in sorted({g.task.env for g in pool}):
      groups = [g for g in pool if g.task.env == env]
      metrics[f"rollout/{env}/success"] = float(np.mean([g.successes.mean() for g in groups]))
      tagged = [t for g in groups for t in g.trajectories if is_tagged(t)]
      if tagged:   # how much the profiles reveal the reward (rule_judge.success_predictability)
        accuracy, base_rate = rule_judge.success_predictability(
            np.stack([t.tags for t in tagged]), np.asarray([t.success for t in tagged]))
        metrics[f"judge/{env}/success_from_tags"] = accuracy
        metrics[f"judge/{env}/success_base_rate"] = base_rate
      if self.guidance is not None:
        metrics[f"guidance/{env}/active_tags"] = float(len(self.guidance.active_tags(env)))
    trajectories = [t for g in pool for t in g.trajectories]
    metrics["select/zero_variance_groups"] = float(sum(np.ptp(g.rewards) == 0 for g in selected))
    metrics["rollout/agent_tokens"] = float(sum(t.num_agent_tokens for t in trajectories))
    metrics["rollout/truncated"] = float(np.mean([t.truncated for t in trajectories]))
    metrics["rollout/hinted"] = float(np.mean([bool(t.hint) for t in trajectories]))
    metrics["judge/failed"] = float(sum(t.untagged for t in trajectories))
    metrics.update(self.faults)
    metrics.update(self.progress.add(pool))
    return metrics

  def log_rollouts(self, log: runlog.RunLog, step: int, pool: Sequence[Group]) -> None:
    """Every rollout of the pool, its tags named by the judge's vocabulary."""
    log.rollouts(step, pool, self.vocab)

  def host_state(self) -> Mapping[str, Any]:
    state = {"tasks": self.tasks, "selector": self.selector, "progress": self.progress}
    if self.teacher is not None:
      state["teacher"] = self.teacher
    if self.guidance is not None:
      state["guidance"] = self.guidance
    return state


PIPELINE = AgenticPipeline
