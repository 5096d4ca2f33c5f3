"""The server's job scheduler: tier, retention, compact and upkeep (optimize + vacuum)
on their own intervals, one after another, in a child process of the server
(``JobProcess``), so that produce never waits for them and never shares a GIL
with them. Tiering also runs right after a segment is sealed: the server writes
a byte to the child's stdin. The child runs at nice 10 (the Spark JVM and its
Python workers inherit it).

The child and everything it starts end with the server, however the server ends:

- a clean stop: the server writes ``STOP`` and closes the pipe; the child lets
  the running job finish (at most ``STOP_WAIT_S``), stops Spark and exits, and
  the server SIGKILLs the child's process group if it takes longer;
- the server dies (SIGKILL, a crash): the pipe closes without ``STOP``, the
  kernel sends the child ``PARENT_DEATH_SIGNAL`` (``PR_SET_PDEATHSIG``, Linux),
  and the child also sees its parent pid change (checked every second): any of
  the three makes it SIGKILL its own process group, itself and its JVM
  included, at once. Every job is safe to kill at any step. (PySpark's daemon
  leads a group of its own; it leaves, with its workers, when the JVM's pipe
  to it closes.)

The child leads a process group of its own, so a Ctrl-C in the server's
terminal reaches the server alone, which then stops the child cleanly.

In a cluster (``cluster``), each run reads ``leadership.json`` first and works only on
the partitions this broker leads (compaction_jobs.job); the brokers share the warehouse,
and their commits to one topic's table rebase on each other (log_tables.cold.commit).

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
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, NoReturn

from compaction_jobs.compact import CompactJob
from compaction_jobs.job import Led, led_here, settle_here
from compaction_jobs.optimize import OptimizeJob
from compaction_jobs.retention import RetentionJob
from compaction_jobs.tier import TierJob
from compaction_jobs.typed import TypedJob
from compaction_jobs.vacuum import VacuumJob
from log_tables import parent_death
from log_tables.hot.log_manager import LogManager
from log_tables.hot.partition_log import PartitionLog
from log_tables.hot.segment import LogSegment
from log_tables.layout import Layout
from log_tables.typed.catalog import CLUSTER_WAIT_S, Catalog

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
JOBS_NICE = 10
STOP_WAIT_S = 60.0
"""How long a stop waits for a running job to finish before the job process is killed
(every job is safe to kill at any step; the next run finishes or undoes its work)."""
ROLLED = b"r"
STOP = b"s"
PARENT_DEATH_SIGNAL = signal.SIGUSR1
"""What the kernel sends the job process when the server dies (``PR_SET_PDEATHSIG``)."""
PARENT_CHECK_S = 1.0


class Intervals(NamedTuple):
    """Milliseconds between runs of each job; 0 turns a job off."""

    tier_ms: int = 5000
    retention_ms: int = 30_000
    compact_ms: int = 15_000
    upkeep_ms: int = 600_000
    vacuum_retention_hours: int = 24


class JobScheduler:
    """Runs the jobs every interval; ``runs`` and ``last_error`` say how it goes."""

    def __init__(self, layout: Layout, intervals: Intervals, spark_master: str,
                 cluster: bool = False) -> None:
        self.layout = layout
        self.intervals = intervals
        self.spark_master = spark_master
        self.cluster = cluster
        """A cluster's broker: each run touches only the partitions it leads."""
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._spark: SparkSession | None = None
        self._catalog = Catalog(layout)
        """The schema registry as read so far (the typed tables' job reads only what is new)."""
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
            from log_tables.spark.session import lakelog_session

            started = time.monotonic()
            self._spark = lakelog_session(self.layout.data_dir, self.layout.warehouse,
                                          master=self.spark_master, app_name="lakelog-jobs")
            log.info("started Spark (%s) for jobs in %.1f s", self.spark_master,
                     time.monotonic() - started)
        return self._spark

    def _led(self) -> Led | None:
        """Read at the start of every run: leadership moves between runs."""
        return led_here(self.layout, self.cluster)

    def _tier(self) -> object:
        led = led_here(self.layout, self.cluster, tiers=True)
        self._catalog.wait_s = None if led is None else CLUSTER_WAIT_S
        report = TierJob(self.layout, led=led, settle_ms=settle_here(self.layout)
                         if self.cluster is not False else 0).run(self._session)
        # Typed and upsert tables follow what was tiered, at once (compaction_jobs.typed).
        TypedJob(self.layout, led=led, catalog=self._catalog).run()
        return report

    def _retention(self) -> object:
        return RetentionJob(self.layout, led=self._led()).run()

    def _compact(self) -> object:
        return CompactJob(self.layout, led=self._led()).run(self._session)

    def _upkeep(self) -> object:
        OptimizeJob(self.layout, led=self._led()).run(self._session)
        return VacuumJob(self.layout, retention_hours=self.intervals.vacuum_retention_hours,
                         led=self._led()).run()

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

    def stop(self, between_waits: Callable[[], None] = lambda: None) -> None:
        """Let the running job finish (at most ``STOP_WAIT_S``), then stop Spark;
        ``between_waits`` runs about every second meanwhile."""
        self._stopping.set()
        self._wake.set()
        deadline = time.monotonic() + STOP_WAIT_S
        while self._thread is not None and self._thread.is_alive() and \
                time.monotonic() < deadline:
            self._thread.join(PARENT_CHECK_S)
            between_waits()
        if self._spark is not None:
            self._spark.stop()
            self._spark = None


