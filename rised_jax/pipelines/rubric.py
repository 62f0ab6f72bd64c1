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
  evaluate   one greedy answer per held-out task, per domain group (science / medicine by
             default): pass rate (every positive criterion met, no pitfall) with its Wilson 95 %
             interval, mean weighted score with a Student-t 95 % interval, the fraction of
             positive criteria met and the pitfall rate (the run log's eval.jsonl keeps the pass
             rates; `trainer.train` and `rised-eval` return everything).

`roll_out` touches only the task stream and the engine, and the later stages neither (the
in-process criteria judge excepted: it asks the engine, so `judge` runs before the next
`roll_out` starts); so the trainer may roll out step t + 1 while step t trains.

Which branches run is the config's (`rubric.uc_branch`, `rubric.sc_branch`, with the matching
step settings; the presets `cripo`, `cripo_u`, `cripo_s` and `grpo_rubric` of `rised_jax.config`).
Held-out tasks are a fixed, seeded subset of the task set (`rubric.eval_tasks`, `rubric.split_seed`)
that training never samples; the training cursor is host state, saved with every checkpoint.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from rised_jax import config as config_lib
from rised_jax import rubric_tasks, runlog, select
from rised_jax import tasks as tasks_lib
from rised_jax.checks import is_int, named
from rised_jax.learn import cripo
from rised_jax.learn.batching import Row
from rised_jax.rollout import hosts
from rised_jax.rollout import engines
from rised_jax.rollout.agent_loop import sampling_seed
from rised_jax.rollout.base import GenerationRequest, SamplingParams, generate_or_none
from rised_jax.rubrics import criteria as criteria_lib
from rised_jax.rubrics.engine_text import judge_options, supplied_options
from rised_jax.stats import t_interval, wilson_interval
from rised_jax.teach import cripo_prefix
from rised_jax.types import Group, Task, Trajectory, Turn

OTHER_DOMAINS = "other"   # evaluation group of a domain that no configured group lists


def load_task_set(path: str) -> rubric_tasks.RubricTaskSet:
  """The task file at `path`, or the built-in set when `path` is ""."""
  return rubric_tasks.load_jsonl(path) if path else rubric_tasks.builtin_task_set()


def split_tasks(num_tasks: int, eval_tasks: int, split_seed: int) -> tuple[list[int], list[int]]:
  """(training, held-out) task indices: a seeded random subset of `eval_tasks` is held out."""
  if not 1 <= eval_tasks < num_tasks:
    raise ValueError(f"config.rubric.eval_tasks={eval_tasks}: expected 1 <= eval_tasks < the "
                     f"{num_tasks} tasks of the task set (some must remain for training)")
  order = np.random.default_rng(split_seed).permutation(num_tasks)
  return sorted(order[eval_tasks:].tolist()), sorted(order[:eval_tasks].tolist())


def check_normalizer(task_set: rubric_tasks.RubricTaskSet, normalizer: str) -> None:
  """Every task must have a positive reward normaliser Z (see `cripo.weighted_rewards`)."""
  for task in task_set.tasks:
    try:
      cripo.weighted_rewards(np.zeros((1, 1, len(task.criteria))), task.weights[None], None,
                             normalizer)
    except ValueError as e:
      raise ValueError(f"rubric task {task.id!r} of {task_set.name!r} "
                       f"(config.rubric.cripo.reward_normalizer): {e}") from None


def eval_group_of(domain_groups: Mapping[str, Sequence[str]]) -> dict[str, str]:
  """domain -> evaluation group, from {group: [domains]}; a domain may be in one group only."""
  group_of: dict[str, str] = {}
  for group, domains in domain_groups.items():
    if isinstance(domains, str) or not all(isinstance(d, str) for d in domains):
      raise ValueError(f"config.rubric.eval_groups.{group}={domains!r}: expected a list of "
                       "domain names")
    for domain in domains:
      if domain in group_of:
        raise ValueError(f"config.rubric.eval_groups: domain {domain!r} is in both "
                         f"{group_of[domain]!r} and {group!r}")
      group_of[domain] = group
  return group_of


