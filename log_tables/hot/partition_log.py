"""The log of one partition: an ordered run of segments, one writer, many readers.

Files in the partition directory::

    00000000000000000000.log / .index / .timeindex   one segment per base offset
    partition.json     checkpoint: log_start_offset and recovery_point
    .clean-shutdown    written by close(); lists segment sizes; removed on open

``recovery_point`` is the base offset of the first segment that may hold bytes
not yet fsynced; every segment before it is sealed and synced. After an
unclean stop, open() validates every batch from the recovery point on and
truncates at the first torn or corrupt one (dropping later segments too).
Segments below it (and every segment after a clean stop) are durable and are
never truncated: if their indexes do not check out, they are rebuilt, and a
damaged batch found on the way is kept and reported to the readers that reach it
(``LogSegment.intact``), so it hides neither the batches before nor after it.

A roll during an append does not wait for the sealed segment's fdatasync (tens
of milliseconds for a full segment) when the log has a ``flush_scheduler``: as in
Kafka, the sync runs in the background (the group commit), and the recovery
point, the checkpoint and the roll listeners follow once it is done.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from bisect import bisect_right
from collections.abc import Callable
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
    StorageError,
)
from log_tables.files import atomic_write, fsync_dir
from log_tables.hot.batch import NO_PRODUCER_ID, EncodedBatch, ScannedBatch, assign, prepare
from log_tables.hot.producer_state import ProducerStateManager, seq_add
from log_tables.hot.segment import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIMEINDEX_SUFFIX,
    LogSegment,
    parse_stem,
    records_from,
)
from log_tables.records import MAX_TIMESTAMP_MS, RECORD_SCHEMA, Record, batch_records

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "partition.json"
SNAPSHOT_SUFFIX = ".snapshot"
CLEAN_SHUTDOWN_FILE = ".clean-shutdown"
# Any batch is bounded by segment.bytes when written; scans accept up to i32 so
# that lowering segment.bytes later never makes old batches look corrupt.
MAX_BATCH_BYTES = 2**31 - 1


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


class LogBatch(NamedTuple):
    """Records read from a log: offsets ``base_offset .. base_offset + len(records) - 1``."""

    base_offset: int
    records: pa.RecordBatch
    log_append_time: bool
    producer_id: int

    def to_records(self) -> list[Record]:
        return batch_records(self.base_offset, self.records)


class FetchResult(NamedTuple):
    """A read: batches in offset order and the bounds of the log at read time."""

    batches: list[LogBatch]
    high_watermark: int
    log_start_offset: int

    @property
    def next_offset(self) -> int | None:
        if not self.batches:
            return None
        last = self.batches[-1]
        return last.base_offset + int(last.records.num_rows)

    def records(self) -> list[Record]:
        return [r for b in self.batches for r in b.to_records()]


class PartitionLog:
    """Append, read, roll, recover, truncate and delete the segments of one partition."""

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
        self.roll_listeners: list[Callable[[PartitionLog, LogSegment], None]] = []
        """Called once a rolled segment is sealed and durable (on the thread that synced it)."""
        self.flush_scheduler: Callable[[PartitionLog, int], None] | None = None
        """Set: a roll during an append asks it to flush below an offset soon, rather than
        syncing the sealed segment on the appending thread; it may raise to refuse."""
        self._unsynced: tuple[LogSegment, ...] = ()
        """Sealed segments whose fdatasync is still to come (oldest first)."""
        self.recovered_from: list[str] = []
        self.producers = ProducerStateManager(name)

    # -- properties ---------------------------------------------------------------
    @property
    def high_watermark(self) -> int:
        """The offset the next record gets (the log end offset)."""
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
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

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
        d = self.directory
        self._remove_leftovers()
        log_start, recovery_point = self._read_checkpoint()
        clean, clean_end = self._read_clean_marker()
        now = self.clock.now_ms()
        bases = sorted(b for p in d.iterdir() if p.name.endswith(LOG_SUFFIX)
                       and (b := parse_stem(p.name)) is not None)
        interval = self.config.index_interval_bytes
        segments: list[LogSegment] = []
        expected: int | None = None
        for i, base in enumerate(bases):
            seg = LogSegment.open_existing(d, base, interval, now)
            if expected is not None and base != expected:
                self._note(f"{seg.path}: gap or overlap (expected base offset {expected})")
                seg.close()
                self._drop_files_from(bases[i:])
                break
            last = i == len(bases) - 1
            trusted = (clean.get(base) == seg.size) if clean else (
                not last and bases[i + 1] <= recovery_point)
            if trusted and seg.load(MAX_BATCH_BYTES):
                segments.append(seg)
                expected = seg.next_offset
                continue
            # A durable segment (synced, its end known) is never cut: a damaged batch in
            # it is a fault of the disk, not a torn write, and the batches after it were
            # acknowledged. Its indexes are rebuilt; reads report the damage.
            known_end = (bases[i + 1] if not last else clean_end) if trusted else None
            if known_end is not None and known_end > base:
                for damage in seg.rebuild(known_end, MAX_BATCH_BYTES):
                    self._note(f"{seg.path}: offsets {damage.first_offset}.."
                               f"{damage.last_offset} at byte {damage.position} are damaged "
                               f"({damage.reason}); kept, and reported to readers")
                seg.flush()
                segments.append(seg)
                expected = seg.next_offset
                continue
            stop = seg.recover(MAX_BATCH_BYTES)
            seg.flush()
            if stop is not None:
                self._note(f"{seg.path}: truncated at byte {stop.position} ({stop.reason})")
            if seg.size == 0 and segments:
                seg.close()
                seg.delete()
            else:
                segments.append(seg)
                expected = seg.next_offset
            if stop is not None:
                self._drop_files_from(bases[i + 1:])
                break
        if not segments:
            start = max(log_start, 0)
            segments.append(LogSegment.create(d, start, interval, now))
        for seg in segments[:-1]:
            seg.sealed = True
        self._segments = tuple(segments)
        self._next_offset = segments[-1].next_offset
        first_base = segments[0].base_offset
        self._log_start_offset = min(max(log_start, first_base), self._next_offset)
        self._delete_below_log_start()
        self._flushed_offset = self._next_offset if clean else self._segments[-1].base_offset
        self._recovery_point = self._segments[-1].base_offset
        self._write_checkpoint()
        self._rebuild_producer_state()

    # -- producer state snapshots -------------------------------------------------
    def _snapshots(self) -> list[int]:
        return sorted(int(p.name[:-len(SNAPSHOT_SUFFIX)]) for p in self.directory.iterdir()
                      if p.name.endswith(SNAPSHOT_SUFFIX) and p.name[:20].isdigit())

    def _snapshot_path(self, offset: int) -> Path:
        return self.directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"

    def _write_producer_snapshot(self) -> None:
        """Persist producer state as of the log end; keep the newest two snapshots."""
        offset = self._next_offset
        try:
            atomic_write(self._snapshot_path(offset), json.dumps(self.producers.to_json()).encode())
        except OSError as exc:
            raise StorageError(f"{self.name}: cannot write producer snapshot: {exc.strerror}",
                               exc.errno) from None
        for old in self._snapshots()[:-2]:
            self._snapshot_path(old).unlink(missing_ok=True)

    def _rebuild_producer_state(self) -> None:
        """Load the newest snapshot at or below the log end and replay the headers after it."""
        self.producers = ProducerStateManager(self.name)
        start = self._segments[0].base_offset
        for offset in reversed(self._snapshots()):
            if offset > self._next_offset:
                self._snapshot_path(offset).unlink(missing_ok=True)
                continue
            try:
                self.producers.load_json(json.loads(self._snapshot_path(offset).read_bytes()))
                start = max(offset, start)
                break
            except (ValueError, KeyError, TypeError, OSError):
                self._note(f"producer snapshot {offset} unreadable; replaying the log")
        for seg in self._segments:
            if seg.next_offset <= start:
                continue
            for batch in seg.intact(start, MAX_BATCH_BYTES):
                if isinstance(batch, ScannedBatch) and batch.header.base_offset >= start:
                    self.producers.apply(batch.header)

    def _note(self, message: str) -> None:
        log.warning("recovery of %s: %s", self.name, message)
        self.recovered_from.append(message)

    def _remove_leftovers(self) -> None:
        d = self.directory
        logs = {p.name[: -len(LOG_SUFFIX)] for p in d.iterdir() if p.name.endswith(LOG_SUFFIX)}
        for p in d.iterdir():
            if p.name.endswith((DELETED_SUFFIX, ".tmp")):
                p.unlink(missing_ok=True)
            elif p.name.endswith((INDEX_SUFFIX, TIMEINDEX_SUFFIX)) and (
                p.name.rsplit(".", 1)[0] not in logs
            ):
                self._note(f"{p}: orphan index removed")
                p.unlink(missing_ok=True)

    def _drop_files_from(self, bases: list[int]) -> None:
        for base in bases:
            seg = LogSegment(self.directory, base, 0, 0)
            self._note(f"{seg.path}: removed (follows a truncation point)")
            seg.delete()

    def _read_checkpoint(self) -> tuple[int, int]:
        try:
            data = json.loads((self.directory / CHECKPOINT_FILE).read_bytes())
            return int(data["log_start_offset"]), int(data["recovery_point"])
        except FileNotFoundError:
            return 0, 0
        except (ValueError, KeyError, TypeError):
            self._note("checkpoint unreadable; recovering every segment")
            return 0, 0

    def _read_clean_marker(self) -> tuple[dict[int, int], int | None]:
        """(segment sizes, log end offset) of a clean stop; ({}, None) after an unclean one."""
        marker = self.directory / CLEAN_SHUTDOWN_FILE
        end: int | None = None
        try:
            data = json.loads(marker.read_bytes())
            sizes = {int(k): int(v) for k, v in data["segments"].items()}
            if data.get("log_end_offset") is not None:
                end = int(data["log_end_offset"])
        except FileNotFoundError:
            return {}, None
        except (ValueError, KeyError, TypeError, AttributeError):
            sizes = {}
        # Removed before any append: a crash from here on is an unclean stop.
        marker.unlink()
        fsync_dir(self.directory)
        return sizes, end

    def _write_checkpoint(self) -> None:
        body = {"log_start_offset": self._log_start_offset, "recovery_point": self._recovery_point}
        try:
            atomic_write(self.directory / CHECKPOINT_FILE, json.dumps(body).encode())
        except OSError as exc:
            raise StorageError(f"{self.name}: cannot write checkpoint: {exc.strerror}",
                               exc.errno) from None

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

    def _roll_locked(self, background: bool = False) -> LogSegment | None:
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
            raise StorageError(f"{self.name}: cannot roll segment: {exc.strerror}", exc.errno) from None
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

    def _notify_rolled(self, sealed: tuple[LogSegment, ...]) -> None:
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
                raise StorageError(f"{self.name}: fsync failed: {exc.strerror}", exc.errno) from None
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
        high_watermark = self._next_offset
        log_start = self._log_start_offset
        segments = self._segments
        if not log_start <= offset <= high_watermark:
            raise OffsetOutOfRangeError(self.name, offset, log_start, high_watermark)
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

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """The first offset whose timestamp is >= ``timestamp``; None if there is none."""
        high_watermark = self._next_offset
        for seg in self._segments:
            if seg.max_timestamp < timestamp or seg.next_offset == seg.base_offset:
                continue
            found = seg.offset_for_timestamp(timestamp, MAX_BATCH_BYTES, high_watermark)
            if found is not None:
                return max(found, self._log_start_offset)
        return None

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
            self._write_producer_snapshot()
            sizes = {str(s.base_offset): s.size for s in self._segments}
            atomic_write(self.directory / CLEAN_SHUTDOWN_FILE,
                         json.dumps({"log_end_offset": self._next_offset, "segments": sizes}).encode())
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

