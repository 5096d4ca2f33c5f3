"""Records as Arrow: the schema of a batch body, building batches, and row views."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from log_tables.errors import InvalidRecordError

HEADER_TYPE = pa.struct([pa.field("key", pa.string(), nullable=False), ("value", pa.binary())])
HEADERS_TYPE = pa.list_(HEADER_TYPE)
# The body of a hot-tier batch. Offsets are not stored: they are dense from the
# batch's base offset. Timestamps are epoch milliseconds, as in Kafka.
RECORD_SCHEMA = pa.schema(
    [
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADERS_TYPE),
    ]
)

Header = tuple[str, bytes | None]
# The last instant RFC 3339 (and Python's datetime) can write: 9999-12-31T23:59:59.999Z.
# A record's timestamp is 0 to this; Kafka allows any int64, but a time the API and
# Spark cannot show would make the record unreadable.
MAX_TIMESTAMP_MS = 253_402_300_799_999

_NULL_HEADERS_CACHED = 1 << 16


def _build_null_headers(count: int) -> pa.Array:
    offsets = pa.array(np.zeros(count + 1, np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array([], HEADER_TYPE),
                                    mask=pa.array(np.ones(count, np.bool_)))


_NULL_HEADERS = _build_null_headers(_NULL_HEADERS_CACHED)


def null_headers(count: int) -> pa.Array:
    """A headers column of ``count`` nulls whose slices stay small when serialized.

    ``pa.nulls(n, HEADERS_TYPE)`` gives its struct child ``n`` rows, and an IPC
    write of a *slice* of it writes that child whole: a 10-record slice of a
    1,000-record request stored ~8 KB of nothing. Here the child is empty.
    """
    if count <= _NULL_HEADERS_CACHED:
        return _NULL_HEADERS.slice(0, count)
    return _build_null_headers(count)


class Record(NamedTuple):
    """One record as read back from a log."""

    offset: int
    """Position in the partition, dense from 0."""
    timestamp: int
    """Epoch milliseconds (CreateTime or LogAppendTime, per the batch)."""
    key: bytes | None
    """Key bytes, or None."""
    value: bytes | None
    """Value bytes, or None for a tombstone."""
    headers: list[Header]
    """(name, value) pairs, in order."""


def build_batch(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
    timestamps: int | Sequence[int] | None = None,
    headers: Sequence[Sequence[Header] | None] | None = None,
) -> pa.RecordBatch:
    """Build a batch body from Python values; a single timestamp applies to every record."""
    count = len(values)
    if count == 0:
        raise InvalidRecordError("a batch needs at least one record")
    if keys is not None and len(keys) != count:
        raise InvalidRecordError(f"{len(keys)} keys for {count} values")
    if headers is not None and len(headers) != count:
        raise InvalidRecordError(f"{len(headers)} header lists for {count} values")
    if timestamps is None:
        raise InvalidRecordError("timestamps are required (pass one int for all records)")
    try:
        if isinstance(timestamps, int):
            ts = pa.repeat(pa.scalar(timestamps, pa.int64()), count)
        else:
            if len(timestamps) != count:
                raise InvalidRecordError(f"{len(timestamps)} timestamps for {count} values")
            ts = pa.array(timestamps, pa.int64())
        key_array = pa.nulls(count, pa.binary()) if keys is None else pa.array(keys, pa.binary())
        value_array = pa.array(values, pa.binary())
        if headers is None:
            header_array = null_headers(count)
        else:
            header_array = pa.array(
                [None if h is None else [{"key": k, "value": v} for k, v in h] for h in headers],
                HEADERS_TYPE,
            )
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise InvalidRecordError(f"records do not fit the record schema: {exc}") from None
    if ts.null_count:
        raise InvalidRecordError("a timestamp is null")
    return pa.RecordBatch.from_arrays([ts, key_array, value_array, header_array], schema=RECORD_SCHEMA)


def batch_records(base_offset: int, batch: pa.RecordBatch) -> list[Record]:
    """Rows of a batch body as Records (for APIs that hand out Python objects)."""
    timestamps = batch.column(0).to_pylist()
    keys = batch.column(1).to_pylist()
    values = batch.column(2).to_pylist()
    header_col = batch.column(3)
    if header_col.null_count == len(header_col):
        headers: list[list[Header]] = [[] for _ in range(len(batch))]
    else:
        headers = [
            [] if h is None else [(e["key"], e["value"]) for e in h] for h in header_col.to_pylist()
        ]
    return [
        Record(base_offset + i, timestamps[i], keys[i], values[i], headers[i])
        for i in range(len(batch))
    ]


class LogBatch(NamedTuple):
    """Records read from a log: offsets ``base_offset .. base_offset + len(records) - 1``."""

    base_offset: int
    records: pa.RecordBatch
    log_append_time: bool
    producer_id: int

    def to_records(self) -> list[Record]:
        return batch_records(self.base_offset, self.records)


class FetchResult(NamedTuple):
    """A read: batches in offset order and the bounds of the log at read time."""

    batches: list[LogBatch]
    high_watermark: int
    log_start_offset: int
    read_to: int | None = None
    """Where the read stopped, past batches it stepped over (markers, aborted records)."""

    @property
    def next_offset(self) -> int | None:
        """Where the next read starts; None when this one read nothing."""
        if self.batches:
            last = self.batches[-1]
            after = last.base_offset + int(last.records.num_rows)
            return after if self.read_to is None else max(after, self.read_to)
        return self.read_to

    def records(self) -> list[Record]:
        return [r for b in self.batches for r in b.to_records()]
