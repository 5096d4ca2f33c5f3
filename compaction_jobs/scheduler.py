"""The server's job scheduler: tier, retention, compact and upkeep (optimize + vacuum)
on their own intervals, one after another in one worker thread, so that produce
never waits for them. Tiering also runs right after a segment is sealed.

The SparkSession is built on the first run that needs one, in this thread; the
Spark work itself runs in the JVM and in Python worker processes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

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
"""How long stop() waits for a running job to finish before leaving it to die with the process."""


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

    def start(self, manager: LogManager) -> None:
        manager.roll_listeners.append(self._on_roll)
        self._thread = threading.Thread(target=self._loop, name="lakelog-jobs", daemon=True)
        self._thread.start()

    def _on_roll(self, plog: PartitionLog, sealed: LogSegment) -> None:
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

    def _loop(self) -> None:
        # Jobs yield the CPU to produce and fetch: on Linux a thread has its own nice value,
        # and the Spark JVM and its Python workers, started from this thread, inherit it.
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), JOBS_NICE)
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
