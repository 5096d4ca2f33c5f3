"""Topics as Spark DataFrames: the Delta tier union the hot tail.

``read_topic`` fixes, at call time, one Delta snapshot and per partition its
tiered offset T and the hot tier's high watermark H. Offsets below T come from
that snapshot's Parquet files (Spark's own Parquet reader, files picked by
their offset stats); offsets T .. H-1 from the ``lakelog`` source (hot
segments, or the Delta table if local retention removed them meanwhile). The
two ranges meet at T, so there is no gap and no duplicate, whatever commits
land while the query runs.
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
from log_tables.layout import Layout, delta_path
from log_tables.spark.session import session_layout

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

OffsetSpec = Literal["earliest", "latest"] | Mapping[int, int]
FILE_DDL = ("key BINARY, value BINARY, offset BIGINT, timestamp TIMESTAMP, timestampType INT, "
            "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, partition INT")
KAFKA_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
                 "headers"]


def read_topic(spark: SparkSession, topic: str, *,
               starting_offsets: OffsetSpec = "earliest",
               ending_offsets: OffsetSpec = "latest",
               starting_timestamp: int | datetime | None = None,
               ending_timestamp: int | datetime | None = None,
               include_hot: bool | None = None,
               version: int | None = None,
               timestamp_as_of: datetime | str | None = None,
               fail_on_data_loss: bool = True) -> DataFrame:
    """A topic as a DataFrame with the schema of Spark's Kafka source.

    Offsets are per partition (``{partition: offset}``; missing partitions read
    from the earliest / to the latest); ``starting_timestamp`` / ``ending_timestamp``
    (epoch ms or datetime) pick offsets as Kafka's ListOffsets does. ``version``
    or ``timestamp_as_of`` time-travel the Delta part and leave the hot tail out
    unless ``include_hot=True``. ``fail_on_data_loss`` (Spark's ``failOnDataLoss``):
    False skips the records of a damaged hot batch (with a warning) instead of failing.
    """
    from pyspark.sql import functions as F

    layout = session_layout(spark)
    meta = {t.name: t for t in layout.topics()}.get(topic)
    if meta is None:
        raise UnknownTopicError(topic)
    if version is not None and timestamp_as_of is not None:
        raise InvalidOptionError("pass version or timestamp_as_of, not both")
    travel = version if version is not None else timestamp_as_of
    if isinstance(travel, datetime):
        travel = travel.isoformat()
    hot = include_hot if include_hot is not None else travel is None
    _, cold = cold_states(layout, topic, meta.partitions, travel)
    if cold is not None and travel is None:
        _check_topic_id(layout, topic, meta.topic_id)
    plan = _plan(layout, topic, meta.partitions, cold, hot, starting_offsets, ending_offsets,
                 starting_timestamp, ending_timestamp)
    parts: list[DataFrame] = []
    chosen = {p: [f for f in cold[p].files if f.max_offset >= s and f.min_offset < min(e, t)]
              for p, (s, e, t) in plan.items()} if cold is not None else {}
    cold_files = [f.path for files in chosen.values() for f in files]
    if cold_files:
        df = spark.read.schema(FILE_DDL).option("basePath", layout.table_uri(topic)).parquet(
            *cold_files)
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
    hot_ranges = [(topic, p, max(s, t), e) for p, (s, e, t) in plan.items() if max(s, t) < e]
    if hot_ranges:
        parts.append(spark.read.format("lakelog").option("ranges", json.dumps(hot_ranges))
                     .option("dataDir", layout.data_dir).option("warehouse", layout.warehouse)
                     .option("failOnDataLoss", str(fail_on_data_loss).lower()).load())
    if not parts:
        return spark.createDataFrame([], SPARK_DDL)
    out = parts[0]
    for more in parts[1:]:
        out = out.unionByName(more)
    return out


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
          starting_ts: int | datetime | None, ending_ts: int | datetime | None
          ) -> dict[int, tuple[int, int, int]]:
    """Per partition: (start, end, tiered offset); ``end`` is at most the high watermark."""
    plan = {}
    for p in range(partitions):
        state = cold[p] if cold is not None else None
        earliest, tiered, hw = partition_bounds(layout, topic, p, state)
        if not hot:
            hw = tiered
        start = _pick(starting, p, earliest, hw, missing=earliest)
        end = _pick(ending, p, earliest, hw, missing=hw)
        if starting_ts is not None:
            found = offset_for_timestamp(layout, topic, p, _ms(starting_ts), state)
            start = hw if found is None else max(found, start)
        if ending_ts is not None:
            found = offset_for_timestamp(layout, topic, p, _ms(ending_ts), state)
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
    schema; empty when the table does not exist yet."""
    dt = open_table(uri)
    files = [delta_path(u) for u in dt.file_uris()] if dt is not None else []
    return spark.read.schema(ddl).parquet(*files) if files else spark.createDataFrame([], ddl)


PARTITIONS_DDL = ("topic STRING, partition INT, log_start_offset BIGINT, high_watermark BIGINT, "
                  "tiered_offset BIGINT, hot_bytes BIGINT, cold_bytes BIGINT, "
                  "delta_version BIGINT")


def partition_rows(layout: Layout) -> list[tuple[object, ...]]:
    """One row per topic partition: bounds, tiered offset, bytes per tier, Delta version."""
    rows: list[tuple[object, ...]] = []
    for meta in layout.topics():
        version, cold = cold_states(layout, meta.name, meta.partitions)
        for p in range(meta.partitions):
            state = cold[p] if cold is not None else None
            hot_dir = layout.partition_dir(meta.name, p)
            hot_bytes = sum(f.stat().st_size for f in hot_dir.glob("*.log")) if hot_dir.exists() else 0
            start, tiered, hw = partition_bounds(layout, meta.name, p, state)
            rows.append((meta.name, p, start, hw, tiered, hot_bytes,
                         state.size_bytes if state else 0, version))
    return rows
