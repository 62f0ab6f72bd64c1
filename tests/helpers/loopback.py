"""A threaded stdlib HTTP server on 127.0.0.1 (an ephemeral port) for a test's own handler
class: the raw servers of the fault tests, which shape their replies byte by byte, and the
listening socket every fake server of the tests binds (`LoopbackHTTPServer`)."""
from __future__ import annotations

import http.server
import threading


class LoopbackHTTPServer(http.server.ThreadingHTTPServer):
  """A threaded HTTP server on 127.0.0.1, an ephemeral port, with a listen backlog as deep as
  a real server's. The stdlib's default backlog of 5 overflows when a few client threads per
  process connect at once on a loaded machine, and Linux then resets some connections: the
  client's retry counters (`rollout/server_retries`) would count the test server's queue,
  not the code under test. Measured on 2 cores with two busy loops beside: 2 processes × 8
  threads posting at once had 53 of 16,000 connections reset at a backlog of 5 and none of
  9,600 at 1,024, and the two-process roll-out test (tests/integration/
  test_multihost_rollouts.py) saw a retry the one-process run did not in 3 of 26 runs."""

  request_queue_size = 1024
  daemon_threads = True

  def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]):
    super().__init__(("127.0.0.1", 0), handler)


class QuietHandler(http.server.BaseHTTPRequestHandler):
  """HTTP/1.1, no request log on stderr."""

  protocol_version = "HTTP/1.1"

  def log_message(self, *args):
    pass


class Loopback:
  """Serves `handler` (a `QuietHandler` subclass) while inside `with`."""

  def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]):
    self.httpd = LoopbackHTTPServer(handler)
    self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

  @property
  def port(self) -> int:
    return self.httpd.server_address[1]

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.port}"

  def __enter__(self):
    self.thread.start()
    return self

  def __exit__(self, *exc):
    self.httpd.shutdown()
    self.httpd.server_close()
    self.thread.join(timeout=5)
