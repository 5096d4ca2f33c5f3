"""Reading offset ranges of a partition across both tiers, from any process.

The hot tier is read with ``PartitionReader`` (CRC-checked, never a partial
batch). Offsets below what the hot tier still holds (tiered, then removed by
local retention, possibly while the read runs) are read from the Delta table.
Rows come out in the schema of Spark's Kafka source.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from log_tables.cold.rows import to_table_rows
from log_tables.cold.table import PartitionState, log_start, open_table, read_files, snapshot
from log_tables.errors import CorruptRecordError, OffsetOutOfRangeError
from log_tables.hot.hot_reader import PartitionReader, list_segments
from log_tables.hot.isolation import READ_COMMITTED, Isolation, published_readable_end
from log_tables.layout import Layout

log = logging.getLogger(__name__)

SPARK_HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
# Spark's Kafka source schema as Arrow, as Spark's Arrow conversion produces it.
SPARK_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
    ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
    ("headers", SPARK_HEADERS_TYPE),
])
SPARK_DDL = ("key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
             "timestamp TIMESTAMP, timestampType INT, "
             "headers ARRAY<STRUCT<key: STRING, value: BINARY>>")
MAX_ROUNDS = 64
"""Hot/cold switches a single range read may make before giving up (each makes progress)."""


def with_topic(rows: pa.RecordBatch, topic: str, partition: int) -> pa.RecordBatch:
    """Cold rows (FILE_SCHEMA) as Spark rows: ``topic`` and ``partition`` added, Kafka order."""
    n = rows.num_rows
    return pa.RecordBatch.from_arrays([
        rows.column(0), rows.column(1),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.array(np.full(n, partition, np.int32)),
        rows.column(2), rows.column(3), rows.column(4),
        rows.column(5).cast(SPARK_HEADERS_TYPE),
    ], schema=SPARK_SCHEMA)


def read_range(layout: Layout, topic: str, partition: int, start: int, end: int, *,
               fail_on_data_loss: bool = True,
               isolation: Isolation = READ_COMMITTED) -> Iterator[pa.RecordBatch]:
    """Records ``start .. end-1`` of a partition, hot tier first, cold for what it lost.

    Raises OffsetOutOfRangeError when an offset is in neither tier any more
    (deleted by retention) or beyond what is readable. A damaged hot batch is read
    from the Delta tier if it was tiered before the damage; otherwise it raises
    CorruptRecordError (after the records before it), or with ``fail_on_data_loss``
    False (Spark's Kafka source option) its records are skipped with a warning.
    """
    position = start
    cold: PartitionState | None = None
    for _ in range(MAX_ROUNDS):
        if position >= end:
            return
        reader = PartitionReader(layout.partition_dir(topic, partition))
        before = position
        damage: CorruptRecordError | None = None
        try:
            for batch in reader.batches(position, end, isolation=isolation):
                rows = to_table_rows(batch.base_offset, batch.records, batch.log_append_time)
                yield with_topic(rows, topic, partition)
                position = batch.base_offset + rows.num_rows
            # Markers and aborted records are stepped over: the read got this far.
            position = max(position, min(reader.read_to, end))
        except OffsetOutOfRangeError:
            pass  # below the hot tier: read it from Delta
        except CorruptRecordError as exc:
            damage = exc.located(topic, partition)
        if position >= end:
            return
        if position > before:
            continue  # a segment went away mid-read, or a damaged batch is next: look again
        if cold is None or not cold.start_offset <= position < cold.tiered_offset:
            cold = _cold_state(layout, topic, partition)
        if cold is None or not cold.start_offset <= position < cold.tiered_offset:
            if damage is not None:
                if fail_on_data_loss:
                    raise damage
                log.warning("%s (failOnDataLoss is false: skipped)", damage.message)
                assert damage.next_offset is not None
                position = min(damage.next_offset, end)
                continue
            got = cold.start_offset if cold is not None else -1
            raise OffsetOutOfRangeError(f"{topic}-{partition}", position, got, end)
        # The Delta tier answers for all of [start, tiered): what it lacks was compacted away.
        stop = min(end, cold.tiered_offset)
        if damage is not None and damage.next_offset is not None:
            stop = min(stop, damage.next_offset)  # only the damaged batch: hot again after it
        for rb in read_files(cold.files, position, stop).to_batches():
            yield with_topic(rb, topic, partition)
        position = stop
    raise OffsetOutOfRangeError(f"{topic}-{partition}", position, start, end)


def read_tiered(layout: Layout, topic: str, partition: int, start: int, end: int
                ) -> Generator[pa.RecordBatch, None, int]:
    """Records ``start .. end-1`` from the Delta tier alone, never the hot tier; returns
    where it stopped (``end``, or the tiered offset if that is lower). Raises
    OffsetOutOfRangeError when the Delta tier does not hold ``start``."""
    cold = _cold_state(layout, topic, partition)
    if cold is None or not cold.start_offset <= start < cold.tiered_offset:
        raise OffsetOutOfRangeError(f"{topic}-{partition}", start,
                                    cold.start_offset if cold is not None else -1, end)
    stop = min(end, cold.tiered_offset)
    for rb in read_files(cold.files, start, stop).to_batches():
        yield with_topic(rb, topic, partition)
    return stop


def _cold_state(layout: Layout, topic: str, partition: int) -> PartitionState | None:
    dt = open_table(layout.table_uri(topic))
    if dt is None:
        return None
    return snapshot(dt, partition + 1)[partition]


def _hot_start(reader: PartitionReader) -> int | None:
    segments = list_segments(reader.directory)
    return segments[0].base_offset if segments else None


def hot_start_offset(layout: Layout, topic: str, partition: int) -> int | None:
    """The first offset the hot tier holds (None: no segment at all)."""
    return _hot_start(PartitionReader(layout.partition_dir(topic, partition)))


class PartitionBounds(NamedTuple):
    """One partition across both tiers, as other processes see it."""

    log_start_offset: int
    """The lowest offset not deleted (0 for an empty partition); compacted offsets count."""
    tiered_offset: int
    """Offsets below this are in the Delta tier."""
    high_watermark: int
    """The hot tier's readable end (at least the tiered offset)."""


def partition_bounds(layout: Layout, topic: str, partition: int,
                     cold: PartitionState | None,
                     isolation: Isolation = READ_COMMITTED) -> PartitionBounds:
    """Log start, tiered offset and readable end of one partition (what a table reads:
    ``read_committed``)."""
    tiered = cold.tiered_offset if cold is not None else 0
    hot_start = hot_start_offset(layout, topic, partition)
    start = log_start(hot_start if hot_start is not None else 0, cold)
    end = hot_end_offset(layout, topic, partition, isolation, max(tiered, start))
    return PartitionBounds(start, tiered, max(end, tiered))


def hot_end_offset(layout: Layout, topic: str, partition: int,
                   isolation: Isolation = READ_COMMITTED, start: int | None = None) -> int:
    """The hot tier's readable end as other processes see it: the last complete batch's
    end, bounded as ``published_readable_end`` says (for a replicated partition, the
    published high watermark if that is lower), and for ``read_committed`` by the first
    transaction still open that the headers from ``start`` (the tiered offset: no
    transaction open below it, as tiering stops at them; None: the hot tier's start)
    show."""
    directory = layout.partition_dir(topic, partition)
    reader = PartitionReader(directory)
    if isolation is not READ_COMMITTED:
        return published_readable_end(directory, reader.end_offset(), isolation)
    if start is None:
        start = _hot_start(reader) or 0
    end, found = reader.committed(start)
    stable = found.last_stable
    return end if stable is None else max(start, min(end, stable))


def offset_for_timestamp(layout: Layout, topic: str, partition: int, timestamp_ms: int,
                         cold: PartitionState | None) -> int | None:
    """Kafka's ListOffsets by time: the first offset whose timestamp is >= ``timestamp_ms``."""
    if cold is not None:
        files = [f for f in cold.files if f.max_timestamp_ms >= timestamp_ms]
        for f in files:
            found = first_at_or_after(read_files([f], cold.start_offset, f.max_offset + 1,
                                                  ["offset", "timestamp"]), timestamp_ms)
            if found is not None:
                return found
    start = cold.tiered_offset if cold is not None else 0
    reader = PartitionReader(layout.partition_dir(topic, partition))
    try:
        batches = list(reader.batches(start, skip_damage=True))
    except OffsetOutOfRangeError:
        batches = list(reader.batches(_hot_start(reader) or 0, skip_damage=True))
    for b in batches:
        ts = b.records.column(0).to_numpy()
        hits = np.flatnonzero(ts >= timestamp_ms)
        if hits.size:
            return b.base_offset + int(hits[0])
    return None


def first_at_or_after(rows: pa.Table, timestamp_ms: int) -> int | None:
    if rows.num_rows == 0:
        return None
    millis = pc.divide(rows.column("timestamp").cast(pa.int64()), 1000).to_numpy()
    hits = np.flatnonzero(millis >= timestamp_ms)
    return int(rows.column("offset")[int(hits[0])].as_py()) if hits.size else None


def cold_states(layout: Layout, topic: str, partitions: int, version: int | str | None = None
                ) -> tuple[int | None, Sequence[PartitionState] | None]:
    """(Delta version, per-partition cold state) of a topic's table, or (None, None)."""
    dt = open_table(layout.table_uri(topic), version)
    if dt is None:
        return None, None
    return dt.version(), snapshot(dt, partitions)
