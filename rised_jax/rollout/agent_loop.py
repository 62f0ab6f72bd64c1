"""Multi-turn rollouts: G episodes per task, across many environments, batched turn by turn.

Each turn every live episode asks the engine for one reply (all of them in ONE `generate`
call), its environment steps on the decoded reply, and the observation is appended. The
transcript is kept token-exact and is never re-tokenised:

  prompt ids     `ChatFormat.prompt_ids(system prompt [+ hint], first observation)`,
                 encoded once per task;
  agent ids      exactly the engine's output ids (the stop token included), loss_mask 1,
                 behaviour_logprobs = the engine's log-probs;
  closing ids    only when the episode continues and the reply does not already end with
                 the template's end-of-turn token (cut by max_new_tokens, or stopped on
                 another stop token such as EOS): the end-of-turn ids, loss_mask 0, so the
                 next turn sees a well-formed chat;
  observation    `ChatFormat.observation_ids(observation)`, loss_mask 0.
With a reply prefix (`ChatFormat`), the prompt and every observation segment end with its ids,
and the environment steps on prefix + decoded reply. With stop strings, a reply is cut after
the first token at which its decoded text contains one; the ids after it are dropped as if
the engine had stopped there (the kept ids and their log-probs are exactly what was sampled).
The final observation (after the episode ends) is recorded in `turns` but not appended: no
agent token follows it.

Budgets (running out is `truncated`, a failure): the turn budget is the environment's own
`max_turns` (its step reports truncated) and, when set, the loop's `max_turns`; the token
budget `max_total_tokens` bounds the whole transcript: a turn may generate at most
min(max_new_tokens_per_turn, tokens left), and an episode whose next observation would leave
no room for one more agent token ends truncated without appending it.

The loop offers the engine two savings that change no token (the in-process `JaxEngine` takes
them; a server has its own): the G rollouts' shared first prompt is prefilled once
(`shared_prefill`), and a reply that already holds a stop string ends inside the engine between
decode chunks (`stop_check`), so it stops costing decode steps; the cut above is made as before.

Failed requests: a request the engine gives up on (after its retries) ends its episode, and
the episode's whole group is left out of `run`'s result (never trained on in part). `run`
returns its groups with its own counts (`Rollouts`: the groups dropped, the engine's retries
and failed requests of the run's `generate_counted` calls, the errored episodes); the loop
keeps no count across runs.

Environment errors: an exception raised by an environment's `reset` or `step` (a crashed game,
a dead remote server after its retries), a step result that breaks
`envs.base.EnvironmentProtocol`, a first observation whose prompt leaves no room under
`max_total_tokens` (a web page, a long room description), or a step reward outside the reward
bound (not finite once cast to float32, the dtype it is trained in, or |reward| above
`max_abs_reward`: a reward of 1e39 is finite in Python and inf in float32) ends that episode as
errored. Its whole group is left out of
`run`'s result like a failed request's: a group's advantages are taken against the mean of
its G rewards, and an errored episode has no reward (scoring it 0 would teach the policy to
avoid whatever the crash followed; masking it alone would leave a group of G - 1 among groups
of G). `Rollouts.env_errors` lists the run's errored episodes (`EnvError`, counted in the
metrics), the instance is discarded and the next episode gets a new one (`EnvPool`). A run in
which every group is dropped and some environment raised ends in `EnvironmentFailure`, which
carries the run's `Rollouts` (no groups, its counts).

Seeds: every rollout of a task plays the environment episode `task.seed`; the engine seed of
rollout i at turn t is a hash of (run seed, task, i, t), so a run is reproducible and the G
rollouts of a group differ.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import Mapping, Sequence

import jax
import numpy as np

from rised_jax import envs
from rised_jax.envs.base import check_step_result
from rised_jax.model.tokenizer import Tokenizer
from rised_jax.rollout.base import (Engine, EngineFaults, GenerationRequest, GenerationResult,
                                    SamplingParams)
from rised_jax.rollout.chat import ChatFormat, join_system_text
from rised_jax.rollout.env_pool import EnvError, EnvPool
from rised_jax.rollout.progress import TurnBar
from rised_jax.types import Group, Task, Trajectory, Turn
from rised_jax.checks import is_int, is_number

log = logging.getLogger(__name__)


# A reward beyond this is a broken environment, not a signal (built-ins give rewards near 1).
DEFAULT_MAX_ABS_REWARD = 1e6
_FLOAT32_MAX = float(np.finfo(np.float32).max)   # a Python float: comparing casts nothing


@dataclasses.dataclass(frozen=True)
class RolloutFaults:
  """What one roll-out call lost and met: groups dropped whole (a request failed after its
  retries, or an environment raised), the engine's retried attempts and failed requests."""

  groups_dropped: int = 0
  engine: EngineFaults = EngineFaults()

  def metrics(self) -> dict[str, float]:
    """rollout/server_retries, rollout/failed_requests, rollout/groups_dropped."""
    return {"rollout/server_retries": float(self.engine.server_retries),
            "rollout/failed_requests": float(self.engine.failed_requests),
            "rollout/groups_dropped": float(self.groups_dropped)}