def assistant_start_ids(tokenizer) -> list[int]:
  """The ids the chat template appends as the generation prompt (the assistant's header).

  Every prefix that an answer follows must end with them: the answer was generated after them.
  """
  probe = [{"role": "user", "content": "Probe question?"}]
  with_start = tokenizer.encode_chat(probe, add_generation_prompt=True)
  without = tokenizer.encode_chat(probe, add_generation_prompt=False)
  if len(with_start) <= len(without) or with_start[:len(without)] != without:
    raise ValueError("chat template: rendering with the generation prompt does not extend the "
                     "rendering without it, so the assistant start cannot be located; the rubric "
                     "pipeline needs a template whose generation prompt is appended text")
  return with_start[len(without):]


def visible_answer(text: str, strip_thinking: bool) -> str:
  """The answer a reader sees: without a leading <think>…</think> block (empty if unclosed)."""
  if strip_thinking and text.lstrip().startswith("<think>"):
    _, closed, after = text.partition("</think>")
    return after.strip() if closed else ""
  return text.strip()


def passes(verdicts: np.ndarray, weights: np.ndarray) -> bool:
  """Every positive criterion met and no pitfall committed."""
  met = np.asarray(verdicts) > 0
  return bool(np.all(met[weights > 0]) and not np.any(met[weights < 0]))


def check_config(config) -> None:
  """The rubric pipeline's keys: task file, split, branches vs step settings, judge, templates,
  answer length against the engine's limits (then the engine stage's own `check_config`)."""
  rc = config.rubric
  if config.advantage != "grpo":
    raise ValueError(f"config.advantage={config.advantage!r}: the rubric pipeline uses GRPO "
                     "advantages (CriPO's SC rule is defined on them); expected 'grpo'")
  select.check_config(config)
  if config.select.name != "uniform" or config.select.pool_groups != config.select.batch_groups:
    raise ValueError(f"config.select.name={config.select.name!r} with pool_groups="
                     f"{config.select.pool_groups}, batch_groups={config.select.batch_groups}: "
                     "the rubric pipeline trains on every group it rolls out; expected 'uniform' "
                     "and pool_groups == batch_groups (the cripo* and grpo_rubric presets set "
                     "them)")
  step = config_lib.step_config(config)
  if rc.uc_branch != step.distills:
    raise ValueError(f"config.rubric.uc_branch={rc.uc_branch} but config.step.beta={step.beta}: "
                     "the injection teacher is the only distillation of the rubric pipeline, so "
                     "the UC branch needs beta > 0 and beta must be 0 without it (use the presets "
                     "cripo, cripo_u, cripo_s, grpo_rubric)")
  if rc.sc_branch != step.counterfactual:
    raise ValueError(f"config.rubric.sc_branch={rc.sc_branch} but config.step.counterfactual="
                     f"{step.counterfactual}: the SC branch and the step's counterfactual flips go "
                     "together (use the presets cripo, cripo_u, cripo_s, grpo_rubric)")
  group_config = config_lib.cripo_group_config(config)
  task_set = load_task_set(rc.tasks)
  split_tasks(len(task_set), rc.eval_tasks, rc.split_seed)
  check_normalizer(task_set, group_config.reward_normalizer)
  eval_group_of(rc.eval_groups.to_dict())
  for key in ("injection_template", "counterfactual_template"):
    if rc[key]:
      cripo_prefix.load_template(rc[key])
  for key, value in (("max_new_tokens", rc.max_new_tokens),
                     ("judge.max_new_tokens", rc.judge.max_new_tokens)):
    if not is_int(value) or value < 1:
      raise ValueError(f"config.rubric.{key}={value!r}: expected an integer >= 1")
  limits = engines.limits_of(config)
  if not limits.reply_fits(rc.max_new_tokens):
    raise ValueError(f"config.rubric.max_new_tokens={rc.max_new_tokens} is above the largest "
                     f"config.rollout.new_token_buckets entry {limits.max_new_tokens}")
  with named("config.rubric.judge"):
    criteria_lib.check_options(rc.judge.backend, rc.judge.options.to_dict(),
                               supplied=supplied_options(rc.judge.backend))
  engines.check_config(config)


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

  Per-group fields are tuples in pool order (K groups, G_k answers, C_k criteria each).

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


