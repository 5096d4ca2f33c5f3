"""Ports for the servers the tests start, apart for each pytest-xdist worker.

``lakelog.local.free_port`` binds port 0 and closes it: the port is free when asked, but
another process may take it before the server binds it. Two workers starting servers at
once met exactly that (a broker failed to bind, and its /healthz was answered by the
other worker's server on the same port). Here each worker takes ports from a range of
its own, below the kernel's ephemeral range (so no client socket takes one either), in
turn, each checked free by a bind. ``install`` puts this in place of every
``free_port`` the tests and the code they run in this process use; servers started as
other programs (``lakelog cluster up``) still use the kernel's.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading

PER_WORKER = 4000
FIRST = 20_000

_lock = threading.Lock()
_turn: itertools.count[int] = itertools.count()


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # one process: the first range
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


def free_port() -> int:
    base = FIRST + (_worker_index() % 3) * PER_WORKER
    with _lock:
        for _ in range(PER_WORKER):
            port = base + next(_turn) % PER_WORKER
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    raise RuntimeError(f"no free port in {base}..{base + PER_WORKER - 1}")


def install() -> None:
    import lakelog.local
    import lakelog.zookeeper

    lakelog.local.free_port = free_port
    lakelog.zookeeper.free_port = free_port
