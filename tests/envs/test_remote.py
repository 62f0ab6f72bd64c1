"""`RemoteEnvironment` against a loopback AgentGym-style server written here (issue 12): the exact
JSON it speaks (TextCraft/BabyAI, ALFWorld and WebShop dialects), retries of idempotent calls
only, timeouts, and a dead server reported per episode while the run goes on."""
from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from rised_jax import envs
from rised_jax.envs.remote import ALFWorld, RemoteEnvError, RemoteEnvironment, WebShop
from rised_jax.model import tiny
from rised_jax import http_retry
from rised_jax.rollout.agent_loop import AgentLoop, EnvironmentFailure
from rised_jax.rollout.base import GenerationResult, SamplingParams
from rised_jax.types import Task
from tests.helpers.fake_engine import FixedReplyEngine
from tests.helpers.loopback import LoopbackHTTPServer

LIFETIME_S = 120.0   # the server shuts itself down after this, whatever the test does


class CounterServer:
  """AgentGym-style server of a counting game: item i asks to reach 1 + i % 3 with "inc";
  "dec" lowers the counter. `dialect` picks the field names ("agentgym": id / data_idx,
  "alfworld": id / game, "webshop": env_idx / session_id, with WebShop's reply shapes).
  `faults[path]` is a list of statuses (or "delay", "drop") answered to the next calls."""

  def __init__(self, dialect: str = "agentgym", delay_s: float = 1.0):
    self.dialect = dialect
    self.delay_s = delay_s
    self.id_key = "env_idx" if dialect == "webshop" else "id"
    self.item_key = {"agentgym": "data_idx", "alfworld": "game", "webshop": "session_id"}[dialect]
    self.calls: list[tuple[str, dict]] = []
    self.faults: dict[str, list] = {}
    self.sessions: dict[int, dict] = {}
    self.lock = threading.Lock()
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def log_message(self, *args):
        pass

      def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        path = self.path.strip("/")
        with server.lock:
          server.calls.append((path, body))
          fault = server.faults.get(path, []) and server.faults[path].pop(0)
        if fault == "drop":
          self.close_connection = True
          return
        if fault == "delay":
          time.sleep(server.delay_s)
        if isinstance(fault, int):
          self._send(fault, {"detail": f"injected {fault}"})
          return
        self._send(200, server.answer(path, body))

      def _send(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
          self.wfile.write(data)
        except BrokenPipeError:   # the client stopped waiting (the "delay" fault)
          pass

    self.httpd = LoopbackHTTPServer(Handler)
    self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
    self.timer = threading.Timer(LIFETIME_S, self.stop)
    self.timer.daemon = True

  @property
  def url(self) -> str:
    return "http://127.0.0.1:%d" % self.httpd.server_address[1]

  def __enter__(self):
    self.thread.start()
    self.timer.start()
    return self

  def __exit__(self, *exc):
    self.stop()

  def stop(self):
    self.timer.cancel()
    self.httpd.shutdown()
    self.httpd.server_close()

  def answer(self, path: str, body: dict):
    with self.lock:
      if path == "create":
        sid = len(self.sessions)
        self.sessions[sid] = {}
        return sid if self.dialect == "webshop" else {"id": sid}
      session = self.sessions.get(body.get(self.id_key))
      if session is None:
        return {"error": f"The id {body.get(self.id_key)} is not valid."}
      if path == "close":
        del self.sessions[body[self.id_key]]
        return {"closed": True}
      if path == "reset":
        session.update(target=1 + body[self.item_key] % 3, count=0)
        observation = self._observation(session)
        if self.dialect == "webshop":
          return [observation, None]
        return {"observation": observation, "available_actions": ["inc", "dec"]}
      if path == "step":
        session["count"] += {"inc": 1, "dec": -1}.get(body["action"], 0)
        done = session["count"] == session["target"]
        key = "state" if self.dialect == "webshop" else "observation"
        return {key: self._observation(session), "reward": float(done), "done": done}
    return {"error": f"no route {path}"}

  @staticmethod
  def _observation(session):
    return f"Counter {session['count']}, target {session['target']}."


def _env(cls, server, **knobs):
  return cls(url=server.url, items=10, timeout_s=2.0, retries=2, backoff_s=0.0, max_turns=3,
             **knobs)


@pytest.mark.parametrize("cls, dialect, id_key, item_key, extra", [
    (RemoteEnvironment, "agentgym", "id", "data_idx", {}),
    (ALFWorld, "alfworld", "id", "game", {"world_type": "Text"}),
    (WebShop, "webshop", "env_idx", "session_id", {}),
])
def test_an_episode_speaks_the_documented_json(cls, dialect, id_key, item_key, extra):
  with CounterServer(dialect) as server:
    env = _env(cls, server, item_offset=3)
    assert env.instance_key_for(14) == f"{cls.name}:7" and server.calls == []   # no request
    assert env.reset(14) == "Counter 0, target 2."          # item 3 + 14 % 10 = 7 -> 1 + 7 % 3
    assert env.instance_key() == f"{cls.name}:7"
    first = env.step("I will count. <answer>inc</answer>")
    second = env.step("<answer> inc </answer>")
    env.close()
    assert server.calls == [
        ("create", {}),
        ("reset", {id_key: 0, item_key: 7, **extra}),
        ("step", {id_key: 0, "action": "inc"}),
        ("step", {id_key: 0, "action": "inc"}),
        ("close", {id_key: 0}),
    ]
  assert first == ("Counter 1, target 2.", 0.0, False,
                   {"success": False, "invalid": False, "events": [], "truncated": False,
                    "turn": 1, "action": "inc"})
  events = ["repeated_action", "success"]
  assert second == ("Counter 2, target 2.", 1.0, True,
                    {"success": True, "invalid": False, "events": events, "truncated": False,
                     "turn": 2, "action": "inc"})


def test_local_turn_rules_inadmissible_empty_and_the_turn_budget():
  with CounterServer() as server:
    env = _env(RemoteEnvironment, server)
    env.reset(0)                                            # target 1
    _, _, done, info = env.step("no tags and nothing")      # a line is an action: sent
    assert info["invalid"] and info["events"] == ["invalid_action"] and not done
    _, _, done, info = env.step("<answer></answer>")         # empty: not sent
    assert info["events"] == ["invalid_action"] and not done
    observation, _, done, info = env.step("<answer>dec</answer>")
    assert done and info["truncated"] and not info["success"]
    assert observation.endswith("Out of turns: episode over (failure).")
    assert [c for c, _ in server.calls].count("step") == 2


def test_idempotent_calls_are_retried_a_step_only_when_refused():
  with CounterServer() as server:
    env = _env(RemoteEnvironment, server)
    server.faults = {"create": [500], "reset": ["drop", 503]}
    env.reset(0)
    assert env.retries == 3
    server.faults = {"step": [503]}                          # refused: sent again
    assert env.step("<answer>dec</answer>")[0] == "Counter -1, target 1."
    assert env.retries == 4
    server.faults = {"step": [500]}                          # maybe played: not sent again
    with pytest.raises(http_retry.HTTPRequestError, match="HTTP 500"):
      env.step("<answer>inc</answer>")
    server.faults = {"step": ["delay"]}
    env.timeout_s = 0.3
    with pytest.raises(http_retry.HTTPRequestError, match="timed out after 0.3 s"):
      env.step("<answer>inc</answer>")
    assert [c for c, _ in server.calls].count("step") == 4   # refused + resent, the 500, the late one
    server.faults = {"step": []}
    with pytest.raises(RemoteEnvError, match=r"the server reported an error: The id 99"):
      env.session = 99
      env.step("<answer>inc</answer>")


@pytest.fixture
def aliases(monkeypatch):
  registry = dict(envs._REGISTRY)
  envs.register("counter", "rised_jax.envs.remote:RemoteEnvironment")
  envs.register("counter_dead", "rised_jax.envs.remote:RemoteEnvironment")
  yield
  envs._REGISTRY.clear()
  envs._REGISTRY.update(registry)
  envs._ENVS.clear()
  envs._KEYS.clear()


def test_a_dead_server_errors_its_episodes_and_the_run_goes_on(aliases):
  tokenizer = tiny.build_tokenizer(["inc", "dec", "Counter", "target", "<", ">", "/", "answer",
                                    ",", ".", *"0123456789", "You", "are", "an", "agent"])
  loop = AgentLoop(FixedReplyEngine(tokenizer, "<answer>inc</answer>"), tokenizer,
                   max_new_tokens_per_turn=8, max_total_tokens=512,
                   sampling=SamplingParams(max_new_tokens=8))
  with CounterServer() as doomed:
    dead_url = doomed.url                                   # nothing listens there any more
  knobs = dict(items=10, timeout_s=2.0, retries=1, backoff_s=0.0, max_turns=3)
  with CounterServer() as live:
    tasks = [Task("counter", 1, dict(knobs, url=live.url)),
             Task("counter_dead", 1, dict(knobs, url=dead_url)),
             Task("counter", 2, dict(knobs, url=live.url))]
    run = loop.run(tasks, group_size=2)
    groups = run.groups
    assert [g.task.seed for g in groups] == [1, 2] and run.faults.groups_dropped == 1
    assert [t.success for g in groups for t in g.trajectories] == [True] * 4
    assert [len(t.turns) for g in groups for t in g.trajectories] == [2, 2, 3, 3]
    assert [(e.task.env, e.stage) for e in run.env_errors] == [("counter_dead", "reset")] * 2
    assert "connection" in run.env_errors[0].message
    # The live sessions were kept for the next run: no second /create.
    creates = [c for c, _ in live.calls].count("create")
    loop.run(tasks[::2], group_size=2)
    assert [c for c, _ in live.calls].count("create") == creates == 4
    with pytest.raises(EnvironmentFailure, match="2 of 2 episodes ended in an environment error"):
      loop.run(tasks[1:2], group_size=2)
    loop.envs.close()                                       # (also done at process exit)
    assert [c for c, _ in live.calls].count("close") == 4 and live.sessions == {}
