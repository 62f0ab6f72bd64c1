"""An environment served over HTTP with the AgentGym create / reset / step / close protocol.

AgentGym (github.com/WooooDyy/AgentGym) serves each suite (ALFWorld, WebShop, TextCraft,
BabyAI, SciWorld, ...) from its own FastAPI server; `RemoteEnvironment` plays any of them from
another host, so the suite's dependencies never enter this process. Reference it from a config
by import path, under an alias per server:

  envs.aliases = {"alfworld": "rised_jax.envs.remote:ALFWorld"}
  envs.names = ["alfworld"]
  envs.difficulty = {"alfworld": dict(url="http://envhost:36001", items=3553)}

The JSON spoken (every request a POST with a JSON body; ID is the session id the server gave,
sent under `id_field`; ITEM is the instance index, sent under `item_field`):

  POST /create  {}                                  -> {"id": ID} | {"env_idx": ID} | ID
  POST /reset   {id_field: ID, item_field: ITEM, **reset_extra}
                                                    -> {"observation": str,
                                                        "available_actions": [str]?} | [str, ...]
  POST /step    {id_field: ID, "action": str}       -> {"observation": str, "reward": number,
                                                        "done": bool, "available_actions": [str]?,
                                                        "success": bool?, "events": [str]?}
  POST /close   {id_field: ID}                      -> (ignored)

"state" is read where "observation" is absent (WebShop's /step). A 200 reply holding an
"error" key (AgentGym servers report their exceptions so) is an error, as is any reply of
another shape: it raises `RemoteEnvError`, which the agent loop counts as an environment error
of that episode (the run goes on; the instance is discarded and a new session created).
Optional fields beyond AgentGym's: "success" (otherwise success = done and reward >=
`success_reward`) and "events" (rule-judge events, `rised_jax.types.Event` values).

Instances: seed s plays item `item_offset + s % items`; the instance key is the item, known
without a request (`instance_key_for`), so building the evaluation set and the training stream
costs no server round trip. `items` must be the number of items the server holds.

Timeouts and retries (`rised_jax.http_retry`: a deadline per request, jittered exponential
backoff): /create, /reset and /close are retried on every transient error (a reset restarts
the item whatever happened before). /step is NOT idempotent — a step whose reply was lost may
have been played — so it is retried only when the server says it did not take the request
(HTTP 429 or 503); a step that times out or loses its connection errors the episode.

Reply size: a reply body is read up to `max_reply_bytes` (16 MiB by default); a larger one
stops the read at the cap and is an environment error naming it (`http_retry.ReplyTooLarge`).

Actions are read from the reply as by the built-ins: the last `<answer>…</answer>` (or, without
tags, the last non-empty line), whitespace-collapsed but not lower-cased (WebShop's
`click[Item Name]`). An empty action costs a turn and is not sent ("invalid_action"); one that
is not among the server's last `available_actions` (when it sends them) is sent, and reported
as "invalid_action"; a "give up" phrase ends the episode ("gave_up"). The turn budget is
`max_turns` (a truncated failure when it runs out).
"""
from __future__ import annotations

import logging
from typing import Any, ClassVar, Mapping

from rised_jax.checks import is_http_url, is_int, is_number
from rised_jax.envs import parsing
from rised_jax.envs.base import StepResult, check_float, check_int
from rised_jax import http_retry
from rised_jax.types import Event

log = logging.getLogger(__name__)
# The largest reply body read from the server (an observation is text: a web page at most).
DEFAULT_MAX_REPLY_BYTES = 16 << 20

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent acting in a text environment. Every turn you receive an observation; "
    "reply with exactly one action as <answer>ACTION</answer>, using the environment's own "
    "command syntax.")


class RemoteEnvError(RuntimeError):
  """The environment server failed or answered outside the protocol."""


def _is_refused(error: BaseException) -> bool:
  """The server answered that it did not take the request: safe to send a step again."""
  return isinstance(error, http_retry.HTTPRequestError) and error.status in (429, 503)


def _id_from(reply: Any, where: str) -> int | str:
  if isinstance(reply, Mapping):
    for key in ("id", "env_idx"):
      if key in reply:
        reply = reply[key]
        break
  if isinstance(reply, bool) or not isinstance(reply, (int, str)):
    raise RemoteEnvError(f"{where}: reply {reply!r:.200}; expected a session id, "
                         "{\"id\": ID} or {\"env_idx\": ID}")
  return reply


def _observation_from(reply: Mapping[str, Any], where: str) -> str:
  observation = reply.get("observation", reply.get("state"))
  if not isinstance(observation, str):
    raise RemoteEnvError(f"{where}: reply {dict(reply)!r:.200} has no string 'observation' "
                         "(or 'state')")
  return observation


