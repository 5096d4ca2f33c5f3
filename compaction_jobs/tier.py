"""The tiering job: sealed hot segments into the topics' Delta tables, exactly once.

Steps of one run (a failure or a kill at any of them leaves the old or the new
table state, never a mix):

1. plan: per topic, open the table (create it if missing), clean up what dead
   jobs left in ``_stage/``, read each partition's tiered offset (its app
   transaction version) and list the sealed segments past it that are durable
   (below the hot log's checkpointed recovery point);
2. stage: Spark tasks (segments spread over one task per core: ``tier_tasks``) read
   each segment (CRC-checked), write its records as one Parquet file under
   ``<table>/_stage/<job>/`` and return the file's stats. A damaged batch ends
   its partition's run: the records before it are tiered, the partition's later
   segments wait (reported, not failing the other partitions), unless
   ``skip_damaged`` says to tier around it (the damaged offsets become a hole,
   as compaction leaves, and the run records which);
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

On an object-store warehouse (``s3://``) there is no rename and no flock
(``staging.Outputs``): step 2 writes each file straight to its final, job-unique
name under ``partition=<p>/``, step 3 moves nothing, and step 4 is the same commit
(delta-rs writes the log entry with a conditional put, so of two racing jobs one
wins and the other's partitions are lost as above). Files no commit takes are
deleted, best effort; a killed job's are in no commit, so never read, and the
vacuum job deletes them after its grace period.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple

from deltalake import DeltaTable
from deltalake.transaction import AddAction

from compaction_jobs.job import Job, Led, session_of, step
from compaction_jobs.staging import Outputs, clean_orphans
from compaction_jobs.tier_tasks import (
    SegmentWork,
    StagedFile,
    balance,
    final_name,
    write_segments,
)
from compaction_jobs.tier_txns import OPEN_END, whole_transactions
from compaction_jobs.tier_typed import TypedPlan, commit_typed, plan_typed, work_for
from log_tables.cold import job_runs
from log_tables.cold.commit import (
    PartitionChange,
    commit_changes,
    open_topic_table,
    relative_path,
)
from log_tables.cold.table import open_table, snapshot, tier_app_id
from log_tables.errors import StaleTableError, StorageError
from log_tables.hot.damage import Damage
from log_tables.hot.hot_reader import PartitionReader, SegmentFile, list_segments, recovery_point
from log_tables.hot.isolation import READ_UNCOMMITTED, published_readable_end
from log_tables.hot.txn_index import AbortedTxn, TxnId
from log_tables.layout import Layout
from log_tables.registry import TopicMetadata

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

class TieredRange(NamedTuple):
    """What one run committed for one partition."""

    topic: str
    partition: int
    start: int
    end: int
    bytes: int
    skipped: tuple[Damage, ...] = ()
    """Damaged batches tiered around (``skip_damaged``): their offsets are a hole."""


class DamagedPartition(NamedTuple):
    """A partition whose tiering stopped at a damaged batch (the records before it are in)."""

    topic: str
    partition: int
    damage: Damage

    @property
    def message(self) -> str:
        d = self.damage
        return (f"topic {self.topic!r} partition {self.partition}: offsets {d.first_offset}.."
                f"{d.last_offset} are in a damaged batch in {d.path} at byte {d.position} "
                f"({d.reason}); tiered up to offset {d.first_offset}, the rest waits: restore "
                "the file, or run `lakelog jobs tier --skip-damaged` to tier around it "
                "(docs/reliability.md)")


class TierReport(NamedTuple):
    tiered: list[TieredRange]
    conflicts: int
    """Partitions another job tiered first (their staged files were dropped)."""
    seconds: float
    damaged: tuple[DamagedPartition, ...] = ()
    """Partitions that stopped at a damaged batch."""

    @property
    def records(self) -> int:
        return sum(r.end - r.start for r in self.tiered)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.tiered)


def untiered(layout: Layout, ends: dict[tuple[str, int], int]) -> list[str]:
    """The partitions whose Delta table does not cover every offset below the given end
    (records deleted before they were tiered count as covered), as
    ``topic-partition: tiered up to T of E``."""
    late = []
    for topic in sorted({t for t, _ in ends}):
        dt = open_table(layout.table_uri(topic))
        count = 1 + max(p for t, p in ends if t == topic)
        states = snapshot(dt, count) if dt is not None else None
        for (t, p), end in sorted(ends.items()):
            st = states[p] if states is not None else None
            covered = max(st.tiered_offset, st.start_offset) if st is not None else 0
            if t == topic and covered < end:
                late.append(f"{t}-{p}: tiered up to {covered} of {end}")
    return late


class _TopicPlan(NamedTuple):
    topic: str
    table: DeltaTable
    tiered: dict[int, int]
    """Per partition: the tiered offset planned on (the app transaction's version)."""
    floors: dict[int, int]
    """Per partition: where tiering starts (the tiered offset or a later log start)."""
    works: list[SegmentWork]
    outputs: Outputs | None
    """Where the works' files go (None: no works)."""
    whole: bool = False
    """Transactions among the records: committed whole or not at all (``commit_changes``)."""
    typed: TypedPlan | None = None
    """A typed topic's partitions whose typed rows the tasks write too (``tier_typed``)."""


class TierJob(Job[TierReport]):
    """One run of the tiering job over some topics of a layout: every topic's segments are
    staged by one Spark job, so a failure fails the run (one failed row), not a topic."""

    name = "tier"

    def __init__(self, layout: Layout, topics: Iterable[str] | None = None, *,
                 progress: Callable[[str], None] | None = None,
                 orphan_min_age_s: float = 60.0, skip_damaged: bool = False,
                 led: Led | None = None, settle_ms: int = 0) -> None:
        super().__init__(layout, topics, progress=progress, orphan_min_age_s=orphan_min_age_s,
                         led=led)
        self.skip_damaged = skip_damaged
        """Tier around damaged batches (an operator's choice: their records are lost)."""
        self.settle_ms = settle_ms
        """A committed transaction whose marker is younger is held back as an open one (a
        cluster's tierer: ``cluster.tierers``)."""
        self._new_damage: list[DamagedPartition] = []

    def run(self, spark: SparkSession | Callable[[], SparkSession] | None = None, *,
            record: bool = True) -> TierReport:
        """Plan, stage (Spark tasks), move, commit and clean up; see the module docstring.

        ``spark`` may be a factory: it is called only when there is something to tier.
        Each partition tiered is a row in ``_job_runs`` (a failed run, one failed row).
        """
        started = time.monotonic()
        began = job_runs.now_ms()
        try:
            report = self._run(spark, started)
        except Exception as exc:
            if record:
                job_runs.record(self.layout.warehouse, [self.failed_row(None, began, exc)])
            raise
        if record:
            job_runs.record(self.layout.warehouse, [self.row(
                r.topic, r.partition, began, job_runs.SUCCEEDED, records_in=r.end - r.start,
                records_out=r.end - r.start, bytes_in=r.bytes, bytes_out=r.bytes,
                detail=f"tiered offsets {r.start}..{r.end - 1}" + "".join(
                    f"; skipped damaged offsets {d.first_offset}..{d.last_offset} of {d.path}"
                    for d in r.skipped)) for r in report.tiered] + [self.row(
                d.topic, d.partition, began, job_runs.FAILED, error=d.message)
                for d in self._new_damage])
        return report

    def _run(self, spark: SparkSession | Callable[[], SparkSession] | None, started: float
             ) -> TierReport:
        plans = [p for p in map(self._plan, self.topic_metas()) if p is not None]
        works = [w for p in plans for w in p.works]
        try:
            staged: list[StagedFile] = []
            if works:
                self.progress(f"tiering {len(works)} segment(s) of "
                              f"{sum(1 for p in plans if p.works)} topic(s)")
                session = session_of(spark)
                groups = balance(works, session.sparkContext.defaultParallelism)
                rdd = session.sparkContext.parallelize(groups, len(groups))
                staged = rdd.flatMap(write_segments).collect()
            step("staged")
            tiered: list[TieredRange] = []
            conflicts = 0
            for plan in plans:
                mine = [s for s in staged if s.work.topic == plan.topic]
                if mine:
                    done, lost = self._commit(plan, mine)
                    tiered += done
                    conflicts += lost
        finally:
            for plan in plans:
                if plan.outputs is not None:
                    plan.outputs.close()
                if plan.typed is not None:
                    plan.typed.outputs.close()
        report = TierReport(tiered, conflicts, time.monotonic() - started, self._damaged(staged))
        if tiered or conflicts:
            self.progress(f"tiered {report.records:,} records ({report.bytes / 1e6:.1f} MB) of "
                          f"{len({(r.topic, r.partition) for r in tiered})} partition(s) in "
                          f"{report.seconds:.2f} s"
                          + (f"; {conflicts} partition(s) tiered by another job" if conflicts else ""))
        return report

    # -- plan -----------------------------------------------------------------------
    def _plan(self, meta: TopicMetadata) -> _TopicPlan | None:
        topic, topic_id, partitions = meta.name, meta.topic_id, meta.partitions
        uri = self.layout.table_uri(topic)
        try:
            dt = open_topic_table(uri, topic, topic_id)
        except StaleTableError as exc:
            self.progress(f"skipping topic {topic}: {exc}")
            return None
        clean_orphans(uri, dt, self.orphan_min_age_s)
        states = snapshot(dt, partitions)
        tiered = {p: st.tiered_offset for p, st in enumerate(states)}
        # Records below the log start (deleted before they were tiered) are not tiered.
        floors = {p: max(st.tiered_offset, st.start_offset) for p, st in enumerate(states)}
        todo: list[tuple[int, SegmentFile, int, int]] = []
        aborted: dict[int, tuple[AbortedTxn, ...]] = {}
        spans: dict[int, dict[TxnId, tuple[int, int]]] = {}
        for p in range(partitions):
            if not self.leads(topic, p):
                continue  # another broker tiers it (``cluster.tierers``)
            directory = self.layout.partition_dir(topic, p)
            # Only durable segments: one rolled moments ago may still await its fdatasync,
            # and a tiered record must never be one that an OS crash could take back.
            # Replicated: below the published high watermark only.
            durable = published_readable_end(directory, recovery_point(directory),
                                             READ_UNCOMMITTED)
            # Only below the last stable offset (a table holds committed records), and
            # without the markers and aborted records (``SegmentWork.aborted``).
            _, found = PartitionReader(directory).committed(floors[p])
            if found.last_stable is not None:
                durable = min(durable, found.last_stable)
            aborted[p] = found.hidden.spans()
            # A transaction with no marker here may be committed elsewhere already: as
            # one without end here, it holds back its records in the other partitions; so
            # does one whose marker is too young for every replica read here to hold all
            # its records (``settle_ms``).
            settled = job_runs.now_ms() - self.settle_ms
            spans[p] = {**{t: span if found.ended_ms.get(t, 0) <= settled else (span[0], OPEN_END)
                           for t, span in found.committed.items()},
                        **{t: (first, OPEN_END) for t, first in found.open.items()}}
            for seg, nxt in itertools.pairwise(list_segments(directory)):  # the last is active
                if nxt.base_offset > durable:
                    break
                start = max(floors[p], seg.base_offset)
                if start >= nxt.base_offset:
                    continue
                todo.append((p, seg, start, nxt.base_offset))
        if any(spans.values()):  # a committed transaction is tiered whole or not yet
            boundaries = {p: [floors[p]] + [end for q, _, _, end in todo if q == p]
                          for p in spans}
            ends = whole_transactions({p: b[-1] for p, b in boundaries.items()}, boundaries,
                                      spans)
            todo = [w for w in todo if w[3] <= ends[w[0]]]
        if not todo:
            return _TopicPlan(topic, dt, tiered, floors, [], None)
        out = Outputs(uri, self.job_id)
        typed = plan_typed(self.layout, meta, tiered, self.job_id, self.orphan_min_age_s)
        works = [SegmentWork(topic, p, str(seg.path), seg.base_offset, start, end,
                             out.path(f"p{p}-{start:020d}-{end:020d}.parquet",
                                      final_name(p, start, end, self.job_id)),
                             self.skip_damaged, out.env,
                             tuple(a for a in aborted[p]
                                   if a.first_offset < end and a.last_offset >= start),
                             work_for(typed, self.layout, p, start, end,
                                      final_name(p, start, end, self.job_id)))
                 for p, seg, start, end in todo]
        return _TopicPlan(topic, dt, tiered, floors, works, out, any(spans.values()), typed)

    # -- move and commit -----------------------------------------------------------
    def _commit(self, plan: _TopicPlan, staged: list[StagedFile]
                ) -> tuple[list[TieredRange], int]:
        """Steps 3 and 4 for one topic; returns what was committed and how many partitions lost.

        On an object store the files are already at their final names: step 3 moves
        nothing, and files no commit takes are deleted (best effort; otherwise they are
        never read, being in no commit, and vacuum removes them).

        A partition's files are taken up to the first that stopped at a damaged batch (the
        files after it stay in the stage directory, which is removed); files without
        records move nothing but still count for the partition's new tiered offset.
        """
        by_partition: dict[int, list[StagedFile]] = defaultdict(list)
        for s in sorted(staged, key=lambda s: (s.work.partition, s.work.start)):
            files = by_partition[s.work.partition]
            if files and files[-1].end < files[-1].work.end:
                continue  # after a damaged batch: waits for the damage to be dealt with
            files.append(s)
        for p, files in by_partition.items():
            expected = plan.floors[p]
            for f in files:
                if f.work.start != max(expected, f.work.base_offset):
                    raise StorageError(f"{plan.topic}-{p}: staged files are not contiguous at "
                                       f"offset {expected} (found {f.work.start}); rerun the job")
                expected = f.work.end
        out = plan.outputs
        assert out is not None  # a plan with works has its outputs
        moved = [s for files in by_partition.values() for s in files if s.size_bytes]
        if out.direct:
            taken = {id(s) for s in moved}  # files after a damaged batch wait: deleted
            out.discard([relative_path(out.uri, s.work.staged_path) for s in staged
                         if s.size_bytes and id(s) not in taken])
            finals = {s.work.staged_path: relative_path(out.uri, s.work.staged_path)
                      for s in moved}
        else:
            finals = {s.work.staged_path: final_name(s.work.partition, s.work.start, s.end,
                                                     self.job_id) for s in moved}
        out.move_in(finals)
        step("moved")
        now_ms = int(time.time() * 1000)
        changes = [PartitionChange(
            p, [AddAction(finals[s.work.staged_path], s.size_bytes, {"partition": str(p)}, now_ms,
                          True, s.stats) for s in files if s.size_bytes], [],
            {tier_app_id(p): files[-1].end}, {tier_app_id(p): plan.tiered[p]})
            for p, files in by_partition.items() if files[-1].end > plan.floors[p]]
        done, lost = commit_changes(
            plan.table, changes, self.name, self.job_id,
            on_lost=lambda c: out.discard([finals[s.work.staged_path]
                                           for s in by_partition[c.partition] if s.size_bytes]),
            whole=plan.whole)
        if done:
            step("committed")
        if plan.typed is not None:  # the typed rows the tasks wrote, where they can go
            commit_typed(plan.typed, {p: [(f.work.typed, f.typed, f.end, f.work.end)
                                          for f in files] for p, files in by_partition.items()},
                         {c.partition for c in done}, self.job_id)
        return [TieredRange(plan.topic, c.partition, plan.floors[c.partition],
                            by_partition[c.partition][-1].end,
                            sum(f.size_bytes for f in by_partition[c.partition]),
                            tuple(d for f in by_partition[c.partition] for d in f.damage))
                for c in done], len(lost)

    def _damaged(self, staged: list[StagedFile]) -> tuple[DamagedPartition, ...]:
        """Where partitions stopped at a damaged batch; each is logged (and a failed row in
        ``_job_runs``) once per job process, not at every run of the server's scheduler."""
        out = []
        for s in staged:
            if s.end < s.work.end and s.damage:
                d = s.damage[-1]
                found = DamagedPartition(s.work.topic, s.work.partition, d)
                out.append(found)
                if (d.path, d.position) not in _REPORTED:
                    _REPORTED.add((d.path, d.position))
                    self._new_damage.append(found)
                    log.warning("%s", found.message)
                    self.progress(found.message)
        return tuple(out)


_REPORTED: set[tuple[str, int]] = set()
"""Damage already reported by this process (the server's job process tiers every few
seconds, and must not log the same damage each time)."""
