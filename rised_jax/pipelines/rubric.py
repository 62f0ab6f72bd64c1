"""CriPO and rubric-reward GRPO on open-ended rubric tasks (docs/ALGORITHMS.md §3).

Each stage takes the step's `RubricStep` and returns a copy with its own fields set
(`dataclasses.replace`); nothing mutates a group, a trajectory or a record:

  roll_out   the next `select.batch_groups` training tasks of a `tasks.ShuffledStream`, each prompt
             (system prompt + question) rendered with the tokenizer's chat template, G single-turn
             answers each from the engine; a `types.Group` per task, whose `task` is the
             `rubric_tasks.RubricTask`; a `Trajectory` holds prompt ⊕ answer ids, the loss mask
             on the answer, the sampler's log-probs and the decoded answer text (`turns[0]`); a
             group with a failed engine request is dropped whole -> `pool`, `faults`;
  judge      a verdict r_ij per criterion (`rubrics.criteria`: the deterministic checker offline, an
             LLM at scale); reward R_i = Σ ω_j r_ij / Z and success (every positive criterion met,
             no pitfall) go into new trajectories; an answer without a usable verdict for some
             criterion is `unjudged`: reward 0, left out of its group's statistics and trained on
             with no loss -> `pool`, `verdicts`, `unjudged`, `judge_stats`;
  advantages GRPO over the group's judged answers, UC, SC, y* and the counterfactual targets
             (`learn.cripo.analyse_groups`) -> `advantages`, `analysis`;
  select     every group (plain GRPO on the batch, as the paper) -> `chosen`;
  teach      UC branch: the criterion-injection teacher prefix over y* (only y*'s row distils; the
             step localises the tokens); SC branch: a counterfactual teacher prefix for every
             answer with A_i < 0 that meets an SC criterion (the step flips its tokens); an
             empty answer gets no teacher (counted) -> `teacher_ids`, `cf_teacher_ids`,
             `teacher_stats`;
  rows       student prefix = the question prompt, teacher prefixes = the rendered teacher chats,
             each ⊕ the same answer ids; every prefix ends with the chat template's assistant
             start, checked, so the answer follows each prefix unchanged;
  metrics    everything the step logs of its stages: the fault counters (groups dropped because
             an engine request failed after its retries, never trained on in part; the engine's
             retries), the judge's `judge/…` and the teacher's `cripo/…` counters, CriPO's
             diagnostics (samples with ≥ 1 UC, with ≥ 1 SC, SC per sample; the step adds
             `kept_frac` and `flip_frac`), reward and pass rate of the judged answers, the
             unjudged fraction and count (`rollout/unjudged`, `judge/failed`);
  log_rollouts  every answer, with its group's notes (chosen, injection teacher, unjudged);
  evaluate   one greedy answer per held-out task, judged, per domain group (`criteria_eval`).

Besides the stages: the question prompts and answers (`criteria_prompts`), the task split
(`rubric_tasks.split`) and the typed config with its checks (`rubric_settings`).

`roll_out` touches only the task stream and the engine, and the later stages neither (the
in-process criteria judge excepted: it asks the engine, so `judge` runs before the next
`roll_out` starts); so the trainer may roll out step t + 1 while step t trains.

Which branches run is the config's (`rubric.uc_branch`, `rubric.sc_branch`, with the matching
step settings; the presets `cripo`, `cripo_u`, `cripo_s` and `grpo_rubric` of `rised_jax.config`).
The training cursor over the tasks that are not held out is host state, saved with every
checkpoint.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from rised_jax import rubric_tasks, runlog
from rised_jax import tasks as tasks_lib
from rised_jax.learn import cripo
from rised_jax.learn.batching import Row
from rised_jax.pipelines import criteria_eval
from rised_jax.pipelines.criteria_prompts import (QuestionChat, answer_seed, check_answer_fits,
                                                  check_prompts_fit)
from rised_jax.pipelines.records import require
from rised_jax.pipelines.rubric_settings import check_config  # noqa: F401 - the pipeline's check
from rised_jax.pipelines.rubric_settings import rubric_configs
from rised_jax.rollout import hosts
from rised_jax.rollout.agent_loop import RolloutFaults
from rised_jax.rollout.base import Generation, GenerationRequest, SamplingParams
from rised_jax.rubric_tasks.split import eval_group_of, load_task_set, split_tasks
from rised_jax.rubrics import criteria as criteria_lib
from rised_jax.rubrics.engine_text import judge_options
from rised_jax.teach import cripo_prefix
from rised_jax.types import Group, Trajectory


@dataclasses.dataclass(frozen=True)
class GroupAnalysis:
  """CriPO's decisions for one group with at least one judged answer (`cripo.analyse_groups`
  over the judged answers; indices are into all G rollouts of the group)."""

  uc: np.ndarray            # bool [C]: unexplored criteria
  sc: np.ndarray            # bool [C]: suppressed criteria
  best: int                 # y*
  cf_criteria: np.ndarray   # bool [G, C]: the SC criteria each counterfactual answer meets


PrefixIds = tuple[int, ...] | None   # a teacher prefix of one rollout, or None: no teacher


@dataclasses.dataclass(frozen=True)
class RubricStep:
  """One training step of the rubric pipeline; each stage returns a copy with its fields set.

  Per-group fields are tuples in pool order (K groups, G_k answers, C_k criteria each); a field
  is None until the stage named beside it has set it (`pipelines.records`).

  step, pool       the step and its groups; `group.task` is the `rubric_tasks.RubricTask`
                   (roll_out; judge replaces each trajectory by one with its reward and success)
  faults           {"rollout/server_retries", "rollout/failed_requests",
                    "rollout/groups_dropped"}                                      (roll_out)
  verdicts         float32 [G_k, C_k] r_ij, zero rows where unjudged                (judge)
  unjudged         bool [G_k]: no usable verdict for some criterion                  (judge)
  judge_stats      {"judge/…": count} of the criteria judge                          (judge)
  advantages       float32 [G_k], 0 for an unjudged answer                           (advantages)
  analysis         GroupAnalysis, or None for a group without a judged answer        (advantages)
  chosen           indices into pool of the groups trained on                        (select)
  teacher_ids      per group, [G_k] injection teacher prefixes (only y*'s can be set)  (teach)
  cf_teacher_ids   per group, [G_k] counterfactual teacher prefixes                    (teach)
  teacher_stats    {"cripo/…": count} of the teacher stage                             (teach)
  error            a split roll-out's failure on this process, raised at the judge's gather
                   on every process (`rollout.hosts`)                              (roll_out)
  """

  step: int
  pool: tuple[Group, ...]
  faults: Mapping[str, float]
  verdicts: tuple[np.ndarray, ...] | None = None
  unjudged: tuple[np.ndarray, ...] | None = None
  judge_stats: Mapping[str, float] | None = None
  advantages: tuple[np.ndarray, ...] | None = None
  analysis: tuple[GroupAnalysis | None, ...] | None = None
  chosen: tuple[int, ...] | None = None
  teacher_ids: tuple[tuple[PrefixIds, ...], ...] | None = None
  cf_teacher_ids: tuple[tuple[PrefixIds, ...], ...] | None = None
  teacher_stats: Mapping[str, float] | None = None
  error: BaseException | None = None

  def teacher_applies(self, k: int) -> bool:
    """Whether the injection teacher distils a row of group k."""
    return self.teacher_ids is not None and any(ids is not None for ids in self.teacher_ids[k])


class RubricPipeline:

  def __init__(self, config, engine, tokenizer):
    # The typed pieces only (pipelines/stages.py, rubric_settings.py): no stage reads `config`.
    self.configs, self.rubric = c, rc = rubric_configs(config)
    self.engine = engine
    self.tokenizer = tokenizer
    self.task_set = load_task_set(rc.tasks)
    self.group_config = rc.cripo
    self.train_indices, self.eval_indices = split_tasks(len(self.task_set), rc.eval_tasks,
                                                        rc.split_seed)
    self.eval_group = eval_group_of(dict(rc.eval_groups))
    self.tasks = tasks_lib.ShuffledStream(self.train_indices, seed=c.seed)
    self.injection_template = rc.injection_template_path
    self.counterfactual_template = rc.counterfactual_template_path
    self.chat = QuestionChat(tokenizer, rc.system_prompt, rc.strip_thinking)
    self.prompt_ids = [self.chat.question_ids(task) for task in self.task_set.tasks]
    check_prompts_fit(engine.limits(), self.prompt_ids, self.task_set.tasks)
    check_answer_fits(engine.limits(), rc.max_new_tokens)
    stops = tuple(tokenizer.stop_token_ids)
    self.sampling = SamplingParams(max_new_tokens=rc.max_new_tokens,
                                   temperature=c.rollout.temperature,
                                   top_p=c.rollout.top_p, top_k=c.rollout.top_k,
                                   stop_token_ids=stops)
    self.eval_sampling = SamplingParams(max_new_tokens=rc.max_new_tokens,
                                        temperature=c.eval.temperature, stop_token_ids=stops)
    self.judge_backend = criteria_lib.make_criteria_judge(
        rc.judge.backend, **judge_options(rc.judge, engine, tokenizer))
    self.eval_episodes: list[dict[str, Any]] = []   # per-answer records: not kept yet
    self.split = hosts.splits(engine)   # each process rolls out its share (`rollout.hosts`)

  # ---- stages (roll_out may run in a background thread: module docstring) ------------------

  def roll_out(self, step: int) -> RubricStep:
    indices = self.tasks.next(self.configs.select.batch_groups)   # all B on every process
    share, error = hosts.attempt(self.split, lambda: self._roll_out_share(
        step, hosts.own_share(indices, self.split)))
    if error is not None:
      return RubricStep(step=step, pool=(), faults={}, error=error)
    groups, faults = share
    record = RubricStep(step=step, pool=tuple(groups), faults=faults.metrics())
    # A split roll-out is checked whole, after the judge's gather.
    return record if self.split else hosts.require_groups(record, len(indices))

  def _roll_out_share(self, step: int, indices: Sequence[int]
                      ) -> tuple[list[Group], RolloutFaults]:
    """The groups of the tasks `indices` (a failed request drops its group) and the faults."""
    group_size = self.configs.rollout.group_size
    run_seed = self.configs.seed * 1_000_003 + step
    tasks = [self.task_set.tasks[i] for i in indices]
    requests = [GenerationRequest(self.prompt_ids[i], self.sampling,
                                  seed=answer_seed(run_seed, self.task_set.name, i, task, rollout))
                for i, task in zip(indices, tasks) for rollout in range(group_size)]
    generation = self.engine.generate_counted(requests) if requests else Generation(())
    if len(generation.results) != len(requests):
      raise RuntimeError(f"engine returned {len(generation.results)} results for "
                         f"{len(requests)} requests")
    groups = []
    for k, (i, task) in enumerate(zip(indices, tasks)):
      mine = generation.results[k * group_size:(k + 1) * group_size]
      if any(r is None for r in mine):   # a request failed: the whole group is dropped
        continue
      groups.append(Group(task=task, trajectories=[
          self.chat.answer_trajectory(task, self.prompt_ids[i], r) for r in mine]))
    return groups, RolloutFaults(len(tasks) - len(groups), generation.faults)

  def judge(self, record: RubricStep) -> RubricStep:
    """Verdicts r_ij per answer; each trajectory is replaced by one with R_i and success (every
    positive criterion met, no pitfall), both 0 / False where unjudged. A split roll-out's
    shares are judged where they were rolled out, then gathered (`rollout.hosts`)."""
    error = record.error
    if error is None:
      judged, error = hosts.attempt(self.split, lambda: self._judge_share(record))
      if error is None:
        record = judged
    if not self.split:
      return record
    fields = ("pool", "verdicts", "unjudged")
    whole = hosts.gather(hosts.Share(
        fields={name: getattr(record, name) or () for name in fields},
        counters={**record.faults, **(record.judge_stats or {})}, error=error),
        f"step {record.step}")
    record = dataclasses.replace(
        record, **whole.fields, faults={k: whole.counters[k] for k in record.faults},
        judge_stats={k: whole.counters[k] for k in record.judge_stats})
    return hosts.require_groups(record, self.configs.select.batch_groups)

  def _judge_share(self, record: RubricStep) -> RubricStep:
    tasks = [g.task for g in record.pool for _ in g.trajectories]
    answers = [t.turns[0].action_text for g in record.pool for t in g.trajectories]
    result = self.judge_backend.judge(tasks, answers)
    normalizer = self.group_config.reward_normalizer
    pool, verdicts, unjudged, start = [], [], [], 0
    for group in record.pool:
      size, weights = len(group.trajectories), group.task.weights
      failed = np.asarray(result.unjudged[start:start + size], bool)
      mine = np.stack(result.verdicts[start:start + size]).astype(np.float32)   # 0 if unjudged
      start += size
      rewards = cripo.weighted_rewards(mine[None], weights[None], None, normalizer)[0]
      pool.append(dataclasses.replace(group, trajectories=[
          _with_reward(traj, 0.0 if bad else float(reward),
                       not bad and rubric_tasks.passes(row, weights))
          for traj, row, reward, bad in zip(group.trajectories, mine, rewards, failed)]))
      verdicts.append(mine)
      unjudged.append(failed)
    return dataclasses.replace(
        record, pool=tuple(pool), verdicts=tuple(verdicts), unjudged=tuple(unjudged),
        judge_stats={f"judge/{k}": float(v) for k, v in result.stats.as_dict().items()})

  def advantages(self, record: RubricStep) -> RubricStep:
    """GRPO over each group's judged answers (0 for the unjudged) and CriPO's analysis."""
    require(record, "advantages", "verdicts", "unjudged")
    advantages, analyses = [], []
    for group, verdicts, unjudged in zip(record.pool, record.verdicts, record.unjudged):
      judged = np.flatnonzero(~unjudged)
      mine = np.zeros(len(group.trajectories), np.float32)
      advantages.append(mine)
      if not judged.size:
        analyses.append(None)
        continue
      analysis = cripo.analyse_groups(verdicts[judged][None], group.task.weights[None], None,
                                      self.group_config)
      mine[judged] = analysis.advantages[0]
      cf_criteria = np.zeros(verdicts.shape, bool)
      cf_criteria[judged] = analysis.cf_criteria[0]
      analyses.append(GroupAnalysis(uc=analysis.uc_mask[0], sc=analysis.sc_mask[0],
                                    best=int(judged[analysis.best[0]]), cf_criteria=cf_criteria))
    return dataclasses.replace(record, advantages=tuple(advantages), analysis=tuple(analyses))

  def select(self, record: RubricStep) -> RubricStep:
    """Every group (plain GRPO on the batch, as the paper)."""
    return dataclasses.replace(record, chosen=tuple(range(len(record.pool))))

  def teach(self, record: RubricStep) -> RubricStep:
    require(record, "teach", "analysis", "chosen")
    injection = counterfactual = skipped_empty = 0
    rc = self.rubric
    chosen = set(record.chosen)
    teacher_ids, cf_teacher_ids = [], []
    for k, (group, analysis) in enumerate(zip(record.pool, record.analysis)):
      teachers: list[PrefixIds] = [None] * len(group.trajectories)
      cf_teachers: list[PrefixIds] = [None] * len(group.trajectories)
      teacher_ids.append(teachers)
      cf_teacher_ids.append(cf_teachers)
      if k not in chosen or analysis is None:
        continue
      question, texts = group.task.prompt, [c.text for c in group.task.criteria]
      if rc.uc_branch and analysis.uc.any():
        answer = group.trajectories[analysis.best].turns[0].action_text
        if answer:
          messages = cripo_prefix.injection_messages(
              question, answer, [texts[j] for j in np.flatnonzero(analysis.uc)],
              self.chat.system_prompt, self.injection_template)
          teachers[analysis.best] = tuple(self.chat.prefix_ids(messages, "injection teacher"))
          injection += 1
        else:
          skipped_empty += 1
      if rc.sc_branch:
        for i in np.flatnonzero(analysis.cf_criteria.any(-1)):
          answer = group.trajectories[i].turns[0].action_text
          if not answer:
            skipped_empty += 1
            continue
          messages = cripo_prefix.counterfactual_messages(
              question, answer, [texts[j] for j in np.flatnonzero(analysis.cf_criteria[i])],
              self.chat.system_prompt, self.counterfactual_template)
          cf_teachers[i] = tuple(self.chat.prefix_ids(messages, "counterfactual teacher"))
          counterfactual += 1
    return dataclasses.replace(
        record, teacher_ids=tuple(map(tuple, teacher_ids)),
        cf_teacher_ids=tuple(map(tuple, cf_teacher_ids)),
        teacher_stats={"cripo/injection_rows": float(injection),
                       "cripo/counterfactual_rows": float(counterfactual),
                       "cripo/skipped_empty_answers": float(skipped_empty)})

  def teacher_metrics(self, record: RubricStep, model: Any) -> dict[str, float]:
    """Nothing: an answer to a rubric question has no enumerable action set to measure the
    teacher's valid-action mass on (the agentic pipeline's teacher/valid_action_mass_ratio)."""
    del record, model
    return {}

  def rows(self, record: RubricStep) -> list[Row]:
    """The chosen groups' rows, in pool order."""
    require(record, "rows", "advantages", "teacher_ids")
    rows = []
    for k in record.chosen:
      group = record.pool[k]
      for traj, adv, unjudged, teacher, cf_teacher in zip(
          group.trajectories, record.advantages[k], record.unjudged[k], record.teacher_ids[k],
          record.cf_teacher_ids[k], strict=True):
        answer = traj.token_ids[traj.prompt_len:]
        # An unjudged answer stays in the batch (fixed shapes) with no loss.
        mask = [0] * len(answer) if unjudged else traj.loss_mask[traj.prompt_len:]
        rows.append(Row(prefix_ids=traj.token_ids[:traj.prompt_len], response_ids=answer,
                        response_loss_mask=mask,
                        response_behaviour_logprobs=traj.behaviour_logprobs[traj.prompt_len:],
                        advantage=float(adv), teacher_prefix_ids=teacher,
                        cf_teacher_prefix_ids=cf_teacher))
    return rows

  def observe(self, record: RubricStep) -> None:
    del record   # no memory across steps besides the task cursor

  def evaluate(self) -> dict[str, dict[str, float]]:
    """Per evaluation group of the held-out tasks (`criteria_eval`); greedy by default."""
    return criteria_eval.evaluate(
        self.engine, self.judge_backend, [self.task_set.tasks[i] for i in self.eval_indices],
        [self.prompt_ids[i] for i in self.eval_indices],
        [answer_seed(self.configs.seed, self.task_set.name, i, self.task_set.tasks[i], 0)
         for i in self.eval_indices],
        self.eval_sampling, self.chat.answer_text, self.eval_group,
        self.group_config.reward_normalizer)

  def metrics(self, record: RubricStep) -> dict[str, float]:
    """Everything the step logs about its stages: the roll-out's faults, the judge's and the
    teacher's counters, and the diagnostics; `rollout/reward` is the mean reward of the judged
    answers (0 when none is judged, which `judge/failed` then shows)."""
    require(record, "metrics", "judge_stats", "analysis", "chosen", "teacher_stats")
    trajectories = [t for g in record.pool for t in g.trajectories]
    unjudged = np.concatenate(record.unjudged)
    judged = [t for t, bad in zip(trajectories, unjudged) if not bad]
    metrics = {
        "rollout/unjudged": float(unjudged.mean()),
        "rollout/answer_tokens": float(np.mean([t.num_agent_tokens for t in trajectories])),
        "rollout/truncated": float(np.mean([t.truncated for t in trajectories])),
        "rollout/reward": float(np.mean([t.reward for t in judged])) if judged else 0.0,
        "judge/failed": float(unjudged.sum()),
        **record.faults, **record.judge_stats, **record.teacher_stats,
    }
    if judged:
      metrics["rollout/pass_rate"] = float(np.mean([t.success for t in judged]))
    analysed = [k for k in record.chosen if record.analysis[k] is not None]
    metrics["select/zero_variance_groups"] = float(sum(
        np.ptp(record.pool[k].rewards[~record.unjudged[k]]) == 0 for k in analysed))
    if analysed:
      width = max(len(record.analysis[k].uc) for k in analysed)
      uc, sc = np.zeros((len(analysed), width), bool), np.zeros((len(analysed), width), bool)
      for row, k in enumerate(analysed):
        analysis = record.analysis[k]
        uc[row, :len(analysis.uc)], sc[row, :len(analysis.sc)] = analysis.uc, analysis.sc
      metrics.update(cripo.group_diagnostics(uc, sc))
    return metrics

  def log_rollouts(self, log: runlog.RunLog, step: int, record: RubricStep) -> None:
    """Every answer of the pool (no tags: verdicts are per criterion, in the metrics); a group
    is marked `teacher` when the injection teacher distils one of its rows."""
    require(record, "log_rollouts", "unjudged", "chosen", "teacher_ids")
    chosen = set(record.chosen)
    notes = [runlog.GroupNotes(selected=k in chosen, teacher=record.teacher_applies(k),
                               unjudged=tuple(bool(u) for u in record.unjudged[k]))
             for k in range(len(record.pool))]
    log.rollouts(step, record.pool, notes, None)

  def host_state(self) -> Mapping[str, Any]:
    return {"rubric_tasks": self.tasks}


def _with_reward(traj: Trajectory, reward: float, success: bool) -> Trajectory:
  """A judged copy of a one-turn answer: its reward on the trajectory and on its turn."""
  return dataclasses.replace(traj, reward=reward, success=success,
                             turns=[dataclasses.replace(traj.turns[0], reward=reward)])


PIPELINE = RubricPipeline