def _actions_from(reply: Mapping[str, Any], where: str) -> list[str] | None:
  actions = reply.get("available_actions")
  if actions is None:
    return None
  if isinstance(actions, str) or not isinstance(actions, list) or not all(
      isinstance(a, str) for a in actions):
    raise RemoteEnvError(f"{where}: 'available_actions' is {actions!r:.200}; expected a list of "
                         "strings")
  return actions


def read_action(reply: Any) -> str:
  """The action text of a reply (module docstring); "" when there is none."""
  text = parsing.as_text(reply)
  answer = parsing.extract_answer(text)
  if answer is None:
    lines = [line for line in text.splitlines() if line.strip()]
    answer = lines[-1] if lines else ""
  return " ".join(answer.split())


class RemoteEnvironment:
  """One session on an AgentGym-style environment server (module docstring)."""

  name: ClassVar[str] = "remote"
  # AgentGym's field names differ per suite; subclasses below set a server's own.
  id_field: ClassVar[str] = "id"
  item_field: ClassVar[str] = "data_idx"
  default_reset_extra: ClassVar[Mapping[str, Any]] = {}

  def __init__(self, *, url: str, items: int, item_offset: int = 0, max_turns: int = 30,
               timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 0.5,
               success_reward: float = 1.0, system_prompt: str = DEFAULT_SYSTEM_PROMPT,
               reset_extra: Mapping[str, Any] | None = None,
               max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES):
    if not is_http_url(url):
      raise ValueError(f"{self.name}: url must be an http(s) URL, got {url!r}")
    if not isinstance(system_prompt, str) or not system_prompt.strip():
      raise ValueError(f"{self.name}: system_prompt must be a non-empty string")
    self.url = url.rstrip("/")
    self.items = check_int(self.name, "items", items, 1, 10**9)
    self.item_offset = check_int(self.name, "item_offset", item_offset, 0, 10**9)
    self.max_turns = check_int(self.name, "max_turns", max_turns, 1, 1000)
    self.timeout_s = check_float(self.name, "timeout_s", timeout_s, 1e-3, 86_400.0)
    self.success_reward = check_float(self.name, "success_reward", success_reward, -1e9, 1e9)
    self.retry_policy = http_retry.RetryPolicy(
        max_retries=check_int(self.name, "retries", retries, 0, 100),
        backoff_s=check_float(self.name, "backoff_s", backoff_s, 0.0, 600.0))
    self.max_reply_bytes = check_int(self.name, "max_reply_bytes", max_reply_bytes, 1, 1 << 40)
    self._system_prompt = system_prompt
    self.reset_extra = {**self.default_reset_extra, **dict(reset_extra or {})}
    self.session: int | str | None = None   # created on the first reset
    self.retries = 0   # retried requests of this instance (all its sessions)
    self._item: int | None = None
    self._turn = 0
    self._done = True
    self._actions: list[str] | None = None
    self._last_action: str | None = None

  # ---- protocol ------------------------------------------------------------------------

  @property
  def system_prompt(self) -> str:
    return self._system_prompt

  def item_of(self, seed: int) -> int:
    if not is_int(seed):
      raise ValueError(f"{self.name}: seed must be an integer, got {seed!r}")
    return self.item_offset + int(seed) % self.items

  def instance_key_for(self, seed: int) -> str:
    return f"{self.name}:{self.item_of(seed)}"

  def instance_key(self) -> str:
    if self._item is None:
      raise RuntimeError(f"{self.name}: call reset(seed) before instance_key()")
    return f"{self.name}:{self._item}"

  def reset(self, seed: int) -> str:
    item = self.item_of(seed)
    if self.session is None:
      self.session = _id_from(self._post("create", {}, idempotent=True), self._where("create"))
    reply = self._post("reset", {self.id_field: self.session, self.item_field: item,
                                 **self.reset_extra}, idempotent=True)
    where = self._where("reset")
    if isinstance(reply, list) and reply and isinstance(reply[0], str):
      observation, actions = reply[0], None   # WebShop: [observation, info]
    elif isinstance(reply, Mapping):
      self._check_error(reply, where)
      observation, actions = _observation_from(reply, where), _actions_from(reply, where)
    else:
      raise RemoteEnvError(f"{where}: reply {reply!r:.200}; expected an object with "
                           "'observation' or a list [observation, ...]")
    self._item, self._turn, self._done = item, 0, False
    self._actions, self._last_action = actions, None
    return observation

  def step(self, reply: Any) -> StepResult:
    if self._item is None or self._done:
      raise RuntimeError(f"{self.name}: call reset(seed) before step() (and after an episode "
                         "ends)")
    self._turn += 1
    action = read_action(reply)
    events: list[str] = []
    if action and action == self._last_action:
      events.append(Event.REPEATED_ACTION.value)
    if not action or parsing.normalize(action) in parsing.GIVE_UP_PHRASES:
      gave_up = bool(action)
      observation = ("You gave up." if gave_up else
                     f'Invalid action "{parsing.shown(reply)}". Answer with one action as '
                     "<answer>ACTION</answer>.")
      events.append(Event.GAVE_UP.value if gave_up else Event.INVALID_ACTION.value)
      return self._finish(observation, 0.0, gave_up, False, not gave_up, events, action)
    invalid = self._actions is not None and action not in self._actions
    if invalid:
      events.append(Event.INVALID_ACTION.value)
    answer = self._post("step", {self.id_field: self.session, "action": action},
                        idempotent=False)
    where = self._where("step")
    if not isinstance(answer, Mapping):
      raise RemoteEnvError(f"{where}: reply {answer!r:.200}; expected an object")
    self._check_error(answer, where)
    observation = _observation_from(answer, where)
    reward, done = answer.get("reward"), answer.get("done")
    if not is_number(reward) or not isinstance(done, bool):
      raise RemoteEnvError(f"{where}: reply has reward={reward!r}, done={done!r}; expected a "
                           "finite number and a boolean")
    success = answer.get("success", done and reward >= self.success_reward)
    server_events = answer.get("events", [])
    if not isinstance(success, bool) or isinstance(server_events, str) or not isinstance(
        server_events, list) or not all(isinstance(e, str) for e in server_events):
      raise RemoteEnvError(f"{where}: reply has success={success!r}, events="
                           f"{server_events!r:.200}; expected a boolean and a list of strings")
    events += [e for e in server_events if e not in events]
    if success and Event.SUCCESS.value not in events:
      events.append(Event.SUCCESS.value)
    self._actions = _actions_from(answer, where) if "available_actions" in answer \
        else self._actions
    return self._finish(observation, float(reward), done, success, invalid, events, action)

  def close(self) -> None:
    """Ends the server session (one attempt: the instance is being discarded anyway)."""
    session, self.session = self.session, None
    self._item, self._done = None, True
    if session is None:
      return
    try:
      http_retry.request_json("POST", f"{self.url}/close", {self.id_field: session},
                              timeout_s=min(self.timeout_s, 5.0),
                              max_reply_bytes=self.max_reply_bytes)
    except http_retry.HTTPRequestError as error:
      log.debug("%s: closing session %r failed: %s", self.name, session, error)

  # ---- helpers ---------------------------------------------------------------------------

  def _finish(self, observation: str, reward: float, done: bool, success: bool, invalid: bool,
              events: list[str], action: str) -> StepResult:
    truncated = not done and self._turn >= self.max_turns
    self._done = done or truncated
    self._last_action = action or None
    if truncated:
      observation += "\nOut of turns: episode over (failure)."
    info = {"success": bool(success and done), "invalid": invalid, "events": events,
            "truncated": truncated, "turn": self._turn, "action": action or None}
    return observation, reward, self._done, info

  def _where(self, path: str) -> str:
    return f"{self.name} POST {self.url}/{path}"

  @staticmethod
  def _check_error(reply: Mapping[str, Any], where: str) -> None:
    if "error" in reply:
      raise RemoteEnvError(f"{where}: the server reported an error: {reply['error']!s:.500}")

  def _post(self, path: str, payload: Mapping[str, Any], *, idempotent: bool) -> Any:
    def count(error: BaseException, wait_s: float) -> None:
      self.retries += 1
      log.info("%s: retrying in %.2f s after %s", self._where(path), wait_s, error)

    return http_retry.call_with_retry(
        lambda: http_retry.request_json("POST", f"{self.url}/{path}", dict(payload),
                                        timeout_s=self.timeout_s,
                                        max_reply_bytes=self.max_reply_bytes),
        self.retry_policy, on_retry=count,
        is_transient=(lambda e: isinstance(e, http_retry.HTTPRequestError) and e.retryable)
        if idempotent else _is_refused)


class ALFWorld(RemoteEnvironment):
  """AgentGym's agentenv-alfworld server: sessions under "id", games under "game", the text
  world; it sends the admissible commands as available_actions."""

  name = "alfworld"
  id_field = "id"
  item_field = "game"
  default_reset_extra = {"world_type": "Text"}


class WebShop(RemoteEnvironment):
  """AgentGym's agentenv-webshop server: sessions under "env_idx", goals under "session_id";
  the reward is the purchase score in [0, 1], a success only at 1."""

  name = "webshop"
  id_field = "env_idx"
  item_field = "session_id"
