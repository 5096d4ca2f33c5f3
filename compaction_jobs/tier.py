"""The tiering job: sealed hot segments into the topics' Delta tables, exactly once.

Steps of one run (a failure or a kill at any of them leaves the old or the new
table state, never a mix):

1. plan: per topic, open the table (create it if missing), clean up what dead
   jobs left in ``_stage/``, read each partition's tiered offset (its app
   transaction version) and list the sealed segments past it;
2. stage: Spark tasks (segments spread over one task per core) read each
   segment (CRC-checked), write its records as one Parquet file under
   ``<table>/_stage/<job>/`` and return the file's stats;
3. move: write the job's manifest, then move the staged files into
   ``partition=<p>/``;
4. commit: one Delta commit per topic through delta-rs, on the handle that
   was planned on, adding the files and setting each partition's app
   transaction to its new tiered offset. A racing job's commit makes ours
   fail with ``CommitFailedError``: the handle is refreshed, partitions the
   other job tiered are dropped (their files deleted) and the rest retried;
5. clean up: remove the job's stage directory.

A killed job's stage directory is found by the next run: its lock is free, so
the moved files that no commit references are deleted with it.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import logging
import os
import shutil
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa
from deltalake import DeltaTable, Schema
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

from log_tables.cold_table import (
    STAGE_DIR,
    TABLE_SCHEMA,
    create_table,
    file_stats,
    is_local,
    local_path,
    open_table,
    snapshot,
    table_topic_id,
    tier_app_id,
    to_table_rows,
    write_rows,
)
from log_tables.errors import CorruptRecordError, StorageError
from log_tables.hot_reader import SegmentFile, list_segments, scan_segment
from log_tables.layout import Layout
from log_tables.segment import records_from

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

MAX_COMMIT_ATTEMPTS = 8
step_hook: Callable[[str], None] | None = None
"""Called with each step's name as it completes (tests kill the process here)."""


def _step(name: str) -> None:
    if step_hook is not None:
        step_hook(name)


class SegmentWork(NamedTuple):
    """One sealed segment (or its untiered rest) to write as one Parquet file."""

    topic: str
    partition: int
    segment_path: str
    base_offset: int
    start: int
    """First offset to tier (the partition's tiered offset, or the segment base)."""
    end: int
    """The next segment's base offset: the segment holds exactly ``start .. end-1``."""
    staged_path: str


class StagedFile(NamedTuple):
    """A Parquet file a task wrote, with what its add action needs."""

    work: SegmentWork
    size_bytes: int
    stats: str


class TieredRange(NamedTuple):
    """What one run committed for one partition."""

    topic: str
    partition: int
    start: int
    end: int
    bytes: int


class TierReport(NamedTuple):
    tiered: list[TieredRange]
    conflicts: int
    """Partitions another job tiered first (their staged files were dropped)."""
    seconds: float

    @property
    def records(self) -> int:
        return sum(r.end - r.start for r in self.tiered)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.tiered)


def write_segment(work: SegmentWork) -> StagedFile:
    """Stage step (runs in a Spark task): one sealed segment as one Parquet file."""
    segment = SegmentFile(work.base_offset, Path(work.segment_path))
    scanned, stop = scan_segment(segment, work.start)
    rows = []
    position = work.start
    for b in scanned:
        if b.header.next_offset <= position or position >= work.end:
            continue
        body = records_from(b, work.segment_path, position, work.end - 1)
        rows.append(to_table_rows(position, body, b.header.log_append_time))
        position += body.num_rows
    if position != work.end:
        why = stop.reason if stop is not None else "the segment ends early"
        raise CorruptRecordError(
            work.segment_path, stop.position if stop is not None else -1,
            f"sealed segment readable only up to offset {position}, expected up to "
            f"{work.end} ({why}); not tiering {work.topic}-{work.partition}")
    os.makedirs(os.path.dirname(work.staged_path), exist_ok=True)
    size = write_rows(work.staged_path, rows)
    return StagedFile(work, size, file_stats(pa.Table.from_batches(rows)))


def write_segments(works: list[SegmentWork]) -> list[StagedFile]:
    """One Spark task: several segments, one after the other."""
    return [write_segment(w) for w in works]


def balance(works: list[SegmentWork], slots: int) -> list[list[SegmentWork]]:
    """Spread segments over at most ``slots`` tasks with similar record counts (largest
    first onto the lightest task): a Spark task costs tens of milliseconds, so one per
    core beats one per segment."""
    groups: list[list[SegmentWork]] = [[] for _ in range(max(1, min(slots, len(works))))]
    loads = [0] * len(groups)
    for w in sorted(works, key=lambda w: w.end - w.start, reverse=True):
        i = loads.index(min(loads))
        groups[i].append(w)
        loads[i] += w.end - w.start
    return groups


