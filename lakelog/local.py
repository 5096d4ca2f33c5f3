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
import time
from pathlib import Path
from types import TracebackType

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalServer:
    """A server on 127.0.0.1; ``settings`` become ``LAKELOG_*`` variables (e.g.
    ``tier_interval_ms=0``). Without ``data_dir`` it uses a temporary directory that
    ``stop`` removes. Authentication is off (it listens on loopback only) unless
    ``auth="api-key"`` is passed."""

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, port: int | None = None,
                 **settings: object) -> None:
        self._owned = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="lakelog-")) / (
            "data" if data_dir is None else "")
        self.port = port or free_port()
        settings.setdefault("auth", "none")
        self.settings = {f"LAKELOG_{k.upper()}": str(v) for k, v in settings.items()}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60) -> LocalServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lakelog = Path(sys.executable).parent / "lakelog"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(lakelog), "serve", "--data-dir", str(self.data_dir), "--port",
                 str(self.port), "--log-level", "warning"],
                env={**os.environ, **self.settings}, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lakelog serve exited with {self.proc.returncode}; "
                                   f"see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"lakelog serve did not answer within {timeout_s:.0f} s; "
                           f"see {self.log_path}")

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), then remove a temporary data directory."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._owned:
            shutil.rmtree(self.data_dir.parent, ignore_errors=True)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
