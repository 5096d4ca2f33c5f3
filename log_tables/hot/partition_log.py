"""The log of one partition: an ordered run of segments, one writer, many readers.

Files in the partition directory::

    00000000000000000000.log / .index / .timeindex   one segment per base offset
    partition.json     checkpoint: log_start_offset and recovery_point
    .clean-shutdown    written by close(); lists segment sizes; removed on open

Opening a log recovers it (``log_tables.hot.recovery``: what is trusted, what is
truncated); rolling, flushing and reading the segments are ``LocalLog``'s
(``log_tables.hot.local_log``); appends, with their checks and the idempotent
producers' state, truncation and shutdown are here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa

from log_tables.clock import SYSTEM_CLOCK, Clock
from log_tables.config import TopicConfig
from log_tables.errors import (
    CorruptRecordError,
    InvalidRecordError,
    LogClosedError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from log_tables.hot.batch import (
    HEADER_SIZE,
    MAX_BATCH_BYTES,
    NO_PRODUCER_ID,
    EncodedBatch,
    assign,
    check_header,
    decode_header,
    prepare,
    verify,
)
from log_tables.hot.local_log import LocalLog
from log_tables.hot.producer_state import seq_add
from log_tables.hot.recovery import rebuild_producer_state, recover, write_clean_marker
from log_tables.hot.segment import LogSegment
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



class PartitionLog(LocalLog):
    """Append, read, roll, recover, truncate and delete the segments of one partition."""

    # -- open and recovery -------------------------------------------------------
    @classmethod
    def open(cls, directory: Path, config: TopicConfig | None = None, *, name: str = "",
             clock: Clock = SYSTEM_CLOCK) -> PartitionLog:
        """Open (or create) the log in ``directory``, recovering it if it was not closed."""
        directory.mkdir(parents=True, exist_ok=True)
        plog = cls(directory, config or TopicConfig(), name or directory.name, clock)
        plog._load()
        return plog

    def _load(self) -> None:
        found = recover(self.directory, self.config, self.clock, self._note)
        segments = found.segments
        for seg in segments[:-1]:
            seg.sealed = True
        self._segments = tuple(segments)
        self._next_offset = segments[-1].next_offset
        first_base = segments[0].base_offset
        self._log_start_offset = min(max(found.log_start_offset, first_base), self._next_offset)
        self._delete_below_log_start()
        self._flushed_offset = self._next_offset if found.clean else self._segments[-1].base_offset
        self._recovery_point = self._segments[-1].base_offset
        self._write_checkpoint()
        self._rebuild_producer_state()

    def _rebuild_producer_state(self) -> None:
        """Load the newest snapshot at or below the log end and replay the headers after it."""
        self.producers = rebuild_producer_state(self.directory, self.name, self._segments,
                                                self._next_offset, self._note)

    # -- appending ---------------------------------------------------------------
    def append(self, records: pa.RecordBatch, *, producer_id: int = NO_PRODUCER_ID,
               producer_epoch: int = -1, base_sequence: int = -1) -> AppendInfo:
        """Append a batch of records (RECORD_SCHEMA) as one unit; returns its offsets.

        When this returns, the batch is in the OS page cache: it survives a killed
        process. ``flush()`` makes it survive a power cut.
        """
        if records.schema != RECORD_SCHEMA:
            raise InvalidRecordError(f"{self.name}: batch schema {records.schema} is not RECORD_SCHEMA")
        if records.num_rows == 0:
            raise InvalidRecordError(f"{self.name}: empty batch")
        config = self.config
        append_time = -1
        if config.log_append_time:
            append_time = self.clock.now_ms()
            records = records.set_column(
                0, RECORD_SCHEMA.field(0), pa.array([append_time] * records.num_rows, pa.int64()))
        prepared = prepare(records, log_append_time=config.log_append_time,
                           producer_id=producer_id, producer_epoch=producer_epoch,
                           base_sequence=base_sequence)
        if not config.log_append_time:  # the broker's own time is always in range
            low = int(records.column(0).to_numpy(zero_copy_only=False).min())
            if low < 0 or prepared.max_timestamp > MAX_TIMESTAMP_MS:
                raise InvalidRecordError(
                    f"{self.name}: record timestamp {low if low < 0 else prepared.max_timestamp} "
                    f"is outside 0..{MAX_TIMESTAMP_MS} (epoch milliseconds from 1970 to the end "
                    "of year 9999)")
        limit = min(config.max_message_bytes, config.segment_bytes)
        if prepared.size > limit:
            which = "max.message.bytes" if limit == config.max_message_bytes else "segment.bytes"
            what = ("a record" if prepared.record_count == 1
                    else f"a batch of {prepared.record_count} records")
            raise RecordTooLargeError(
                f"{self.name}: {what} is {prepared.size} bytes as stored, over {which}={limit} "
                "(a batch is bounded by the smaller of max.message.bytes and segment.bytes)")
        with self._lock:
            if self._closed:
                raise LogClosedError(f"{self.name} is closed")
            duplicates: list[int] = []
            if producer_id >= 0:
                duplicates = self.producers.check(producer_id, producer_epoch, base_sequence,
                                                  records.num_rows)
                if len(duplicates) == records.num_rows:
                    return AppendInfo(duplicates[0], duplicates[-1], append_time,
                                      prepared.max_timestamp, 0, tuple(duplicates))
                if duplicates:  # a retry that overlaps: append only the new tail
                    base_sequence = seq_add(base_sequence, len(duplicates))
                    prepared = prepare(records.slice(len(duplicates)),
                                       log_append_time=config.log_append_time,
                                       producer_id=producer_id, producer_epoch=producer_epoch,
                                       base_sequence=base_sequence)
            batch = assign(prepared, self._next_offset)
            self._maybe_roll_for(batch)
            active = self._segments[-1]
            if active.size == 0:
                active.first_append_ms = self.clock.now_ms()
            active.append(batch)
            self._next_offset = batch.header.next_offset
            if producer_id >= 0:
                self.producers.update(producer_id, producer_epoch, base_sequence,
                                      prepared.record_count, batch.header.base_offset)
        h = batch.header
        return AppendInfo(h.base_offset, h.last_offset, append_time, h.max_timestamp, h.size,
                          tuple(duplicates))

    # -- replication -----------------------------------------------------------------
    def become_leader(self, leader_epoch: int) -> None:
        """This replica leads from ``leader_epoch`` on: that epoch starts at the log end."""
        with self._lock:
            self.leader_epochs.assign(leader_epoch, self._next_offset)

    def append_replica(self, data: bytes | memoryview,
                       epochs: Sequence[tuple[int, int]] = ()) -> int:
        """Append batches fetched from the leader as they are: same offsets, bytes and CRCs.

        Each must start at this log's end and pass its CRC; the first that does not ends
        the append with CorruptRecordError (the batches before it stay). ``epochs``: the
        leader's epoch entries (epoch, start offset) for the fetched range, copied into
        this replica's leader-epoch cache. The producers' state follows the headers, so a
        retry sent to this replica once it leads is still answered with the first offsets.
        Returns the new log end.
        """
        view = memoryview(data)
        pending = sorted(epochs)
        with self._lock:
            if self._closed:
                raise LogClosedError(f"{self.name} is closed")
            pos = 0
            while pos < len(view):
                header = decode_header(view, pos) if len(view) - pos >= HEADER_SIZE else None
                problem = ("a torn batch" if header is None else
                           check_header(header, self.name, pos, MAX_BATCH_BYTES))
                if header is not None and problem is None:
                    if header.base_offset != self._next_offset:
                        problem = (f"batch at offset {header.base_offset}, but the log ends "
                                   f"at {self._next_offset}")
                    elif pos + header.size > len(view):
                        problem = "a torn batch"
                    elif not verify(header, pa.py_buffer(view[pos:pos + header.size])):
                        problem = "CRC mismatch"
                if problem is not None or header is None:
                    raise CorruptRecordError(f"replica fetch of {self.name}", pos,
                                             problem or "a torn batch",
                                             first_offset=self._next_offset)
                while pending and pending[0][1] <= header.base_offset:
                    epoch, start = pending.pop(0)
                    self.leader_epochs.assign(epoch, start)
                raw = view[pos:pos + header.size]
                batch = EncodedBatch(header, bytes(raw[:HEADER_SIZE]),
                                     pa.py_buffer(raw[HEADER_SIZE:]))
                self._maybe_roll_for(batch)
                active = self._segments[-1]
                if active.size == 0:
                    active.first_append_ms = self.clock.now_ms()
                active.append(batch)
                self._next_offset = header.next_offset
                self.producers.apply(header)
                pos += header.size
            return self._next_offset

    def truncate_fully(self, offset: int, log_start: int | None = None) -> None:
        """Drop every record and start the log at ``offset`` (a follower whose log ends
        below the leader's log start: Kafka's truncateFullyAndStartAt). ``log_start``: the
        leader's, when it falls inside the batch at ``offset`` (readers start there)."""
        with self._flush_lock, self._lock:
            old = self._segments
            new = LogSegment.create(self.directory, offset, self.config.index_interval_bytes,
                                    self.clock.now_ms())
            self._segments = (new,)
            self._unsynced = ()
            self._next_offset = offset
            self._log_start_offset = max(offset, log_start or 0)
            self._flushed_offset = self._recovery_point = offset
            if self._hw is not None:
                self._hw = offset
            self._write_checkpoint()
            for seg in old:
                if seg.base_offset != offset:
                    seg.delete()
            self.leader_epochs.clear()
            self.producers = type(self.producers)(self.name)
            self._write_producer_snapshot()

    # -- deletion and truncation -------------------------------------------------
    def delete_records(self, offset: int) -> int:
        """Kafka's DeleteRecords: move the log start to ``offset`` and drop whole segments below it."""
        with self._flush_lock, self._lock:
            if not self._log_start_offset <= offset <= self._next_offset:
                raise OffsetOutOfRangeError(self.name, offset, self._log_start_offset,
                                            self._next_offset)
            if offset == self._next_offset and self._segments[-1].size:
                self._roll_locked()
            self._log_start_offset = offset
            self._write_checkpoint()
            self._delete_below_log_start()
            self.leader_epochs.truncate_from_start(offset)
            return offset

    def delete_segments_below(self, offset: int) -> list[LogSegment]:
        """Drop every sealed segment whose records are all below ``offset``; returns them.

        The log start moves to the first remaining segment's base offset (if higher).
        """
        with self._flush_lock:
            with self._lock:
                doomed = [s for s in self._segments[:-1] if s.next_offset <= offset]
                if not doomed:
                    return []
                keep = self._segments[len(doomed):]
                self._log_start_offset = max(self._log_start_offset, keep[0].base_offset)
                self._segments = keep
                if not self._forget_unsynced(doomed):  # it wrote the checkpoint otherwise
                    self._write_checkpoint()
            for seg in doomed:
                seg.delete()
        return doomed

    def _forget_unsynced(self, doomed: list[LogSegment]) -> bool:
        """Deleted segments need no sync (callers hold both locks); True if the
        checkpoint was written."""
        if not self._unsynced:
            return False
        self._unsynced = tuple(s for s in self._unsynced if s not in doomed)
        return self._advance_recovery_point_locked()

    def _delete_below_log_start(self) -> None:
        doomed = [s for s in self._segments[:-1] if s.next_offset <= self._log_start_offset]
        if doomed:
            self._segments = self._segments[len(doomed):]
            self._forget_unsynced(doomed)
            for seg in doomed:
                seg.delete()

    def truncate_to(self, offset: int) -> None:
        """Remove every record at or after ``offset`` (the log end becomes ``offset``)."""
        with self._flush_lock, self._lock:
            if not self._log_start_offset <= offset <= self._next_offset:
                raise OffsetOutOfRangeError(self.name, offset, self._log_start_offset,
                                            self._next_offset)
            if offset == self._next_offset:
                return
            segments = list(self._segments)
            while len(segments) > 1 and segments[-1].base_offset >= offset:
                doomed = segments.pop()
                self._unsynced = tuple(s for s in self._unsynced if s is not doomed)
                doomed.delete()
            seg = segments[-1]
            straddling = seg.truncate_to(offset, MAX_BATCH_BYTES)
            if straddling is not None:
                h = straddling.header
                kept = straddling.records(str(seg.path)).slice(0, offset - h.base_offset)
                batch = assign(prepare(kept, log_append_time=h.log_append_time,
                                       producer_id=h.producer_id, producer_epoch=h.producer_epoch,
                                       base_sequence=h.base_sequence), h.base_offset)
                seg.append(batch)
            seg.flush()
            self._unsynced = tuple(s for s in self._unsynced if s is not seg)
            self._segments = tuple(segments)
            self._next_offset = offset
            if self._hw is not None:
                self._hw = min(self._hw, offset)
            self.leader_epochs.truncate_from_end(offset)
            self._flushed_offset = min(self._flushed_offset, offset)
            self._recovery_point = min(self._recovery_point, seg.base_offset)
            self._write_checkpoint()
            self._rebuild_producer_state()

    # -- shutdown ------------------------------------------------------------------
    def update_config(self, config: TopicConfig) -> None:
        self.config = config

    def close(self) -> None:
        """Flush, checkpoint and write the clean-shutdown marker; the log is unusable after."""
        with self._flush_lock, self._lock:
            if self._closed:
                return
            self._closed = True
            self._sync_unsynced_locked()
            active = self._segments[-1]
            active.flush()
            self._recovery_point = active.base_offset
            self._write_checkpoint()
            self.checkpoint_high_watermark()
            self._write_producer_snapshot()
            write_clean_marker(self.directory, self._next_offset, self._segments)
            for seg in self._segments:
                seg.close()

    def abandon(self) -> None:
        """Close file handles without flushing or marking a clean stop (tests, fatal errors)."""
        with self._lock:
            self._closed = True
            for seg in self._segments:
                with contextlib.suppress(OSError):
                    seg.close()

    def __repr__(self) -> str:
        return (f"PartitionLog({self.name}, offsets {self._log_start_offset}..{self._next_offset}, "
                f"{len(self._segments)} segments)")


def partition_dir(hot_dir: Path, topic: str, partition: int) -> Path:
    return hot_dir / topic / str(partition)

