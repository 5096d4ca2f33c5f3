"""``format("lakelog")``: a Spark Python data source for batch reads and Structured Streaming.

Option names follow Spark's Kafka source: ``subscribe`` (or ``topic``),
``startingOffsets`` and ``endingOffsets`` (``earliest``, ``latest`` or JSON
like ``{"events": {"0": 42}}``, where -2 is earliest and -1 latest),
``maxOffsetsPerTrigger``, ``failOnDataLoss`` (``true``: a damaged hot batch that the
Delta tier does not hold fails the read, naming its offsets and file; ``false``:
its records are skipped with a warning), ``kafka.isolation.level`` (``read_committed``,
the default: no record of an open or aborted transaction; ``read_uncommitted``). Offsets in checkpoints have the same JSON
shape.
Every task reads one offset range of one partition with ``read_range``
(hot tier, Delta tier for what the hot tier no longer holds), or, for ``read_topic``
on an object store that Spark's own Parquet reader cannot reach (no ``hadoop-aws``),
the rows of one file of a fixed Delta snapshot (a fifth element, the file's URI, in
an entry of the ``ranges`` option) through pyarrow.
An object store's settings travel in the reader (``storage.object_store_env``: in
memory, never logged), since a Python worker's environment need not hold them. On a
cluster broker's data directory, a partition's end is its leader's high watermark, and
what the data directory lacks below it is fetched from the leader (``spark.tails``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from log_tables.cold.table import ColdFile, read_files
from log_tables.cold.topic_reader import (
    SPARK_DDL,
    cold_states,
    partition_bounds,
    read_range,
    with_topic,
)
from log_tables.errors import InvalidOptionError, UnknownTopicError
from log_tables.hot.isolation import READ_COMMITTED, Isolation
from log_tables.layout import Layout
from log_tables.spark.leaders import leader_bounds, merged
from log_tables.spark.sink import SinkStreamWriter, SinkWriter, Target, target_of
from log_tables.spark.tails import TailSource, read_tail, tail_source
from log_tables.storage import adopt_env, object_store_env

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Offsets = dict[str, dict[str, int]]
"""``{topic: {partition (as a string): offset}}``, the Kafka source's JSON shape."""
EARLIEST, LATEST = -2, -1
MAX_TASK_RECORDS = 1_000_000
"""A batch read splits a partition's range into tasks of at most this many offsets."""


class RangePartition(InputPartition):
    """One task: offsets ``start .. end-1`` of one topic partition; ``file`` (a Delta data
    file's URI): read them from that file alone. In a cluster, ``leader`` (its URL) has
    what the data directory lacks, and offsets below ``tiered`` are in the Delta tier."""

    def __init__(self, topic: str, partition: int, start: int, end: int,
                 file: str | None = None, leader: str | None = None, tiered: int = 0) -> None:
        super().__init__((topic, partition, start, end, file, leader, tiered))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.file, self.leader, self.tiered = file, leader, tiered


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    """Spark hands options over case-insensitively; keep them with lower-case names."""
    return {k.lower(): v for k, v in options.items()}


def _layout(options: Mapping[str, str], default: tuple[str, str] | None) -> Layout:
    data_dir = options.get("datadir") or (default and default[0])
    if not data_dir:
        raise InvalidOptionError("format('lakelog') needs option dataDir (or a session from "
                                 "log_tables.spark.session.lakelog_session / attach)")
    warehouse = options.get("warehouse") or (default[1] if default else None)
    return Layout.of(data_dir, warehouse)


def _topics(options: Mapping[str, str], layout: Layout) -> dict[str, int]:
    names = options.get("subscribe") or options.get("topic")
    if not names:
        raise InvalidOptionError("format('lakelog') needs option subscribe (or topic)")
    known = {t.name: t.partitions for t in layout.topics()}
    out = {}
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if name not in known:
            raise UnknownTopicError(name)
        out[name] = known[name]
    return out


Hints = dict[tuple[str, str], tuple[str | None, int]]
"""``(topic, partition)``: (its leader's URL, its tiered offset) as last planned."""


class Bounds(NamedTuple):
    starts: Offsets
    """The log start of every partition, across both tiers."""
    ends: Offsets
    """The high watermark of every partition (in a cluster, its leader's)."""
    hints: Hints


def log_bounds(layout: Layout, topics: Mapping[str, int], tails: TailSource | None = None,
               isolation: Isolation = READ_COMMITTED) -> Bounds:
    """(log start, high watermark) of every partition, across both tiers; ``tails``: those
    of the partitions' leaders where they are further."""
    leaders = leader_bounds(tails, topics) if tails is not None else None
    out = Bounds({}, {}, {})
    for topic, count in topics.items():
        _, cold = cold_states(layout, topic, count)
        out.starts[topic], out.ends[topic] = {}, {}
        for p in range(count):
            bounds = partition_bounds(layout, topic, p, cold[p] if cold is not None else None,
                                      isolation)
            leader = (leaders or {}).get(topic, {}).get(p)
            bounds = merged(bounds, leader)
            out.starts[topic][str(p)] = bounds.log_start_offset
            out.ends[topic][str(p)] = bounds.high_watermark
            out.hints[topic, str(p)] = (leader.leader_url if leader else None,
                                        bounds.tiered_offset)
    return out


