"""Read a partition's hot segments from another process, without the writer's memory.

The reader never writes. It trusts nothing: an index entry is used only if the
batch it points at has the expected base offset, and every batch is CRC-checked.
The first torn or invalid batch ends the readable log, so a reader racing the
writer sees a prefix of complete batches and never a partial one.
"""

from __future__ import annotations

import contextlib
import json
import os
from bisect import bisect_right
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from log_tables.batch import BatchScanner, ScannedBatch, ScanStop
from log_tables.errors import CorruptIndexError, OffsetOutOfRangeError
from log_tables.offset_index import OffsetIndex
from log_tables.partition_log import CHECKPOINT_FILE, MAX_BATCH_BYTES, LogBatch
from log_tables.segment import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, parse_stem, records_from
from log_tables.time_index import TimeIndex


class SegmentFile(NamedTuple):
    """A ``.log`` file found in a partition directory."""

    base_offset: int
    path: Path


def list_segments(directory: Path) -> list[SegmentFile]:
    """The segments of a partition directory in offset order."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = [SegmentFile(b, directory / n) for n in names
             if n.endswith(LOG_SUFFIX) and (b := parse_stem(n)) is not None]
    return sorted(found)


def recovery_point(directory: Path) -> int:
    """The writer's checkpointed recovery point: every segment that ends at or below it
    is sealed and fsynced (0 when there is no readable checkpoint)."""
    try:
        return int(json.loads((directory / CHECKPOINT_FILE).read_bytes())["recovery_point"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def scan_segment(segment: SegmentFile, from_offset: int | None = None
                 ) -> tuple[list[ScannedBatch], ScanStop | None]:
    """Every valid batch of a segment file (from the one holding ``from_offset``)."""
    try:
        fd = os.open(segment.path, os.O_RDONLY)
    except FileNotFoundError:
        return [], ScanStop(0, "segment deleted")
    try:
        end = os.fstat(fd).st_size
        start_offset, start_pos = segment.base_offset, 0
        if from_offset is not None and from_offset > segment.base_offset:
            start_offset, start_pos = _index_hint(segment, from_offset)
        scanner = BatchScanner(fd, str(segment.path), start_pos, end,
                               expected_offset=start_offset, max_batch_bytes=MAX_BATCH_BYTES)
        batches = list(scanner)
        if start_pos and scanner.stop is not None and not batches:
            # A stale or garbled index entry: fall back to scanning from the start.
            scanner = BatchScanner(fd, str(segment.path), 0, end,
                                   expected_offset=segment.base_offset,
                                   max_batch_bytes=MAX_BATCH_BYTES)
            batches = list(scanner)
        return batches, scanner.stop
    finally:
        os.close(fd)


def _index_hint(segment: SegmentFile, offset: int) -> tuple[int, int]:
    index = OffsetIndex(segment.path.with_suffix(INDEX_SUFFIX), segment.base_offset)
    with contextlib.suppress(CorruptIndexError, OSError):
        index.load()
        return index.lookup(offset)
    return segment.base_offset, 0


class PartitionReader:
    """A read-only view of one partition directory, for readers in other processes."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def end_offset(self) -> int:
        """The offset after the last complete valid batch (0 for an empty partition)."""
        segments = list_segments(self.directory)
        for segment in reversed(segments):
            batches, _ = scan_segment(segment, _last_indexed(segment))
            if batches:
                return batches[-1].header.next_offset
            if segment.path.stat().st_size == 0:
                return segment.base_offset
        return 0

    def batches(self, offset: int, end_offset: int | None = None) -> Iterator[LogBatch]:
        """Records from ``offset`` up to ``end_offset`` (or the readable end), batch by batch."""
        segments = list_segments(self.directory)
        if not segments:
            return
        bases = [s.base_offset for s in segments]
        if offset < bases[0]:
            raise OffsetOutOfRangeError(str(self.directory), offset, bases[0], -1)
        position = offset
        for segment in segments[max(0, bisect_right(bases, offset) - 1):]:
            batches, stop = scan_segment(segment, position)
            for b in batches:
                if b.header.next_offset <= position:
                    continue
                if end_offset is not None and b.header.base_offset >= end_offset:
                    return
                last = b.header.last_offset if end_offset is None else min(
                    b.header.last_offset, end_offset - 1)
                rb = records_from(b, str(segment.path), position, last)
                yield LogBatch(position, rb, b.header.log_append_time, b.header.producer_id)
                position += rb.num_rows
            if stop is not None:
                return  # the readable log ends at the first invalid batch


def _last_indexed(segment: SegmentFile) -> int | None:
    index = OffsetIndex(segment.path.with_suffix(INDEX_SUFFIX), segment.base_offset)
    try:
        index.load()
    except (CorruptIndexError, OSError):
        return None
    last = index.last
    return None if last is None else last[0]


def segment_max_timestamp(segment: SegmentFile) -> int:
    """A sealed segment's newest record timestamp (ms): the last time index entry (sealing
    writes it), else a scan of the segment; -1 for an empty segment."""
    index = TimeIndex(segment.path.with_suffix(TIMEINDEX_SUFFIX), segment.base_offset)
    with contextlib.suppress(CorruptIndexError, OSError):
        index.load()
        last = index.last
        if last is not None:
            return last[0]
    batches, _ = scan_segment(segment)
    return max((b.header.max_timestamp for b in batches), default=-1)