def _require(record: RubricStep, stage: str, **fields: Any) -> None:
  """Raises when `stage` runs before the stages that set `fields` (None: not set yet)."""
  missing = [name for name, value in fields.items() if value is None]
  if missing:
    raise RuntimeError(f"rubric pipeline, step {record.step}: {stage} needs {missing}, which "
                       "earlier stages set (order: roll_out, judge, advantages, select, teach)")


def answer_seed(run_seed: int, task_set: str, index: int, task: rubric_tasks.RubricTask,
                rollout: int) -> int:
  """The engine seed of one answer: `sampling_seed` over the key (set name, task index, task id),
  the one rubric questions had as `types.Task`s, so every answer is sampled as before."""
  return sampling_seed(run_seed, Task(env=task_set, seed=index, difficulty={"id": task.id}),
                       rollout, 0)


class RubricPipeline:

  def __init__(self, config, engine, tokenizer):
    self.config = config
    rc = config.rubric
    self.engine = engine
    self.tokenizer = tokenizer
    self.task_set = load_task_set(rc.tasks)
    self.group_config = config_lib.cripo_group_config(config)
    self.train_indices, self.eval_indices = split_tasks(len(self.task_set), rc.eval_tasks,
                                                        rc.split_seed)
    self.eval_group = eval_group_of(rc.eval_groups.to_dict())
    self.tasks = tasks_lib.ShuffledStream(self.train_indices, seed=config.seed)
    self.system_prompt = rc.system_prompt or None
    self.injection_template = rc.injection_template or cripo_prefix.INJECTION_TEMPLATE
    self.counterfactual_template = (rc.counterfactual_template
                                    or cripo_prefix.COUNTERFACTUAL_TEMPLATE)
    self.assistant_start = assistant_start_ids(tokenizer)
    self.prompt_ids = [self._prefix_ids(self._messages(task.prompt), f"task {task.id!r}")
                       for task in self.task_set.tasks]
    self._check_engine_limits()
    stops = tuple(tokenizer.stop_token_ids)
    self.sampling = SamplingParams(max_new_tokens=rc.max_new_tokens,
                                   temperature=config.rollout.temperature,
                                   top_p=config.rollout.top_p, top_k=config.rollout.top_k,
                                   stop_token_ids=stops)
    self.eval_sampling = SamplingParams(max_new_tokens=rc.max_new_tokens,
                                        temperature=config.eval.temperature, stop_token_ids=stops)
    self.judge_backend = criteria_lib.make_criteria_judge(
        rc.judge.backend, **judge_options(rc.judge, engine, tokenizer))
    self.eval_episodes: list[dict[str, Any]] = []   # per-answer records: not kept yet
    self.split = hosts.splits(engine)   # each process rolls out its share (`rollout.hosts`)

  # ---- prompts ----------------------------------------------------------------------------

  def _messages(self, question: str) -> list[dict[str, str]]:
    messages = [{"role": "user", "content": question}]
    if self.system_prompt:
      messages.insert(0, {"role": "system", "content": self.system_prompt})
    return messages

  def _prefix_ids(self, messages: list[dict[str, str]], what: str) -> list[int]:
    """The chat with the generation prompt; it must end with the assistant start."""
    ids = self.tokenizer.encode_chat(messages, add_generation_prompt=True)
    if ids[-len(self.assistant_start):] != self.assistant_start:
      raise ValueError(f"{what}: the chat template's rendering ends with "
                       f"{ids[-len(self.assistant_start):]} instead of the assistant start "
                       f"{self.assistant_start}, so an answer would not follow it unchanged")
    return ids

  def _check_engine_limits(self) -> None:
    """Fails now, not steps into a run, when the engine (JaxEngine's buckets) cannot take a
    prompt or the answer length."""
    limits = self.engine.limits()
    longest = int(np.argmax([len(p) for p in self.prompt_ids]))
    if not limits.prompt_fits(len(self.prompt_ids[longest])):
      raise ValueError(f"rubric task {self.task_set.tasks[longest].id!r}: its prompt has "
                       f"{len(self.prompt_ids[longest])} tokens, more than the engine's largest "
                       f"prompt bucket {limits.max_prompt_tokens}; raise "
                       "config.rollout.prompt_buckets")
    if not limits.reply_fits(self.config.rubric.max_new_tokens):
      raise ValueError(f"config.rubric.max_new_tokens={self.config.rubric.max_new_tokens} is above "
                       f"the engine's largest new-token bucket {limits.max_new_tokens}; raise "
                       "config.rollout.new_token_buckets")

  def _answer_text(self, output_ids: Sequence[int]) -> str:
    return visible_answer(self.tokenizer.decode(output_ids, skip_special_tokens=True),
                          self.config.rubric.strip_thinking)

  # ---- stages -----------------------------------------------------------------------------
  # roll_out touches only the task stream and the engine (it may run in a background thread
  # while the main thread runs the later stages of the previous record); the later stages
  # touch neither, except the in-process criteria judge, which the trainer runs before it
  # launches the next roll_out.

  def roll_out(self, step: int) -> RubricStep:
    indices = self.tasks.next(self.config.select.batch_groups)   # all B on every process
    share, error = hosts.attempt(self.split, lambda: self._roll_out_share(
        step, hosts.own_share(indices, self.split)))
    if error is not None:
      return RubricStep(step=step, pool=(), faults={}, error=error)
    groups, faults = share
    record = RubricStep(step=step, pool=tuple(groups), faults=faults)
    # A split roll-out is checked whole, after the judge's gather.
    return record if self.split else hosts.require_groups(record, len(indices))

  def _roll_out_share(self, step: int, indices: Sequence[int]
                      ) -> tuple[list[Group], dict[str, float]]:
    """The groups of the tasks `indices` (a failed request drops its group) and the faults."""
    group_size = self.config.rollout.group_size
    run_seed = self.config.seed * 1_000_003 + step
    tasks = [self.task_set.tasks[i] for i in indices]
    requests = [GenerationRequest(self.prompt_ids[i], self.sampling,
                                  seed=answer_seed(run_seed, self.task_set.name, i, task, rollout))
                for i, task in zip(indices, tasks) for rollout in range(group_size)]
    retries, failed = self.engine.server_retries, self.engine.failed_requests
    results = generate_or_none(self.engine, requests) if requests else []
    if len(results) != len(requests):
      raise RuntimeError(f"engine returned {len(results)} results for {len(requests)} requests")
    groups = []
    for k, (i, task) in enumerate(zip(indices, tasks)):
      mine = results[k * group_size:(k + 1) * group_size]
      if any(r is None for r in mine):   # a request failed: the whole group is dropped
        continue
      groups.append(Group(task=task, trajectories=[self._trajectory(task, self.prompt_ids[i], r)
                                                   for r in mine]))
    faults = {"rollout/server_retries": float(self.engine.server_retries - retries),
              "rollout/failed_requests": float(self.engine.failed_requests - failed),
              "rollout/groups_dropped": float(len(tasks) - len(groups))}
    return groups, faults

  def _trajectory(self, task: rubric_tasks.RubricTask, prompt: list[int], result) -> Trajectory:
    answer = [int(t) for t in result.output_ids]
    if not answer or len(result.logprobs) != len(answer):
      raise RuntimeError(f"engine result for task {task.key} breaks the Engine contract: "
                         f"{len(answer)} output ids, {len(result.logprobs)} log-probs")
    text = self._answer_text(answer)
    return Trajectory(task=task, token_ids=list(prompt) + answer,
                      loss_mask=[0] * len(prompt) + [1] * len(answer),
                      behaviour_logprobs=[0.0] * len(prompt) + [float(x) for x in result.logprobs],
                      prompt_len=len(prompt),
                      turns=[Turn(action_text=text, observation="", reward=0.0, done=True,
                                  invalid=False, events=[])],
                      success=False, reward=0.0, truncated=result.finish_reason == "length")

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
    return hosts.require_groups(record, self.config.select.batch_groups)

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
          _with_reward(traj, 0.0 if bad else float(reward), not bad and passes(row, weights))
          for traj, row, reward, bad in zip(group.trajectories, mine, rewards, failed)]))
      verdicts.append(mine)
      unjudged.append(failed)
    return dataclasses.replace(
        record, pool=tuple(pool), verdicts=tuple(verdicts), unjudged=tuple(unjudged),
        judge_stats={f"judge/{k}": float(v) for k, v in result.stats.as_dict().items()})

  def advantages(self, record: RubricStep) -> RubricStep:
    """GRPO over each group's judged answers (0 for the unjudged) and CriPO's analysis."""
    _require(record, "advantages", verdicts=record.verdicts, unjudged=record.unjudged)
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
    _require(record, "teach", analysis=record.analysis, chosen=record.chosen)
    injection = counterfactual = skipped_empty = 0
    rc = self.config.rubric
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
              self.system_prompt, self.injection_template)
          teachers[analysis.best] = tuple(self._prefix_ids(messages, "injection teacher"))
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
              self.system_prompt, self.counterfactual_template)
          cf_teachers[i] = tuple(self._prefix_ids(messages, "counterfactual teacher"))
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
    _require(record, "rows", advantages=record.advantages, teacher_ids=record.teacher_ids)
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
    """Per evaluation group of the held-out tasks (module docstring); greedy by default.

    Answers the judge could not judge are left out and counted as `unjudged`.
    """
    tasks = [self.task_set.tasks[i] for i in self.eval_indices]
    requests = [GenerationRequest(self.prompt_ids[i], self.eval_sampling,
                                  seed=answer_seed(self.config.seed, self.task_set.name, i,
                                                   self.task_set.tasks[i], 0))
                for i in self.eval_indices]
    answers = [self._answer_text(r.output_ids) for r in self.engine.generate(requests)]
    judged = self.judge_backend.judge(tasks, answers)
    normalizer = self.group_config.reward_normalizer
    records: dict[str, list[tuple[bool, float, float, bool]]] = {}
    unjudged: dict[str, int] = {}
    for task, verdicts, failed in zip(tasks, judged.verdicts, judged.unjudged):
      group = self.eval_group.get(task.domain or "", OTHER_DOMAINS)
      if failed:
        unjudged[group] = unjudged.get(group, 0) + 1
        continue
      score = float(cripo.weighted_rewards(verdicts[None, None], task.weights[None], None,
                                           normalizer)[0, 0])
      positive = task.weights > 0
      records.setdefault(group, []).append((
          passes(verdicts, task.weights), score, float(verdicts[positive].mean()),
          bool((verdicts[task.weights < 0] > 0).any())))
    if not records:
      raise RuntimeError(f"evaluation: the {self.judge_backend.backend} criteria judge gave no "
                         f"usable verdicts for any of the {len(tasks)} held-out answers")
    results = {}
    for group, rows in sorted(records.items()):
      passed, scores, met, pitfalls = (list(column) for column in zip(*rows))
      low, high = wilson_interval(sum(passed), len(passed))
      score_low, score_high = t_interval(scores)
      results[group] = {
          "pass_rate": sum(passed) / len(passed), "ci_low": low, "ci_high": high,
          "episodes": len(passed), "score": float(np.mean(scores)), "score_ci_low": score_low,
          "score_ci_high": score_high, "criteria_met": float(np.mean(met)),
          "pitfall_rate": float(np.mean(pitfalls)), "unjudged": unjudged.get(group, 0)}
    return results

  def metrics(self, record: RubricStep) -> dict[str, float]:
    """Everything the step logs about its stages: the roll-out's faults, the judge's and the
    teacher's counters, and the diagnostics; `rollout/reward` is the mean reward of the judged
    answers (0 when none is judged, which `judge/failed` then shows)."""
    _require(record, "metrics", judge_stats=record.judge_stats, analysis=record.analysis,
             chosen=record.chosen, teacher_stats=record.teacher_stats)
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
    _require(record, "log_rollouts", unjudged=record.unjudged, chosen=record.chosen,
             teacher_ids=record.teacher_ids)
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
