"""Prometheus metrics: records and bytes in and out per topic, request latency, partition
offsets and tiering backlog (this broker's replicas), the lag of consumer groups on every
partition they read (and per group; in a cluster counted to each partition's leader's
high watermark, ``ingest_api.broker.leader_bounds``), and what the jobs did (from
``_job_runs``, through the dashboard's cached view: a scrape never reads the table more
than once in its ``CACHE_S``)."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from consumer_groups.coordinator import GroupCoordinator
from consumer_groups.lag import BoundsOf, all_group_lag, log_bounds
from log_tables.cold.tiered_storage import TieredStorage
from log_tables.errors import UnknownPartitionError, UnknownTopicError
from log_tables.hot.log_manager import LogManager
from log_tables.typed.status import TypedPartition

if TYPE_CHECKING:
    from cluster.replica_manager import ReplicaManager


def tiering_backlog(high_watermark: int, tiered_offset: int, log_start_offset: int) -> int:
    """Records below the high watermark that the Delta tier does not hold yet (records
    deleted before they were tiered wait for nothing)."""
    return max(0, high_watermark - max(tiered_offset, log_start_offset))


class JobRunsSummary(Protocol):
    """What ``lakelog_job_runs`` and the last-run gauges read of the job runs."""

    @property
    def recent(self) -> Mapping[tuple[str, str], int]: ...

    @property
    def last(self) -> Mapping[str, Mapping[str, Any]]: ...


class JobRunsView(Protocol):
    """A cached view of ``_job_runs`` (the HTTP front's dashboard keeps one)."""

    def snapshot(self) -> JobRunsSummary: ...


class Sources(NamedTuple):
    """What the gauges read: set at startup, cleared at shutdown."""

    manager: LogManager
    tiered: TieredStorage
    groups: GroupCoordinator
    group_bounds: BoundsOf
    """The bounds group lag counts to: in a cluster, each partition's leader's
    (``ingest_api.broker.leader_bounds``), refreshed before the scrape."""


class Metrics:
    """The metrics of one app, in a registry of their own (so tests can run several apps)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._partitions = _PartitionCollector()
        self.records_in = Counter("lakelog_records_in", "Records appended", ["topic"],
                                  registry=self.registry)
        self.bytes_in = Counter("lakelog_bytes_in", "Key+value bytes appended", ["topic"],
                                registry=self.registry)
        self.records_out = Counter("lakelog_records_out", "Records fetched", ["topic"],
                                   registry=self.registry)
        self.bytes_out = Counter("lakelog_bytes_out", "Key+value bytes fetched", ["topic"],
                                 registry=self.registry)
        self.forwarded = Counter("lakelog_forwarded_requests",
                                 "Requests this broker sent on to another broker of its "
                                 "cluster (a leader, the controller, a group coordinator)",
                                 ["broker", "kind"], registry=self.registry)
        self.latency = Histogram(
            "lakelog_request_seconds", "HTTP request latency", ["method", "route", "status"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                     10, 30),
            registry=self.registry)
        self.registry.register(self._partitions)
        self._replicas = _ReplicaCollector()
        self.registry.register(self._replicas)
        self._jobs = _JobRunsCollector()
        self.registry.register(self._jobs)
        self._typed = _TypedCollector()
        self.registry.register(self._typed)

    def attach(self, sources: Sources | None) -> None:
        """Report the partitions and groups of ``sources`` (None: nothing, at shutdown)."""
        self._partitions.sources = sources

    def attach_replicas(self, replicas: ReplicaManager | None) -> None:
        """Report a cluster broker's replication (None: nothing)."""
        self._replicas.replicas = replicas

    def attach_job_runs(self, view: JobRunsView | None) -> None:
        """Report the job runs that ``view`` reads (None: nothing)."""
        self._jobs.view = view

    def attach_typed(self, view: TypedView | None) -> None:
        """Report the typed tables that ``view`` reads (None: nothing)."""
        self._typed.view = view


class TypedView(Protocol):
    def snapshot(self) -> Mapping[str, Sequence[TypedPartition]]: ...


class _TypedCollector(Collector):
    def __init__(self) -> None:
        self.view: TypedView | None = None

    def collect(self) -> Iterator[Any]:
        typed = GaugeMetricFamily(
            "lakelog_typed_offset", "The offset each partition's typed table covers up to "
            "(delta.table.mode typed or upsert)", labels=["topic", "partition"])
        dead = GaugeMetricFamily(
            "lakelog_dead_letters", "Records of each partition in its topic's dead-letter "
            "table (they could not be typed: delta.errors.mode=dlq)",
            labels=["topic", "partition"])
        if self.view is not None:
            for topic, parts in sorted(self.view.snapshot().items()):
                for part in parts:
                    typed.add_metric([topic, str(part.partition)], part.typed_offset)
                    dead.add_metric([topic, str(part.partition)], part.dead_letters)
        yield from (typed, dead)


class _JobRunsCollector(Collector):
    def __init__(self) -> None:
        self.view: JobRunsView | None = None

    def collect(self) -> Iterator[Any]:
        runs = GaugeMetricFamily(
            "lakelog_job_runs", "Job runs that ended in the last hour, by job and result "
            "(succeeded, failed: any of its partitions failed, dry_run), from _job_runs",
            labels=["job", "status"])
        ended = GaugeMetricFamily("lakelog_job_last_run_end_timestamp_seconds",
                                  "When each job's newest run ended (Unix time)",
                                  labels=["job"])
        took = GaugeMetricFamily("lakelog_job_last_run_duration_seconds",
                                 "How long each job's newest run took", labels=["job"])
        failed = GaugeMetricFamily("lakelog_job_last_run_failed",
                                   "1 if each job's newest run failed, else 0", labels=["job"])
        if self.view is not None:
            snap = self.view.snapshot()
            for (job, status), count in sorted(snap.recent.items()):
                runs.add_metric([job, status], count)
            for job, last in sorted(snap.last.items()):
                ended.add_metric([job], last["end_ms"] / 1000)
                took.add_metric([job], last["duration_ms"] / 1000)
                failed.add_metric([job], 1 if last["status"] == "failed" else 0)
        yield from (runs, ended, took, failed)


class _ReplicaCollector(Collector):
    def __init__(self) -> None:
        self.replicas: ReplicaManager | None = None

    def collect(self) -> Iterator[Any]:
        rm = self.replicas
        urp = GaugeMetricFamily(
            "lakelog_under_replicated_partitions", "Partitions this broker leads whose ISR is "
            "smaller than their replicas (Kafka's UnderReplicatedPartitions)")
        isr = GaugeMetricFamily("lakelog_partition_isr_size", "In-sync replicas of each "
                                "partition this broker leads", labels=["topic", "partition"])
        lag = GaugeMetricFamily(
            "lakelog_replica_lag_records", "Records each follower is behind this leader's log "
            "end, as of its last fetch (-1: none since this broker leads)",
            labels=["topic", "partition", "replica"])
        shrinks = CounterMetricFamily("lakelog_isr_shrinks", "ISR shrinks this broker made")
        expands = CounterMetricFamily("lakelog_isr_expands", "ISR expansions this broker made")
        if rm is not None:
            urp.add_metric([], len(rm.under_replicated()))
            for (topic, p), lp in list(rm.leaders.items()):
                isr.add_metric([topic, str(p)], len(lp.isr))
                for replica, behind in lp.lag().items():
                    lag.add_metric([topic, str(p), str(replica)], behind)
            shrinks.add_metric([], rm.isr_shrinks)
            expands.add_metric([], rm.isr_expands)
        yield from (urp, isr, lag, shrinks, expands)


class _PartitionCollector(Collector):
    def __init__(self) -> None:
        self.sources: Sources | None = None

    def collect(self) -> Iterator[Any]:
        end = GaugeMetricFamily("lakelog_partition_high_watermark",
                                "High watermark: consumers read below it (the log end, for "
                                "a partition of one replica)", labels=["topic", "partition"])
        log_end = GaugeMetricFamily("lakelog_partition_log_end_offset",
                                    "The offset this broker's replica appends at next",
                                    labels=["topic", "partition"])
        start = GaugeMetricFamily("lakelog_partition_log_start_offset",
                                  "Log start offset (the lowest offset either tier holds)",
                                  labels=["topic", "partition"])
        hot_start = GaugeMetricFamily("lakelog_partition_hot_log_start_offset",
                                      "The hot tier's first offset (local retention moves it)",
                                      labels=["topic", "partition"])
        size = GaugeMetricFamily("lakelog_partition_hot_bytes", "Bytes in hot segments",
                                 labels=["topic", "partition"])
        tiered = GaugeMetricFamily("lakelog_partition_tiered_offset",
                                   "The Delta tier holds every record below it",
                                   labels=["topic", "partition"])
        backlog = GaugeMetricFamily(
            "lakelog_partition_tiering_backlog_records", "Records below the high watermark "
            "not yet in the Delta tier (high watermark - max(tiered offset, log start))",
            labels=["topic", "partition"])
        lag = GaugeMetricFamily(
            "lakelog_consumer_group_lag", "Records a group has not committed past, on every "
            "partition it reads (from the log start where it has committed nothing)",
            labels=["group", "topic", "partition"])
        committed = GaugeMetricFamily(
            "lakelog_consumer_group_committed_offset",
            "A group's committed offset (absent where it has committed nothing)",
            labels=["group", "topic", "partition"])
        group_lag = GaugeMetricFamily(
            "lakelog_consumer_group_total_lag", "A group's lag summed over every partition "
            "it reads", labels=["group"])
        src = self.sources
        families = (end, log_end, start, hot_start, size, tiered, backlog, lag, committed,
                    group_lag)
        if src is None:
            yield from families
            return
        # Runs in a worker thread (the /metrics route): a topic may go meanwhile.
        bounds_of = functools.cache(log_bounds(src.manager, src.tiered))
        for plog in src.manager.all_logs():
            topic, _, partition = plog.name.rpartition("-")
            bounds = bounds_of(topic, int(partition))
            if bounds is None:
                continue
            try:
                cold = src.tiered.state(topic, int(partition))
            except (UnknownTopicError, UnknownPartitionError):  # deleted meanwhile
                continue
            end.add_metric([topic, partition], bounds.high_watermark)
            log_end.add_metric([topic, partition], plog.log_end_offset)
            start.add_metric([topic, partition], bounds.log_start_offset)
            hot_start.add_metric([topic, partition], plog.log_start_offset)
            size.add_metric([topic, partition], plog.size_bytes)
            tiered_offset = cold.tiered_offset if cold is not None else 0
            tiered.add_metric([topic, partition], tiered_offset)
            backlog.add_metric([topic, partition], tiering_backlog(
                bounds.high_watermark, tiered_offset, bounds.log_start_offset))
        totals: dict[str, int] = {}
        for group, row in all_group_lag(src.groups, src.group_bounds):
            labels = [group, row.topic, str(row.partition)]
            if row.lag is not None:
                lag.add_metric(labels, row.lag)
                totals[group] = totals.get(group, 0) + row.lag
            if row.committed is not None:
                committed.add_metric(labels, row.committed.offset)
        for group, total in sorted(totals.items()):
            group_lag.add_metric([group], total)
        yield from families
