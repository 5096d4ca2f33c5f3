"""Reads of a partition's segments: records for a consumer, raw batches for a follower,
the offset of a time. Each reads one snapshot of the segment list (``LocalLog.segments``)
without the log's lock, up to an end its caller chose (``PartitionLog.readable_end``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from log_tables.errors import CorruptRecordError, OffsetOutOfRangeError
from log_tables.hot.batch import MAX_BATCH_BYTES, BatchHeader, BatchScanner
from log_tables.hot.segment_reads import records_from
from log_tables.records import FetchResult, LogBatch

if TYPE_CHECKING:
    from log_tables.hot.local_log import LocalLog


class RawBatches(NamedTuple):
    """Stored batches as they are on disk (a replica fetch): offsets ``[first, next)``."""

    data: bytes
    first_offset: int
    next_offset: int


def read_records(log: LocalLog, offset: int, end: int, max_bytes: int = 1 << 20,
                 max_records: int | None = None,
                 hidden: Callable[[BatchHeader], bool] | None = None) -> FetchResult:
    """Records from ``offset`` on, below ``end`` (the readable end), up to about
    ``max_bytes`` and at most ``max_records``; batches ``hidden`` says to step over
    (transaction markers, aborted transactions: ``txn_index.Hidden``) count against the
    bytes but are not returned, and the result's ``next_offset`` passes them.

    At least one record is returned when any exists (even past ``max_bytes``). A
    damaged batch ends the read: the records before it are returned, and a read that
    starts at it raises CorruptRecordError naming the offsets it hides.
    """
    log_end = log.log_end_offset
    log_start = log.log_start_offset
    segments = log.segments
    if not log_start <= offset <= log_end:
        raise OffsetOutOfRangeError(log.name, offset, log_start, end)
    if offset >= end:  # replicated, and not yet in every in-sync replica
        return FetchResult([], end, log_start, offset)
    stop = end if max_records is None else min(end, offset + max_records)
    out: list[LogBatch] = []
    bases = [s.base_offset for s in segments]
    i = max(0, bisect_right(bases, offset) - 1)
    budget = max_bytes
    position = offset
    for seg in segments[i:]:
        if position >= stop or (out and budget <= 0):
            break
        try:
            batches = seg.read(position, stop, budget, MAX_BATCH_BYTES, first=not out)
        except CorruptRecordError:
            if out:
                break  # the records before the damaged batch are answered
            raise
        for b in batches:
            if b.header.base_offset > position:
                # The segment holding `position` was deleted after this read began.
                raise OffsetOutOfRangeError(log.name, position, log.log_start_offset, end)
            if hidden is not None and hidden(b.header):
                position = min(b.header.next_offset, stop)
                budget -= b.header.size
                continue
            rb = records_from(b, str(seg.path), position, stop - 1)
            out.append(LogBatch(position, rb, b.header.log_append_time, b.header.producer_id))
            position += rb.num_rows
            budget -= b.header.size
        if position < min(seg.next_offset, stop):
            break  # stopped inside this segment for the byte budget
    return FetchResult(out, end, log_start, position)


def read_raw(log: LocalLog, offset: int, max_bytes: int, high_watermark: int) -> RawBatches:
    """Whole stored batches, as stored, from the one holding ``offset`` on, up to about
    ``max_bytes`` (at least one batch) and the end of its segment: what a follower
    fetches. It reads below the log end, not the high watermark (named only in errors),
    and checks no CRC (the follower checks every batch it appends)."""
    log_end = log.log_end_offset
    log_start = log.log_start_offset
    segments = log.segments
    if not log_start <= offset <= log_end:
        raise OffsetOutOfRangeError(log.name, offset, log_start, high_watermark)
    if offset == log_end:
        return RawBatches(b"", offset, offset)
    seg = segments[max(0, bisect_right([s.base_offset for s in segments], offset) - 1)]
    index_offset, position = seg.offset_index.lookup(offset)
    scanner = BatchScanner(seg._fd, str(seg.path), position, seg.size,
                           expected_offset=index_offset, verify_crc=False,
                           read_ahead=min(max_bytes, 8 << 20))
    parts: list[memoryview] = []
    first = total = 0
    nxt = offset
    try:
        for b in scanner:
            if b.header.next_offset <= offset:
                continue
            if parts and total + b.header.size > max_bytes:
                break
            if not parts:
                first = b.header.base_offset
            parts.append(memoryview(b.raw))
            total += b.header.size
            nxt = b.header.next_offset
    except OSError:
        parts = []  # the segment was deleted meanwhile
    if not parts:
        if scanner.stop is not None and not scanner.stop.torn:
            raise CorruptRecordError(str(seg.path), scanner.stop.position,
                                     scanner.stop.reason, first_offset=offset)
        raise OffsetOutOfRangeError(log.name, offset, log.log_start_offset, high_watermark)
    return RawBatches(b"".join(parts), first, nxt)


def offset_for_timestamp(log: LocalLog, timestamp: int, end: int) -> int | None:
    """The first offset below ``end`` whose timestamp is >= ``timestamp``; None if none."""
    for seg in log.segments:
        if seg.max_timestamp < timestamp or seg.next_offset == seg.base_offset:
            continue
        found = seg.offset_for_timestamp(timestamp, MAX_BATCH_BYTES, end)
        if found is not None:
            return max(found, log.log_start_offset)
    return None
