"""CriPO and rubric-reward GRPO on open-ended rubric tasks (docs/ALGORITHMS.md §3).

Stages:
  roll out   the next `select.batch_groups` training tasks of a `tasks.ShuffledStream`, each prompt
             (system prompt + question) rendered with the tokenizer's chat template, G single-turn
             answers each from the engine; a `Trajectory` holds prompt ⊕ answer ids, the loss mask
             on the answer, the sampler's log-probs and the decoded answer text (`turns[0]`);
  judge      a verdict r_ij per criterion (`rubrics.criteria`: the deterministic checker offline, an
             LLM at scale); reward R_i = Σ ω_j r_ij / Z; an answer whose verdicts are unusable is
             marked `untagged`, left out of its group's statistics and trained on with no loss;
  advantages GRPO over the group's usable answers, UC, SC, y* and the counterfactual targets
             (`learn.cripo.analyse_groups`);
  select     every group (plain GRPO on the batch, as the paper);
  teach      UC branch: the criterion-injection teacher prefix over y* (only y*'s row distils; the
             step localises the tokens); SC branch: a counterfactual teacher prefix for every
             answer with A_i < 0 that meets an SC criterion (the step flips its tokens); an
             empty answer gets no teacher (counted);
  rows       student prefix = the question prompt, teacher prefixes = the rendered teacher chats,
             each ⊕ the same answer ids; every prefix ends with the chat template's assistant
             start, checked, so the answer follows each prefix unchanged;
  evaluate   one greedy answer per held-out task, per domain group (science / medicine by
             default): pass rate (every positive criterion met, no pitfall) with its Wilson 95 %
             interval, mean weighted score with a Student-t 95 % interval, the fraction of
             positive criteria met and the pitfall rate (the run log's eval.jsonl keeps the pass
             rates; `trainer.train` and `rised-eval` return everything);
  metrics    CriPO's diagnostics of every step (samples with ≥ 1 UC, with ≥ 1 SC, SC per sample;
             the step adds `kept_frac` and `flip_frac`), reward, pass rate, unusable answers,
             and the fault counters: groups dropped because an engine request failed after its
             retries (never trained on in part), the engine's retries, unjudged answers.

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
from rised_jax.rollout import engines
from rised_jax.rollout.agent_loop import sampling_seed
from rised_jax.rollout.base import GenerationRequest, SamplingParams, generate_or_none
from rised_jax.rollout.text import judge_options
from rised_jax.rubrics import criteria as criteria_lib
from rised_jax.rubrics import registry
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
                               supplied=registry.supplied_options(rc.judge.backend))
  engines.check_config(config)


@dataclasses.dataclass
class RubricGroup(Group):
  """A group of answers to one rubric task and what CriPO decided about it."""

  rubric: rubric_tasks.RubricTask | None = None
  uc: np.ndarray | None = None              # [C] unexplored criteria (None: no usable answer)
  sc: np.ndarray | None = None              # [C] suppressed criteria
  best: int | None = None                   # y*, an index into trajectories
  cf_criteria: np.ndarray | None = None     # [G, C] SC criteria each counterfactual answer meets
  teacher_ids: list[list[int] | None] = dataclasses.field(default_factory=list)
  cf_teacher_ids: list[list[int] | None] = dataclasses.field(default_factory=list)


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
    self.faults: dict[str, float] = {}   # the last roll-out's fault counters
    self.eval_episodes: list[dict[str, Any]] = []   # per-answer records: not kept yet

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

  def roll_out(self, step: int) -> list[Group]:
    indices = self.tasks.next(self.config.select.batch_groups)
    group_size = self.config.rollout.group_size
    run_seed = self.config.seed * 1_000_003 + step
    tasks = [self.task_set.as_task(i) for i in indices]
    requests = [GenerationRequest(self.prompt_ids[i], self.sampling,
                                  seed=sampling_seed(run_seed, task, rollout, 0))
                for i, task in zip(indices, tasks) for rollout in range(group_size)]
    retries = self.engine.server_retries
    results = generate_or_none(self.engine, requests)
    if len(results) != len(requests):
      raise RuntimeError(f"engine returned {len(results)} results for {len(requests)} requests")
    groups = []
    for k, (i, task) in enumerate(zip(indices, tasks)):
      mine = results[k * group_size:(k + 1) * group_size]
      if any(r is None for r in mine):   # a request failed: the whole group is dropped
        continue
      groups.append(RubricGroup(task=task, rubric=self.task_set.tasks[i],
                                trajectories=[self._trajectory(task, self.prompt_ids[i], r)
                                              for r in mine]))
    self.faults = {"rollout/server_retries": float(self.engine.server_retries - retries),
                   "rollout/groups_dropped": float(len(tasks) - len(groups))}
    if not groups:
      raise RuntimeError(f"step {step}: every one of the {len(tasks)} rollout groups was "
                         "dropped because engine requests failed after their retries (see the "
                         "log for the server's errors)")
    return groups

  def _trajectory(self, task: Task, prompt: list[int], result) -> Trajectory:
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

  def judge(self, pool: list[Group]) -> dict[str, float]:
    tasks = [g.rubric for g in pool for _ in g.trajectories]
    trajectories = [t for g in pool for t in g.trajectories]
    result = self.judge_backend.judge(tasks, [t.turns[0].action_text for t in trajectories])
    normalizer = self.group_config.reward_normalizer
    for task, traj, verdicts, usable in zip(tasks, trajectories, result.verdicts, result.usable):
      traj.untagged = not usable
      traj.criteria = verdicts if usable else None
      traj.reward = (float(cripo.weighted_rewards(verdicts[None, None], task.weights[None], None,
                                                  normalizer)[0, 0]) if usable else 0.0)
      traj.turns[0].reward = traj.reward
      traj.success = usable and passes(verdicts, task.weights)
    return {f"judge/{k}": float(v) for k, v in result.stats.as_dict().items()}

  def advantages(self, pool: list[Group]) -> None:
    for group in pool:
      usable = np.flatnonzero([not t.untagged for t in group.trajectories])
      group.advantages = np.zeros(len(group.trajectories), np.float32)
      group.uc = group.sc = group.best = group.cf_criteria = None
      if not usable.size:
        continue
      verdicts = np.stack([group.trajectories[i].criteria for i in usable])
      analysis = cripo.analyse_groups(verdicts[None], group.rubric.weights[None], None,
                                      self.group_config)
      group.advantages[usable] = analysis.advantages[0]
      group.uc, group.sc = analysis.uc_mask[0], analysis.sc_mask[0]
      group.best = int(usable[analysis.best[0]])
      group.cf_criteria = np.zeros((len(group.trajectories), verdicts.shape[1]), bool)
      group.cf_criteria[usable] = analysis.cf_criteria[0]

  def select(self, pool: list[Group], step: int) -> list[Group]:
    for group in pool:
      group.selected = True
    return list(pool)

  def teach(self, selected: Sequence[Group], pool: Sequence[Group],
            step: int) -> dict[str, float]:
    injection = counterfactual = skipped_empty = 0
    rc = self.config.rubric
    for group in selected:
      size = len(group.trajectories)
      group.teacher_ids, group.cf_teacher_ids = [None] * size, [None] * size
      group.teacher_prefix = None
      if group.uc is None:
        continue
      question, texts = group.rubric.prompt, [c.text for c in group.rubric.criteria]
      if rc.uc_branch and group.uc.any():
        answer = group.trajectories[group.best].turns[0].action_text
        if answer:
          messages = cripo_prefix.injection_messages(
              question, answer, [texts[j] for j in np.flatnonzero(group.uc)], self.system_prompt,
              self.injection_template)
          group.teacher_ids[group.best] = self._prefix_ids(messages, "injection teacher")
          group.teacher_prefix = self.tokenizer.render_chat(messages, add_generation_prompt=True)
          injection += 1
        else:
          skipped_empty += 1
      if rc.sc_branch:
        for i in np.flatnonzero(group.cf_criteria.any(-1)):
          answer = group.trajectories[i].turns[0].action_text
          if not answer:
            skipped_empty += 1
            continue
          messages = cripo_prefix.counterfactual_messages(
              question, answer, [texts[j] for j in np.flatnonzero(group.cf_criteria[i])],
              self.system_prompt, self.counterfactual_template)
          group.cf_teacher_ids[i] = self._prefix_ids(messages, "counterfactual teacher")
          counterfactual += 1
    return {"cripo/injection_rows": float(injection),
            "cripo/counterfactual_rows": float(counterfactual),
            "cripo/skipped_empty_answers": float(skipped_empty)}

  def rows(self, selected: Sequence[Group]) -> list[Row]:
    rows = []
    for group in selected:
      teachers = group.teacher_ids or [None] * len(group.trajectories)
      cf_teachers = group.cf_teacher_ids or [None] * len(group.trajectories)
      for traj, adv, teacher, cf_teacher in zip(group.trajectories, group.advantages, teachers,
                                                cf_teachers):
        answer = traj.token_ids[traj.prompt_len:]
        # An answer without usable verdicts stays in the batch (fixed shapes) with no loss.
        mask = [0] * len(answer) if traj.untagged else traj.loss_mask[traj.prompt_len:]
        rows.append(Row(prefix_ids=traj.token_ids[:traj.prompt_len], response_ids=answer,
                        response_loss_mask=mask,
                        response_behaviour_logprobs=traj.behaviour_logprobs[traj.prompt_len:],
                        advantage=float(adv), teacher_prefix_ids=teacher,
                        cf_teacher_prefix_ids=cf_teacher))
    return rows

  def observe(self, pool: Sequence[Group]) -> None:
    del pool   # no memory across steps besides the task cursor

  def evaluate(self) -> dict[str, dict[str, float]]:
    """Per evaluation group of the held-out tasks (module docstring); greedy by default.

    Answers the judge could not judge are left out and counted as `unjudged`.
    """
    tasks = [self.task_set.tasks[i] for i in self.eval_indices]
    requests = [GenerationRequest(self.prompt_ids[i], self.eval_sampling,
                                  seed=sampling_seed(self.config.seed, self.task_set.as_task(i),
                                                     0, 0))
                for i in self.eval_indices]
    answers = [self._answer_text(r.output_ids) for r in self.engine.generate(requests)]
    judged = self.judge_backend.judge(tasks, answers)
    normalizer = self.group_config.reward_normalizer
    records: dict[str, list[tuple[bool, float, float, bool]]] = {}
    unjudged: dict[str, int] = {}
    for task, verdicts, usable in zip(tasks, judged.verdicts, judged.usable):
      group = self.eval_group.get(task.domain or "", OTHER_DOMAINS)
      if not usable:
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

  def metrics(self, pool: Sequence[Group], selected: Sequence[Group]) -> dict[str, float]:
    trajectories = [t for g in pool for t in g.trajectories]
    judged = [t for t in trajectories if not t.untagged]
    metrics = {
        "rollout/unusable": float(np.mean([t.untagged for t in trajectories])),
        "rollout/answer_tokens": float(np.mean([t.num_agent_tokens for t in trajectories])),
        "rollout/truncated": float(np.mean([t.truncated for t in trajectories])),
        "judge/failed": float(sum(t.untagged for t in trajectories)),
        **self.faults,
    }
    if judged:
      metrics["rollout/reward"] = float(np.mean([t.reward for t in judged]))
      metrics["rollout/pass_rate"] = float(np.mean([t.success for t in judged]))
    analysed = [g for g in selected if g.uc is not None]
    metrics["select/zero_variance_groups"] = float(sum(
        np.ptp([t.reward for t in g.trajectories if not t.untagged]) == 0 for g in analysed))
    if analysed:
      width = max(len(g.uc) for g in analysed)
      uc, sc = np.zeros((len(analysed), width), bool), np.zeros((len(analysed), width), bool)
      for k, group in enumerate(analysed):
        uc[k, :len(group.uc)], sc[k, :len(group.sc)] = group.uc, group.sc
      metrics.update(cripo.group_diagnostics(uc, sc))
    return metrics

  def log_rollouts(self, log: runlog.RunLog, step: int, pool: Sequence[Group]) -> None:
    """Every answer of the pool (no tags: verdicts are per criterion, in the metrics)."""
    log.rollouts(step, pool, None)

  def host_state(self) -> Mapping[str, Any]:
    return {"rubric_tasks": self.tasks}


PIPELINE = RubricPipeline
