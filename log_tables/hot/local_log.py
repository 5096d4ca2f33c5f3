"""The segments of one partition and their durability: roll, flush, read, drop.

A roll during an append does not wait for the sealed segment's fdatasync (tens
of milliseconds for a full segment) when the log has a ``flush_scheduler``: as in
Kafka, the sync runs in the background (the group commit), and the recovery
point, the checkpoint and the roll listeners follow once it is done.

``LocalLog`` is the lower half of ``PartitionLog`` (as Kafka's ``LocalLog`` is of
its ``UnifiedLog``); ``PartitionLog`` adds recovery, appends (validation and
producer state), truncation and shutdown.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_right
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, Self

from log_tables.clock import Clock
from log_tables.config import TopicConfig
from log_tables.errors import CorruptRecordError, OffsetOutOfRangeError, StorageError
from log_tables.hot.batch import MAX_BATCH_BYTES, BatchScanner, EncodedBatch
from log_tables.hot.high_watermark import read_high_watermark, write_high_watermark
from log_tables.hot.leader_epochs import LeaderEpochCache
from log_tables.hot.producer_state import ProducerStateManager
from log_tables.hot.recovery import write_checkpoint, write_producer_snapshot
from log_tables.hot.segment import LogSegment
from log_tables.hot.segment_reads import records_from
from log_tables.records import FetchResult, LogBatch

log = logging.getLogger(__name__)


class RawBatches(NamedTuple):
    """Stored batches as they are on disk (a replica fetch): offsets ``[first, next)``."""

    data: bytes
    first_offset: int
    next_offset: int


class LocalLog:
    """Roll, flush, read and drop the segments of one partition (see ``PartitionLog``)."""

    def __init__(self, directory: Path, config: TopicConfig, name: str, clock: Clock) -> None:
        self.directory = directory
        self.config = config
        self.name = name
        self.clock = clock
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._segments: tuple[LogSegment, ...] = ()
        self._next_offset = 0
        self._log_start_offset = 0
        self._recovery_point = 0
        self._flushed_offset = 0
        self._closed = False
        self.roll_listeners: list[Callable[[Self, LogSegment], None]] = []
        """Called once a rolled segment is sealed and durable (on the thread that synced it)."""
        self.flush_scheduler: Callable[[Self, int], None] | None = None
        """Set: a roll during an append asks it to flush below an offset soon, rather than
        syncing the sealed segment on the appending thread; it may raise to refuse."""
        self._unsynced: tuple[LogSegment, ...] = ()
        """Sealed segments whose fdatasync is still to come (oldest first)."""
        self.recovered_from: list[str] = []
        self.producers = ProducerStateManager(name)
        self.leader_epochs = LeaderEpochCache(directory, name)
        self._hw: int | None = read_high_watermark(directory)
        """None: not replicated (readers see up to the log end); else the high watermark."""
        self._hw_written = self._hw

    # -- properties ---------------------------------------------------------------
    @property
    def log_end_offset(self) -> int:
        """The offset the next record gets."""
        return self._next_offset

    @property
    def high_watermark(self) -> int:
        """Readers (consumers, tiering, Spark) see the records below this: the log end for
        a partition of one replica; for a replicated one, the offset below which every
        in-sync replica has the records (the leader advances it, followers learn it)."""
        hw = self._hw
        if hw is None:
            return self._next_offset
        return max(self._log_start_offset, min(hw, self._next_offset))

    @property
    def replicated(self) -> bool:
        return self._hw is not None

    def start_replication(self) -> None:
        """From now on readers see only below the high watermark: the checkpointed one, or
        the log start (it rises as the in-sync replicas fetch)."""
        with self._lock:
            if self._hw is None:
                self._hw = self._log_start_offset
                self.checkpoint_high_watermark()

    def advance_high_watermark(self, offset: int) -> bool:
        """Raise the high watermark to ``offset`` (at most the log end); True if it moved."""
        with self._lock:
            if self._hw is None:
                return False
            new = min(offset, self._next_offset)
            if new <= self._hw:
                return False
            self._hw = new
            return True

    def checkpoint_high_watermark(self) -> None:
        """Publish the high watermark to readers in other processes (``high-watermark``,
        written without fsync: a stale or missing one only shows them less)."""
        hw = self._hw
        if hw is not None and hw != self._hw_written:
            write_high_watermark(self.directory, self.name, self.high_watermark)
            self._hw_written = hw

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def flushed_offset(self) -> int:
        """Every offset below this is fsynced."""
        return self._flushed_offset

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return self._segments

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    def _note(self, message: str) -> None:
        log.warning("recovery of %s: %s", self.name, message)
        self.recovered_from.append(message)

    def _write_checkpoint(self) -> None:
        write_checkpoint(self.directory, self.name, self._log_start_offset, self._recovery_point)

    def _write_producer_snapshot(self) -> None:
        """Persist producer state as of the log end; keep the newest two snapshots."""
        write_producer_snapshot(self.directory, self.name, self.producers, self._next_offset)

    # -- rolling and flushing -----------------------------------------------------
    def _maybe_roll_for(self, batch: EncodedBatch) -> None:
        active = self._segments[-1]
        if active.size == 0:
            return
        too_big = active.size + batch.size > self.config.segment_bytes
        too_old = self.clock.now_ms() - active.created_ms >= self.config.segment_ms
        if too_big or too_old:
            self._roll_locked(background=True)

    def roll(self) -> LogSegment | None:
        """Seal the active segment (if it has data) and start a new one; returns the sealed one."""
        with self._lock:
            return self._roll_locked()

    def roll_if_due(self) -> LogSegment | None:
        """Roll a non-empty active segment older than ``segment.ms`` (quiet partitions)."""
        with self._lock:
            active = self._segments[-1]
            if active.size and self.clock.now_ms() - active.created_ms >= self.config.segment_ms:
                return self._roll_locked()
        return None

    def roll_if_older(self, age_ms: int) -> LogSegment | None:
        """Roll the active segment if it holds records and the first of them was appended
        ``age_ms`` ago or more (0: whenever it holds records); returns the sealed one.

        As with a roll during an append, the sealed segment's sync is left to the
        ``flush_scheduler``: the recovery point and the roll listeners (the tiering
        job) follow once it is done, so no tiering job takes it before it is durable.
        """
        with self._lock:
            active = self._segments[-1]
            if active.size and self.clock.now_ms() - active.first_append_ms >= age_ms:
                return self._roll_locked(background=True)
        return None

    def _roll_locked(self: Self, background: bool = False) -> LogSegment | None:
        """Steps: 1. seal (fsync) the active segment; 2. create the next one;
        3. checkpoint recovery_point = its base (also fsyncs the new directory entries).

        ``background`` (a roll during an append or ``roll_if_older``, with a
        ``flush_scheduler``): step 1 does not sync, and step 3 waits for the scheduled
        ``flush``.
        """
        old = self._segments[-1]
        if old.size == 0 or self._closed:
            return None
        # Nothing of the old segment's records left to sync: the inline seal is cheap.
        defer = (background and self.flush_scheduler is not None
                 and self._flushed_offset < old.next_offset)
        try:
            old.seal(sync=not defer)
            new = LogSegment.create(self.directory, old.next_offset,
                                    self.config.index_interval_bytes, self.clock.now_ms())
        except OSError as exc:
            raise StorageError(f"{self.name}: cannot roll segment {old.path} in {self.directory}: "
                               f"{exc.strerror}", exc.errno) from None
        self._segments = (*self._segments, new)
        self._write_producer_snapshot()
        if defer:
            assert self.flush_scheduler is not None
            self._unsynced = (*self._unsynced, old)
            try:
                self.flush_scheduler(self, new.base_offset)
                return old
            except Exception as exc:  # e.g. the group commit is closed or full: sync here
                log.info("%s: syncing the rolled segment %s inline (%s)", self.name, old.path, exc)
        synced = self._sync_unsynced_locked() if defer else (old,)
        self._advance_recovery_point_locked()
        self._notify_rolled(synced)
        return old

    def _notify_rolled(self: Self, sealed: tuple[LogSegment, ...]) -> None:
        for seg in sealed:
            for listener in self.roll_listeners:
                try:
                    listener(self, seg)
                except Exception:  # a listener's failure is not the log's
                    log.exception("%s: roll listener failed for %s", self.name, seg.path)

    def _sync_unsynced_locked(self) -> tuple[LogSegment, ...]:
        synced = self._unsynced
        for seg in synced:
            try:
                seg.flush()
            except OSError as exc:
                raise StorageError(f"{self.name}: fsync of sealed segment {seg.path} failed: "
                                   f"{exc.strerror}", exc.errno) from None
        self._unsynced = ()
        return synced

    def _advance_recovery_point_locked(self) -> bool:
        """Every segment before the first unsynced one (or the active one) is durable;
        True if the recovery point moved (and the checkpoint was written)."""
        point = (self._unsynced or self._segments[-1:])[0].base_offset
        self._flushed_offset = max(self._flushed_offset, point)
        if point <= self._recovery_point:
            return False
        self._recovery_point = point
        self._write_checkpoint()
        return True

    def flush(self, up_to: int | None = None) -> int:
        """fdatasync what is appended (sealed segments still waiting for their sync first);
        returns the offset below which all is durable.

        Concurrent callers share the work (group commit): one sync covers every
        append that finished before it started, and a caller whose ``up_to`` is
        already durable when its turn comes returns without syncing.
        """
        if up_to is not None and self._flushed_offset >= up_to and not self._unsynced:
            return self._flushed_offset
        with self._flush_lock:
            with self._lock:
                target = self._next_offset
                active = self._segments[-1]
                sealed = self._unsynced
            if not sealed and (self._flushed_offset >= target or (
                    up_to is not None and self._flushed_offset >= up_to)):
                return self._flushed_offset
            try:
                for seg in sealed:
                    seg.flush()
            except OSError as exc:
                raise StorageError(f"{self.name}: fsync of sealed segment {seg.path} failed: "
                                   f"{exc.strerror}", exc.errno) from None
            try:
                active.flush_log()
            except OSError as exc:
                raise StorageError(f"{self.name}: fsync failed on {active.path}: {exc.strerror}",
                                   exc.errno) from None
            if sealed:
                with self._lock:
                    self._unsynced = tuple(s for s in self._unsynced if s not in sealed)
                    self._advance_recovery_point_locked()
                self._notify_rolled(sealed)
            self._flushed_offset = max(self._flushed_offset, target)
            return self._flushed_offset

    # -- reading -----------------------------------------------------------------
    def read(self, offset: int, max_bytes: int = 1 << 20, max_records: int | None = None
             ) -> FetchResult:
        """Records from ``offset`` on, up to about ``max_bytes`` and at most ``max_records``.

        At least one record is returned when any exists (even past ``max_bytes``). A
        damaged batch ends the read: the records before it are returned, and a read that
        starts at it raises CorruptRecordError naming the offsets it hides.
        """
        log_end = self._next_offset
        high_watermark = self.high_watermark
        log_start = self._log_start_offset
        segments = self._segments
        if not log_start <= offset <= log_end:
            raise OffsetOutOfRangeError(self.name, offset, log_start, high_watermark)
        if offset >= high_watermark:  # replicated, and not yet in every in-sync replica
            return FetchResult([], high_watermark, log_start)
        end = high_watermark if max_records is None else min(high_watermark, offset + max_records)
        out: list[LogBatch] = []
        bases = [s.base_offset for s in segments]
        i = max(0, bisect_right(bases, offset) - 1)
        budget = max_bytes
        position = offset
        for seg in segments[i:]:
            if position >= end or (out and budget <= 0):
                break
            try:
                batches = seg.read(position, end, budget, MAX_BATCH_BYTES, first=not out)
            except CorruptRecordError:
                if out:
                    break  # the records before the damaged batch are answered
                raise
            for b in batches:
                if b.header.base_offset > position:
                    # The segment holding `position` was deleted after this read began.
                    raise OffsetOutOfRangeError(self.name, position, self._log_start_offset,
                                                high_watermark)
                rb = records_from(b, str(seg.path), position, end - 1)
                out.append(LogBatch(position, rb, b.header.log_append_time, b.header.producer_id))
                position += rb.num_rows
                budget -= b.header.size
            if position < min(seg.next_offset, end):
                break  # stopped inside this segment for the byte budget
        return FetchResult(out, high_watermark, log_start)

    def read_raw(self, offset: int, max_bytes: int) -> RawBatches:
        """Whole stored batches, as stored, from the one holding ``offset`` on, up to about
        ``max_bytes`` (at least one batch) and the end of its segment: what a follower
        fetches. It reads below the log end, not the high watermark, and checks no CRC (the
        follower checks every batch it appends)."""
        log_end = self._next_offset
        log_start = self._log_start_offset
        segments = self._segments
        if not log_start <= offset <= log_end:
            raise OffsetOutOfRangeError(self.name, offset, log_start, self.high_watermark)
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
            raise OffsetOutOfRangeError(self.name, offset, self._log_start_offset,
                                        self.high_watermark)
        return RawBatches(b"".join(parts), first, nxt)

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """The first offset whose timestamp is >= ``timestamp``; None if there is none."""
        high_watermark = self.high_watermark
        for seg in self._segments:
            if seg.max_timestamp < timestamp or seg.next_offset == seg.base_offset:
                continue
            found = seg.offset_for_timestamp(timestamp, MAX_BATCH_BYTES, high_watermark)
            if found is not None:
                return max(found, self._log_start_offset)
        return None
