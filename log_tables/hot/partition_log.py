"""The log of one partition: an ordered run of segments, one writer, many readers.

Files in the partition directory::

    00000000000000000000.log / .index / .timeindex   one segment per base offset
    partition.json     checkpoint: log_start_offset and recovery_point
    .clean-shutdown    written by close(); lists segment sizes; removed on open

Opening a log recovers it (``log_tables.hot.recovery``). A ``PartitionLog`` holds a ``LocalLog`` (``log_tables.hot.local_log``:
the segments, rolling, flushing, truncating and dropping them) beside the idempotent
producers' state, the leader epochs and the high watermark; appends with their checks,
the one bound of every read (``readable_end``) and shutdown are here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import pyarrow as pa

from log_tables.clock import SYSTEM_CLOCK, Clock
from log_tables.config import TopicConfig
from log_tables.errors import LogClosedError
from log_tables.hot.appends import AppendInfo, check_append, check_replica_batch
from log_tables.hot.batch import (
    ATTR_TRANSACTIONAL,
    HEADER_SIZE,
    NO_PRODUCER_ID,
    EncodedBatch,
    assign,
    prepare,
)
from log_tables.hot.high_watermark import HighWatermark
from log_tables.hot.isolation import READ_COMMITTED, READ_UNCOMMITTED, Isolation, bounded_end
from log_tables.hot.leader_epochs import LeaderEpochCache
from log_tables.hot.local_log import LocalLog
from log_tables.hot.log_reads import RawBatches, offset_for_timestamp, read_raw, read_records
from log_tables.hot.producer_state import ProducerStateManager, seq_add
from log_tables.hot.recovery import rebuild_producer_state, write_producer_snapshot
from log_tables.hot.segment import LogSegment
from log_tables.hot.txn_index import Hidden, TxnMark
from log_tables.records import FetchResult

__all__ = ["AppendInfo", "PartitionLog", "partition_dir"]

log = logging.getLogger(__name__)


class PartitionLog:
    """Append, read, roll, recover, truncate and delete the segments of one partition.

    It holds a ``LocalLog`` (the segment files), the producers' state, the leader
    epochs and the high watermark; changes that touch more than one of them hold the
    local log's lock.
    """

    def __init__(self, directory: Path, config: TopicConfig, name: str, clock: Clock) -> None:
        self._local = LocalLog(directory, config, name, clock, on_roll=self._snapshot_producers,
                               on_sealed=self._notify_rolled)
        self.directory = directory
        self.name = name
        self.clock = clock
        self.roll_listeners: list[Callable[[PartitionLog, LogSegment], None]] = []
        """Called once a rolled segment is sealed and durable (on the thread that synced it)."""
        self._flush_scheduler: Callable[[PartitionLog, int], None] | None = None
        self.producers = ProducerStateManager(name)
        self.leader_epochs = LeaderEpochCache(directory, name)
        self._hw = HighWatermark(directory, name)
        self._txn_mark = TxnMark(directory)

    # -- open and recovery -------------------------------------------------------
    @classmethod
    def open(cls, directory: Path, config: TopicConfig | None = None, *, name: str = "",
             clock: Clock = SYSTEM_CLOCK) -> PartitionLog:
        """Open (or create) the log in ``directory``, recovering it if it was not closed."""
        directory.mkdir(parents=True, exist_ok=True)
        plog = cls(directory, config or TopicConfig(), name or directory.name, clock)
        plog._local.load()
        plog._rebuild_producer_state()
        return plog

    def _rebuild_producer_state(self) -> None:
        """Load the newest snapshot at or below the log end and replay the headers after it."""
        local = self._local
        self.producers = rebuild_producer_state(self.directory, self.name, local.segments,
                                                local.log_end_offset, local.note)

    def _snapshot_producers(self, offset: int) -> None:
        """Persist producer state as of ``offset`` (the log end); keep the newest two."""
        self.producers.txns.prune(self._local.log_start_offset)
        write_producer_snapshot(self.directory, self.name, self.producers, offset)

    def _notify_rolled(self, sealed: LogSegment) -> None:
        for listener in self.roll_listeners:
            try:
                listener(self, sealed)
            except Exception:  # a listener's failure is not the log's
                log.exception("%s: roll listener failed for %s", self.name, sealed.path)

    # -- the segments' state (the local log's) -------------------------------------
    @property
    def config(self) -> TopicConfig:
        return self._local.config

    def update_config(self, config: TopicConfig) -> None:
        self._local.config = config

    @property
    def flush_scheduler(self) -> Callable[[PartitionLog, int], None] | None:
        """Set: a roll during an append asks it to flush below an offset soon, rather than
        syncing the sealed segment on the appending thread; it may raise to refuse."""
        return self._flush_scheduler

    @flush_scheduler.setter
    def flush_scheduler(self, scheduler: Callable[[PartitionLog, int], None] | None) -> None:
        self._flush_scheduler = scheduler
        self._local.flush_scheduler = None if scheduler is None else partial(scheduler, self)

    @property
    def recovered_from(self) -> list[str]:
        """What recovery found and did, one line each."""
        return self._local.recovered_from

    @property
    def log_end_offset(self) -> int:
        """The offset the next record gets."""
        return self._local.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self._local.log_start_offset

    @property
    def recovery_point(self) -> int:
        return self._local.recovery_point

    @property
    def flushed_offset(self) -> int:
        """Every offset below this is fsynced."""
        return self._local.flushed_offset

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return self._local.segments

    @property
    def active_segment(self) -> LogSegment:
        return self._local.segments[-1]

    @property
    def size_bytes(self) -> int:
        return self._local.size_bytes

    def roll(self) -> LogSegment | None:
        """Seal the active segment (if it has data); returns the sealed one."""
        return self._local.roll()

    def roll_if_due(self) -> LogSegment | None:
        """Roll a non-empty active segment older than ``segment.ms`` (quiet partitions)."""
        return self._local.roll_if_due()

    def roll_if_older(self, age_ms: int) -> LogSegment | None:
        """``LocalLog.roll_if_older``: its sync is left to the ``flush_scheduler``."""
        return self._local.roll_if_older(age_ms)

    def flush(self, up_to: int | None = None) -> int:
        """fdatasync what is appended (``LocalLog.flush``); returns the durable end."""
        return self._local.flush(up_to)

    # -- the high watermark and the readable end -----------------------------------
    @property
    def high_watermark(self) -> int:
        """Below it every in-sync replica has the records (the log end for one replica);
        a reader's limit is ``readable_end``, not this."""
        local = self._local
        return bounded_end(local.log_end_offset, local.log_start_offset, self._hw.value,
                           READ_UNCOMMITTED)

    def readable_end(self, isolation: Isolation) -> int:
        """Readers (consumers, tiering, Spark) see the records below this: the high
        watermark, and for ``read_committed`` the last stable offset if lower."""
        local = self._local
        return bounded_end(local.log_end_offset, local.log_start_offset, self._hw.value, isolation,
                           self.producers.txns.first_unstable())

    @property
    def replicated(self) -> bool:
        return self._hw.value is not None

    def start_replication(self) -> None:
        """From now on readers see only below the high watermark: the checkpointed one, or
        the log start (it rises as the in-sync replicas fetch)."""
        with self._local.lock:
            if self._hw.start(self._local.log_start_offset):
                self.checkpoint_high_watermark()

    def advance_high_watermark(self, offset: int) -> bool:
        """Raise the high watermark to ``offset`` (at most the log end); True if it moved."""
        with self._local.lock:
            return self._hw.advance(offset, self._local.log_end_offset)

    def checkpoint_high_watermark(self) -> None:
        """Publish the high watermark to readers in other processes (``HighWatermark``)."""
        self._hw.checkpoint(self.high_watermark)

    # -- reading -----------------------------------------------------------------
    def read(self, offset: int, max_bytes: int = 1 << 20, max_records: int | None = None,
             isolation: Isolation = READ_UNCOMMITTED, *, to_log_end: bool = False
             ) -> FetchResult:
        """Records from ``offset`` on, below the readable end (``to_log_end``: the log end,
        as a coordinator loads its state), up to about ``max_bytes`` and at most
        ``max_records`` (``log_reads.read_records``)."""
        end = self._local.log_end_offset if to_log_end else self.readable_end(isolation)
        aborted = self.producers.txns.aborted_in(offset, end) if isolation is READ_COMMITTED \
            else ()
        return read_records(self._local, offset, end, max_bytes, max_records, Hidden(aborted))

    def read_raw(self, offset: int, max_bytes: int) -> RawBatches:
        """Whole stored batches from the one holding ``offset`` on, below the log end:
        what a follower fetches (``log_reads.read_raw``)."""
        return read_raw(self._local, offset, max_bytes, self.high_watermark)

    def offset_for_timestamp(self, timestamp: int,
                             isolation: Isolation = READ_UNCOMMITTED) -> int | None:
        """The first offset whose timestamp is >= ``timestamp``; None if there is none."""
        return offset_for_timestamp(self._local, timestamp, self.readable_end(isolation))

    # -- appending ---------------------------------------------------------------
    def append(self, records: pa.RecordBatch, *, producer_id: int = NO_PRODUCER_ID,
               producer_epoch: int = -1, base_sequence: int = -1,
               transactional: bool = False) -> AppendInfo:
        """Append a batch of records (RECORD_SCHEMA) as one unit; returns its offsets (a
        ``transactional`` one opens its producer's transaction here until a marker).

        When this returns, the batch is in the OS page cache: it survives a killed
        process. ``flush()`` makes it survive a power cut.
        """
        config = self.config
        flags = ATTR_TRANSACTIONAL if transactional else 0
        if transactional:
            self._txn_mark.ensure(self.name, producer_id)
        records, prepared, append_time = check_append(self.name, config, self.clock, records,
                                                      producer_id, producer_epoch, base_sequence,
                                                      flags)
        local = self._local
        with local.lock:
            if local.closed:
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
                                       base_sequence=base_sequence, flags=flags)
            batch = assign(prepared, local.log_end_offset)
            local.append_locked(batch)
            if producer_id >= 0:
                self.producers.update(producer_id, producer_epoch, base_sequence,
                                      prepared.record_count, batch.header.base_offset)
                self.producers.txns.apply(batch.header)
        h = batch.header
        return AppendInfo(h.base_offset, h.last_offset, append_time, h.max_timestamp, h.size,
                          tuple(duplicates))

    def append_marker(self, producer_id: int, producer_epoch: int, commit: bool,
                      coordinator_epoch: int) -> int | None:
        """End the producer's transaction here with a COMMIT or ABORT marker; returns its
        offset, or None when one at that epoch is here (``ProducerStateManager.marker``)."""
        local = self._local
        with local.lock:
            if local.closed:
                raise LogClosedError(f"{self.name} is closed")
            prepared = self.producers.marker(producer_id, producer_epoch, commit,
                                             coordinator_epoch, self.clock.now_ms())
            if prepared is None:
                return None
            batch = assign(prepared, local.log_end_offset)
            local.append_locked(batch)
            self.producers.apply(batch.header)
            return batch.header.base_offset

    # -- replication -----------------------------------------------------------------
    def become_leader(self, leader_epoch: int) -> None:
        """This replica leads from ``leader_epoch`` on: that epoch starts at the log end."""
        with self._local.lock:
            self.leader_epochs.assign(leader_epoch, self._local.log_end_offset)

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
        local = self._local
        with local.lock:
            if local.closed:
                raise LogClosedError(f"{self.name} is closed")
            pos = 0
            while pos < len(view):
                header = check_replica_batch(self.name, view, pos, local.log_end_offset)
                while pending and pending[0][1] <= header.base_offset:
                    epoch, start = pending.pop(0)
                    self.leader_epochs.assign(epoch, start)
                raw = view[pos:pos + header.size]
                if header.transactional:
                    self._txn_mark.ensure(self.name, header.producer_id)
                local.append_locked(EncodedBatch(header, bytes(raw[:HEADER_SIZE]),
                                                 pa.py_buffer(raw[HEADER_SIZE:])))
                self.producers.apply(header)
                pos += header.size
            return local.log_end_offset

    def truncate_fully(self, offset: int, log_start: int | None = None) -> None:
        """Drop every record and start the log at ``offset`` (a follower whose log ends
        below the leader's log start: Kafka's truncateFullyAndStartAt). ``log_start``: the
        leader's, when it falls inside the batch at ``offset`` (readers start there)."""
        local = self._local
        with local.flush_lock, local.lock:
            local.start_at_locked(offset, max(offset, log_start or 0))
            self._hw.lower(offset, to=True)
            self.leader_epochs.clear()
            self.producers = type(self.producers)(self.name)
            self._snapshot_producers(offset)

    # -- deletion and truncation -------------------------------------------------
    def delete_records(self, offset: int) -> int:
        """Kafka's DeleteRecords: move the log start to ``offset`` and drop whole segments below it."""
        local = self._local
        with local.flush_lock, local.lock:
            local.move_log_start_locked(offset)
            self.leader_epochs.truncate_from_start(offset)
            return offset

    def delete_segments_below(self, offset: int) -> list[LogSegment]:
        """Drop every sealed segment whose records are all below ``offset``; returns them.

        The log start moves to the first remaining segment's base offset (if higher).
        """
        return self._local.delete_segments_below(offset)

    def truncate_to(self, offset: int) -> None:
        """Remove every record at or after ``offset`` (the log end becomes ``offset``)."""
        local = self._local
        with local.flush_lock, local.lock:
            if not local.truncate_to_locked(offset):
                return
            self._hw.lower(offset)
            self.leader_epochs.truncate_from_end(offset)
            self._rebuild_producer_state()

    # -- shutdown ------------------------------------------------------------------
    def close(self) -> None:
        """Flush, checkpoint and write the clean-shutdown marker; the log is unusable after."""
        local = self._local
        with local.flush_lock, local.lock:
            if not local.close_locked():
                return
            self.checkpoint_high_watermark()
            self._snapshot_producers(local.log_end_offset)
            local.mark_clean()

    def abandon(self) -> None:
        """Close file handles without flushing or marking a clean stop (tests, fatal errors)."""
        self._local.abandon()

    def __repr__(self) -> str:
        local = self._local
        return (f"PartitionLog({self.name}, offsets {local.log_start_offset}.."
                f"{local.log_end_offset}, {len(local.segments)} segments)")


def partition_dir(hot_dir: Path, topic: str, partition: int) -> Path:
    return hot_dir / topic / str(partition)
