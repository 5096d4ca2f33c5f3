"""What every job shares: the topics and partitions it covers, its id, the
local-warehouse check, dry runs, and its rows in ``_job_runs`` (one per partition it
touched, or one per topic or run that failed). ``TopicJob`` works topic by topic; the
tiering job stages every topic's segments in one Spark job, so it runs on ``Job`` itself.

In a cluster, a broker's jobs touch only the partitions it leads (``led``, read from
``leadership.json`` at the start of each run): one broker tiers, compacts and expires
each partition, and work on a topic's table as a whole (vacuum, checkpoints) falls to
the leader of its partition 0. Every commit is still guarded by the partitions' app
transactions (log_tables.cold.commit), so a broker acting on a leadership that moved
away mid-run loses its commit for that partition instead of doubling or dropping
records."""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Set
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Generic, NamedTuple

from typing_extensions import TypeVar

from compaction_jobs.staging import new_job_id
from log_tables.cold import job_runs
from log_tables.cold.job_runs import DRY_RUN, FAILED, JobRun
from log_tables.errors import StorageError
from log_tables.layout import Layout
from log_tables.leadership import read_cluster_id, read_leadership, read_settle_ms
from log_tables.registry import TopicMetadata

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
step_hook: Callable[[str], None] | None = None
"""Called with each step's name as a job completes it (tests kill the process there)."""


def step(name: str) -> None:
    if step_hook is not None:
        step_hook(name)


class JobReport(NamedTuple):
    """The outcome of one run: its rows, as written to ``_job_runs``."""

    job: str
    job_id: str
    runs: list[JobRun]
    seconds: float

    @property
    def failed(self) -> list[JobRun]:
        return [r for r in self.runs if r.status == FAILED]

    def summary(self) -> str:
        if not self.runs:
            return f"{self.job}: nothing to do ({self.seconds:.2f} s)"
        rin = sum(r.records_in for r in self.runs)
        rout = sum(r.records_out for r in self.runs)
        bin_ = sum(r.bytes_in for r in self.runs)
        bout = sum(r.bytes_out for r in self.runs)
        line = (f"{self.job}: {len(self.runs)} partition run(s), records {rin:,} -> {rout:,}, "
                f"bytes {bin_ / 1e6:.1f} MB -> {bout / 1e6:.1f} MB in {self.seconds:.2f} s")
        if self.failed:
            line += f"; {len(self.failed)} failed"
        return line


Report = TypeVar("Report", default=JobReport)
"""What ``run`` returns: a ``JobReport`` (the tiering job has its own)."""


Led = Mapping[str, Set[int]]
"""Partitions by topic that a cluster's broker leads."""


def led_here(layout: Layout, cluster: bool | None = None, *, tiers: bool = False
             ) -> Led | None:
    """The partitions this data directory's broker leads now (``tiers``: those it tiers,
    ``cluster.tierers``), or None (every partition) when it is not a cluster's broker.
    ``cluster`` None: a data directory that joined a cluster (it holds ``cluster.json``)
    is one. A broker of a cluster without ``leadership.json`` (it is starting, or lost its
    metadata) leads nothing."""
    if cluster is None:
        cluster = read_cluster_id(Path(layout.data_dir)) is not None
    if not cluster:
        return None
    return read_leadership(Path(layout.data_dir), "tiers" if tiers else "partitions") or {}


def settle_here(layout: Layout) -> int:
    """How old a transaction's marker must be before this broker's tiering job takes it
    (``cluster.tierers``; 0 outside a cluster)."""
    return read_settle_ms(Path(layout.data_dir))


class Job(abc.ABC, Generic[Report]):
    """A job over some topics of a layout; ``run`` records its rows in ``_job_runs``."""

    name: ClassVar[str]

    def __init__(self, layout: Layout, topics: Iterable[str] | None = None, *,
                 dry_run: bool = False, progress: Callable[[str], None] | None = None,
                 now_ms: int | None = None, orphan_min_age_s: float = 60.0,
                 led: Led | None = None) -> None:
        self.layout = layout
        self.only = None if topics is None else set(topics)
        self.dry_run = dry_run
        self.job_id = new_job_id()
        self.progress = progress or (lambda line: log.info("%s", line))
        self.now_ms = now_ms if now_ms is not None else job_runs.now_ms()
        self.orphan_min_age_s = orphan_min_age_s
        self.led = led
        """The partitions this job may touch (a cluster's broker: those it leads); None: all."""

    def topic_metas(self) -> list[TopicMetadata]:
        """The topics to work on: those asked for, with at least one partition led here."""
        return [t for t in self.layout.topics() if (self.only is None or t.name in self.only)
                and (self.led is None or self.led.get(t.name))]

    def leads(self, topic: str, partition: int) -> bool:
        """Whether this job may touch the partition (always, outside a cluster)."""
        return self.led is None or partition in self.led.get(topic, ())

    def leads_table(self, topic: str) -> bool:
        """Whether this job does the table-wide work (vacuum, checkpoints) of the topic:
        outside a cluster always, in one the leader of partition 0 does it."""
        return self.leads(topic, 0)

    @abc.abstractmethod
    def run(self, spark: SparkSession | Callable[[], SparkSession] | None = None, *,
            record: bool = True) -> Report:
        """Do the job; its rows go to ``_job_runs`` unless ``record`` is False.

        ``spark`` may be a factory: it is called only when there is Spark work to do.
        """

    def row(self, topic: str | None, partition: int | None, began_ms: int, status: str,
            **counts: int | str | None) -> JobRun:
        return JobRun(self.name, self.job_id, topic, partition, began_ms, job_runs.now_ms(),
                      status, **counts)  # type: ignore[arg-type]

    def failed_row(self, topic: str | None, began_ms: int, exc: Exception) -> JobRun:
        """The row of a topic (or, topic None, a whole run) that failed with ``exc``."""
        return self.row(topic, None, began_ms, FAILED, error=f"{type(exc).__name__}: {exc}")


class TopicJob(Job[JobReport]):
    """A job done topic by topic: ``run_topic`` for each, and a topic that fails gets a
    failed row while the others go on."""

    def run(self, spark: SparkSession | Callable[[], SparkSession] | None = None, *,
            record: bool = True) -> JobReport:
        """Run over every topic; a topic that fails gets a failed row and the others go on."""
        started = time.monotonic()
        runs: list[JobRun] = []
        for meta in self.topic_metas():
            began = job_runs.now_ms()
            try:
                runs += self.run_topic(meta, spark)
            except Exception as exc:
                log.exception("%s job failed on topic %s", self.name, meta.name)
                runs.append(self.failed_row(meta.name, began, exc))
        if self.dry_run:
            runs = [r._replace(status=DRY_RUN) if r.status != FAILED else r for r in runs]
        if record:
            job_runs.record(self.layout.warehouse, runs)
        report = JobReport(self.name, self.job_id, runs, time.monotonic() - started)
        if runs:
            self.progress(report.summary())
        return report

    @abc.abstractmethod
    def run_topic(self, meta: TopicMetadata,
                  spark: SparkSession | Callable[[], SparkSession] | None) -> list[JobRun]:
        """Do (or, dry, describe) the work on one topic; one row per partition touched."""


def session_of(spark: SparkSession | Callable[[], SparkSession] | None) -> SparkSession:
    """The session, built on first need when a factory was given."""
    if spark is None:
        raise StorageError("this job needs a SparkSession")
    return spark() if callable(spark) else spark
