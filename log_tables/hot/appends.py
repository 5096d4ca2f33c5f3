"""The checks of an append before it takes the log's lock, and what an append assigned.

A producer's batch is checked against the schema, the timestamps' range and the
topic's size bounds, and encoded once (``prepare``); a follower's fetched batches are
checked header by header against the log end and their CRC. Neither needs the log's
state beyond its end offset, so ``PartitionLog`` runs them and keeps only the writes.
"""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa

from log_tables.clock import Clock
from log_tables.config import TopicConfig
from log_tables.errors import CorruptRecordError, InvalidRecordError, RecordTooLargeError
from log_tables.hot.batch import (
    HEADER_SIZE,
    MAX_BATCH_BYTES,
    BatchHeader,
    PreparedBatch,
    check_header,
    decode_header,
    prepare,
    verify,
)
from log_tables.records import MAX_TIMESTAMP_MS, RECORD_SCHEMA


class AppendInfo(NamedTuple):
    """What an append assigned."""

    base_offset: int
    last_offset: int
    log_append_time_ms: int
    """-1 for CreateTime topics."""
    max_timestamp: int
    size: int
    """Bytes written."""
    duplicate_offsets: tuple[int, ...] = ()
    """Offsets of leading records that an idempotent producer had already written."""

    def offset_of(self, index: int) -> int:
        """The offset of the ``index``-th record of the appended batch."""
        dups = len(self.duplicate_offsets)
        return self.duplicate_offsets[index] if index < dups else self.base_offset + index - dups


class CheckedAppend(NamedTuple):
    """A producer's batch that passed the checks, encoded."""

    records: pa.RecordBatch
    """The records as appended (LogAppendTime topics: with the broker's time)."""
    prepared: PreparedBatch
    append_time: int
    """The broker's time for a LogAppendTime topic; else -1."""


def check_append(name: str, config: TopicConfig, clock: Clock, records: pa.RecordBatch,
                 producer_id: int, producer_epoch: int, base_sequence: int,
                 flags: int = 0) -> CheckedAppend:
    """Check a producer's batch (schema, not empty, timestamps within 0..year 9999, at
    most the smaller of ``max.message.bytes`` and ``segment.bytes``) and encode it."""
    if records.schema != RECORD_SCHEMA:
        raise InvalidRecordError(f"{name}: batch schema {records.schema} is not RECORD_SCHEMA")
    if records.num_rows == 0:
        raise InvalidRecordError(f"{name}: empty batch")
    append_time = -1
    if config.log_append_time:
        append_time = clock.now_ms()
        records = records.set_column(
            0, RECORD_SCHEMA.field(0), pa.array([append_time] * records.num_rows, pa.int64()))
    prepared = prepare(records, log_append_time=config.log_append_time,
                       producer_id=producer_id, producer_epoch=producer_epoch,
                       base_sequence=base_sequence, flags=flags)
    if not config.log_append_time:  # the broker's own time is always in range
        low = prepared.min_timestamp
        if low < 0 or prepared.max_timestamp > MAX_TIMESTAMP_MS:
            raise InvalidRecordError(
                f"{name}: record timestamp {low if low < 0 else prepared.max_timestamp} "
                f"is outside 0..{MAX_TIMESTAMP_MS} (epoch milliseconds from 1970 to the end "
                "of year 9999)")
    limit = min(config.max_message_bytes, config.segment_bytes)
    if prepared.size > limit:
        which = "max.message.bytes" if limit == config.max_message_bytes else "segment.bytes"
        what = ("a record" if prepared.record_count == 1
                else f"a batch of {prepared.record_count} records")
        raise RecordTooLargeError(
            f"{name}: {what} is {prepared.size} bytes as stored, over {which}={limit} "
            "(a batch is bounded by the smaller of max.message.bytes and segment.bytes)")
    return CheckedAppend(records, prepared, append_time)


def check_replica_batch(name: str, view: memoryview, pos: int, log_end: int) -> BatchHeader:
    """The header of the fetched batch at ``pos``, which must start at ``log_end``, be
    whole and pass its CRC; CorruptRecordError otherwise."""
    header = decode_header(view, pos) if len(view) - pos >= HEADER_SIZE else None
    problem = ("a torn batch" if header is None else
               check_header(header, name, pos, MAX_BATCH_BYTES))
    if header is not None and problem is None:
        if header.base_offset != log_end:
            problem = f"batch at offset {header.base_offset}, but the log ends at {log_end}"
        elif pos + header.size > len(view):
            problem = "a torn batch"
        elif not verify(header, pa.py_buffer(view[pos:pos + header.size])):
            problem = "CRC mismatch"
    if problem is not None or header is None:
        raise CorruptRecordError(f"replica fetch of {name}", pos, problem or "a torn batch",
                                 first_offset=log_end)
    return header
