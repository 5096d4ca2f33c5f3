"""The optimize job: small Delta files merged into larger ones, kept in offset order.

Per partition, runs of consecutive files each smaller than ``target_bytes`` are
grouped into bins of at most ``target_bytes``; every bin of two or more files
becomes one file (the files are sorted and do not overlap, so concatenating
them keeps offset order). delta-rs's own ``optimize.compact()`` does not
promise that order, so lakelog does this itself.

Steps, as in the compaction job: plan → staged (Spark tasks, one per core,
concatenate each bin with pyarrow) → moved → committed (remove + add with
``dataChange=false``, guarded by the partition's file-removal counter) →
stage directory removed. On an object store the tasks write straight to final,
job-unique names and nothing moves (``staging.Outputs``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from deltalake.transaction import AddAction

from compaction_jobs.job import TopicJob, session_of, step
from compaction_jobs.staging import Outputs, clean_orphans
from log_tables.cold.commit import PartitionChange, commit_changes, open_topic_table, relative_path
from log_tables.cold.job_runs import SUCCEEDED, JobRun, now_ms
from log_tables.cold.rows import file_stats, write_rows_at
from log_tables.cold.table import ColdFile, files_app_id, read_files, snapshot
from log_tables.layout import Layout
from log_tables.registry import TopicMetadata

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_TARGET_BYTES = 64 * 1024 * 1024


class Bin(NamedTuple):
    partition: int
    files: list[ColdFile]
    staged_path: str = ""
    """Where its task writes the merged file (``Outputs.path``); "" until there is one."""
    store_env: tuple[tuple[str, str], ...] = ()
    """An object store's settings (``storage.object_store_env``), in the task."""

    def final_name(self, job_id: str) -> str:
        return (f"partition={self.partition}/{self.files[0].min_offset:020d}-"
                f"{self.files[-1].max_offset:020d}-{job_id}.parquet")


class MergedFile(NamedTuple):
    bin: Bin
    size_bytes: int
    stats: str


def plan_bins(partition: int, files: list[ColdFile], start_offset: int, target_bytes: int
              ) -> list[Bin]:
    """Consecutive small files grouped up to ``target_bytes``; only bins of 2+ files."""
    bins: list[list[ColdFile]] = [[]]
    for f in files:
        current = bins[-1]
        small = f.size_bytes < target_bytes and f.min_offset >= start_offset
        if small and sum(x.size_bytes for x in current) + f.size_bytes <= target_bytes:
            current.append(f)
        else:
            bins.append([f] if small else [])
    return [Bin(partition, b) for b in bins if len(b) >= 2]


def merge_bin(b: Bin) -> MergedFile:
    """Stage step (in a Spark task): the bin's files, concatenated, as one file."""
    rows = read_files(b.files, b.files[0].min_offset, b.files[-1].max_offset + 1,
                      env=b.store_env)
    size = write_rows_at(b.staged_path, rows.to_batches(), b.store_env)
    return MergedFile(b, size, file_stats(rows))


def merge_bins(bins: list[Bin]) -> list[MergedFile]:
    return [merge_bin(b) for b in bins]


class OptimizeJob(TopicJob):
    """Merge small files of every topic's partitions, in offset order."""

    name = "optimize"

    def __init__(self, layout: Layout, topics: list[str] | None = None, *,
                 target_bytes: int = DEFAULT_TARGET_BYTES, **kwargs: object) -> None:
        super().__init__(layout, topics, **kwargs)  # type: ignore[arg-type]
        self.target_bytes = target_bytes

    def run_topic(self, meta: TopicMetadata,
                  spark: SparkSession | Callable[[], SparkSession] | None) -> list[JobRun]:
        began = now_ms()
        uri = self.layout.table_uri(meta.name)
        dt = open_topic_table(uri, meta.name, meta.topic_id)
        clean_orphans(uri, dt, self.orphan_min_age_s)
        states = snapshot(dt, meta.partitions)
        bins = [b for p, st in enumerate(states) if self.leads(meta.name, p)
                for b in plan_bins(p, list(st.files), st.start_offset, self.target_bytes)]
        by_partition: dict[int, list[Bin]] = {}
        for b in bins:
            by_partition.setdefault(b.partition, []).append(b)
        for p, pbins in by_partition.items():
            n = sum(len(b.files) for b in pbins)
            self.progress(f"{'would merge' if self.dry_run else 'merging'} {n} file(s) of "
                          f"{meta.name}-{p} into {len(pbins)}")
        if not bins or self.dry_run:
            return [self._row(meta.name, p, began, pbins, []) for p, pbins in by_partition.items()]
        out = Outputs(uri, self.job_id)
        bins = [b._replace(staged_path=out.path(f"p{b.partition}-{b.files[0].min_offset:020d}"
                                                ".parquet", b.final_name(self.job_id)),
                           store_env=out.env) for b in bins]
        try:
            session = session_of(spark)
            groups = [bins[i::session.sparkContext.defaultParallelism]
                      for i in range(min(len(bins), session.sparkContext.defaultParallelism))]
            merged = session.sparkContext.parallelize(groups, len(groups)).flatMap(
                merge_bins).collect()
            step("staged")
            finals = {m.bin.staged_path: relative_path(uri, m.bin.staged_path) if out.direct
                      else m.bin.final_name(self.job_id) for m in merged}
            out.move_in(finals)
            step("moved")
            modified = int(time.time() * 1000)
            changes = [PartitionChange(
                p,
                [AddAction(finals[m.bin.staged_path], m.size_bytes, {"partition": str(p)},
                           modified, False, m.stats) for m in merged if m.bin.partition == p],
                [f for b in pbins for f in b.files],
                {files_app_id(p): states[p].files_version + 1},
                {files_app_id(p): states[p].files_version}) for p, pbins in by_partition.items()]
            done, _lost = commit_changes(
                dt, changes, self.name, self.job_id, data_change=False,
                on_lost=lambda c: out.discard([finals[m.bin.staged_path] for m in merged
                                               if m.bin.partition == c.partition]))
            if done:
                step("committed")
        finally:
            out.close()
        ok = {c.partition for c in done}
        return [self._row(meta.name, p, began, pbins, [m for m in merged if m.bin.partition == p])
                for p, pbins in by_partition.items() if p in ok]

    def _row(self, topic: str, partition: int, began: int, bins: list[Bin],
             merged: list[MergedFile]) -> JobRun:
        files = [f for b in bins for f in b.files]
        return self.row(topic, partition, began, SUCCEEDED,
                        records_in=sum(f.num_records for f in files),
                        records_out=sum(f.num_records for f in files) if merged else 0,
                        bytes_in=sum(f.size_bytes for f in files),
                        bytes_out=sum(m.size_bytes for m in merged),
                        detail=f"{len(files)} file(s) into {len(bins)}")
