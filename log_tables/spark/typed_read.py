"""Typed and upsert topics (``delta.table.mode``) as Spark DataFrames: the typed table
and the records it does not hold yet, decoded as the job would, in one answer.

Per partition the typed table covers offsets up to its app transaction
``lakelog-typed-<p>`` (M); the records from M on (tiered and not typed yet, or still
hot) are read as ``read_topic(typed=False)`` does and decoded in Spark tasks
(``mapInArrow``) with the schemas of this data directory's replica of the registry, into
the table's columns (widened by the newest schema of the topic's value subject). A
record that cannot be decoded is left out (the job puts it in the dead-letter table);
one whose schema this replica does not hold yet is left out until it does.
``stream_topic`` decodes a stream of the topic the same way.

An upsert topic's answer is its table with the newer records applied: the latest row
per key (by offset), a tombstone removing its key. Time travel (``version``,
``timestamp_as_of``) reads the typed table's own history, without the hot tail.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from log_tables.cold.rows import TIMESTAMP_TYPE
from log_tables.errors import InvalidOptionError, StorageError, UnknownTopicError
from log_tables.layout import Layout, delta_path
from log_tables.records import HEADERS_TYPE
from log_tables.registry import TopicMetadata
from log_tables.typed.catalog import Catalog
from log_tables.typed.columns import (
    META_FIELDS,
    META_NAMES,
    TYPED_KEY,
    conform,
    typed_app_id,
)
from log_tables.typed.decode import Decoder, table_fields
from log_tables.typed.rows import SKIP, type_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DELETE_FLAG = "_lakelog_delete"


def read_typed(spark: SparkSession, layout: Layout, meta: TopicMetadata, *,
               starting_offsets: Any, ending_offsets: Any, travel: int | str | datetime | None,
               include_hot: bool | None, isolation_level: str,
               fail_on_data_loss: bool) -> DataFrame:
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from log_tables.spark.read import read_topic, spark_uri

    upsert = meta.config.delta_table_mode == "upsert"
    if upsert and (starting_offsets != "earliest" or ending_offsets != "latest"):
        raise InvalidOptionError("an upsert topic reads as its table (the latest value per "
                                 "key): offsets do not apply; read it with typed=False")
    if isinstance(travel, datetime):
        travel = travel.isoformat()
    dt, fields = table_fields(layout, meta.name, travel, latest=travel is None)
    if travel is not None and dt is None:
        raise InvalidOptionError(f"topic {meta.name!r} has no typed table to time-travel yet")
    schema = pa.schema(META_FIELDS + fields)
    spark_schema = from_arrow_schema(schema)
    files = [delta_path(u) for u in dt.file_uris()] if dt is not None else []
    out = (spark.read.schema(spark_schema).option("basePath", spark_uri(layout.typed_uri(meta.name)))
           .parquet(*map(spark_uri, files)) if files else spark.createDataFrame([], spark_schema))
    ranges = _ranges(starting_offsets, ending_offsets)  # (on the table and tail alike)
    hot = include_hot if include_hot is not None else travel is None
    if not hot:
        return (out.where(ranges) if ranges is not None else out).select(*schema.names)
    covered = {p: (dt.transaction_version(typed_app_id(p)) or 0) if dt is not None else 0
               for p in range(meta.partitions)}
    raw = read_topic(spark, meta.name, starting_offsets=covered, ending_offsets=ending_offsets,
                     isolation_level=isolation_level, fail_on_data_loss=fail_on_data_loss,
                     typed=False)
    tail_schema = pa.schema([*schema, pa.field(DELETE_FLAG, pa.bool_())])
    tail = raw.mapInArrow(_decode_tail(layout, schema, upsert), from_arrow_schema(tail_schema))
    if not upsert:
        both = out.select(*schema.names).unionByName(tail.drop(DELETE_FLAG))
        return both.where(ranges) if ranges is not None else both
    newest = Window.partitionBy("partition", "key").orderBy(F.col("offset").desc())
    both = out.withColumn(DELETE_FLAG, F.lit(False)).unionByName(tail)
    return (both.withColumn("_lakelog_rank", F.row_number().over(newest))
            .where((F.col("_lakelog_rank") == 1) & ~F.col(DELETE_FLAG))
            .select(*schema.names))


def stream_topic(spark: SparkSession, topic: str, **options: str) -> DataFrame:
    """A topic as a stream (the ``lakelog`` source: ``options`` are its options, such as
    ``startingOffsets``); a typed or upsert topic's records decoded into its typed
    columns (as of the stream's start: a column a newer schema adds shows once the query
    restarts). An upsert topic streams its changes: each record a row, a tombstone a row
    whose value columns are null."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from log_tables.spark.session import session_layout

    layout = session_layout(spark)
    meta = {t.name: t for t in layout.topics()}.get(topic)
    if meta is None:
        raise UnknownTopicError(topic)
    reader = spark.readStream.format("lakelog").option("subscribe", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    raw = reader.load()
    if meta.config.delta_table_mode == "raw":
        return raw
    _, fields = table_fields(layout, topic)
    schema = pa.schema(META_FIELDS + fields)
    tail_schema = pa.schema([*schema, pa.field(DELETE_FLAG, pa.bool_())])
    return raw.mapInArrow(_decode_tail(layout, schema, False, strict=True),
                          from_arrow_schema(tail_schema)).drop(DELETE_FLAG)


def _ranges(starting: Any, ending: Any) -> Any:
    """A filter for per-partition offsets given (None: every row); -2 is earliest and -1
    latest, as in Kafka (from latest, or to earliest: none of the partition)."""
    from pyspark.sql import functions as F

    conds = [F.lit(False)] if starting == "latest" or ending == "earliest" else []
    for spec, is_start in ((starting, True), (ending, False)):
        if isinstance(spec, Mapping):
            for p, o in spec.items():
                if o == (-2 if is_start else -1):
                    continue
                if o in (-1, -2):
                    conds.append(F.col("partition") != p)
                    continue
                bound = F.col("offset") >= o if is_start else F.col("offset") < o
                conds.append((F.col("partition") != p) | bound)
        elif spec not in ("earliest", "latest"):
            raise InvalidOptionError(f"offsets must be 'earliest', 'latest' or "
                                     f"{{partition: offset}}, not {spec!r}")
    if not conds:
        return None
    out = conds[0]
    for c in conds[1:]:
        out = out & c
    return out


def _decode_tail(layout: Layout, schema: pa.Schema, upsert: bool, strict: bool = False
                 ) -> Any:
    """The ``mapInArrow`` function: Kafka-column batches to the typed columns. ``strict``
    (a stream, which never reads a record again): a schema id this data directory's
    registry does not hold fails the task, instead of leaving its records out."""
    fields = [f for f in schema if f.name not in META_NAMES]

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        decoder = Decoder(Catalog(layout, float("inf") if strict else None))
        out_schema = pa.schema([*schema, pa.field(DELETE_FLAG, pa.bool_())])
        for batch in batches:
            table = pa.Table.from_batches([batch])
            for p in pc.unique(table.column("partition")).to_pylist():
                part = table.filter(pc.equal(table.column("partition"), p)).sort_by("offset")
                if upsert:
                    part = part.filter(pc.is_valid(part.column("key")))
                raw = pa.table({"offset": part.column("offset"),
                                "timestamp": part.column("timestamp").cast(TIMESTAMP_TYPE),
                                "key": part.column("key"), "value": part.column("value"),
                                "headers": part.column("headers").cast(HEADERS_TYPE)})
                decoded = decoder.decode(raw.column("value").combine_chunks())
                keys = decoder.decode(raw.column("key").combine_chunks()) if any(
                    f.name == TYPED_KEY for f in fields) else None
                if keys is not None and keys.wait_at is not None and (
                        decoded.wait_at is None or keys.wait_at < decoded.wait_at):
                    decoded.wait_at = keys.wait_at
                if decoded.wait_at is not None and strict:
                    raise StorageError(
                        f"typed stream: partition {p} offset "
                        f"{raw.column('offset')[decoded.wait_at].as_py()} has a schema id "
                        "this data directory's copy of the registry does not hold; the "
                        "stream stops rather than leave the record out (restart it once "
                        "the replica of __schemas has it)")
                end = int(raw.column("offset")[-1].as_py()) + 1 if raw.num_rows else 0
                typed = type_rows(raw, int(p), end, decoded, fields, SKIP, False, keys)
                kept = typed.rows
                deletes = pc.is_null(raw.column("value")).take(
                    pc.index_in(kept.column("offset"), raw.column("offset")))
                columns = [conform(kept.column(f.name).combine_chunks(), f.type)
                           if f.name in kept.column_names else pa.nulls(kept.num_rows, f.type)
                           for f in schema]
                yield pa.RecordBatch.from_arrays([*columns, deletes.combine_chunks()
                                                  if isinstance(deletes, pa.ChunkedArray)
                                                  else deletes], schema=out_schema)
    return decode