@dataclasses.dataclass(frozen=True)
class Rollouts:
  """One `AgentLoop.run`: the groups kept, in task order, and the run's own counts."""

  groups: tuple[Group, ...]
  faults: RolloutFaults = RolloutFaults()
  env_errors: tuple[EnvError, ...] = ()   # the run's errored episodes, in the order they raised


class EnvironmentFailure(RuntimeError):
  """Every group of a run was dropped and environments raised: nothing is left to use.
  `rollouts`: that run's result (no groups, its counts), when a run raised it."""

  def __init__(self, message: str, rollouts: Rollouts | None = None):
    super().__init__(message)
    self.rollouts = rollouts


def sampling_seed(seed: int, task: Task, rollout: int, turn: int) -> int:
  """The engine seed of one turn of one rollout: a stable hash in [0, 2**31)."""
  difficulty = sorted((str(k), repr(v)) for k, v in task.difficulty.items())
  key = repr((int(seed), task.env, int(task.seed), difficulty, int(rollout), int(turn)))
  return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little") & 0x7FFFFFFF


def make_env(task: Task) -> envs.EnvironmentProtocol:
  """A fresh environment for the task (its difficulty knobs as keyword arguments)."""
  return envs.make(task.env, **dict(task.difficulty))


@dataclasses.dataclass
class _Episode:
  """One rollout in progress."""

  task: Task
  rollout: int
  env: envs.EnvironmentProtocol | None   # None once released or discarded
  hint: str
  token_ids: list[int]
  loss_mask: list[int]
  logprobs: list[float]
  prompt_len: int
  turns: list[Turn] = dataclasses.field(default_factory=list)
  reward: float = 0.0
  success: bool = False
  truncated: bool = False
  done: bool = False
  failed: bool = False   # a request of this episode failed: its group is dropped
  env_error: EnvError | None = None   # its environment raised: its group is dropped
  system_prompt: str = ""      # what the environment showed before the first action
  first_observation: str = ""

  def to_trajectory(self) -> Trajectory:
    return Trajectory(task=self.task, token_ids=self.token_ids, loss_mask=self.loss_mask,
                      behaviour_logprobs=self.logprobs, prompt_len=self.prompt_len,
                      turns=self.turns, success=self.success and not self.truncated,
                      reward=self.reward, truncated=self.truncated, hint=self.hint)


def _positive_int(name: str, value: object) -> int:
  if not is_int(value) or value < 1:
    raise ValueError(f"AgentLoop: {name} must be a positive integer, got {value!r}")
  return int(value)


