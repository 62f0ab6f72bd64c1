"""A TCP port for a server or a JAX coordinator that a test starts in another process.

Binding port 0 and closing it hands back a port from the kernel's ephemeral range, which any
socket on the machine (another xdist worker's HTTP client, gRPC channel) may be given before
the child process binds it. These ports come from below that range, in a block of their own
per xdist worker, each used once per worker.
"""

from __future__ import annotations

import itertools
import os
import socket

_FIRST = 20_000          # below Linux's default ephemeral range (32768-60999)
_BLOCK = 1_000           # ports per xdist worker
_next = itertools.count()


def _worker_index() -> int:
  name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")   # "gw3"; unset without xdist
  return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0


def free_port() -> int:
  """A port no other worker of this test session is handed, free when this returns."""
  base = _FIRST + _BLOCK * _worker_index()
  for _ in range(_BLOCK):
    port = base + next(_next) % _BLOCK
    with socket.socket() as sock:
      try:
        sock.bind(("127.0.0.1", port))
      except OSError:
        continue   # held by something outside this test session
      return port
  raise RuntimeError(f"no free port in {base}..{base + _BLOCK - 1}")
