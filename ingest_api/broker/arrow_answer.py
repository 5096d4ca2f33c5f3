"""Fetch and poll answers as Arrow: an IPC stream in the schema of Spark's Kafka source,
and its paging as fields (the HTTP front sends the stream when the request's ``Accept``
asks for it, and the paging in ``Lakelog-*`` headers: ``ingest_api.http.arrow_headers``).

Hot batches become Arrow rows without a loop per record: the stored body's
key, value and headers columns are used as they are (sliced to the offset range), the
offsets, the microsecond timestamps and the constant columns are made per batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from log_tables.cold.rows import to_table_rows
from log_tables.cold.topic_reader import SPARK_SCHEMA, with_topic
from log_tables.moved import moved
from log_tables.records import LogBatch

SMALL_BATCH_ROWS = 64
"""Runs of batches this small are written as one IPC message (a message costs a few
hundred bytes of metadata; single-record produces leave one batch per record)."""


def kafka_rows(batch: LogBatch, topic: str, partition: int, first_offset: int = 0
               ) -> pa.RecordBatch:
    """A read batch's records from ``first_offset`` on, in SPARK_SCHEMA."""
    records = batch.records
    base = batch.base_offset
    skip = first_offset - base
    if skip > 0:
        records = records.slice(skip)
        base = first_offset
    return with_topic(to_table_rows(base, records, batch.log_append_time), topic, partition)


def binary_bytes(column: pa.Array) -> int:
    """Bytes of a binary column's values: the span of its offsets, values untouched."""
    if len(column) == 0:
        return 0
    offsets = np.frombuffer(column.buffers()[1], np.int32, len(column) + 1, column.offset * 4)
    return int(offsets[-1] - offsets[0])


def data_bytes(rows: pa.RecordBatch) -> int:
    """Bytes of keys and values of SPARK_SCHEMA rows (as ``lakelog_bytes_out`` counts)."""
    return binary_bytes(rows.column(0)) + binary_bytes(rows.column(1))


def _coalesced(batches: Sequence[pa.RecordBatch]) -> list[pa.RecordBatch]:
    out: list[pa.RecordBatch] = []
    run: list[pa.RecordBatch] = []
    for b in batches:
        if b.num_rows < SMALL_BATCH_ROWS:
            run.append(b)
            continue
        if run:
            out.append(run[0] if len(run) == 1 else pa.concat_batches(run))
            run = []
        out.append(b)
    if run:
        out.append(run[0] if len(run) == 1 else pa.concat_batches(run))
    return out


POSITIONS = b"lakelog.positions"
"""Schema metadata of a group poll's Arrow answer: the member's position in each of its
assigned partitions after this poll, as JSON ``[[topic, partition, offset], ...]``."""


def stream(batches: Sequence[pa.RecordBatch],
           metadata: dict[bytes, bytes] | None = None) -> memoryview:
    """An Arrow IPC stream of ``batches`` (SPARK_SCHEMA, with ``metadata``): the schema,
    then the batches; with none, a valid stream of the schema alone."""
    sink = pa.BufferOutputStream()
    schema = SPARK_SCHEMA.with_metadata(metadata) if metadata else SPARK_SCHEMA
    with pa.ipc.new_stream(sink, schema) as writer:
        for b in _coalesced(batches):
            if b.num_rows:
                writer.write_batch(b)
    return memoryview(sink.getvalue())


@dataclass(frozen=True, slots=True)
class Paging:
    """What a JSON answer carries in its body beside the records, for an Arrow one."""

    record_count: int
    next_offset: int | None = None
    high_watermark: int | None = None
    log_start_offset: int | None = None
    member_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class ArrowAnswer:
    """An Arrow answer: the stream and its paging."""

    body: memoryview
    paging: Paging


__getattr__ = moved(__name__, {name: "ingest_api.http.arrow_headers" for name in (
    "ARROW_STREAM", "NEXT_OFFSET", "HIGH_WATERMARK", "LOG_START_OFFSET", "MEMBER_EPOCH",
    "RECORD_COUNT", "ARROW_RESPONSE", "wants_arrow")})
"""The media type, the ``Lakelog-*`` header names and the Accept check went to the HTTP
front (issue 36)."""
