"""One segment of a partition log: ``<base_offset:020d>.log`` with its two indexes.

A segment is appended to by one writer and read by any number of readers. Its
``size`` and ``next_offset`` are published after the bytes are in the file, so
a reader that stays below them never sees a partial batch. A sealed segment
never changes again.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from log_tables.errors import CorruptIndexError, StorageError
from log_tables.hot.batch import HEADER_SIZE, BatchScanner, EncodedBatch, ScannedBatch, ScanStop
from log_tables.hot.damage import Damage
from log_tables.hot.offset_index import OffsetIndex
from log_tables.hot.segment_reads import SegmentReads
from log_tables.hot.time_index import TimeIndex

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
DELETED_SUFFIX = ".deleted"
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX)


def segment_stem(base_offset: int) -> str:
    return f"{base_offset:020d}"


def parse_stem(name: str) -> int | None:
    """The base offset of a segment file name, or None if it is not one."""
    stem = name.split(".", 1)[0]
    if len(stem) == 20 and stem.isdigit():
        return int(stem)
    return None


class IndexedBatch(NamedTuple):
    """What the indexes need to know of an appended batch."""

    base_offset: int
    last_offset: int
    max_timestamp: int
    position: int
    size: int


class LogSegment(SegmentReads):
    """A ``.log`` file of batches, an offset index and a time index."""

    def __init__(self, directory: Path, base_offset: int, index_interval_bytes: int,
                 created_ms: int) -> None:
        stem = segment_stem(base_offset)
        self.directory = directory
        self.base_offset = base_offset
        self.path = directory / (stem + LOG_SUFFIX)
        self.offset_index = OffsetIndex(directory / (stem + INDEX_SUFFIX), base_offset)
        self.time_index = TimeIndex(directory / (stem + TIMEINDEX_SUFFIX), base_offset)
        self.index_interval_bytes = index_interval_bytes
        self.created_ms = created_ms
        self.first_append_ms = created_ms
        """When its first batch was appended (set by the partition log; for a segment
        opened from disk, when it was opened)."""
        self.size = 0
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.sealed = False
        self._bytes_since_index = 0
        self._index_broken = False
        self._damage: dict[int, Damage | None] = {}
        """Damage found by reads, by the byte a scan stopped at (sealed segments only)."""
        self._fd = -1

    # -- lifecycle ----------------------------------------------------------------
    @classmethod
    def create(cls, directory: Path, base_offset: int, index_interval_bytes: int,
               now_ms: int) -> LogSegment:
        """A new empty segment (any leftover files of the same name are replaced)."""
        seg = cls(directory, base_offset, index_interval_bytes, now_ms)
        seg._fd = os.open(seg.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
        for index in (seg.offset_index, seg.time_index):
            index.path.unlink(missing_ok=True)
            index.open()
        return seg

    @classmethod
    def open_existing(cls, directory: Path, base_offset: int, index_interval_bytes: int,
                      now_ms: int) -> LogSegment:
        """Open the files of a segment; call ``load`` or ``recover`` next."""
        seg = cls(directory, base_offset, index_interval_bytes, now_ms)
        seg._fd = os.open(seg.path, os.O_RDWR | os.O_APPEND)
        seg.size = os.fstat(seg._fd).st_size
        return seg

    def load(self, max_batch_bytes: int) -> bool:
        """Trust the log but check the indexes; False if the segment must be recovered.

        Checks the indexes' ordering, that the last offset-index entry points at a
        batch with that base offset, and validates (CRC) the batches after it to
        find the segment's end and maximum timestamp.
        """
        try:
            self.offset_index.load()
            self.time_index.load()
        except CorruptIndexError:
            return False
        start_offset, start_pos = self.offset_index.lookup(2**63 - 1)
        if start_pos >= max(self.size, 1) and self.size > 0:
            return False
        scanner = BatchScanner(self._fd, str(self.path), start_pos, self.size,
                               expected_offset=start_offset, max_batch_bytes=max_batch_bytes)
        max_ts = self.time_index.last[0] if self.time_index.last else -1
        last: ScannedBatch | None = None
        for batch in scanner:
            last = batch
            max_ts = max(max_ts, batch.header.max_timestamp)
        if scanner.stop is not None:
            return False
        next_offset = last.header.next_offset if last else start_offset
        time_last = self.time_index.last
        if time_last is not None and (time_last[1] >= next_offset or time_last[0] > max_ts):
            return False
        self.next_offset = next_offset
        self.max_timestamp = max_ts
        for index in (self.offset_index, self.time_index):
            index.open()
        return True

    def recover(self, max_batch_bytes: int) -> ScanStop | None:
        """Validate every batch, truncate at the first bad one, rebuild both indexes.

        Returns where and why the segment was truncated, or None if it was whole.
        """
        scanner = BatchScanner(self._fd, str(self.path), 0, self.size,
                               expected_offset=self.base_offset, max_batch_bytes=max_batch_bytes)
        self._reindex(scanner)
        self.next_offset = scanner.expected_offset or self.base_offset
        if scanner.stop is not None:
            os.ftruncate(self._fd, scanner.stop.position)
            self.size = scanner.stop.position
        return scanner.stop

    def rebuild(self, next_offset: int, max_batch_bytes: int) -> list[Damage]:
        """Rebuild both indexes of a durable segment whose next offset is known, without
        truncating anything: damage inside it is left for reads to report, rather than cut
        away with the intact batches after it. Returns the damage found.
        """
        self.next_offset = next_offset
        self.offset_index.reset([], [])  # scan from the start, not from a broken entry
        damages: list[Damage] = []

        def batches() -> Iterator[ScannedBatch]:
            for item in self.intact(self.base_offset, max_batch_bytes):
                if isinstance(item, Damage):
                    damages.append(item)
                else:
                    yield item

        self._reindex(batches())
        return damages

    def _reindex(self, batches: Iterable[ScannedBatch]) -> None:
        """Replace both indexes with entries for ``batches`` (all of the segment's, in order)."""
        off_a: list[int] = []
        off_b: list[int] = []
        ts_a: list[int] = []
        ts_b: list[int] = []
        self._bytes_since_index = 0
        self.max_timestamp = -1
        for batch in batches:
            h = batch.header
            if self._index_point(IndexedBatch(h.base_offset, h.last_offset, h.max_timestamp,
                                              batch.position, h.size)):
                off_a.append(h.base_offset - self.base_offset)
                off_b.append(batch.position)
                if not ts_a or self.max_timestamp > ts_a[-1]:
                    ts_a.append(self.max_timestamp)
                    ts_b.append(h.last_offset - self.base_offset)
        self.offset_index.reset(off_a, off_b)
        self.time_index.reset(ts_a, ts_b)

    def _index_point(self, b: IndexedBatch) -> bool | None:
        """Account for an appended batch; True when it should get index entries."""
        self.max_timestamp = max(self.max_timestamp, b.max_timestamp)
        self._bytes_since_index += b.size
        if self._bytes_since_index >= self.index_interval_bytes:
            self._bytes_since_index = 0
            return True
        return None

    # -- writing ------------------------------------------------------------------
    def append(self, batch: EncodedBatch) -> int:
        """Write a batch at the end; returns its position. StorageError leaves no trace."""
        position = self.size
        size = batch.size
        try:
            written = os.writev(self._fd, [batch.header_bytes, batch.body])
        except OSError as exc:
            self._undo(position)
            raise StorageError(f"cannot append to {self.path}: {exc.strerror}", exc.errno) from None
        if written != size:
            self._undo(position)
            raise StorageError(
                f"short write to {self.path}: {written} of {size} bytes (disk full?)", errno.ENOSPC
            )
        h = batch.header
        if self._index_point(IndexedBatch(h.base_offset, h.last_offset, h.max_timestamp,
                                          position, size)):
            self._add_index_entries(h.base_offset, position, h.last_offset)
        # Size first: a reader that sees the new next offset also sees the bytes that hold
        # it (``intact`` reads them in the other order), so a live read never takes a
        # batch still being published for one missing from the file.
        self.size = position + size
        self.next_offset = h.next_offset
        return position

    def _add_index_entries(self, base_offset: int, position: int, last_offset: int) -> None:
        # A lost index entry costs only a longer scan; the batch itself is already
        # in the log, so an index write failure must not fail the append.
        if self._index_broken:
            return
        try:
            self.offset_index.append(base_offset, position)
            self.time_index.maybe_append(self.max_timestamp, last_offset)
        except OSError:
            self._index_broken = True

    def _undo(self, position: int) -> None:
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, position)

    def truncate_to(self, offset: int, max_batch_bytes: int) -> ScannedBatch | None:
        """Remove every record at or after ``offset``.

        Returns the batch that straddled ``offset`` (already cut away whole) so the
        caller can append back its records below ``offset``; None if ``offset``
        fell on a batch boundary.
        """
        straddling: ScannedBatch | None = None
        cut = self.size
        for batch in self.scan(offset, max_batch_bytes):
            cut = batch.position
            if batch.header.base_offset < offset:
                straddling = batch
            break
        os.ftruncate(self._fd, cut)
        self.size = cut
        # The straddling batch is removed whole (its head is re-appended by the
        # caller), so its index entries go too.
        self.next_offset = offset if straddling is None else straddling.header.base_offset
        self.offset_index.truncate_to(self.next_offset)
        self.time_index.truncate_to(self.next_offset)
        self._recompute_max_timestamp(max_batch_bytes)
        self.sealed = False
        return straddling

    def _recompute_max_timestamp(self, max_batch_bytes: int) -> None:
        last_ts = self.time_index.last
        max_ts = last_ts[0] if last_ts else -1
        start_offset, start_pos = self.offset_index.lookup(2**63 - 1)
        for batch in BatchScanner(self._fd, str(self.path), start_pos, self.size,
                                  expected_offset=start_offset, max_batch_bytes=max_batch_bytes):
            max_ts = max(max_ts, batch.header.max_timestamp)
        self.max_timestamp = max_ts
        self._bytes_since_index = 0

    def seal(self, sync: bool = True) -> None:
        """Index the maximum timestamp, make everything durable (unless ``sync`` is
        False: the caller has ``flush`` run later); no more appends."""
        if self.max_timestamp >= 0 and self.next_offset > self.base_offset and not self._index_broken:
            with contextlib.suppress(OSError):
                self.time_index.maybe_append(self.max_timestamp, self.next_offset - 1)
        if sync:
            self.flush()
        self.sealed = True

    def flush(self) -> None:
        """fdatasync the log and its indexes."""
        os.fdatasync(self._fd)
        self.offset_index.flush()
        self.time_index.flush()

    def flush_log(self) -> None:
        """fdatasync only the log (the indexes are rebuilt by recovery if lost)."""
        os.fdatasync(self._fd)

    # -- removal ------------------------------------------------------------------
    def close(self) -> None:
        for index in (self.offset_index, self.time_index):
            index.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        """Rename the files to ``.deleted`` (the atomic step), then unlink them.

        The log's file descriptor stays open until the segment object is dropped,
        so readers already inside it finish their read.
        """
        for index in (self.offset_index, self.time_index):
            index.close()
        paths = [self.path, self.offset_index.path, self.time_index.path]
        doomed = []
        for p in paths:
            target = p.with_name(p.name + DELETED_SUFFIX)
            with contextlib.suppress(FileNotFoundError):
                os.replace(p, target)
                doomed.append(target)
        for p in doomed:
            p.unlink(missing_ok=True)

    def __del__(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def __repr__(self) -> str:
        return (f"LogSegment({self.path.name}, offsets {self.base_offset}..{self.next_offset}, "
                f"{self.size} bytes)")


assert HEADER_SIZE % 8 == 0
