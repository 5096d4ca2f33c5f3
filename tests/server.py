"""A real ``lakelog serve`` process on 127.0.0.1 for integration tests."""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from lakelog.local import free_port

LAKELOG = Path(sys.executable).parent / "lakelog"
CLUSTER = "/v3/clusters/lakelog"


def process_alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


class ServerProcess:
    """Start, stop (SIGTERM), kill (SIGKILL) and restart a server on one data directory."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None, *,
                 host: str = "127.0.0.1") -> None:
        self.data_dir = data_dir
        self.host = host
        self.port = free_port()
        # Scheduled tiering and the SQL endpoint start Spark beside the server: only tests
        # that want them turn them on. Authentication is off (loopback) except in the tests of security.
        self.env = {**os.environ, "LAKELOG_AUTH": "none", "LAKELOG_TIER_INTERVAL_MS": "0",
                    "LAKELOG_RETENTION_INTERVAL_MS": "0", "LAKELOG_COMPACT_INTERVAL_MS": "0",
                    "LAKELOG_UPKEEP_INTERVAL_MS": "0", "LAKELOG_SQL_PORT": "0",
                    **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.scheme = "http"
        self.verify: ssl.SSLContext | bool = True
        self.log_path = data_dir.parent / f"{data_dir.name}-server.log"
        self.command: list[str] = [str(LAKELOG)]
        """What runs ``serve`` (a test may put a launcher with a fault hook in front)."""

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30) -> ServerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [*self.command, "serve", "--data-dir", str(self.data_dir), "--host", self.host,
                 "--port", str(self.port), "--log-level", "warning"],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1,
                             verify=self.verify).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server did not answer within {timeout_s}s: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    def stop(self, timeout_s: float = 30, sig: signal.Signals = signal.SIGTERM) -> None:
        """SIGTERM, then check the shutdown was clean: every partition has its marker.

        (uvicorn re-raises the signal after its graceful shutdown, so the exit status
        says SIGTERM either way; the markers are what tells clean from not.)
        """
        assert self.proc is not None
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout_s)
        assert code in (0, -sig, 128 + sig), f"exit {code}: {self.log()}"
        hot = self.data_dir / "hot"
        partitions = [p for t in hot.iterdir() if not t.name.startswith(".")
                      for p in t.iterdir()] if hot.exists() else []
        unclean = [p for p in partitions if not (p / ".clean-shutdown").exists()]
        assert not unclean, f"no clean-shutdown marker in {unclean[:3]}: {self.log()}"

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def kill_all(self) -> None:
        """SIGKILL the server and every process it started (its job process, that one's
        Spark JVM) at once: the server runs in a process group of its own, and so does
        its job process (PySpark's daemon, in a group of its own too, leaves with the JVM)."""
        assert self.proc is not None
        groups = [self.proc.pid, *_children(self.proc.pid)]
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        self.proc.wait(30)
        deadline = time.monotonic() + 30
        while any(_group_alive(g) for g in groups):
            assert time.monotonic() < deadline, "processes of the killed server linger"
            time.sleep(0.02)

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url + CLUSTER, timeout=30, verify=self.verify, **kwargs)


def _children(pid: int) -> list[int]:
    """The server's child processes that lead a process group (its job process)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return [c for c in out if _pgid(c) == c]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