def resolve(spec: str | None, default: str, starts: Offsets, ends: Offsets, what: str) -> Offsets:
    """``earliest`` / ``latest`` / per-partition JSON as concrete offsets."""
    spec = (spec or default).strip()
    if spec == "earliest":
        return {t: dict(ps) for t, ps in starts.items()}
    if spec == "latest":
        return {t: dict(ps) for t, ps in ends.items()}
    try:
        given = json.loads(spec)
        if not isinstance(given, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise InvalidOptionError(f"{what} must be earliest, latest or JSON like "
                                 f'{{"topic": {{"0": 42}}}}: {exc}') from None
    out: Offsets = {}
    for topic, parts in ends.items():
        out[topic] = {}
        for p, end in parts.items():
            value = int(given.get(topic, {}).get(p, EARLIEST if what == "startingOffsets" else LATEST))
            out[topic][p] = starts[topic][p] if value == EARLIEST else end if value == LATEST \
                else min(max(value, starts[topic][p]), end)
    return out


def ranges(start: Offsets, end: Offsets, max_task_records: int = MAX_TASK_RECORDS,
           hints: Hints | None = None) -> list[RangePartition]:
    out = []
    for topic, parts in end.items():
        for p, stop in parts.items():
            first = start.get(topic, {}).get(p, 0)
            leader, tiered = (hints or {}).get((topic, p), (None, 0))
            while first < stop:
                last = min(stop, first + max_task_records)
                out.append(RangePartition(topic, int(p), first, last, None, leader, tiered))
                first = last
    return out


def fail_on_data_loss(options: Mapping[str, str]) -> bool:
    """Spark's Kafka source option ``failOnDataLoss`` (default true)."""
    value = options.get("failondataloss", "true").strip().lower()
    if value not in ("true", "false"):
        raise InvalidOptionError(f"failOnDataLoss must be true or false, not {value!r}")
    return value == "true"


def isolation_of(options: Mapping[str, str]) -> Isolation:
    """Kafka's ``isolation.level``, as Spark's Kafka source takes a consumer's settings
    (``kafka.isolation.level``; ``isolation.level`` too): ``read_committed`` by default,
    what a table holds; ``read_uncommitted`` also reads the hot tail's records of open
    and aborted transactions."""
    value = options.get("kafka.isolation.level", options.get("isolation.level",
                                                             READ_COMMITTED.value))
    try:
        return Isolation(value.strip().lower())
    except ValueError:
        raise InvalidOptionError(f"kafka.isolation.level must be read_committed or "
                                 f"read_uncommitted, not {value!r}") from None


def read_partition(layout: Layout, partition: InputPartition, fail: bool = True,
                   env: tuple[tuple[str, str], ...] = (), tails: TailSource | None = None,
                   isolation: Isolation = READ_COMMITTED) -> Iterator[pa.RecordBatch]:
    assert isinstance(partition, RangePartition)
    adopt_env(env)
    p = partition
    if p.file is not None:
        cold = ColdFile(p.file, p.partition, p.start, p.end - 1, 0, 0, 0, 0)
        for rb in read_files([cold], p.start, p.end).to_batches():
            yield with_topic(rb, p.topic, p.partition)
        return
    if tails is not None:
        yield from read_tail(layout, tails, p.leader, p.topic, p.partition, p.start, p.end,
                             p.tiered, fail_on_data_loss=fail, isolation=isolation)
        return
    yield from read_range(layout, p.topic, p.partition, p.start, p.end, fail_on_data_loss=fail,
                          isolation=isolation)


class LakelogDataSource(DataSource):
    """``spark.read.format("lakelog")`` / ``spark.readStream.format("lakelog")``."""

    default_layout: tuple[str, str] | None = None
    store_env: tuple[tuple[str, str], ...] = ()
    """The warehouse's object-store settings at registration, for the tasks."""

    @classmethod
    def name(cls) -> str:
        return "lakelog"

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return _BatchReader(_lower(self.options), self.default_layout, self.store_env)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _StreamReader(_lower(self.options), self.default_layout, self.store_env)

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        """``df.write.format("lakelog")``: one transaction (``log_tables.spark.sink``)."""
        options = _lower(self.options)
        version = options.get("txnversion")
        return SinkWriter(self._target(options), int(version) if version else None)

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        """``writeStream.format("lakelog")``: each micro-batch once."""
        return SinkStreamWriter(self._target(_lower(self.options)))

    def _target(self, options: dict[str, str]) -> Target:
        layout = _layout(options, self.default_layout) \
            if options.get("datadir") or self.default_layout else None
        return target_of(options, tail_source(layout) if layout is not None else None)


def _env_for(layout: Layout, given: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The settings the tasks use: this process's when it has them, else those given at
    registration."""
    return object_store_env(layout.warehouse) or given


class _BatchReader(DataSourceReader):
    def __init__(self, options: dict[str, str], default: tuple[str, str] | None,
                 env: tuple[tuple[str, str], ...] = ()) -> None:
        self.layout = _layout(options, default)
        self.env = _env_for(self.layout, env)
        adopt_env(self.env)
        self.fail = fail_on_data_loss(options)
        self.isolation = isolation_of(options)
        self.tails = tail_source(self.layout)
        exact = options.get("ranges")
        if exact is not None:  # read_topic passes the exact ranges (and files) it planned
            self.parts = [RangePartition(t, int(p), int(s), int(e), *f)
                          for t, p, s, e, *f in json.loads(exact)]
            return
        topics = _topics(options, self.layout)
        starts, ends, hints = log_bounds(self.layout, topics, self.tails, self.isolation)
        first = resolve(options.get("startingoffsets"), "earliest", starts, ends, "startingOffsets")
        last = resolve(options.get("endingoffsets"), "latest", starts, ends, "endingOffsets")
        self.parts = ranges(first, last, hints=hints)

    def partitions(self) -> Sequence[InputPartition]:
        return self.parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.layout, partition, self.fail, self.env, self.tails,
                              self.isolation)


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str], default: tuple[str, str] | None,
                 env: tuple[tuple[str, str], ...] = ()) -> None:
        self.options = options
        self.layout = _layout(options, default)
        self.env = _env_for(self.layout, env)
        adopt_env(self.env)
        self.fail = fail_on_data_loss(options)
        self.isolation = isolation_of(options)
        self.tails = tail_source(self.layout)
        self.hints: Hints = {}
        self.topics = _topics(options, self.layout)
        limit = options.get("maxoffsetspertrigger")
        self.max_offsets = int(limit) if limit else None
        if self.max_offsets is not None and self.max_offsets < 1:
            raise InvalidOptionError("maxOffsetsPerTrigger must be a positive number")
        self.available_now: Offsets | None = None

    def _bounds(self) -> tuple[Offsets, Offsets]:
        self.topics = _topics(self.options, self.layout)  # partitions may have been added
        # cluster.json again at every plan: its broker rewrites it at every start (on
        # another address, maybe), and a stream outlives the broker it started beside.
        self.tails = tail_source(self.layout)
        starts, ends, hints = log_bounds(self.layout, self.topics, self.tails, self.isolation)
        self.hints.update(hints)
        return starts, ends

    def initialOffset(self) -> dict:  # type: ignore[type-arg]
        starts, ends = self._bounds()
        return resolve(self.options.get("startingoffsets"), "latest", starts, ends,
                       "startingOffsets")

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now = self._bounds()[1]

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_offsets) if self.max_offsets else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # type: ignore[type-arg]
        starts, ends = self._bounds()
        target = self.available_now or ends
        begin: Offsets = {t: {p: start.get(t, {}).get(p, starts[t][p]) for p in ps}
                          for t, ps in target.items()}
        end: Offsets = {t: {p: max(begin[t][p], min(v, ends[t][p])) for p, v in ps.items()}
                        for t, ps in target.items()}
        if isinstance(limit, ReadMaxRows):
            end = _rate_limit(begin, end, limit.max_rows)
        return end

    def reportLatestOffset(self) -> dict | None:  # type: ignore[type-arg]
        return self._bounds()[1]

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:  # type: ignore[type-arg]
        return ranges(start, end, hints=self.hints)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.layout, partition, self.fail, self.env, self.tails,
                              self.isolation)

    def commit(self, end: dict) -> None:  # type: ignore[type-arg]
        pass  # nothing to release: the log keeps data by retention, not by consumers


def _rate_limit(begin: Offsets, end: Offsets, max_rows: int) -> Offsets:
    """Share ``max_rows`` among partitions in proportion to their backlog (as Kafka's source)."""
    backlog = {(t, p): end[t][p] - begin[t][p] for t in end for p in end[t]}
    total = sum(backlog.values())
    if total <= max_rows:
        return end
    out: Offsets = {t: dict(ps) for t, ps in begin.items()}
    budget = max_rows
    for (t, p), lag in sorted(backlog.items(), key=lambda kv: -kv[1]):
        share = min(lag, max(1, lag * max_rows // total), budget)
        out[t][p] = begin[t][p] + share
        budget -= share
    return out


def attached_source(layout: Layout) -> type[LakelogDataSource]:
    """``LakelogDataSource`` with ``layout`` as its default dataDir/warehouse."""
    return type("LakelogDataSourceAttached", (LakelogDataSource,),
                {"default_layout": (layout.data_dir, layout.warehouse),
                 "store_env": object_store_env(layout.warehouse)})


def register_source(spark: SparkSession, layout: Layout) -> None:
    """Register ``format("lakelog")`` with ``layout`` as its default dataDir/warehouse."""
    spark.dataSource.register(attached_source(layout))