class JobProcess:
    """The server's side of the scheduler: starts ``python -m compaction_jobs.scheduler``
    with the layout and intervals, tells it when a segment rolls, and stops it.

    ``start`` must run on a thread that lives as long as the server (the main thread
    of ``lakelog serve``): the parent-death signal fires when the forking thread ends.
    (The child checks its parent pid when the signal comes, so an early one is ignored.)
    """

    def __init__(self, layout: Layout, intervals: Intervals, spark_master: str,
                 log_level: str = "info", *, cluster: bool = False) -> None:
        self.layout = layout
        self.intervals = intervals
        self.spark_master = spark_master
        self.log_level = log_level
        self.cluster = cluster
        self._proc: subprocess.Popen[bytes] | None = None
        self._pipe: int | None = None
        """The write end of the child's stdin."""
        self._pipe_lock = threading.Lock()
        """Held to write and to close: a roll never writes to a closed (maybe reused) fd."""

    @property
    def enabled(self) -> bool:
        return any(ms > 0 for ms in self.intervals[:4])

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    MODULE = "compaction_jobs.scheduler"
    """What ``python -m`` runs as the child."""
    WANTS_ROLLS = True
    """Whether the child hears of every sealed segment."""

    def spec(self) -> dict[str, object]:
        """What the child is told (one JSON argument)."""
        return {"data_dir": self.layout.data_dir, "warehouse": self.layout.warehouse,
                "spark_master": self.spark_master, "intervals": self.intervals._asdict(),
                "log_level": self.log_level.upper(), "parent_pid": os.getpid(),
                "cluster": self.cluster}

    def describe(self) -> str:
        return "tier/retention/compact/upkeep every " + \
            "/".join(str(ms) for ms in self.intervals[:4]) + " ms"

    def status(self) -> dict[str, object]:
        """How the child is (a row of the dashboard's health): off, running (with its
        pid and what it runs), stopped, or exited (with its code)."""
        if not self.enabled:
            return {"state": "off"}
        proc = self._proc
        if proc is None:
            return {"state": "stopped"}
        code = proc.poll()
        if code is None:
            return {"state": "running", "pid": proc.pid, "runs": self.describe()}
        return {"state": "exited", "pid": proc.pid, "exit_code": code}

    def start(self, manager: LogManager | None = None) -> None:
        # A process group of its own: the child can take its JVM with it in one kill,
        # and a Ctrl-C meant for the server does not reach it.
        self._proc = subprocess.Popen(
            [sys.executable, "-m", self.MODULE, json.dumps(self.spec())],
            stdin=subprocess.PIPE, process_group=0)
        assert self._proc.stdin is not None
        self._pipe = self._proc.stdin.fileno()
        os.set_blocking(self._pipe, False)
        if manager is not None and self.WANTS_ROLLS:
            manager.roll_listeners.append(self._on_roll)
        log.info("%s %d started (%s)", self.MODULE, self._proc.pid, self.describe())

    def _on_roll(self, plog: PartitionLog, sealed: LogSegment) -> None:
        # Never blocks the appender: a full pipe already holds a wake-up. One os.write of
        # one byte is atomic, whichever thread rolled.
        with self._pipe_lock, contextlib.suppress(OSError):  # full, or the child is gone
            if self._pipe is not None:
                os.write(self._pipe, ROLLED)

    def stop(self) -> None:
        """Ask the child to stop after its running job; SIGKILL its process group (the
        child, its JVM) if it is not gone within ``STOP_WAIT_S``."""
        if self._proc is None:
            return
        proc = self._proc
        # A pipe too full for one more byte means the child does not read it: closing it
        # without STOP makes the child leave at once, which is then the right thing.
        with self._pipe_lock:
            if self._pipe is not None:
                with contextlib.suppress(OSError):
                    os.write(self._pipe, STOP)
            self._pipe = None
            with contextlib.suppress(OSError):
                if proc.stdin is not None:
                    proc.stdin.close()
        try:
            proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            log.warning("%s %d still busy after %.0f s: killed with its Spark JVM (a job "
                        "is undone or finished by the next run)", self.MODULE, proc.pid,
                        STOP_WAIT_S)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self._proc = None


