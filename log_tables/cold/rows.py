"""Rows of the cold tier: the table's schema, converting between the hot and the cold
form, Delta stats of a file's rows, and writing them as Parquet.

A cold row is a record in the schema of Spark's Kafka source, its offset explicit;
a file's rows are sorted by offset. ``file_stats`` gives the add action's stats
(``numRecords``, min/max of ``offset`` and ``timestamp``) that readers pick files by.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from log_tables.errors import StorageError
from log_tables.layout import is_local, local_path
from log_tables.records import HEADERS_TYPE, RECORD_SCHEMA
from log_tables.storage import filesystem

TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
CREATE_TIME, LOG_APPEND_TIME = 0, 1
ROW_GROUP_ROWS = 65_536
"""Rows per Parquet row group: small enough that a fetch of one offset reads a few MB."""

# Spark's Kafka source schema; ``topic`` is added at read time, not stored.
TABLE_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp", TIMESTAMP_TYPE, nullable=False),
    pa.field("timestampType", pa.int32(), nullable=False),
    pa.field("headers", HEADERS_TYPE),
])
FILE_SCHEMA = pa.schema([f for f in TABLE_SCHEMA if f.name != "partition"])


def to_table_rows(base_offset: int, records: pa.RecordBatch, log_append_time: bool
                  ) -> pa.RecordBatch:
    """A hot batch body (RECORD_SCHEMA) as cold rows (FILE_SCHEMA), offsets made explicit."""
    n = records.num_rows
    millis = records.column(0).cast(pa.timestamp("ms", tz="UTC"))
    return pa.RecordBatch.from_arrays([
        records.column(1),
        records.column(2),
        pa.array(np.arange(base_offset, base_offset + n, dtype=np.int64)),
        millis.cast(TIMESTAMP_TYPE),
        pa.array(np.full(n, LOG_APPEND_TIME if log_append_time else CREATE_TIME, np.int32)),
        records.column(3),
    ], schema=FILE_SCHEMA)


class ColdBatch(NamedTuple):
    """Rows of the cold tier back in the hot form: offsets ``base_offset ..`` dense."""

    base_offset: int
    records: pa.RecordBatch
    log_append_time: bool


def from_table_rows(rows: pa.Table) -> Iterator[ColdBatch]:
    """Cold rows sorted by offset as hot-form batches: one per run of consecutive offsets
    (compaction leaves holes) with one timestamp type."""
    if rows.num_rows == 0:
        return
    ts_type = rows.column("timestampType").to_numpy()
    offsets = rows.column("offset").to_numpy()
    breaks = (np.diff(ts_type) != 0) | (np.diff(offsets) != 1)
    cuts = [0, *(np.flatnonzero(breaks) + 1).tolist(), rows.num_rows]
    millis = pc.divide(rows.column("timestamp").cast(pa.int64()), 1000)
    body = pa.Table.from_arrays(
        [millis, rows.column("key"), rows.column("value"), rows.column("headers")],
        schema=RECORD_SCHEMA).combine_chunks()
    for lo, hi in itertools.pairwise(cuts):
        first = int(offsets[lo])
        for rb in body.slice(lo, hi - lo).to_batches():
            yield ColdBatch(first, rb, bool(ts_type[lo] == LOG_APPEND_TIME))
            first += rb.num_rows


def _iso_ms(micros: int) -> str:
    return datetime.fromtimestamp(micros / 1_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def file_stats(rows: pa.RecordBatch | pa.Table, key_nulls: int | None = None,
               value_nulls: int | None = None) -> str:
    """Delta stats JSON of a file's rows (sorted by offset; ``key``/``value`` columns may be
    left out when their null counts are given)."""
    n = rows.num_rows
    ts = pc.min_max(rows.column("timestamp").cast(pa.int64()))
    tt = pc.min_max(rows.column("timestampType"))
    offsets = rows.column("offset")
    return json.dumps({
        "numRecords": n,
        "minValues": {"offset": offsets[0].as_py(), "timestamp": _iso_ms(ts["min"].as_py()),
                      "timestampType": tt["min"].as_py()},
        "maxValues": {"offset": offsets[n - 1].as_py(), "timestamp": _iso_ms(ts["max"].as_py()),
                      "timestampType": tt["max"].as_py()},
        "nullCount": {"key": rows.column("key").null_count if key_nulls is None else key_nulls,
                      "value": rows.column("value").null_count if value_nulls is None
                      else value_nulls,
                      "offset": 0, "timestamp": 0, "timestampType": 0},
    })


def parquet_file_stats(path: str) -> tuple[int, int, int, str]:
    """(rows, min offset, max offset, Delta stats JSON) of a Parquet file written by anyone
    (Spark included), sorted by offset: three small columns read, null counts from the footer."""
    pf = pq.ParquetFile(path)
    meta = pf.metadata
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    nulls = dict.fromkeys(("key", "value"), 0)
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for name in nulls:
            stats = group.column(names.index(name)).statistics
            nulls[name] += stats.null_count if stats is not None and stats.has_null_count else 0
    rows = pf.read(columns=["offset", "timestamp", "timestampType"])
    if rows.schema.field("timestamp").type != TIMESTAMP_TYPE:
        raise StorageError(f"{path}: timestamps stored as {rows.schema.field('timestamp').type}, "
                           f"expected {TIMESTAMP_TYPE} (spark.sql.parquet.outputTimestampType)")
    offsets = rows.column("offset")
    return (rows.num_rows, offsets[0].as_py(), offsets[-1].as_py(),
            file_stats(rows, nulls["key"], nulls["value"]))


def write_rows(path: str, batches: Sequence[pa.RecordBatch],
               filesystem: pafs.FileSystem | None = None) -> int:
    """Write cold rows to one Parquet file (a path on ``filesystem``, or a local path);
    returns its size in bytes."""
    table = pa.Table.from_batches(batches, FILE_SCHEMA)
    pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS, compression="snappy",
                   write_statistics=["offset", "timestamp", "timestampType"],
                   filesystem=filesystem)
    if filesystem is None:
        return os.path.getsize(path)
    return int(filesystem.get_file_info(path).size)


def write_rows_at(uri: str, batches: Sequence[pa.RecordBatch],
                  env: tuple[tuple[str, str], ...] = ()) -> int:
    """``write_rows`` to a local path (its directory made) or an object-store URI, reached
    with ``env`` (``storage.object_store_env``: a Spark task's environment need not hold
    the settings)."""
    if is_local(uri):
        path = local_path(uri)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return write_rows(path, batches)
    fs, path = filesystem(uri, env or None)
    return write_rows(path, batches, fs)
