"""A threaded stdlib HTTP server on 127.0.0.1 (an ephemeral port) for a test's own handler
class: the raw servers of the fault tests, which shape their replies byte by byte."""
from __future__ import annotations

import http.server
import threading


class QuietHandler(http.server.BaseHTTPRequestHandler):
  """HTTP/1.1, no request log on stderr."""

  protocol_version = "HTTP/1.1"

  def log_message(self, *args):
    pass


class Loopback:
  """Serves `handler` (a `QuietHandler` subclass) while inside `with`."""

  def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]):
    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    self.httpd.daemon_threads = True
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
