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

With a teacher, `teacher_metrics(record, model)` (the trainer calls it between the teach stage
and the update, on the live policy) logs teacher/valid_action_mass_ratio and the two masses it
divides, teacher/valid_action_mass and teacher/student_valid_action_mass: the probability of
a valid action's first token after the teacher's and the student's prompts, over the chosen
groups with a teacher whose environment lists its actions (exact definition in
`rised_jax.teach.action_mass`). Below 1, the teacher context pulls the student off the action
format.

A rollout group spoilt by a failed engine request or an environment error is dropped from the
pool (`AgentLoop`); the step's metrics count it with the engine's retries, the errored episodes
and the rollouts the judge left unjudged (`rollout/groups_dropped`, `rollout/server_retries`,
`rollout/failed_requests` (requests given up on after their retries), `rollout/env_errors`,
`judge/failed`). Every reply fault of a server is one retry or, on its last attempt, one failed
request: the two counters sum to the faults met.

Multi-host with a server engine: each process rolls out and judges its own share of the K
groups and `judge` gathers them (`rollout.hosts`), so every later stage sees the whole pool,
the same on every process, and the counters above are the sums over the processes.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

from rised_jax import envs, evaluate, rubrics, runlog, select, tasks, teach
from rised_jax.envs.settings import EnvsConfig
from rised_jax.learn import advantages as advantages_lib
from rised_jax.learn.batching import Row
from rised_jax.pipelines import stages
from rised_jax.pipelines.records import require
from rised_jax.rollout import hosts
from rised_jax.rollout.agent_loop import AgentLoop
from rised_jax.rollout.base import SamplingParams
from rised_jax.rollout.settings import RolloutConfig
from rised_jax.rubrics import rule_judge
from rised_jax.rubrics.engine_text import judge_options
from rised_jax.teach import action_mass, positive
from rised_jax.types import Group, GroupTags


def agent_loop(rollout: RolloutConfig, environments: EnvsConfig, engine, tokenizer,
               temperature: float) -> AgentLoop:
  """The agent loop of the rollout and environment configs, sampling at `temperature`."""
  return AgentLoop(engine, tokenizer,
                   max_turns=environments.max_turns or None,
                   max_new_tokens_per_turn=rollout.max_new_tokens_per_turn,
                   max_total_tokens=rollout.max_total_tokens,
                   sampling=SamplingParams(max_new_tokens=rollout.max_new_tokens_per_turn,
                                           temperature=temperature, top_p=rollout.top_p,
                                           top_k=rollout.top_k),
                   reply_prefix=rollout.reply_prefix,
                   stop_strings=list(rollout.stop_strings),
                   max_abs_reward=environments.max_abs_reward)


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
    return self.as_metrics()

  def as_metrics(self) -> dict[str, float]:
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
  """The agentic pipeline's own stages (tag judge, teacher and guidance, environments, the
  agent loop's turns), each through its typed config (`stages.check_agentic`)."""
  stages.check_agentic(stages.stage_configs(config))


@dataclasses.dataclass(frozen=True)
class AgenticStep:
  """What one step's stages produced (each stage returns a copy with its own fields set; a
  field is None until its stage has run, `pipelines.records`).

  pool              the rollout groups (rollout facts only)                         (roll_out)
  faults            the roll-out's fault counters (rollout/…)                      (roll_out)
  tags              the judge's `GroupTags` per group; judge_stats its counters (judge/…)
                                                                                       (judge)
  advantages        [K, G] float32 group advantages of the rewards                (advantages)
  chosen            indices into `pool` of the groups trained on, in selection order  (select)
  teacher_prefixes  per chosen group, the positive teacher's prefix text (None: no teacher,
                    for every group when the pipeline has none); teacher_sources its
                    counters ({} without a teacher)                                    (teach)
  error             a split roll-out's failure on this process (`hosts.attempt`), raised at
                    the judge's gather on every process; pool and faults are then empty
  """

  step: int
  pool: tuple[Group, ...]
  faults: Mapping[str, float]
  tags: tuple[GroupTags, ...] | None = None
  judge_stats: Mapping[str, float] | None = None
  advantages: np.ndarray | None = None
  chosen: tuple[int, ...] | None = None
  teacher_prefixes: tuple[str | None, ...] | None = None
  teacher_sources: Mapping[str, float] | None = None
  error: BaseException | None = None


