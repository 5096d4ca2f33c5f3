"""The nemesis's faults on a client: the consume-transform-produce process (``ctp.py``)
SIGKILLed (at a random moment, or just after it asked for a commit) and restarted, and
SIGSTOPped short of and past its transaction and session timeouts.

The client's schedule is drawn from the seed by a generator of its own, so the brokers'
schedule of a seed is the one it was before clients had faults (old seeds replay).
Client faults follow one another (one process): each starts 1.5-4 s after the last ended.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from tests.cluster.nemesis import ctp
from tests.cluster.nemesis.faults import Fault

log = logging.getLogger("nemesis")
ROOT = Path(__file__).resolve().parents[3]

CLIENT_KINDS: list[tuple[str, int]] = [
    ("kill", 2),          # SIGKILL at a random moment, started again 0.2-2 s later
    ("kill-commit", 3),   # SIGKILL once the journal says a commit is asked for
    ("pause-short", 2),   # SIGSTOP short of the transaction timeout
    ("pause-long", 1),    # SIGSTOP past the session and transaction timeouts
]


def client_schedule(seed: int, seconds: float) -> list[Fault]:
    rng = random.Random(f"clients-{seed}")
    kinds = [k for k, w in CLIENT_KINDS for _ in range(w)]
    out: list[Fault] = []
    at = rng.uniform(2.0, 5.0)
    while at < seconds:
        kind = rng.choice(kinds)
        if kind.startswith("kill"):
            duration = rng.uniform(0.2, 2.0)
        elif kind == "pause-short":
            duration = ctp.TRANSACTION_TIMEOUT_MS / 1000 * rng.uniform(0.1, 0.7)
        else:
            duration = ctp.SESSION_TIMEOUT_MS / 1000 * rng.uniform(1.2, 1.8)
        out.append(Fault(round(at, 2), kind, "ctp", round(duration, 2), rng.randrange(1 << 30)))
        at += duration + rng.uniform(1.5, 4.0)
    return out


class CtpProcess:
    """``python -m tests.cluster.nemesis.ctp`` in its own process group."""

    def __init__(self, directory: Path, urls: Sequence[str], topics: Sequence[str]) -> None:
        self.journal = directory / "ctp.journal"
        self.urls = list(urls)
        self.topics = list(topics)
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.starts = 0

    def start(self) -> None:
        env = {**os.environ, "NEMESIS_CTP_TOPICS": ",".join(self.topics),
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        with (self.journal.parent / "ctp.log").open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.cluster.nemesis.ctp", str(self.journal),
                 *self.urls], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        self.starts += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.paused = False

    def pause(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.proc is not None and self.paused:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)
        self.paused = False

    def last_line(self) -> str:
        try:
            with self.journal.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 300))
                lines = f.read().decode(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return lines[-1] if lines else ""

    def lines(self) -> list[str]:
        try:
            return self.journal.read_text().splitlines()
        except FileNotFoundError:
            return []


class ClientNemesis(threading.Thread):
    """Deals the client schedule on the process; ``heal`` leaves it running."""

    def __init__(self, process: CtpProcess, faults: list[Fault]) -> None:
        super().__init__(name="nemesis-clients", daemon=True)
        self.process = process
        self.faults = faults
        self.history: list[str] = []
        self.mid_commit = 0
        """Kills that struck between a commit's request and its answer."""
        self.errors: list[str] = []
        self._halt = threading.Event()
        self._start = time.monotonic()

    def _say(self, text: str) -> None:
        line = f"{time.monotonic() - self._start:6.1f}s {text}"
        log.warning("nemesis: %s", line)
        self.history.append(line)

    def run(self) -> None:
        self._start = time.monotonic()
        try:
            for fault in self.faults:
                if self._halt.wait(max(0.0, self._start + fault.at_s - time.monotonic())):
                    return
                self._deal(fault)
        except Exception as exc:  # a fault the harness could not deal is a failed run
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def _deal(self, fault: Fault) -> None:
        p = self.process
        if not p.alive():
            p.start()
        if fault.kind == "kill-commit":
            deadline = time.monotonic() + 10
            while not p.last_line().startswith("commit ") and time.monotonic() < deadline:
                time.sleep(0.002)
        if fault.kind.startswith("kill"):
            mid = p.last_line().startswith("commit ")
            p.kill()
            self.mid_commit += mid
            self._say(f"client {fault.kind}{' mid-commit' if mid else ''}, "
                      f"started again in {fault.duration_s:.1f}s")
            self._halt.wait(fault.duration_s)
            p.start()
        else:
            self._say(f"client {fault.kind} for {fault.duration_s:.1f}s")
            p.pause()
            self._halt.wait(fault.duration_s)
            p.resume()

    def heal(self) -> None:
        self._halt.set()
        self.join(60)
        self.process.resume()
        if not self.process.alive():
            self.process.start()