class _TopicPlan(NamedTuple):
    topic: str
    table: DeltaTable
    tiered: dict[int, int]
    works: list[SegmentWork]


class TierJob:
    """One run of the tiering job over some topics of a layout."""

    def __init__(self, layout: Layout, topics: Iterable[str] | None = None,
                 progress: Callable[[str], None] | None = None,
                 orphan_min_age_s: float = 60.0) -> None:
        if not is_local(layout.warehouse):
            raise StorageError(f"{layout.warehouse}: the tiering job stages files on a local "
                               "or mounted file system; object-store warehouses are not supported yet")
        self.layout = layout
        self.only = None if topics is None else set(topics)
        self.job_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        self.progress = progress or (lambda line: log.info("%s", line))
        self.orphan_min_age_s = orphan_min_age_s

    def run(self, spark: SparkSession | Callable[[], SparkSession]) -> TierReport:
        """Plan, stage (Spark tasks), move, commit and clean up; see the module docstring.

        ``spark`` may be a factory: it is called only when there is something to tier.
        """
        started = time.monotonic()
        plans = [p for p in (self._plan(t) for t in self._topics()) if p is not None]
        works = [w for p in plans for w in p.works]
        locks = {p.topic: self._lock_stage_dir(p.topic) for p in plans if p.works}
        try:
            staged: list[StagedFile] = []
            if works:
                self.progress(f"tiering {len(works)} segment(s) of {len(locks)} topic(s)")
                session = spark() if callable(spark) else spark
                groups = balance(works, session.sparkContext.defaultParallelism)
                rdd = session.sparkContext.parallelize(groups, len(groups))
                staged = rdd.flatMap(write_segments).collect()
            _step("staged")
            tiered: list[TieredRange] = []
            conflicts = 0
            for plan in plans:
                mine = [s for s in staged if s.work.topic == plan.topic]
                if mine:
                    done, lost = self._commit(plan, mine)
                    tiered += done
                    conflicts += lost
            for topic in locks:
                shutil.rmtree(self._stage_dir(topic), ignore_errors=True)
        finally:
            for fd in locks.values():
                os.close(fd)
        report = TierReport(tiered, conflicts, time.monotonic() - started)
        if tiered or conflicts:
            self.progress(f"tiered {report.records:,} records ({report.bytes / 1e6:.1f} MB) of "
                          f"{len({(r.topic, r.partition) for r in tiered})} partition(s) in "
                          f"{report.seconds:.2f} s"
                          + (f"; {conflicts} partition(s) tiered by another job" if conflicts else ""))
        return report

    # -- plan -----------------------------------------------------------------------
    def _topics(self) -> list[tuple[str, str, int]]:
        return [(t.name, t.topic_id, t.partitions) for t in self.layout.topics()
                if self.only is None or t.name in self.only]

    def _plan(self, topic_info: tuple[str, str, int]) -> _TopicPlan | None:
        topic, topic_id, partitions = topic_info
        uri = self.layout.table_uri(topic)
        dt = open_table(uri)
        if dt is None:
            create_table(uri, topic_id)
            dt = open_table(uri)
            if dt is None:
                raise StorageError(f"{uri}: table missing right after creating it")
        found = table_topic_id(dt)
        if found != topic_id:
            self.progress(f"skipping topic {topic}: {uri} belongs to an earlier topic of that "
                          f"name (topic id {found}, now {topic_id}); delete that table")
            return None
        clean_orphans(uri, dt, self.orphan_min_age_s)
        tiered = {s_p: st.tiered_offset for s_p, st in enumerate(snapshot(dt, partitions))}
        works: list[SegmentWork] = []
        for p in range(partitions):
            segments = list_segments(self.layout.partition_dir(topic, p))
            for seg, nxt in itertools.pairwise(segments):  # the last is active
                start = max(tiered[p], seg.base_offset)
                if start >= nxt.base_offset:
                    continue
                staged = os.path.join(self._stage_dir(topic),
                                      f"p{p}-{start:020d}-{nxt.base_offset:020d}.parquet")
                works.append(SegmentWork(topic, p, str(seg.path), seg.base_offset, start,
                                         nxt.base_offset, staged))
        return _TopicPlan(topic, dt, tiered, works)

    def _stage_dir(self, topic: str) -> str:
        return os.path.join(local_path(self.layout.table_uri(topic)), STAGE_DIR, self.job_id)

    def _lock_stage_dir(self, topic: str) -> int:
        directory = self._stage_dir(topic)
        os.makedirs(directory, exist_ok=True)
        fd = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd

    # -- move and commit -----------------------------------------------------------
    def _commit(self, plan: _TopicPlan, staged: list[StagedFile]) -> tuple[list[TieredRange], int]:
        """Steps 3 and 4 for one topic; returns what was committed and how many partitions lost."""
        root = local_path(self.layout.table_uri(plan.topic))
        by_partition: dict[int, list[StagedFile]] = defaultdict(list)
        for s in sorted(staged, key=lambda s: (s.work.partition, s.work.start)):
            by_partition[s.work.partition].append(s)
        for p, files in by_partition.items():
            expected = plan.tiered[p]
            for f in files:
                if f.work.start != max(expected, f.work.base_offset):
                    raise StorageError(f"{plan.topic}-{p}: staged files are not contiguous at "
                                       f"offset {expected} (found {f.work.start}); rerun the job")
                expected = f.work.end
        finals = {s.work.staged_path: f"partition={s.work.partition}/"
                  f"{s.work.start:020d}-{s.work.end:020d}-{self.job_id}.parquet" for s in staged}
        manifest = os.path.join(self._stage_dir(plan.topic), "manifest.json")
        with open(manifest, "w") as fh:
            json.dump(sorted(finals.values()), fh)
        for src, rel in finals.items():
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            os.replace(src, os.path.join(root, rel))
        _step("moved")
        dt = plan.table
        live = dict(by_partition)
        lost = 0
        for _attempt in range(MAX_COMMIT_ATTEMPTS):
            for p in list(live):
                if (dt.transaction_version(tier_app_id(p)) or 0) != plan.tiered[p]:
                    for s in live.pop(p):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(os.path.join(root, finals[s.work.staged_path]))
                    lost += 1
            if not live:
                return [], lost
            now_ms = int(time.time() * 1000)
            adds: list[AddAction | RemoveAction] = [AddAction(finals[s.work.staged_path], s.size_bytes, {"partition": str(p)},
                              now_ms, True, s.stats) for p, files in live.items() for s in files]
            txns = [Transaction(tier_app_id(p), files[-1].work.end, now_ms)
                    for p, files in live.items()]
            try:
                dt.create_write_transaction(
                    adds, "append", Schema.from_arrow(TABLE_SCHEMA), partition_by=["partition"],
                    commit_properties=CommitProperties(
                        app_transactions=txns,
                        custom_metadata={"lakelog.job": "tier", "lakelog.jobId": self.job_id}))
            except CommitFailedError:
                dt.update_incremental()
                continue
            _step("committed")
            dt.update_incremental()
            return [TieredRange(plan.topic, p, plan.tiered[p], files[-1].work.end,
                                sum(f.size_bytes for f in files))
                    for p, files in live.items()], lost
        raise StorageError(f"{plan.table.table_uri}: tiering commit failed "
                           f"{MAX_COMMIT_ATTEMPTS} times in a row; rerun the job")