class AgenticPipeline:

  def __init__(self, config, engine, tokenizer):
    # The boundary: the ConfigDict's typed pieces, one per stage (`stages.stage_configs`).
    self.configs = c = stages.stage_configs(config)
    envs.register_aliases(c.envs.aliases)   # validation resolved them without registering
    self.loop = agent_loop(c.rollout, c.envs, engine, tokenizer, c.rollout.temperature)
    self.eval_loop = agent_loop(c.rollout, c.envs, engine, tokenizer, c.eval.temperature)
    self.vocab = rubrics.Vocabulary.load(c.judge.vocabulary_name)
    self.judge_backend = rubrics.make_judge(c.judge.backend, self.vocab,
                                            **judge_options(c.judge, engine, tokenizer))
    self.selector = select.make_selector(c.select.name, seed=c.seed, **c.select.options)
    self.teacher = (teach.PositiveTeacher(self.vocab, **c.teacher.options)
                    if c.teacher.enabled else None)
    self.guidance = (teach.GuidanceMemory(self.vocab, **c.guidance.options)
                     if c.guidance.enabled else None)
    self.eval_samples = evaluate.check_sampling(c.eval.pass_at_k, c.eval.temperature)
    held_out = evaluate.eval_tasks(c.envs.names, c.envs.difficulty, c.eval.episodes_per_env,
                                   c.eval.seed_offset)
    self.tasks = tasks.TaskStream(c.envs.names, c.envs.difficulty, seed=c.seed,
                                  eval_seed_offset=c.eval.seed_offset,
                                  exclude=evaluate.instance_keys(held_out))
    for message in tasks.repeat_warnings(self.tasks, c.train.steps * c.select.pool_groups):
      warnings.warn(message, stacklevel=2)
    self.eval_episodes: list[dict[str, Any]] = []   # the last evaluation's episode records
    self.progress = Progress()
    self.split = hosts.splits(engine)   # each process rolls out its share (module docstring)

  def roll_out(self, step: int) -> AgenticStep:
    c = self.configs
    tasks = self.tasks.next(c.select.pool_groups)   # all K on every process
    hints = None
    if self.guidance is not None:
      hints = {env: self.guidance.hint(env) for env in c.envs.names}
    rollouts, error = hosts.attempt(self.split, lambda: hosts.run_share(
        self.loop, tasks, self.split, group_size=c.rollout.group_size, hints=hints,
        seed=c.seed * 1_000_003 + step))
    if error is not None:
      return AgenticStep(step=step, pool=(), faults={}, error=error)
    faults = {**rollouts.faults.metrics(),
              "rollout/env_errors": float(len(rollouts.env_errors))}
    record = AgenticStep(step=step, pool=rollouts.groups, faults=faults)
    # A split roll-out is checked whole, after the judge's gather.
    return record if self.split else hosts.require_groups(record, len(tasks))

  def judge(self, record: AgenticStep) -> AgenticStep:
    error = record.error
    if error is None:
      judged, error = hosts.attempt(self.split, lambda: self.judge_backend.judge(record.pool))
      if error is None:
        tags, stats = judged
        record = dataclasses.replace(record, tags=tuple(tags), judge_stats={
            f"judge/{k}": float(v) for k, v in stats.as_dict().items()})
    if not self.split:
      return record
    whole = hosts.gather(hosts.Share(fields={"pool": record.pool, "tags": record.tags or ()},
                                     counters={**record.faults, **(record.judge_stats or {})},
                                     error=error), f"step {record.step}")
    record = dataclasses.replace(
        record, pool=whole.fields["pool"], tags=whole.fields["tags"],
        faults={k: whole.counters[k] for k in record.faults},
        judge_stats={k: whole.counters[k] for k in record.judge_stats})
    return hosts.require_groups(record, self.configs.select.pool_groups)

  def advantages(self, record: AgenticStep) -> AgenticStep:
    estimator = advantages_lib.ADVANTAGES[self.configs.advantage]
    values = np.asarray(estimator(np.stack([g.rewards for g in record.pool])), np.float32)
    return dataclasses.replace(record, advantages=values)

  def select(self, record: AgenticStep) -> AgenticStep:
    require(record, "select", "tags")
    chosen = self.selector.select(record.pool, self.configs.select.batch_groups, record.step,
                                  record.tags)
    return dataclasses.replace(record, chosen=tuple(chosen))

  def teach(self, record: AgenticStep) -> AgenticStep:
    require(record, "teach", "tags", "chosen")
    if self.teacher is None:
      return dataclasses.replace(record, teacher_prefixes=(None,) * len(record.chosen),
                                 teacher_sources={})
    prefixes, sources = self.teacher.assign(record.chosen, record.pool, record.tags, record.step)
    return dataclasses.replace(record, teacher_prefixes=tuple(prefixes), teacher_sources={
        f"teacher/{k}": float(v) for k, v in sources.items()})

  def teacher_metrics(self, record: AgenticStep, model) -> dict[str, float]:
    """teacher/valid_action_mass_ratio and its two means under `model` (module docstring);
    {} when no chosen group has both a teacher and an enumerable action space."""
    require(record, "teacher_metrics", "chosen", "teacher_prefixes")
    student, teacher, valid = [], [], []
    for i, teacher_prefix in zip(record.chosen, record.teacher_prefixes):
      if teacher_prefix is None:
        continue
      ids = action_mass.task_first_action_token_ids(self.loop.tokenizer, record.pool[i].task,
                                                    self.loop.chat.reply_prefix)
      if ids is not None:
        plain, teacher_ids = self._prompts(record.pool[i], teacher_prefix)
        student.append(plain)
        teacher.append(teacher_ids)
        valid.append(ids)
    if not valid:
      return {}
    # One forward shape every step (it compiles once): rows for every trained group's two
    # prompts, the engine's prompt buckets as widths.
    logits = action_mass.next_token_logits(
        model, student + teacher, rows=2 * self.configs.select.batch_groups,
        widths=self.configs.rollout.prompt_buckets)
    mass = np.asarray([action_mass.valid_action_mass(row, valid[k % len(valid)])
                       for k, row in enumerate(logits)])
    student_mass, teacher_mass = mass[:len(valid)], mass[len(valid):]
    return {"teacher/valid_action_mass_ratio": action_mass.mass_ratio(teacher_mass, student_mass),
            "teacher/valid_action_mass": float(teacher_mass.mean()),
            "teacher/student_valid_action_mass": float(student_mass.mean())}

  def _prompts(self, group: Group, teacher_prefix: str | None) -> tuple[list[int], list[int] | None]:
    """The group's hint-free student prompt and its teacher prompt (None without a teacher)."""
    chat = self.loop.chat
    teacher_ids = (None if teacher_prefix is None
                   else positive.teacher_prompt_ids(chat, teacher_prefix, group.first_observation))
    return chat.prompt_ids(group.system_prompt, group.first_observation), teacher_ids

  def rows(self, record: AgenticStep) -> list[Row]:
    require(record, "rows", "advantages", "chosen", "teacher_prefixes")
    rows, with_hint = [], self.configs.guidance.train_with_hint
    for i, teacher_prefix in zip(record.chosen, record.teacher_prefixes, strict=True):
      group = record.pool[i]
      plain_prefix, teacher_ids = self._prompts(group, teacher_prefix)
      for traj, adv in zip(group.trajectories, record.advantages[i]):
        prefix = traj.token_ids[:traj.prompt_len] if with_hint else plain_prefix
        rows.append(Row(
            prefix_ids=prefix, response_ids=traj.token_ids[traj.prompt_len:],
            response_loss_mask=traj.loss_mask[traj.prompt_len:],
            response_behaviour_logprobs=traj.behaviour_logprobs[traj.prompt_len:],
            advantage=float(adv), teacher_prefix_ids=teacher_ids,
            sampled_on_prefix=with_hint or not traj.hint))
    return rows

  def observe(self, record: AgenticStep) -> None:
    require(record, "observe", "tags")
    if self.guidance is not None:
      self.guidance.update(record.pool, record.tags)
    self.progress.add(record.pool)

  def evaluate(self) -> dict[str, dict[str, float]]:
    """Pass rates; the episodes' records (tags from the rule judge only: an LLM judge would
    cost requests per evaluation) are kept in `eval_episodes`."""
    c = self.configs
    results, groups = evaluate.evaluate(
        self.eval_loop, c.envs.names, c.envs.difficulty, episodes=c.eval.episodes_per_env,
        seed_offset=c.eval.seed_offset, seed=c.seed, samples=self.eval_samples,
        split=self.split)
    tags = self.judge_backend.judge(groups)[0] if c.judge.backend == "rules" else None
    self.eval_episodes = evaluate.episode_records(groups, tags, self.vocab)
    return results

  def metrics(self, record: AgenticStep) -> dict[str, float]:
    require(record, "metrics", "tags", "judge_stats", "chosen", "teacher_sources")
    pool, metrics = record.pool, {}
    for env in sorted({g.task.env for g in pool}):
      members = [k for k, g in enumerate(pool) if g.task.env == env]
      metrics[f"rollout/{env}/success"] = float(np.mean([pool[k].successes.mean()
                                                         for k in members]))
      judged = [(record.tags[k].tags[r], pool[k].trajectories[r].success) for k in members
                for r in np.flatnonzero(record.tags[k].judged)]
      if judged:   # how much the profiles reveal the reward (rule_judge.success_predictability)
        accuracy, base_rate = rule_judge.success_predictability(
            np.stack([t for t, _ in judged]), np.asarray([s for _, s in judged]))
        metrics[f"judge/{env}/success_from_tags"] = accuracy
        metrics[f"judge/{env}/success_base_rate"] = base_rate
      if self.guidance is not None:
        metrics[f"guidance/{env}/active_tags"] = float(len(self.guidance.active_tags(env)))
    trajectories = [t for g in pool for t in g.trajectories]
    metrics["select/zero_variance_groups"] = float(sum(np.ptp(pool[i].rewards) == 0
                                                       for i in record.chosen))
    metrics["rollout/reward"] = float(np.mean([t.reward for t in trajectories]))
    metrics["rollout/agent_tokens"] = float(sum(t.num_agent_tokens for t in trajectories))
    metrics["rollout/truncated"] = float(np.mean([t.truncated for t in trajectories]))
    metrics["rollout/hinted"] = float(np.mean([bool(t.hint) for t in trajectories]))
    metrics["judge/failed"] = float(sum(t.unjudged.sum() for t in record.tags))
    metrics.update(record.faults)
    metrics.update(record.judge_stats)
    metrics.update(record.teacher_sources)
    metrics.update(self.progress.as_metrics())
    return metrics

  def log_rollouts(self, log: runlog.RunLog, step: int, record: AgenticStep) -> None:
    """Every rollout of the pool, its tags named by the judge's vocabulary."""
    require(record, "log_rollouts", "tags", "chosen", "teacher_prefixes")
    chosen = dict(zip(record.chosen, record.teacher_prefixes))
    notes = [runlog.GroupNotes(selected=k in chosen, teacher=chosen.get(k) is not None,
                               tags=tags.tags, unjudged=tuple(tags.unjudged))
             for k, tags in enumerate(record.tags)]
    log.rollouts(step, record.pool, notes, self.vocab)

  def host_state(self) -> Mapping[str, Any]:
    state = {"tasks": self.tasks, "selector": self.selector, "progress": self.progress}
    if self.teacher is not None:
      state["teacher"] = self.teacher
    if self.guidance is not None:
      state["guidance"] = self.guidance
    return state


PIPELINE = AgenticPipeline
