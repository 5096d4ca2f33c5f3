"""Read a partition's hot segments from another process, without the writer's memory.

The reader never writes. It trusts nothing: an index entry is used only if the
batch it points at has the expected base offset, and every batch is CRC-checked.
A torn batch at the end of the newest segment ends the readable log, so a reader
racing the writer sees a prefix of complete batches and never a partial one. An
invalid batch with intact batches after it (or inside a segment that has a
successor) is damage (``log_tables.hot.damage``): the reader raises CorruptRecordError
naming its offsets when it reaches it, never serves it, and reads past it.
"""

from __future__ import annotations

import contextlib
import json
import os
from bisect import bisect_right
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from log_tables.errors import CorruptIndexError, CorruptRecordError, OffsetOutOfRangeError
from log_tables.hot.batch import (
    ATTR_TRANSACTIONAL,
    MAX_BATCH_BYTES,
    BatchHeader,
    BatchScanner,
    ScannedBatch,
    ScanStop,
)
from log_tables.hot.damage import Damage, locate
from log_tables.hot.isolation import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    Isolation,
    published_readable_end,
)
from log_tables.hot.offset_index import OffsetIndex
from log_tables.hot.recovery import CHECKPOINT_FILE
from log_tables.hot.segment import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, parse_stem
from log_tables.hot.segment_reads import records_from
from log_tables.hot.time_index import TimeIndex
from log_tables.hot.txn_index import Hidden, TxnScan, has_transactions, scan
from log_tables.records import LogBatch


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


def scan_segment(segment: SegmentFile, from_offset: int | None = None,
                 end_offset: int | None = None
                 ) -> tuple[list[ScannedBatch | Damage], ScanStop | None]:
    """Every valid batch of a segment file (from the one holding ``from_offset``), with
    each damaged run between them as a ``Damage``, in order, and where the readable part
    ends early (a torn tail), if it does.

    ``end_offset``: the segment's next offset when known (it has a successor); then
    damage up to the end of the file is told apart from a torn tail, and a file that
    ends short of it is damage too.
    """
    try:
        fd = os.open(segment.path, os.O_RDONLY)
    except FileNotFoundError:
        return [], ScanStop(0, "segment deleted")
    try:
        end = os.fstat(fd).st_size
        position_offset, position = segment.base_offset, 0
        if from_offset is not None and from_offset > segment.base_offset:
            position_offset, position = _index_hint(segment, from_offset)
        skip = from_offset if from_offset is not None else segment.base_offset
        index: list[tuple[int, int]] | None = None
        items: list[ScannedBatch | Damage] = []
        while True:
            scanner = BatchScanner(fd, str(segment.path), position, end,
                                   expected_offset=position_offset, max_batch_bytes=MAX_BATCH_BYTES)
            batches = list(scanner)
            if position and scanner.stop is not None and not batches and not items:
                # A stale or garbled index entry: fall back to scanning from the start.
                position_offset, position = segment.base_offset, 0
                continue
            items += [b for b in batches if b.header.next_offset > skip]
            expected = scanner.expected_offset
            assert expected is not None
            if scanner.stop is None:
                if end_offset is not None and expected < end_offset:
                    items.append(Damage(str(segment.path), end, end, expected, end_offset,
                                        "the segment ends early"))
                return items, None
            if index is None:
                index = _index_entries(segment)
            damage = locate(fd, str(segment.path), scanner.stop, expected, end, end_offset, index,
                            MAX_BATCH_BYTES)
            if damage is None:
                return items, scanner.stop
            if damage.next_offset > skip:
                items.append(damage)
            position_offset, position = damage.next_offset, damage.resume_position
    finally:
        os.close(fd)


def _index_hint(segment: SegmentFile, offset: int) -> tuple[int, int]:
    index = OffsetIndex(segment.path.with_suffix(INDEX_SUFFIX), segment.base_offset)
    with contextlib.suppress(CorruptIndexError, OSError):
        index.load()
        return index.lookup(offset)
    return segment.base_offset, 0


def _index_entries(segment: SegmentFile) -> list[tuple[int, int]]:
    index = OffsetIndex(segment.path.with_suffix(INDEX_SUFFIX), segment.base_offset)
    try:
        index.load()
    except (CorruptIndexError, OSError):
        return []
    return index.entries()