class AgentLoop:
  """Runs groups of multi-turn episodes with an `Engine` (see the module docstring).

  Args:
    engine: the sampler (in-process `JaxEngine` or the SGLang client).
    tokenizer: the policy's tokenizer; its chat template shapes every segment.
    max_turns: the loop's turn budget per episode (None: the environment's own only).
    max_new_tokens_per_turn: most tokens one reply may have.
    max_total_tokens: most tokens a whole transcript (prompt included) may have.
    sampling: temperature / top-p / top-k / stop ids. Its max_new_tokens is replaced per turn;
      empty stop_token_ids mean the tokenizer's; the template's end-of-turn token is always
      added, so a reply ends where the chat format ends a turn.
    reply_prefix: text forced at the start of every reply (e.g. "<answer>" for a model too
      small to follow the answer format on its own); "" for none.
    stop_strings: texts that end a reply (e.g. "</answer>"), kept in it.
    max_abs_reward: the reward bound: a step reward with |reward| above it (or not finite in
      float32) is an environment error of its episode.
  """

  def __init__(self, engine: Engine, tokenizer: Tokenizer, *, max_turns: int | None = None,
               max_new_tokens_per_turn: int, max_total_tokens: int, sampling: SamplingParams,
               reply_prefix: str = "", stop_strings: Sequence[str] = (),
               max_abs_reward: float = DEFAULT_MAX_ABS_REWARD):
    self.engine = engine
    self.tokenizer = tokenizer
    self.max_turns = None if max_turns is None else _positive_int("max_turns", max_turns)
    self.max_new_tokens_per_turn = _positive_int("max_new_tokens_per_turn",
                                                 max_new_tokens_per_turn)
    self.max_total_tokens = _positive_int("max_total_tokens", max_total_tokens)
    if not isinstance(sampling, SamplingParams):
      raise ValueError(f"AgentLoop: sampling must be a SamplingParams, got {sampling!r}")
    self._check_engine_limits(engine)
    self.chat = ChatFormat(tokenizer, reply_prefix)
    if isinstance(stop_strings, str) or not all(isinstance(x, str) and x for x in stop_strings):
      raise ValueError(f"AgentLoop: stop_strings must be a list of non-empty strings, "
                       f"got {stop_strings!r}")
    self.stop_strings = tuple(stop_strings)
    if not (is_number(max_abs_reward) and 0 < max_abs_reward <= _FLOAT32_MAX):
      raise ValueError(f"AgentLoop: max_abs_reward must be a number in (0, float32 max], got "
                       f"{max_abs_reward!r}")
    self.max_abs_reward = float(max_abs_reward)
    stops = tuple(sampling.stop_token_ids) or tokenizer.stop_token_ids
    if len(self.chat.end_of_turn_ids) == 1 and self.chat.end_of_turn_ids[0] not in stops:
      stops += self.chat.end_of_turn_ids
    self.sampling = dataclasses.replace(sampling, stop_token_ids=stops)
    self.envs = EnvPool()

  def _check_engine_limits(self, engine: Engine) -> None:
    """Fails now, not turns into a run, when an engine with fixed buckets (JaxEngine) could
    not take the longest prompt (max_total_tokens - 1) or the longest reply."""
    limits = engine.limits()
    if not limits.prompt_fits(self.max_total_tokens - 1):
      raise ValueError(f"AgentLoop: max_total_tokens={self.max_total_tokens} allows prompts of "
                       f"{self.max_total_tokens - 1} tokens but the engine's largest prompt "
                       f"bucket is {limits.max_prompt_tokens}")
    if not limits.reply_fits(self.max_new_tokens_per_turn):
      raise ValueError(f"AgentLoop: max_new_tokens_per_turn={self.max_new_tokens_per_turn} is "
                       f"above the engine's largest new-token bucket {limits.max_new_tokens}")

  def prompt_ids(self, task: Task, extra_system_text: str = "") -> list[int]:
    """The prompt of the task's episode with `extra_system_text` (a hint, a teacher block)
    after the system prompt. Rollouts use it with their hint; the trainer uses it to build
    teacher prefixes and hint-free student prefixes: a trajectory's response
    (`token_ids[prompt_len:]`) follows any of them unchanged."""
    env = self.envs.acquire(task)
    observation = env.reset(task.seed)
    ids = self.chat.prompt_ids(join_system_text(env.system_prompt, extra_system_text),
                               observation)
    self.envs.release(task, env)
    return ids

  def run(self, tasks: Sequence[Task], group_size: int,
          hints: Mapping[str, str] | None = None, seed: int = 0,
          desc: str = "rollout") -> Rollouts:
    """G rollouts of every task (in order), with the environment's hint where `hints` has one,
    and the run's counts (`Rollouts`; a group spoilt by a failed request or an environment
    error is left out).

    A progress bar named `desc` counts the turns played against the turns budgeted
    (`rollout.progress`; process 0; it clears when done)."""
    group_size = _positive_int("group_size", group_size)
    hints = dict(hints or {})
    for env_name, hint in hints.items():
      if not isinstance(hint, str):
        raise ValueError(f"AgentLoop.run: hints[{env_name!r}] must be a string, got {hint!r}")
    if not is_int(seed):
      raise ValueError(f"AgentLoop.run: seed must be an integer, got {seed!r}")
    env_errors: list[EnvError] = []   # appended as they raise
    engine_faults = EngineFaults()
    episodes = [episode for task in tasks
                for episode in self._start(task, group_size, hints.get(task.env, ""),
                                           env_errors)]
    # Rollouts must not depend on what the engine generated before this run (JaxEngine's
    # prefix reuse would otherwise share keys/values computed in other batch shapes).
    self.engine.reset_prefix_cache()
    live = [e for e in episodes if not e.done]   # not those whose group failed to reset
    slot = {id(e): i for i, e in enumerate(live)}
    with TurnBar(desc, [self._turn_budget(e) for e in live],
                 disable=jax.process_index() != 0) as bar:
      while live:
        generation = self.engine.generate_counted([self._request(e, seed) for e in live],
                                                  **self._engine_options())
        results, engine_faults = generation.results, engine_faults + generation.faults
        if len(results) != len(live):
          raise RuntimeError(f"engine returned {len(results)} results for {len(live)} requests")
        for episode, result in zip(live, results):
          if result is None:
            episode.failed = episode.done = True
          else:
            self._advance(episode, result, env_errors)
        bar.played([(slot[id(e)], len(e.turns), e.done) for e in live],
                   sum(len(r.output_ids) for r in results if r is not None))
        live = [e for e in live if not e.done]
    for episode in episodes:
      self._release(episode)
    groups = [episodes[i * group_size:(i + 1) * group_size] for i in range(len(tasks))]
    kept = [Group(task=task, trajectories=[e.to_trajectory() for e in group],
                  system_prompt=group[0].system_prompt,
                  first_observation=group[0].first_observation)
            for task, group in zip(tasks, groups)
            if not any(e.failed or e.env_error for e in group)]
    rollouts = Rollouts(tuple(kept), RolloutFaults(len(tasks) - len(kept), engine_faults),
                        tuple(env_errors))
    self._report_env_errors(rollouts, len(episodes))
    return rollouts

  def _turn_budget(self, episode: _Episode) -> int | None:
    """The most turns the episode may play: the loop's budget and the environment's own
    (known for `envs.Environment` subclasses), None when neither is known."""
    own = episode.env.max_turns if isinstance(episode.env, envs.Environment) else None
    budgets = [b for b in (self.max_turns, own) if b is not None]
    return min(budgets) if budgets else None

  def _release(self, episode: _Episode) -> None:
    if episode.env is not None:
      self.envs.release(episode.task, episode.env)
      episode.env = None

  def _env_failed(self, episode: _Episode, stage: str, error: Exception,
                  env_errors: list[EnvError]) -> None:
    """Ends the episode as errored (listed in the run's `env_errors`) and discards its
    environment instance."""
    episode.env_error = EnvError(task=episode.task, rollout=episode.rollout, stage=stage,
                                 message=f"{type(error).__name__}: {error}"[:2000])
    episode.done = True
    env_errors.append(episode.env_error)
    log.debug("task %s rollout %d: environment %s raised %r", episode.task.key, episode.rollout,
              stage, error)
    self.envs.discard(episode.env)
    episode.env = None

  def _report_env_errors(self, rollouts: Rollouts, episodes: int) -> None:
    if not rollouts.env_errors:
      return
    first = rollouts.env_errors[0]
    what = (f"{len(rollouts.env_errors)} of {episodes} episodes ended in an environment error "
            f"(first: task {first.task.key} rollout {first.rollout}, {first.stage}: "
            f"{first.message})")
    if not rollouts.groups:
      raise EnvironmentFailure(f"{what}; every group of this run was dropped, so there is "
                               "nothing to train on or evaluate", rollouts)
    log.warning("%s; their groups are left out", what)

  # ---- one episode ---------------------------------------------------------------------------

  def _start(self, task: Task, group_size: int, hint: str,
             env_errors: list[EnvError]) -> list[_Episode]:
    if not isinstance(task, Task):
      raise ValueError(f"AgentLoop.run: tasks must be Task objects, got {task!r}")
    started = []
    prompt = None
    too_long = False   # the task's prompt leaves no room: the other rollouts are not reset
    for rollout in range(group_size):
      episode = _Episode(task=task, rollout=rollout, env=None, hint=hint, token_ids=[],
                         loss_mask=[], logprobs=[], prompt_len=0)
      started.append(episode)
      if too_long:
        continue
      episode.env = self.envs.acquire(task)   # an unknown name or knob is a config error
      try:
        observation = episode.env.reset(task.seed)
        system_prompt = episode.env.system_prompt
        if not isinstance(observation, str) or not isinstance(system_prompt, str):
          raise ValueError(f"{task.env}: reset returned {type(observation).__name__} and "
                           f"system_prompt is {type(system_prompt).__name__}; expected str")
      except Exception as error:  # any environment failure  # pylint: disable=broad-except
        self._env_failed(episode, "reset", error, env_errors)
        continue
      episode.system_prompt, episode.first_observation = system_prompt, observation
      if prompt is None:  # the G rollouts of a task share one prompt
        prompt = self.chat.prompt_ids(join_system_text(system_prompt, hint), observation)
        if len(prompt) >= self.max_total_tokens:
          # The environment's opening is too long for the budget: its group is dropped (the
          # other rollouts of the task would open the same way, so none is started).
          self._env_failed(episode, "reset", ValueError(
              f"the prompt (system prompt and first observation) has {len(prompt)} tokens, "
              f"which leaves no room under max_total_tokens={self.max_total_tokens}"),
              env_errors)
          too_long = True
          continue
      episode.token_ids, episode.prompt_len = list(prompt), len(prompt)
      episode.loss_mask, episode.logprobs = [0] * len(prompt), [0.0] * len(prompt)
    if any(e.env_error for e in started):   # the group is dropped: play none of it
      for episode in started:
        episode.done = True
    return started

  def _check_reward(self, reward: float) -> None:
    """ValueError when a step reward is outside the reward bound (module docstring). The bound
    is at most float32's largest value, so a reward within it stays finite in float32."""
    if not abs(reward) <= self.max_abs_reward:   # also NaN
      raise ValueError(f"step reward {reward!r} is outside the reward bound: expected "
                       f"|reward| <= max_abs_reward={self.max_abs_reward:g} (and finite in "
                       "float32, the dtype it is trained in)")

  def _request(self, episode: _Episode, seed: int) -> GenerationRequest:
    room = self.max_total_tokens - len(episode.token_ids)
    params = dataclasses.replace(self.sampling,
                                 max_new_tokens=min(self.max_new_tokens_per_turn, room))
    return GenerationRequest(prompt_ids=list(episode.token_ids), params=params,
                             seed=sampling_seed(seed, episode.task, episode.rollout,
                                                len(episode.turns)))

  def _engine_options(self) -> dict:
    """The savings offered to the engine (see the module docstring)."""
    options: dict = {"shared_prefill": True}
    if self.stop_strings:
      options["stop_check"] = lambda _, output: self._holds_stop_string(output)
    return options

  def _holds_stop_string(self, output: Sequence[int]) -> bool:
    text = self.tokenizer.decode(list(output), skip_special_tokens=True)
    return any(s in text for s in self.stop_strings)

  def _stop_length(self, output: Sequence[int]) -> int:
    """How many of the reply's ids to keep: up to the first at which the decoded text
    contains a stop string, else all."""
    if not self.stop_strings or not self._holds_stop_string(output):   # usually one decode
      return len(output)
    return next(n for n in range(1, len(output) + 1) if self._holds_stop_string(output[:n]))

  def _advance(self, episode: _Episode, result: GenerationResult,
               env_errors: list[EnvError]) -> None:
    """Appends the reply, steps the environment and appends its observation (or ends)."""
    output = [int(t) for t in result.output_ids]
    if not output or len(result.logprobs) != len(output):
      raise RuntimeError(f"engine result for task {episode.task.key} breaks the Engine "
                         f"contract: {len(output)} output ids, {len(result.logprobs)} log-probs")
    keep = self._stop_length(output)
    output = output[:keep]
    episode.token_ids += output
    episode.loss_mask += [1] * len(output)
    episode.logprobs += [float(x) for x in result.logprobs[:keep]]
    action_text = self.chat.reply_prefix + self.tokenizer.decode(output, skip_special_tokens=True)
    try:
      observation, reward, done, info = check_step_result(episode.env.step(action_text),
                                                          episode.task.env)
      self._check_reward(reward)
    except Exception as error:  # any environment failure  # pylint: disable=broad-except
      self._env_failed(episode, "step", error, env_errors)
      return
    episode.turns.append(Turn(action_text=action_text, observation=observation,
                              reward=float(reward), done=bool(done),
                              invalid=bool(info["invalid"]), events=list(info["events"])))
    episode.reward += float(reward)
    if done:
      episode.success = bool(info["success"])
      episode.truncated = bool(info["truncated"])
      episode.done = True
      return
    if self.max_turns is not None and len(episode.turns) >= self.max_turns:
      episode.truncated = episode.done = True
      return
    eot = list(self.chat.end_of_turn_ids)
    closing = [] if output[-len(eot):] == eot else eot
    segment = closing + self.chat.observation_ids(observation)
    if len(episode.token_ids) + len(segment) >= self.max_total_tokens:
      episode.truncated = episode.done = True
      return
    episode.token_ids += segment
    episode.loss_mask += [0] * len(segment)
    episode.logprobs += [0.0] * len(segment)
