"""Topics as Spark DataFrames: the Delta tier union the hot tail.

``read_topic`` fixes, at call time, one Delta snapshot and per partition its
tiered offset T and the hot tier's high watermark H. Offsets below T come from
that snapshot's Parquet files (Spark's own Parquet reader, files picked by
their offset stats); offsets T .. H-1 from the ``lakelog`` source (hot
segments, or the Delta table if local retention removed them meanwhile). The
two ranges meet at T, so there is no gap and no duplicate, whatever commits
land while the query runs. On a cluster broker's data directory, H is the
partition's leader's high watermark, and the source fetches from the leader
what the data directory lacks below it (``log_tables.spark.leaders``, ``.tails``).

On an object-store warehouse Spark's Parquet reader is used where the session can
reach the store itself (``hadoop-aws``'s ``s3a://`` on a cluster that has it: found
by looking for its class, or forced with ``spark.lakelog.objectStoreReads=spark``);
elsewhere the same snapshot's files are read by the ``lakelog`` source, one task per
file, through pyarrow's file system (``spark.lakelog.objectStoreReads=lakelog``).
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from log_tables.cold.table import PartitionState, open_table, table_topic_id
from log_tables.cold.topic_reader import (
    SPARK_DDL,
    cold_states,
    offset_for_timestamp,
    partition_bounds,
)
from log_tables.errors import InvalidOptionError, StorageError, UnknownTopicError
from log_tables.hot.isolation import READ_COMMITTED, Isolation
from log_tables.layout import Layout, delta_path, is_local
from log_tables.moved import moved
from log_tables.spark.leaders import (
    LeaderBound,
    leader_bounds,
    leader_offset_for_timestamp,
    merged,
)
from log_tables.spark.session import session_layout
from log_tables.spark.source import isolation_of
from log_tables.spark.tails import TailSource, tail_source
from log_tables.storage import S3_SCHEMES, scheme

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__getattr__ = moved(__name__, {"register_views": "lakelog.spark"})  # here until 0.1's refactor
OffsetSpec = Literal["earliest", "latest"] | Mapping[int, int]
FILE_DDL = ("key BINARY, value BINARY, offset BIGINT, timestamp TIMESTAMP, timestampType INT, "
            "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, partition INT")
KAFKA_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
                 "headers"]
CONF_STORE_READS = "spark.lakelog.objectStoreReads"
"""``auto`` (default), ``spark`` (Spark's own reader: the cluster has the store's Hadoop
file system) or ``lakelog`` (pyarrow in lakelog's source)."""
HADOOP_FILE_SYSTEMS = {"s3": "org.apache.hadoop.fs.s3a.S3AFileSystem",
                       "s3a": "org.apache.hadoop.fs.s3a.S3AFileSystem",
                       "gs": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem",
                       "abfss": "org.apache.hadoop.fs.azurebfs.SecureAzureBlobFileSystem",
                       "abfs": "org.apache.hadoop.fs.azurebfs.AzureBlobFileSystem"}


def read_topic(spark: SparkSession, topic: str, *,
               starting_offsets: OffsetSpec = "earliest",
               ending_offsets: OffsetSpec = "latest",
               starting_timestamp: int | datetime | None = None,
               ending_timestamp: int | datetime | None = None,
               include_hot: bool | None = None,
               version: int | None = None,
               timestamp_as_of: datetime | str | None = None,
               fail_on_data_loss: bool = True,
               isolation_level: str = "read_committed",
               typed: bool | None = None) -> DataFrame:
    """A topic as a DataFrame with the schema of Spark's Kafka source (a typed or upsert
    topic: its typed columns, ``log_tables.spark.typed_read``).

    Offsets are per partition (``{partition: offset}``; missing partitions read
    from the earliest / to the latest); ``starting_timestamp`` / ``ending_timestamp``
    (epoch ms or datetime) pick offsets as Kafka's ListOffsets does. ``version``
    or ``timestamp_as_of`` time-travel the Delta part and leave the hot tail out
    unless ``include_hot=True``. ``fail_on_data_loss`` (Spark's ``failOnDataLoss``):
    False skips the records of a damaged hot batch (with a warning) instead of failing.
    ``isolation_level`` (Kafka's): ``read_committed`` (the default, what the table holds)
    reads no record of an open or aborted transaction in the hot tail;
    ``read_uncommitted`` reads them too. ``typed``: the typed columns (the default for a
    topic whose ``delta.table.mode`` is typed or upsert) or, False, the Kafka columns.
    """
    from pyspark.sql import functions as F

    layout = session_layout(spark)
    meta = {t.name: t for t in layout.topics()}.get(topic)
    if meta is None:
        raise UnknownTopicError(topic)
    if version is not None and timestamp_as_of is not None:
        raise InvalidOptionError("pass version or timestamp_as_of, not both")
    travel = version if version is not None else timestamp_as_of
    if typed is None:
        typed = meta.config.delta_table_mode != "raw"
    if typed:
        from log_tables.spark.typed_read import read_typed

        if starting_timestamp is not None or ending_timestamp is not None:
            raise InvalidOptionError("a typed read takes offsets, not timestamps: filter on "
                                     "the timestamp column, or read with typed=False")
        return read_typed(spark, layout, meta, starting_offsets=starting_offsets,
                          ending_offsets=ending_offsets, travel=travel,
                          include_hot=include_hot, isolation_level=isolation_level,
                          fail_on_data_loss=fail_on_data_loss)
    if isinstance(travel, datetime):
        travel = travel.isoformat()
    hot = include_hot if include_hot is not None else travel is None
    _, cold = cold_states(layout, topic, meta.partitions, travel)
    if cold is not None and travel is None:
        _check_topic_id(layout, topic, meta.topic_id)
    tails = tail_source(layout) if hot else None
    leaders = (leader_bounds(tails, [topic]) or {}).get(topic, {}) if tails is not None else {}
    isolation = isolation_of({"isolation.level": isolation_level})
    plan = _plan(layout, topic, meta.partitions, cold, hot, starting_offsets, ending_offsets,
                 starting_timestamp, ending_timestamp, tails, leaders, isolation)
    parts: list[DataFrame] = []
    chosen = {p: [f for f in cold[p].files if f.max_offset >= s and f.min_offset < min(e, t)]
              for p, (s, e, t) in plan.items()} if cold is not None else {}
    cold_files = [f.path for files in chosen.values() for f in files]
    spark_reads = spark_reads_store(spark, layout.warehouse)
    if cold_files and not spark_reads:
        parts.append(_source(spark, layout, [
            (topic, p, max(f.min_offset, plan[p][0]), min(f.max_offset + 1, *plan[p][1:]), f.path)
            for p, files in chosen.items() for f in files], fail_on_data_loss))
    elif cold_files:
        df = spark.read.schema(FILE_DDL).option("basePath", spark_uri(layout.table_uri(topic))
                                                ).parquet(*map(spark_uri, cold_files))
        # Rows are filtered only in partitions where a chosen file reaches past the range:
        # a full scan of whole files stays a plain Parquet scan.
        partial = {p for p, files in chosen.items()
                   if any(f.min_offset < plan[p][0] or f.max_offset >= min(plan[p][1:]) for f in files)}
        if partial:
            conds = [(F.col("partition") == p) & (F.col("offset") >= plan[p][0])
                     & (F.col("offset") < min(plan[p][1:])) for p in sorted(partial)]
            whole = [p for p, files in chosen.items() if files and p not in partial]
            if whole:
                conds.append(F.col("partition").isin(whole))
            df = df.where(functools.reduce(operator.or_, conds))
        parts.append(df.withColumn("topic", F.lit(topic)).select(*KAFKA_COLUMNS))
    hot_ranges: list[tuple[object, ...]] = [
        (topic, p, max(s, t), e) if tails is None else
        (topic, p, max(s, t), e, None, leaders[p].leader_url if p in leaders else None, t)
        for p, (s, e, t) in plan.items() if max(s, t) < e]
    if hot_ranges:
        parts.append(_source(spark, layout, hot_ranges, fail_on_data_loss, isolation))
    if not parts:
        return spark.createDataFrame([], SPARK_DDL)
    out = parts[0]
    for more in parts[1:]:
        out = out.unionByName(more)
    return out


def _source(spark: SparkSession, layout: Layout, ranges: Sequence[tuple[object, ...]],
            fail_on_data_loss: bool, isolation: Isolation = READ_COMMITTED) -> DataFrame:
    """The ``lakelog`` source over exact ranges: (topic, partition, start, end[, file])."""
    return (spark.read.format("lakelog").option("ranges", json.dumps(ranges))
            .option("dataDir", layout.data_dir).option("warehouse", layout.warehouse)
            .option("failOnDataLoss", str(fail_on_data_loss).lower())
            .option("kafka.isolation.level", isolation.value).load())


_FOUND: dict[str, bool] = {}


def spark_reads_store(spark: SparkSession, warehouse: str) -> bool:
    """Whether Spark's own readers reach ``warehouse`` (always for a local one)."""
    if is_local(warehouse):
        return True
    mode = (spark.conf.get(CONF_STORE_READS, None) or "auto").strip().lower()
    if mode not in ("auto", "spark", "lakelog"):
        raise InvalidOptionError(f"{CONF_STORE_READS} must be auto, spark or lakelog, not "
                                 f"{mode!r}")
    if mode != "auto":
        return mode == "spark"
    kind = scheme(warehouse)
    if kind not in _FOUND:
        _FOUND[kind] = _has_class(spark, HADOOP_FILE_SYSTEMS.get(kind))
    return _FOUND[kind]


def _has_class(spark: SparkSession, name: str | None) -> bool:
    if name is None:
        return False
    try:
        jvm = spark.sparkContext._jvm  # not there under Spark Connect: lakelog's reads
        assert jvm is not None
        # Spark's own class loader: it also sees jars added with spark.jars / --packages.
        jvm.org.apache.spark.util.Utils.classForName(name, True, False)
        return True
    except Exception:
        return False


def spark_uri(uri: str) -> str:
    """A URI as Spark's Hadoop file systems name it (``s3a://`` for ``s3://``)."""
    if scheme(uri) in S3_SCHEMES:
        return "s3a://" + uri.split("://", 1)[1]
    return uri


def _check_topic_id(layout: Layout, topic: str, topic_id: str) -> None:

    dt = open_table(layout.table_uri(topic))
    found = None if dt is None else table_topic_id(dt)
    if found is not None and found != topic_id:
        raise StorageError(f"{layout.table_uri(topic)} belongs to an earlier topic named "
                                 f"{topic} (id {found}); delete that table")


def _ms(value: int | datetime) -> int:
    return int(value.timestamp() * 1000) if isinstance(value, datetime) else int(value)


def _plan(layout: Layout, topic: str, partitions: int, cold: Sequence[PartitionState] | None,
          hot: bool, starting: OffsetSpec, ending: OffsetSpec,
          starting_ts: int | datetime | None, ending_ts: int | datetime | None,
          tails: TailSource | None = None, leaders: Mapping[int, LeaderBound] | None = None,
          isolation: Isolation = READ_COMMITTED) -> dict[int, tuple[int, int, int]]:
    """Per partition: (start, end, tiered offset); ``end`` is at most the high watermark
    (in a cluster, the partition's leader's: ``leaders``)."""
    plan = {}
    for p in range(partitions):
        state = cold[p] if cold is not None else None
        leader = (leaders or {}).get(p)
        earliest, tiered, hw = merged(partition_bounds(layout, topic, p, state, isolation),
                                      leader)
        if not hot:
            hw = tiered
        start = _pick(starting, p, earliest, hw, missing=earliest)
        end = _pick(ending, p, earliest, hw, missing=hw)
        for ts, is_start in ((starting_ts, True), (ending_ts, False)):
            if ts is None:
                continue
            found = offset_for_timestamp(layout, topic, p, _ms(ts), state)
            if found is None and tails is not None and leader is not None and leader.leader >= 0:
                # Not in what this data directory holds (a prefix of the log): the leader's.
                found = leader_offset_for_timestamp(tails, leader, topic, p, _ms(ts))
            if is_start:
                start = hw if found is None else max(found, start)
            else:
                end = hw if found is None else min(found, end)
        plan[p] = (max(start, earliest), min(end, hw), tiered)
    return plan


def _pick(spec: OffsetSpec, partition: int, earliest: int, latest: int, *, missing: int) -> int:
    if isinstance(spec, Mapping):
        value = spec.get(partition)
        if value is None:
            return missing
        if value == -2:
            return earliest
        return latest if value == -1 else int(value)
    if spec == "earliest":
        return earliest
    if spec == "latest":
        return latest
    raise InvalidOptionError(f"offsets must be 'earliest', 'latest' or {{partition: offset}}, "
                             f"not {spec!r}")


def read_delta(spark: SparkSession, uri: str, ddl: str) -> DataFrame:
    """A Delta table's current files read by Spark's Parquet reader with the given
    schema; empty when the table does not exist yet. On an object store Spark cannot
    reach, delta-rs reads the table (lakelog's own tables, which stay small) and Spark
    gets the rows."""
    dt = open_table(uri)
    files = [delta_path(u) for u in dt.file_uris()] if dt is not None else []
    if not files:
        return spark.createDataFrame([], ddl)
    if spark_reads_store(spark, uri):
        return spark.read.schema(ddl).parquet(*map(spark_uri, files))
    assert dt is not None
    wanted = spark.createDataFrame([], ddl)
    rows = dt.to_pyarrow_table(columns=wanted.columns)
    return spark.createDataFrame(rows, schema=wanted.schema)


PARTITIONS_DDL = ("topic STRING, partition INT, log_start_offset BIGINT, high_watermark BIGINT, "
                  "tiered_offset BIGINT, hot_bytes BIGINT, cold_bytes BIGINT, "
                  "delta_version BIGINT")


def partition_rows(layout: Layout) -> list[tuple[object, ...]]:
    """One row per topic partition: bounds, tiered offset, bytes per tier, Delta version
    (in a cluster, the high watermark, log start and hot bytes of the partition's leader)."""
    rows: list[tuple[object, ...]] = []
    topics = layout.topics()
    tails = tail_source(layout)
    leaders = (leader_bounds(tails, [m.name for m in topics]) or {}) if tails is not None else {}
    for meta in topics:
        version, cold = cold_states(layout, meta.name, meta.partitions)
        for p in range(meta.partitions):
            state = cold[p] if cold is not None else None
            hot_dir = layout.partition_dir(meta.name, p)
            hot_bytes = sum(f.stat().st_size for f in hot_dir.glob("*.log")) if hot_dir.exists() else 0
            leader = leaders.get(meta.name, {}).get(p)
            if leader is not None and leader.leader >= 0:
                hot_bytes = leader.size_bytes
            start, tiered, hw = merged(partition_bounds(layout, meta.name, p, state), leader)
            rows.append((meta.name, p, start, hw, tiered, hot_bytes,
                         state.size_bytes if state else 0, version))
    return rows