def _leave_now(reason: str) -> NoReturn:
    """SIGKILL this process's group: the job process, its Spark JVM, whatever they run."""
    # os.write, not logging: this may run in a signal handler, maybe while a log call
    # on the same thread holds the logging lock.
    with contextlib.suppress(OSError):
        os.write(2, f"WARNING:  [jobs] {reason}: the job process {os.getpid()} leaves now, "
                    "with its Spark JVM\n".encode())
    if os.getpgrp() == os.getpid():
        os.killpg(0, signal.SIGKILL)
    os._exit(1)


def _watch_parent(parent_pid: int | None) -> Callable[[], None]:
    """Make this process leave (with its group) when its parent goes; returns the
    check to run now and then (it compares the parent pid, portably)."""
    if os.getpgrp() != os.getpid():  # run by hand rather than by JobProcess
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)

    def check() -> None:
        if parent_pid is not None and os.getppid() != parent_pid:
            _leave_now(f"the server (pid {parent_pid}) is gone")

    def on_signal(signum: int, frame: object) -> None:
        if signum == PARENT_DEATH_SIGNAL:
            check()  # sent too when only the forking thread ended: then the parent lives
        else:
            _leave_now(f"signal {signal.Signals(signum).name}")

    for sig in (PARENT_DEATH_SIGNAL, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    parent_death.die_with_parent(PARENT_DEATH_SIGNAL)
    check()  # the parent may have died before the signal was set
    return check


def background_child(spec: dict[str, object], tag: str) -> Callable[[], None]:
    """The start of a child of the server that must never slow it (the job process, the
    SQL endpoint): it leaves with the server (returns the check to run now and then),
    yields the CPU to produce and fetch (SCHED_IDLE where Linux has it: the server's
    threads preempt it at once; nice 10 as well; its Spark JVM and Python workers inherit
    both), and logs with ``[tag]``."""
    parent = spec.get("parent_pid")
    check_parent = _watch_parent(parent if isinstance(parent, int) else None)
    with contextlib.suppress(OSError):
        os.nice(JOBS_NICE)
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    logging.basicConfig(level=str(spec.get("log_level", "INFO")),
                        format=f"%(levelname)s:     [{tag}] %(name)s: %(message)s")
    return check_parent


def main(argv: list[str]) -> None:
    """The job process: run the scheduler until the server says STOP, or leave at once
    (with its process group) when the server is gone; each other byte read means "a
    segment rolled"."""
    spec = json.loads(argv[0])
    check_parent = background_child(spec, "jobs")
    scheduler = JobScheduler(Layout(spec["data_dir"], spec["warehouse"]),
                             Intervals(**spec["intervals"]), spec["spark_master"],
                             spec.get("cluster", False))
    scheduler.start()
    stdin = sys.stdin.fileno()
    while True:
        # A timeout, so that the parent pid is checked even where no signal comes.
        readable, _, _ = select.select([stdin], [], [], PARENT_CHECK_S)
        check_parent()
        if not readable:
            continue
        chunk = os.read(stdin, 64)
        if STOP in chunk:
            break
        if not chunk:
            _leave_now("the server's pipe closed without a stop")
        scheduler.segment_rolled()
    scheduler.stop(check_parent)


if __name__ == "__main__":
    main(sys.argv[1:])
