"""Fetch and poll answers as Arrow: an IPC stream in the schema of Spark's Kafka source,
sent when the request's ``Accept`` asks for ``application/vnd.apache.arrow.stream``.

The paging fields a JSON answer carries in its body travel in ``Lakelog-*`` response
headers. Hot batches become Arrow rows without a loop per record: the stored body's
key, value and headers columns are used as they are (sliced to the offset range), the
offsets, the microsecond timestamps and the constant columns are made per batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from log_tables.cold.rows import to_table_rows
from log_tables.cold.topic_reader import SPARK_SCHEMA, with_topic
from log_tables.records import LogBatch

ARROW_STREAM = "application/vnd.apache.arrow.stream"
NEXT_OFFSET = "Lakelog-Next-Offset"
HIGH_WATERMARK = "Lakelog-High-Watermark"
LOG_START_OFFSET = "Lakelog-Log-Start-Offset"
MEMBER_EPOCH = "Lakelog-Member-Epoch"
RECORD_COUNT = "Lakelog-Record-Count"
ARROW_RESPONSE: dict[int | str, dict[str, object]] = {200: {
    "content": {ARROW_STREAM: {}},
    "description": "JSON; with Accept: application/vnd.apache.arrow.stream an Arrow IPC "
                   "stream (Spark's Kafka-source columns), the paging in Lakelog-* headers"}}
SMALL_BATCH_ROWS = 64
"""Runs of batches this small are written as one IPC message (a message costs a few
hundred bytes of metadata; single-record produces leave one batch per record)."""
_JSON_RANGES = ("application/json", "application/*", "*/*")


def wants_arrow(accept: str | None) -> bool:
    """True when ``accept`` names the Arrow stream type with a quality at least that of
    any range JSON matches (JSON stays the answer to a missing Accept and to ``*/*``)."""
    if not accept or ARROW_STREAM not in accept:
        return False
    arrow_q = 0.0
    json_q = 0.0
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        media = fields[0].lower()
        q = 1.0
        for param in fields[1:]:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if media == ARROW_STREAM:
            arrow_q = max(arrow_q, q)
        elif media in _JSON_RANGES:
            json_q = max(json_q, q)
    return arrow_q > 0 and arrow_q >= json_q


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


class ArrowAnswer(NamedTuple):
    """An Arrow answer: the stream and the response headers that carry its paging."""

    body: memoryview
    headers: dict[str, str]
