"""Run a ``lakelog serve`` process from Python (notebooks, scripts, demos).

    from lakelog.local import LocalServer

    with LocalServer() as server:         # a fresh data directory, a free port
        print(server.url, server.data_dir)
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType

import httpx

from log_tables import parent_death


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalServer:
    """A server on 127.0.0.1; ``settings`` become ``LAKELOG_*`` variables (e.g.
    ``tier_interval_ms=0``). Without ``data_dir`` it uses a temporary directory that
    ``stop`` removes. Authentication is off (it listens on loopback only) unless
    ``auth="api-key"`` is passed; no SQL endpoint runs unless ``sql_port`` is passed."""

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, port: int | None = None,
                 **settings: object) -> None:
        self._owned = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="lakelog-")) / (
            "data" if data_dir is None else "")
        self.port = port or free_port()
        settings.setdefault("auth", "none")
        settings.setdefault("sql_port", 0)
        self.settings = {f"LAKELOG_{k.upper()}": str(v) for k, v in settings.items()}
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopped = threading.Event()
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60) -> LocalServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lakelog = Path(sys.executable).parent / "lakelog"
        self.proc = self._spawn([str(lakelog), "serve", "--data-dir", str(self.data_dir),
                                 "--port", str(self.port), "--log-level", "warning"])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._end_process()
                raise RuntimeError(f"lakelog serve exited with {self.proc.returncode}; "
                                   f"see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self._end_process()  # not left running behind the error
        raise RuntimeError(f"lakelog serve did not answer within {timeout_s:.0f} s; "
                           f"see {self.log_path}")

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start the server so that it stops (SIGTERM, a clean shutdown) when this Python
        process dies, a notebook kernel restarted for one: it would otherwise hold its
        port and data directory for good. Linux's parent-death signal does that, set by
        a trampoline that then execs the server; it fires when the *thread* that forked
        the child ends, so the fork happens on a thread of its own that lives until
        ``stop``."""
        if parent_death.supported():
            argv = [sys.executable, "-m", "log_tables.parent_death", str(os.getpid()),
                    signal.SIGTERM.name, *argv]
        started: list[subprocess.Popen[bytes] | BaseException] = []
        ready = threading.Event()

        def run() -> None:
            try:
                with self.log_path.open("ab") as log:
                    started.append(subprocess.Popen(argv, env={**os.environ, **self.settings},
                                                    stdout=log, stderr=subprocess.STDOUT))
            except BaseException as exc:  # raised to start()'s caller below
                started.append(exc)
            ready.set()
            self._stopped.wait()

        self._stopped.clear()
        threading.Thread(target=run, name=f"lakelog-local-server-{self.port}",
                         daemon=True).start()
        ready.wait()
        if isinstance(started[0], BaseException):
            raise started[0]
        return started[0]

    def _end_process(self) -> None:
        """SIGTERM (a clean shutdown; SIGKILL after 90 s) and let the spawning thread go."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stopped.set()

    def wait_for_sql(self, timeout_s: float = 240) -> str:
        """The SQL endpoint's Spark Connect URL once it is ready (started with
        ``sql_port=...``; its Spark takes seconds to start)."""
        from lakelog.endpoint.state import read_state

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = read_state(self.data_dir)
            if state is not None and state.get("state") == "failed":
                raise RuntimeError(f"the SQL endpoint failed to start: {state.get('error')}")
            if state is not None and state.get("state") == "ready" and state.get("connect"):
                return str(state["connect"])
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"lakelog serve is not running; see {self.log_path}")
            time.sleep(0.2)
        raise RuntimeError(f"the SQL endpoint was not ready within {timeout_s:.0f} s "
                           f"(is sql_port set?); see {self.log_path}")

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), then remove a temporary data directory."""
        self._end_process()
        self.proc = None
        if self._owned:
            shutil.rmtree(self.data_dir.parent, ignore_errors=True)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
