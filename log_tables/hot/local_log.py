"""The segments of one partition and their durability: roll, flush, truncate, drop.

A roll during an append does not wait for the sealed segment's fdatasync (tens
of milliseconds for a full segment) when the log has a ``flush_scheduler``: as in
Kafka, the sync runs in the background (the group commit), and the recovery
point, the checkpoint and the roll listeners follow once it is done.

``LocalLog`` is what ``PartitionLog`` holds for its files (as Kafka's ``LocalLog`` is
for its ``UnifiedLog``): the segments, the log start and end, the recovery point. The
partition log adds recovery of the producers' state, validation of appends, the high
watermark and the leader epochs; reads are ``log_tables.hot.log_reads``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from log_tables.clock import Clock
from log_tables.config import TopicConfig
from log_tables.errors import OffsetOutOfRangeError, StorageError
from log_tables.hot.batch import MAX_BATCH_BYTES, EncodedBatch, assign, prepare
from log_tables.hot.recovery import recover, write_checkpoint, write_clean_marker
from log_tables.hot.segment import LogSegment

log = logging.getLogger(__name__)


class LocalLog:
    """Roll, flush, truncate and drop the segments of one partition (see ``PartitionLog``).

    ``lock`` guards the segment list and the offsets; methods named ``*_locked`` are
    called with it held (the partition log holds it over a change of both its producers'
    state and the segments). ``flush_lock`` orders syncs against truncation and deletion.
    ``on_roll(offset)``: a new segment starts at ``offset`` (called with ``lock`` held);
    ``on_sealed(segment)``: a rolled segment is sealed and durable.
    """

    def __init__(self, directory: Path, config: TopicConfig, name: str, clock: Clock, *,
                 on_roll: Callable[[int], None],
                 on_sealed: Callable[[LogSegment], None]) -> None:
        self.directory = directory
        self.config = config
        self.name = name
        self.clock = clock
        self.lock = threading.Lock()
        self.flush_lock = threading.Lock()
        self._on_roll = on_roll
        self._on_sealed = on_sealed
        self._segments: tuple[LogSegment, ...] = ()
        self._next_offset = 0
        self._log_start_offset = 0
        self._recovery_point = 0
        self._flushed_offset = 0
        self.closed = False
        self.flush_scheduler: Callable[[int], None] | None = None
        """Set: a roll during an append asks it to flush below an offset soon, rather than
        syncing the sealed segment on the appending thread; it may raise to refuse."""
        self._unsynced: tuple[LogSegment, ...] = ()
        """Sealed segments whose fdatasync is still to come (oldest first)."""
        self.recovered_from: list[str] = []

    # -- properties ---------------------------------------------------------------
    @property
    def log_end_offset(self) -> int:
        """The offset the next record gets."""
        return self._next_offset

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
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    def note(self, message: str) -> None:
        """What recovery found and did: logged, and kept in ``recovered_from``."""
        log.warning("recovery of %s: %s", self.name, message)
        self.recovered_from.append(message)

    def write_checkpoint(self) -> None:
        write_checkpoint(self.directory, self.name, self._log_start_offset, self._recovery_point)

    # -- open ------------------------------------------------------------------------
    def load(self) -> None:
        """Recover the segments (``log_tables.hot.recovery``) and checkpoint what is trusted."""
        found = recover(self.directory, self.config, self.clock, self.note)
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
        self.write_checkpoint()

    # -- appending -------------------------------------------------------------------
    def append_locked(self, batch: EncodedBatch) -> None:
        """Write one batch (its offsets assigned from the log end) to the active segment,
        rolling first when the batch does not fit or the segment is old."""
        self._maybe_roll_for(batch)
        active = self._segments[-1]
        if active.size == 0:
            active.first_append_ms = self.clock.now_ms()
        active.append(batch)
        self._next_offset = batch.header.next_offset

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
        with self.lock:
            return self._roll_locked()

    def roll_if_due(self) -> LogSegment | None:
        """Roll a non-empty active segment older than ``segment.ms`` (quiet partitions)."""
        with self.lock:
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
        with self.lock:
            active = self._segments[-1]
            if active.size and self.clock.now_ms() - active.first_append_ms >= age_ms:
                return self._roll_locked(background=True)
        return None

    def _roll_locked(self, background: bool = False) -> LogSegment | None:
        """Steps: 1. seal (fsync) the active segment; 2. create the next one;
        3. checkpoint recovery_point = its base (also fsyncs the new directory entries).

        ``background`` (a roll during an append or ``roll_if_older``, with a
        ``flush_scheduler``): step 1 does not sync, and step 3 waits for the scheduled
        ``flush``.
        """
        old = self._segments[-1]
        if old.size == 0 or self.closed:
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
        self._on_roll(new.base_offset)
        if defer:
            assert self.flush_scheduler is not None
            self._unsynced = (*self._unsynced, old)
            try:
                self.flush_scheduler(new.base_offset)
                return old
            except Exception as exc:  # e.g. the group commit is closed or full: sync here
                log.info("%s: syncing the rolled segment %s inline (%s)", self.name, old.path, exc)
        synced = self._sync_unsynced_locked() if defer else (old,)
        self._advance_recovery_point_locked()
        self._notify_sealed(synced)
        return old

    def _notify_sealed(self, sealed: tuple[LogSegment, ...]) -> None:
        for seg in sealed:
            self._on_sealed(seg)

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
        self.write_checkpoint()
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
        with self.flush_lock:
            with self.lock:
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
                with self.lock:
                    self._unsynced = tuple(s for s in self._unsynced if s not in sealed)
                    self._advance_recovery_point_locked()
                self._notify_sealed(sealed)
            self._flushed_offset = max(self._flushed_offset, target)
            return self._flushed_offset

    # -- deletion and truncation (both locks held) ---------------------------------
    def start_at_locked(self, offset: int, log_start: int) -> None:
        """Drop every segment and start empty at ``offset``, readers at ``log_start``."""
        old = self._segments
        new = LogSegment.create(self.directory, offset, self.config.index_interval_bytes,
                                self.clock.now_ms())
        self._segments = (new,)
        self._unsynced = ()
        self._next_offset = offset
        self._log_start_offset = log_start
        self._flushed_offset = self._recovery_point = offset
        self.write_checkpoint()
        for seg in old:
            if seg.base_offset != offset:
                seg.delete()

    def move_log_start_locked(self, offset: int) -> None:
        """Kafka's DeleteRecords on the files: the log start becomes ``offset`` (rolling
        first when it is the log end) and the whole segments below it go."""
        if not self._log_start_offset <= offset <= self._next_offset:
            raise OffsetOutOfRangeError(self.name, offset, self._log_start_offset,
                                        self._next_offset)
        if offset == self._next_offset and self._segments[-1].size:
            self._roll_locked()
        self._log_start_offset = offset
        self.write_checkpoint()
        self._delete_below_log_start()

    def delete_segments_below(self, offset: int) -> list[LogSegment]:
        """Drop every sealed segment whose records are all below ``offset``; returns them.

        The log start moves to the first remaining segment's base offset (if higher).
        """
        with self.flush_lock:
            with self.lock:
                doomed = [s for s in self._segments[:-1] if s.next_offset <= offset]
                if not doomed:
                    return []
                keep = self._segments[len(doomed):]
                self._log_start_offset = max(self._log_start_offset, keep[0].base_offset)
                self._segments = keep
                if not self._forget_unsynced(doomed):  # it wrote the checkpoint otherwise
                    self.write_checkpoint()
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

    def truncate_to_locked(self, offset: int) -> bool:
        """Remove every record at or after ``offset``; False if the log already ends there."""
        if not self._log_start_offset <= offset <= self._next_offset:
            raise OffsetOutOfRangeError(self.name, offset, self._log_start_offset,
                                        self._next_offset)
        if offset == self._next_offset:
            return False
        segments = list(self._segments)
        while len(segments) > 1 and segments[-1].base_offset >= offset:
            doomed = segments.pop()
            self._unsynced = tuple(s for s in self._unsynced if s is not doomed)
            doomed.delete()
        seg = segments[-1]
        straddling = seg.truncate_to(offset, MAX_BATCH_BYTES)
        if straddling is not None:  # the cut fell inside a batch: write back its head
            h = straddling.header
            kept = straddling.records(str(seg.path)).slice(0, offset - h.base_offset)
            seg.append(assign(prepare(kept, log_append_time=h.log_append_time,
                                      producer_id=h.producer_id, producer_epoch=h.producer_epoch,
                                      base_sequence=h.base_sequence), h.base_offset))
        seg.flush()
        self._unsynced = tuple(s for s in self._unsynced if s is not seg)
        self._segments = tuple(segments)
        self._next_offset = offset
        self._flushed_offset = min(self._flushed_offset, offset)
        self._recovery_point = min(self._recovery_point, seg.base_offset)
        self.write_checkpoint()
        return True

    # -- shutdown ------------------------------------------------------------------
    def close_locked(self) -> bool:
        """Sync every segment and checkpoint; the caller then writes what it owns and
        ``mark_clean``. False if it was closed already."""
        if self.closed:
            return False
        self.closed = True
        self._sync_unsynced_locked()
        active = self._segments[-1]
        active.flush()
        self._recovery_point = active.base_offset
        self.write_checkpoint()
        return True

    def mark_clean(self) -> None:
        """The clean-shutdown marker, then close the files (after ``close_locked``)."""
        write_clean_marker(self.directory, self._next_offset, self._segments)
        for seg in self._segments:
            seg.close()

    def abandon(self) -> None:
        """Close file handles without flushing or marking a clean stop (tests, fatal errors)."""
        with self.lock:
            self.closed = True
            for seg in self._segments:
                with contextlib.suppress(OSError):
                    seg.close()
