"""Reading a segment: its batches from an offset, CRC-checked, the damage between them,
and reads by offset and by time. ``LogSegment`` (``log_tables.hot.segment``) owns the
files and writes them; readers stay below its published ``size`` and ``next_offset``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from log_tables.errors import CorruptRecordError
from log_tables.hot.batch import BatchScanner, ScannedBatch, ScanStop
from log_tables.hot.damage import Damage, locate
from log_tables.hot.offset_index import OffsetIndex
from log_tables.hot.time_index import TimeIndex


class SegmentReads:
    """The read side of ``LogSegment``: every method here only reads its files."""

    path: Path
    offset_index: OffsetIndex
    time_index: TimeIndex
    size: int
    next_offset: int
    sealed: bool
    _fd: int
    _damage: dict[int, Damage | None]

    def scan(self, offset: int, max_batch_bytes: int, end: int | None = None) -> BatchScanner:
        """Batches from the one holding ``offset`` (CRC-checked) up to ``end`` bytes."""
        start_offset, start_pos = self.offset_index.lookup(offset)
        return _SkippingScanner(self._fd, str(self.path), start_pos,
                                self.size if end is None else end, offset,
                                expected_offset=start_offset, max_batch_bytes=max_batch_bytes)

    def intact(self, offset: int, max_batch_bytes: int) -> Iterator[ScannedBatch | Damage]:
        """The batches from the one holding ``offset`` on, CRC-checked, in order; a
        damaged run between them comes as a ``Damage`` (the offsets it hides), and the
        intact batches after it follow."""
        next_offset = self.next_offset
        size = self.size  # after next_offset: it covers at least that (see ``append``)
        position_offset, position = self.offset_index.lookup(offset)
        while True:
            scanner = _SkippingScanner(self._fd, str(self.path), position, size, offset,
                                       expected_offset=position_offset,
                                       max_batch_bytes=max_batch_bytes)
            yield from scanner
            expected = scanner.expected_offset
            assert expected is not None
            if scanner.stop is None:
                if expected < next_offset:  # the file is shorter than its offsets
                    yield Damage(str(self.path), size, size, expected, next_offset,
                                 "the segment ends early")
                return
            damage = self.damage_at(scanner.stop, expected, size, next_offset, max_batch_bytes)
            if damage is None:
                return
            if damage.next_offset > offset:
                yield damage
            position, position_offset = damage.resume_position, damage.next_offset

    def damage_at(self, stop: ScanStop, first_offset: int, size: int, next_offset: int,
                  max_batch_bytes: int) -> Damage | None:
        """The damage a scan of this segment (``size`` bytes holding offsets up to
        ``next_offset``) stopped at (see ``damage.locate``)."""
        if stop.position in self._damage:
            return self._damage[stop.position]
        found = locate(self._fd, str(self.path), stop, first_offset, size, next_offset,
                       self.offset_index.entries(), max_batch_bytes)
        if self.sealed:  # a sealed segment never changes: remember it
            self._damage[stop.position] = found
        return found

    def read(self, offset: int, end_offset: int, max_bytes: int, max_batch_bytes: int,
             first: bool) -> list[ScannedBatch]:
        """Batches holding offsets ``[offset, end_offset)``, up to ``max_bytes``.

        ``first``: the read has nothing yet, so one batch is returned even if it is
        larger than ``max_bytes`` (so that a consumer always makes progress).
        A damaged batch ends the read: the batches before it are returned; with none,
        CorruptRecordError names the offsets it hides (past it, reads go on).
        """
        out: list[ScannedBatch] = []
        total = 0
        for batch in self.intact(offset, max_batch_bytes):
            if isinstance(batch, Damage):
                if out or batch.first_offset >= end_offset:
                    return out
                raise CorruptRecordError(batch.path, batch.position, batch.reason,
                                         first_offset=batch.first_offset,
                                         next_offset=batch.next_offset)
            if batch.header.base_offset >= end_offset:
                return out
            if total + batch.header.size > max_bytes and (out or not first):
                return out
            out.append(batch)
            total += batch.header.size
            if batch.header.next_offset >= end_offset:
                return out
        return out

    def offset_for_timestamp(self, timestamp: int, max_batch_bytes: int,
                             end_offset: int) -> int | None:
        """The first offset below ``end_offset`` whose timestamp is >= ``timestamp``
        (records of damaged batches, whose times are unknown, are passed over)."""
        start = self.time_index.scan_start(timestamp)
        for batch in self.intact(start, max_batch_bytes):
            if isinstance(batch, Damage):
                continue
            h = batch.header
            if h.base_offset >= end_offset:
                return None
            if h.max_timestamp < timestamp:
                continue
            records = batch.records(str(self.path))
            ts = records.column(0)
            if h.log_append_time:
                return max(h.base_offset, start)
            for i in range(max(0, start - h.base_offset), len(ts)):
                if ts[i].as_py() >= timestamp:
                    return h.base_offset + i
        return None


class _SkippingScanner(BatchScanner):
    """A scanner that yields only batches ending at or after ``offset``."""

    def __init__(self, fd: int, path: str, start: int, end: int, offset: int, **kwargs: object
                 ) -> None:
        super().__init__(fd, path, start, end, **kwargs)  # type: ignore[arg-type]
        self._offset = offset

    def __iter__(self):  # type: ignore[no-untyped-def]
        for batch in super().__iter__():
            if batch.header.next_offset > self._offset:
                yield batch


def records_from(batch: ScannedBatch, path: str, first_offset: int,
                 last_offset: int) -> pa.RecordBatch:
    """The body of ``batch`` cut to offsets ``[first_offset, last_offset]``."""
    records = batch.records(path)
    base = batch.header.base_offset
    lo = max(0, first_offset - base)
    hi = min(batch.header.record_count, last_offset - base + 1)
    if lo == 0 and hi == batch.header.record_count:
        return records
    return records.slice(lo, hi - lo)
