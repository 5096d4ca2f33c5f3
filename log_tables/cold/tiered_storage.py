"""The server's view of the Delta tier: log start offsets, reads below the hot tier,
and removal of hot segments that are tiered and past local retention."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from log_tables.cold import job_runs
from log_tables.cold.cache import ColdTables
from log_tables.cold.commit import delete_records
from log_tables.cold.rows import from_table_rows
from log_tables.cold.table import PartitionState, log_start, read_files
from log_tables.cold.topic_reader import first_at_or_after
from log_tables.config import TopicConfig
from log_tables.errors import OffsetOutOfRangeError, StorageError
from log_tables.hot.isolation import READ_UNCOMMITTED, Isolation
from log_tables.hot.log_manager import LogManager
from log_tables.hot.partition_log import PartitionLog
from log_tables.layout import Layout, is_local, local_path
from log_tables.records import LogBatch
from log_tables.storage import filesystem

log = logging.getLogger(__name__)


def local_retention(config: TopicConfig) -> tuple[int, int]:
    """(ms, bytes) the hot tier keeps of tiered data; -1 is unlimited (-2 defers to retention.*)."""
    ms = config.retention_ms if config.local_retention_ms == -2 else config.local_retention_ms
    size = config.retention_bytes if config.local_retention_bytes == -2 else config.local_retention_bytes
    return ms, size


class TieredStorage:
    """Delta-tier lookups for one data directory's topics (see ``ColdTables`` for how fresh)."""

    def __init__(self, manager: LogManager, layout: Layout, max_age_s: float = 1.0) -> None:
        self.manager = manager
        self.layout = layout
        self.tables = ColdTables(layout.warehouse, max_age_s)

    def state(self, topic: str, partition: int, *, refresh: bool = False) -> PartitionState | None:
        """The Delta tier's state of one partition, or None when it holds nothing of it."""
        meta = self.manager.topic(topic)
        try:
            states = self.tables.state(topic, meta.partitions, meta.topic_id, refresh=refresh)
        except Exception:  # an unreadable table must not break produce or fetch
            log.exception("reading the Delta tier of %s failed", topic)
            return None
        if states is None or partition >= len(states):
            return None
        return states[partition]

    def log_start_offset(self, plog: PartitionLog, topic: str, partition: int) -> int:
        """The partition's log start offset across both tiers (see ``cold_table.log_start``)."""
        return log_start(plog.log_start_offset, self.state(topic, partition))

    def read(self, plog: PartitionLog, topic: str, partition: int, offset: int,
             max_records: int, max_bytes: int, isolation: Isolation = READ_UNCOMMITTED
             ) -> list[LogBatch]:
        """Records from ``offset`` (below the hot tier) out of the Delta tier: the first
        record at or after ``offset`` (compaction leaves holes) and those after it.

        Raises OffsetOutOfRangeError (with the log start) when ``offset`` was deleted or
        the Delta tier does not cover it.
        """
        hot_start = plog.log_start_offset
        cold = self.state(topic, partition)
        start = log_start(hot_start, cold)
        end = plog.readable_end(isolation)
        if offset < start:
            raise OffsetOutOfRangeError(plog.name, offset, start, end)
        if cold is None or cold.log_start_offset is None or offset >= hot_start:
            raise OffsetOutOfRangeError(plog.name, offset, hot_start, end)
        return self._read(topic, partition, cold, offset, max(hot_start, cold.tiered_offset),
                          max_records, max_bytes)

    def read_copy(self, topic: str, partition: int, offset: int, end: int, max_records: int,
                  max_bytes: int) -> list[LogBatch] | None:
        """Records ``[offset, end)`` out of the Delta tier when it holds that whole range
        (hot records damaged on disk after they were tiered); None when it does not.
        An empty list: the range is there, compacted away."""
        cold = self.state(topic, partition)
        if cold is None or cold.log_start_offset is None or not (
                cold.start_offset <= offset and end <= cold.tiered_offset):
            return None
        return self._read(topic, partition, cold, offset, end, max_records, max_bytes)

    def _read(self, topic: str, partition: int, cold: PartitionState, offset: int, end: int,
              max_records: int, max_bytes: int) -> list[LogBatch]:
        try:
            rows = read_files(cold.files, offset, end, limit=max_records)
        except FileNotFoundError:
            # A compaction or retention commit (and a vacuum) moved things: use the newest version.
            fresh = self.state(topic, partition, refresh=True)
            rows = read_files(fresh.files if fresh else (), offset, end, limit=max_records)
        out: list[LogBatch] = []
        budget = max_bytes
        for batch in from_table_rows(rows):
            sizes = batch.records.column(1).nbytes + batch.records.column(2).nbytes
            if out and budget <= 0:
                break
            out.append(LogBatch(batch.base_offset, batch.records, batch.log_append_time, -1))
            budget -= sizes
        return out

    def offset_for_timestamp(self, plog: PartitionLog, topic: str, partition: int,
                             timestamp_ms: int) -> int | None:
        """Kafka's ListOffsets by time over both tiers: the first offset (Delta files below
        the hot tier first) whose timestamp is >= ``timestamp_ms``."""
        cold = self.state(topic, partition)
        hot_start = plog.log_start_offset
        files = cold.files if cold is not None else ()
        first = cold.start_offset if cold is not None else 0
        for f in files:
            if f.min_offset >= hot_start:
                break
            if f.max_timestamp_ms < timestamp_ms:
                continue
            found = first_at_or_after(read_files([f], first, hot_start,
                                                 ["offset", "timestamp"]), timestamp_ms)
            if found is not None:
                return found
        return plog.offset_for_timestamp(timestamp_ms)

    def retire(self, now_ms: int) -> int:
        """Delete hot segments that are fully tiered and past local retention; returns how many."""
        deleted = 0
        for meta in self.manager.registry.list():
            try:
                # At most a second old: a late look only retires a segment a little later.
                states = self.tables.state(meta.name, meta.partitions, meta.topic_id)
            except Exception:
                log.exception("reading the Delta tier of %s failed", meta.name)
                continue
            if states is None:
                continue
            keep_ms, keep_bytes = local_retention(meta.config)
            for p, cold in enumerate(states):
                plog = self.manager.log(meta.name, p)
                self.follow_log_start(plog, cold)
                deleted += self._retire_partition(plog, cold.tiered_offset, now_ms, keep_ms,
                                                  keep_bytes)
        return deleted

    def roll_for_target_lag(self) -> int:
        """Roll the active segments whose first record has waited half its topic's
        ``delta.target.lag.ms``; returns how many rolled.

        Each roll wakes the tiering job once the sealed segment is synced, so records
        reach Delta within the target while the jobs keep up (the other half is for
        the sync and the tiering run). A partition whose older sealed segments are not
        tiered yet is left alone: with tiering stopped or failing, it would otherwise
        pile up a small segment per half target, and the next tiering run takes the
        active segment's records a moment later anyway.
        """
        rolled = 0
        for meta in self.manager.registry.list():
            target_ms = meta.config.delta_target_lag_ms
            if target_ms < 0:
                continue
            wait_ms = target_ms // 2
            try:
                due = [(p, plog) for p, plog in enumerate(self.manager.partitions(meta.name))
                       if plog.active_segment.size and
                       plog.clock.now_ms() - plog.active_segment.first_append_ms >= wait_ms]
                states = self.tables.state(meta.name, meta.partitions, meta.topic_id) \
                    if due else None
                for p, plog in due:
                    cold = states[p] if states is not None else None
                    tiered = max(cold.tiered_offset, cold.start_offset) if cold else 0
                    if max(tiered, plog.log_start_offset) < plog.active_segment.base_offset:
                        continue  # sealed segments still wait for the tiering job
                    if plog.roll_if_older(wait_ms) is not None:
                        rolled += 1
            except Exception:  # a deleted topic, an unreadable table: the others go on
                log.exception("rolling %s for delta.target.lag.ms failed", meta.name)
        return rolled

    def seal(self, topic: str) -> list[tuple[int, bool, int]]:
        """Make every record of ``topic`` so far tierable now: roll each active segment
        that holds records and sync every sealed segment. Per partition: (partition,
        rolled, end offset): every record below the end is in a sealed, durable segment."""
        out = []
        for p, plog in enumerate(self.manager.partitions(topic)):
            sealed = plog.roll_if_older(0)
            end = plog.active_segment.base_offset
            plog.flush(end)  # the sync a roll leaves to the group commit, done (or awaited) here
            out.append((p, sealed is not None, end))
        return out

    @staticmethod
    def follow_log_start(plog: PartitionLog, cold: PartitionState) -> None:
        """Move the hot tier's log start up to the one retention or DeleteRecords committed
        in Delta (maybe from another process), dropping the segments below it."""
        target = min(cold.start_offset, plog.high_watermark)
        if target > plog.log_start_offset:
            plog.delete_records(target)
            log.info("%s: log start moved to %d (committed in the Delta tier)", plog.name, target)

    @staticmethod
    def _retire_partition(plog: PartitionLog, tiered: int, now_ms: int, keep_ms: int,
                          keep_bytes: int) -> int:
        sealed = [s for s in plog.segments[:-1] if s.next_offset <= tiered]
        if not sealed:
            return 0
        total = plog.size_bytes
        below = None
        for seg in sealed:
            too_old = keep_ms >= 0 and now_ms - seg.max_timestamp > keep_ms
            too_big = keep_bytes >= 0 and total > keep_bytes
            if not (too_old or too_big):
                break
            below = seg.next_offset
            total -= seg.size
        if below is None:
            return 0
        gone = plog.delete_segments_below(below)
        if gone:
            log.info("%s: removed %d tiered segment(s) below offset %d from the hot tier",
                     plog.name, len(gone), below)
        return len(gone)

    def delete_records(self, topic: str, targets: dict[int, int]) -> dict[int, int]:
        """Kafka's DeleteRecords: per partition, delete every record below the target offset
        (-1: the high watermark). Committed in Delta first (so every process sees it), then
        the hot tier follows. Returns each partition's new log start (low watermark)."""
        meta = self.manager.topic(topic)
        resolved: dict[int, int] = {}
        for p, offset in targets.items():
            plog = self.manager.log(topic, p)
            hw = plog.high_watermark
            target = hw if offset == -1 else offset
            if target > hw:
                raise OffsetOutOfRangeError(plog.name, target, self.log_start_offset(plog, topic, p),
                                            hw)
            resolved[p] = target
        job_id = f"delete-records-{int(time.time() * 1000)}"
        started = job_runs.now_ms()
        starts = delete_records(self.layout.table_uri(topic), topic, meta.topic_id,
                                meta.partitions, resolved, job_id)
        states = self.tables.state(topic, meta.partitions, meta.topic_id, refresh=True)
        for p in resolved:
            if states is not None:
                self.follow_log_start(self.manager.log(topic, p), states[p])
        job_runs.record(self.layout.warehouse, [job_runs.JobRun(
            "delete-records", job_id, topic, p, started, job_runs.now_ms(), job_runs.SUCCEEDED,
            detail=f"log start -> {starts[p]} (asked {resolved[p]})") for p in resolved])
        return starts

    def drop_topic(self, topic: str) -> None:
        """Remove a deleted topic's Delta tables, its typed and dead-letter ones included
        (on an object store: every object under them)."""
        self.tables.forget(topic)
        for uri in (self.layout.table_uri(topic), self.layout.typed_uri(topic),
                    self.layout.dlq_uri(topic)):
            if is_local(uri):
                shutil.rmtree(Path(local_path(uri)), ignore_errors=True)
                continue
            try:
                fs, path = filesystem(uri)
                fs.delete_dir(path)
            except FileNotFoundError:
                pass
            except (OSError, StorageError) as exc:  # a new topic of that name skips it
                log.warning("could not delete the table of deleted topic %s at %s: %s",
                            topic, uri, exc)
