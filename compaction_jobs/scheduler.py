"""The server's job scheduler: runs the tiering job on an interval and right after a roll,
in a thread of its own, so that produce never waits for it."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from compaction_jobs.tier import TierJob
from log_tables.layout import Layout
from log_tables.log_manager import LogManager
from log_tables.partition_log import PartitionLog
from log_tables.segment import LogSegment

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
STOP_WAIT_S = 60.0
"""How long stop() waits for a running job to finish before leaving it to die with the process."""


class JobScheduler:
    """Runs ``TierJob`` every ``interval_ms`` (and when a segment is sealed).

    The SparkSession is built on the first run that has work, in this thread.
    """

    def __init__(self, layout: Layout, interval_ms: int, spark_master: str) -> None:
        self.layout = layout
        self.interval_s = interval_ms / 1000
        self.spark_master = spark_master
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._spark: SparkSession | None = None
        self.runs = 0
        self.last_error: str | None = None

    def start(self, manager: LogManager) -> None:
        manager.roll_listeners.append(self._on_roll)
        self._thread = threading.Thread(target=self._loop, name="lakelog-jobs", daemon=True)
        self._thread.start()

    def _on_roll(self, plog: PartitionLog, sealed: LogSegment) -> None:
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

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stopping.is_set():
                break
            try:
                TierJob(self.layout, progress=lambda line: log.info("%s", line)).run(self._session)
                self.last_error = None
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("tiering job failed (it is retried at the next interval)")
            self.runs += 1

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(STOP_WAIT_S)
        if self._spark is not None:
            self._spark.stop()
            self._spark = None
