"""The server's job scheduler: tier, retention, compact and upkeep (optimize + vacuum)
on their own intervals, one after another, in a child process of the server
(``JobProcess``), so that produce never waits for them and never shares a GIL
with them. Tiering also runs right after a segment is sealed: the server writes
a byte to the child's stdin. The child runs at nice 10 (the Spark JVM and its
Python workers inherit it) and leaves when its stdin closes, which is also what
happens when the server dies, however it dies.

The jobs only need the data directory and the warehouse: everything they change
is committed to Delta, and the server's hot tier follows the log start they
commit (``TieredStorage.follow_log_start``), as it does for ``lakelog jobs``.

The SparkSession is built on the first run that needs one; the Spark work itself
runs in the JVM and in Python worker processes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, NamedTuple

from compaction_jobs.compact import CompactJob
from compaction_jobs.optimize import OptimizeJob
from compaction_jobs.retention import RetentionJob
from compaction_jobs.tier import TierJob
from compaction_jobs.vacuum import VacuumJob
from log_tables.layout import Layout
from log_tables.log_manager import LogManager
from log_tables.partition_log import PartitionLog
from log_tables.segment import LogSegment

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
JOBS_NICE = 10
STOP_WAIT_S = 60.0
"""How long a stop waits for a running job to finish before the job process is killed
(every job is safe to kill at any step; the next run finishes or undoes its work)."""
ROLLED = b"r"


class Intervals(NamedTuple):
    """Milliseconds between runs of each job; 0 turns a job off."""

    tier_ms: int = 5000
    retention_ms: int = 30_000
    compact_ms: int = 15_000
    upkeep_ms: int = 600_000
    vacuum_retention_hours: int = 24


class JobScheduler:
    """Runs the jobs every interval; ``runs`` and ``last_error`` say how it goes."""

    def __init__(self, layout: Layout, intervals: Intervals, spark_master: str) -> None:
        self.layout = layout
        self.intervals = intervals
        self.spark_master = spark_master
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._spark: SparkSession | None = None
        self.runs = 0
        self.last_error: str | None = None
        self._jobs: list[tuple[str, float, Callable[[], object]]] = [
            (name, ms / 1000, fn) for name, ms, fn in (
                ("tier", intervals.tier_ms, self._tier),
                ("retention", intervals.retention_ms, self._retention),
                ("compact", intervals.compact_ms, self._compact),
                ("upkeep", intervals.upkeep_ms, self._upkeep)) if ms > 0]
        # The first runs come one interval after start: a restarting server answers first.
        self._due = {name: time.monotonic() + interval_s for name, interval_s, _ in self._jobs}

    @property
    def enabled(self) -> bool:
        return bool(self._jobs)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.loop, name="lakelog-jobs", daemon=True)
        self._thread.start()

    def segment_rolled(self) -> None:
        """Tier now: a segment was sealed."""
        if "tier" in self._due:
            self._due["tier"] = 0.0
            self._wake.set()

    def _session(self) -> SparkSession:
        if self._spark is None:
            from log_tables.spark_session import lakelog_session

            started = time.monotonic()
            self._spark = lakelog_session(self.layout.data_dir, self.layout.warehouse,
                                          master=self.spark_master, app_name="lakelog-jobs")
            log.info("started Spark (%s) for jobs in %.1f s", self.spark_master,
                     time.monotonic() - started)
        return self._spark

    def _tier(self) -> object:
        return TierJob(self.layout).run(self._session)

    def _retention(self) -> object:
        return RetentionJob(self.layout).run()

    def _compact(self) -> object:
        return CompactJob(self.layout).run(self._session)

    def _upkeep(self) -> object:
        OptimizeJob(self.layout).run(self._session)
        return VacuumJob(self.layout, retention_hours=self.intervals.vacuum_retention_hours).run()

    def loop(self) -> None:
        while not self._stopping.is_set():
            next_due = min(self._due.values())
            self._wake.wait(max(0.0, next_due - time.monotonic()))
            self._wake.clear()
            for name, interval_s, fn in self._jobs:
                if self._stopping.is_set():
                    return
                if self._due[name] > time.monotonic():
                    continue
                self._due[name] = time.monotonic() + interval_s
                try:
                    fn()
                    self.last_error = None
                except Exception as exc:
                    self.last_error = f"{name}: {type(exc).__name__}: {exc}"
                    log.exception("%s job failed (it is retried at the next interval)", name)
                self.runs += 1

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(STOP_WAIT_S)
        if self._spark is not None:
            self._spark.stop()
            self._spark = None


class JobProcess:
    """The server's side of the scheduler: starts ``python -m compaction_jobs.scheduler``
    with the layout and intervals, tells it when a segment rolls, and stops it."""

    def __init__(self, layout: Layout, intervals: Intervals, spark_master: str,
                 log_level: str = "info") -> None:
        self.layout = layout
        self.intervals = intervals
        self.spark_master = spark_master
        self.log_level = log_level
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def enabled(self) -> bool:
        return any(ms > 0 for ms in self.intervals[:4])

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, manager: LogManager) -> None:
        spec = {"data_dir": self.layout.data_dir, "warehouse": self.layout.warehouse,
                "spark_master": self.spark_master, "intervals": self.intervals._asdict(),
                "log_level": self.log_level.upper()}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "compaction_jobs.scheduler", json.dumps(spec)],
            stdin=subprocess.PIPE)
        os.set_blocking(self._stdin().fileno(), False)
        manager.roll_listeners.append(self._on_roll)
        log.info("job process %d started (tier/retention/compact/upkeep every %s ms)",
                 self._proc.pid, "/".join(str(ms) for ms in self.intervals[:4]))

    def _stdin(self) -> IO[bytes]:
        assert self._proc is not None and self._proc.stdin is not None
        return self._proc.stdin

    def _on_roll(self, plog: PartitionLog, sealed: LogSegment) -> None:
        # Never blocks the appender: a full pipe already holds a wake-up.
        with contextlib.suppress(BlockingIOError, BrokenPipeError, ValueError):
            self._stdin().write(ROLLED)
            self._stdin().flush()

    def stop(self) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            self._stdin().close()
        try:
            self._proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            log.warning("job process %d still busy after %.0f s: killed (its job is undone or "
                        "finished by the next run)", self._proc.pid, STOP_WAIT_S)
            self._proc.kill()
            self._proc.wait()
        self._proc = None


def main(argv: list[str]) -> None:
    """The job process: run the scheduler until stdin closes; each byte read means "a
    segment rolled"."""
    spec = json.loads(argv[0])
    # Jobs yield the CPU to produce and fetch: SCHED_IDLE where Linux has it (the server's
    # threads preempt the jobs' at once), nice 10 as well; the Spark JVM and workers inherit both.
    with contextlib.suppress(OSError):
        os.nice(JOBS_NICE)
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    logging.basicConfig(level=spec.get("log_level", "INFO"),
                        format="%(levelname)s:     [jobs] %(name)s: %(message)s")
    scheduler = JobScheduler(Layout(spec["data_dir"], spec["warehouse"]),
                             Intervals(**spec["intervals"]), spec["spark_master"])
    scheduler.start()
    stdin = sys.stdin.buffer.raw if hasattr(sys.stdin.buffer, "raw") else sys.stdin.buffer
    while stdin.read(64):
        scheduler.segment_rolled()
    scheduler.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