class PartitionReader:
    """A read-only view of one partition directory, for readers in other processes."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.read_to = 0
        """Where the last ``batches`` got to (hidden batches included)."""

    def end_offset(self) -> int:
        """The offset after the last complete valid batch (0 for an empty partition)."""
        segments = list_segments(self.directory)
        for i in range(len(segments) - 1, -1, -1):
            segment = segments[i]
            nxt = segments[i + 1].base_offset if i + 1 < len(segments) else None
            items, _ = scan_segment(segment, _last_indexed(segment), nxt)
            if items:
                last = items[-1]
                return last.next_offset if isinstance(last, Damage) else last.header.next_offset
            if segment.path.stat().st_size == 0:
                return segment.base_offset
        return 0

    def batches(self, offset: int, end_offset: int | None = None, *,
                skip_damage: bool = False,
                isolation: Isolation = READ_COMMITTED) -> Iterator[LogBatch]:
        """Records from ``offset`` up to ``end_offset`` (or the readable end), batch by batch.

        Transaction markers are never yielded; ``read_committed`` (the default: what a
        table holds) also stops at the first transaction still open and steps over
        aborted ones (``committed``). A damaged batch in the range raises
        CorruptRecordError (naming the offsets it hides) once the records before it are
        yielded; reading from past it goes on. ``skip_damage``: pass over damaged batches
        instead (their records are never read). ``read_to`` says where the read got to,
        past the batches it stepped over (a log ending in a marker, say).
        """
        self.read_to = offset
        hidden = Hidden()
        if isolation is READ_COMMITTED:
            end, found = self.committed(offset)
            stable, hidden = found.last_stable, found.hidden
            if stable is not None:
                end = min(end, stable)
            end_offset = end if end_offset is None else min(end_offset, end)
            if offset >= end_offset:
                return
        segments = list_segments(self.directory)
        if not segments:
            return
        bases = [s.base_offset for s in segments]
        if offset < bases[0]:
            raise OffsetOutOfRangeError(str(self.directory), offset, bases[0], -1)
        position = offset
        first = max(0, bisect_right(bases, offset) - 1)
        for i in range(first, len(segments)):
            segment = segments[i]
            nxt = bases[i + 1] if i + 1 < len(segments) else None
            items, stop = scan_segment(segment, position, nxt)
            for b in items:
                if isinstance(b, Damage):
                    if end_offset is not None and b.first_offset >= end_offset:
                        return
                    if b.next_offset <= position:
                        continue
                    if skip_damage:
                        position = b.next_offset
                        continue
                    raise CorruptRecordError(b.path, b.position, b.reason,
                                             first_offset=b.first_offset,
                                             next_offset=b.next_offset)
                if b.header.next_offset <= position:
                    continue
                if end_offset is not None and b.header.base_offset >= end_offset:
                    return
                if hidden(b.header):
                    position = self.read_to = b.header.next_offset
                    continue
                last = b.header.last_offset if end_offset is None else min(
                    b.header.last_offset, end_offset - 1)
                rb = records_from(b, str(segment.path), position, last)
                self.read_to = position + rb.num_rows
                yield LogBatch(position, rb, b.header.log_append_time, b.header.producer_id)
                position += rb.num_rows
            if stop is not None and nxt is None:
                return  # the readable log ends at a torn tail


    def committed(self, offset: int) -> tuple[int, TxnScan]:
        """The readable end (the log end, or the published high watermark of a replicated
        partition: a marker above it may yet be truncated away), and what a committed
        reader from ``offset`` must know of the transactions below it: the first offset
        of one still open (None: none is) and which batches were aborted, from the
        headers in between. A partition never written to by a transaction (no
        ``transactional`` file, looked for after the end is found) needs no scan."""
        end = published_readable_end(self.directory, self.end_offset(), READ_UNCOMMITTED)
        if not has_transactions(self.directory) or offset >= end:
            return end, TxnScan(None, Hidden(), {})
        return end, scan(self._headers(offset, end))

    def _headers(self, offset: int, end: int) -> Iterator[BatchHeader]:
        """Headers of the batches holding ``[offset, end)``; at damage the scan ends with
        a header-less stop: the offsets past it count as a transaction still open."""
        segments = list_segments(self.directory)
        for i, segment in enumerate(segments):
            nxt = segments[i + 1].base_offset if i + 1 < len(segments) else None
            if nxt is not None and nxt <= offset:
                continue
            if segment.base_offset >= end:
                return
            items, _ = scan_segment(segment, offset, nxt)
            for b in items:
                if isinstance(b, Damage):
                    if b.first_offset < end:
                        yield _UNKNOWN._replace(base_offset=b.first_offset)
                    return
                if b.header.base_offset >= end:
                    return
                yield b.header


_UNKNOWN = BatchHeader(0, 0, 0, 0, ATTR_TRANSACTIONAL, 1, 0, 0, -2, 0, -1)
"""Where a scan for markers met damage: as a transactional batch of no producer, it
holds the last stable offset there (what follows cannot be told committed)."""


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
    items, _ = scan_segment(segment)
    # Damaged records cannot be read, so their times do not hold the segment back.
    return max((b.header.max_timestamp for b in items if isinstance(b, ScannedBatch)), default=-1)