def clean_orphans(uri: str, dt: DeltaTable, min_age_s: float = 60.0) -> int:
    """Remove stage directories of jobs that are gone, and files they moved in but never
    committed; returns how many files were deleted.

    A running job holds the lock in its directory; ``min_age_s`` keeps a job that
    has just made its directory (and not yet taken the lock) safe."""
    stage = os.path.join(local_path(uri), STAGE_DIR)
    try:
        entries = os.listdir(stage)
    except FileNotFoundError:
        return 0
    removed = 0
    referenced: set[str] | None = None
    for name in entries:
        directory = os.path.join(stage, name)
        try:
            if time.time() - os.stat(directory).st_mtime < min_age_s:
                continue
            fd = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its job is still running
            try:
                with open(os.path.join(directory, "manifest.json")) as fh:
                    moved = json.load(fh)
            except FileNotFoundError:
                moved = []
            if moved and referenced is None:
                dt.update_incremental()
                referenced = {_relative(uri, f) for f in dt.file_uris()}
            for rel in moved:
                if rel not in (referenced or set()):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(local_path(uri), rel))
                        removed += 1
            shutil.rmtree(directory, ignore_errors=True)
            log.info("removed the stage directory of dead tiering job %s (%d uncommitted files)",
                     name, removed)
        finally:
            os.close(fd)
    return removed


def _relative(uri: str, file_uri: str) -> str:
    root = local_path(uri).rstrip("/") + "/"
    path = local_path(file_uri)
    return path[len(root):] if path.startswith(root) else path
