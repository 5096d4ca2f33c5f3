"""The compaction job: Kafka's log compaction on the Delta tier, through Spark.

For each partition of a topic with ``cleanup.policy`` ``compact`` or
``compact,delete``:

- the cleanable range is the Delta files from the log start whose newest record
  is older than ``min.compaction.lag.ms`` (a prefix: the hot tail and younger
  files are never touched);
- the partition is due when its dirty ratio (bytes past the cleaner checkpoint
  over cleanable bytes) reaches ``min.cleanable.dirty.ratio``, or when its oldest
  dirty record is older than ``max.compaction.lag.ms``;
- the cleanable range is rewritten keeping, per key, only the record with the
  highest offset; a tombstone (null value) older than ``delete.retention.ms`` (by
  its timestamp) goes too, and so do records without a key (Kafka drops them).
  Offsets and order never change; a removed offset reads as the next one.

Steps of one run per topic (a kill at any step leaves the old or the new state):

1. plan: snapshot the table, pick the due partitions and their files;
2. staged: one Spark job reads those files, keeps the latest record per
   (partition, key), and writes each partition sorted by offset under
   ``_stage/<job>/``; file stats come from the written files;
3. moved: manifest, then the files move into ``partition=<p>/``;
4. committed: one delta-rs commit removes the old files and adds the new ones,
   advancing each partition's cleaner checkpoint and file-removal counter (the
   guard: a second compaction planned on the same files loses, and its files
   are deleted);
5. the stage directory is removed.

A reader holding an older snapshot keeps reading its files until vacuum's grace
period has passed.
"""

from __future__ import annotations

import functools
import glob
import operator
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, NamedTuple

from deltalake.transaction import AddAction

from compaction_jobs.job import Job, session_of, step
from compaction_jobs.staging import StageDir, clean_orphans
from log_tables.cold_commit import PartitionChange, commit_changes, open_topic_table
from log_tables.cold_table import (
    ColdFile,
    PartitionState,
    cleaned_app_id,
    files_app_id,
    parquet_file_stats,
    snapshot,
)
from log_tables.config import TopicConfig
from log_tables.job_runs import SUCCEEDED, JobRun, now_ms
from log_tables.registry import TopicMetadata
from log_tables.spark_read import FILE_DDL

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MAX_RECORDS_PER_FILE = 4_000_000
"""Bound on one output file; a partition's compacted range may span several."""


class CompactPlan(NamedTuple):
    partition: int
    state: PartitionState
    files: list[ColdFile]
    """The cleanable files (from the log start), all rewritten."""
    cleaned_to: int
    """The new cleaner checkpoint: the end of the cleanable range."""
    dirty_ratio: float
    reason: str

    @property
    def records(self) -> int:
        return sum(f.num_records for f in self.files)

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)


def plan_partition(partition: int, state: PartitionState, config: TopicConfig, now: int
                   ) -> CompactPlan | None:
    """The partition's cleanable files if it is due for compaction, else None."""
    files = [f for f in state.files if f.max_offset >= state.start_offset]
    cleanable: list[ColdFile] = []
    for f in files:
        if now - f.max_timestamp_ms < config.min_compaction_lag_ms:
            break  # younger than min.compaction.lag.ms: this and everything after stay
        cleanable.append(f)
    checkpoint = max(state.cleaned_offset, state.start_offset)
    dirty = [f for f in cleanable if f.max_offset >= checkpoint]
    if not dirty:
        return None
    total = sum(f.size_bytes for f in cleanable)
    ratio = sum(f.size_bytes for f in dirty) / total if total else 1.0
    oldest_dirty_ms = min(f.min_timestamp_ms for f in dirty)
    if ratio >= config.min_cleanable_dirty_ratio:
        reason = f"dirty ratio {ratio:.2f} >= min.cleanable.dirty.ratio"
    elif now - oldest_dirty_ms > config.max_compaction_lag_ms:
        reason = f"dirty records older than max.compaction.lag.ms={config.max_compaction_lag_ms}"
    else:
        return None
    return CompactPlan(partition, state, cleanable, cleanable[-1].max_offset + 1, ratio, reason)


class CompactJob(Job):
    """Compact every partition of every compacted topic that is due."""

    name = "compact"

    def run_topic(self, meta: TopicMetadata,
                  spark: SparkSession | Callable[[], SparkSession] | None) -> list[JobRun]:
        config = meta.config
        if not config.compact:
            return []
        began = now_ms()
        uri = self.layout.table_uri(meta.name)
        dt = open_topic_table(uri, meta.name, meta.topic_id)
        clean_orphans(uri, dt, self.orphan_min_age_s)
        states = snapshot(dt, meta.partitions)
        plans = [plan for p, st in enumerate(states)
                 if (plan := plan_partition(p, st, config, self.now_ms)) is not None]
        for plan in plans:
            self.progress(f"{'would compact' if self.dry_run else 'compacting'} {meta.name}-"
                          f"{plan.partition} offsets {plan.state.start_offset}.."
                          f"{plan.cleaned_to - 1}: {len(plan.files)} file(s), "
                          f"{plan.records:,} records, {plan.size_bytes:,} bytes ({plan.reason})")
        if not plans or self.dry_run:
            return [self.row(meta.name, p.partition, began, SUCCEEDED, records_in=p.records,
                             bytes_in=p.size_bytes, detail=p.reason) for p in plans]
        stage = StageDir(uri, self.job_id)
        try:
            written = self._rewrite(session_of(spark), uri, plans, config, stage.path)
            step("staged")
            finals = {src: f"partition={p}/{lo:020d}-{hi:020d}-{self.job_id}-c{i}.parquet"
                      for p, files in written.items()
                      for i, (src, _n, lo, hi, _stats, _size) in enumerate(files)}
            stage.move_in(finals)
            step("moved")
            modified = int(time.time() * 1000)
            changes = [PartitionChange(
                plan.partition,
                [AddAction(finals[src], size, {"partition": str(plan.partition)}, modified, True,
                           stats) for src, _n, _lo, _hi, stats, size in
                 written.get(plan.partition, [])],
                plan.files,
                {cleaned_app_id(plan.partition): plan.cleaned_to,
                 files_app_id(plan.partition): plan.state.files_version + 1},
                {files_app_id(plan.partition): plan.state.files_version}) for plan in plans]
            done, _lost = commit_changes(
                dt, changes, self.name, self.job_id,
                on_lost=lambda c: stage.discard([finals[f[0]] for f in written.get(c.partition, [])]))
            if done:
                step("committed")
        finally:
            stage.close()
        ok = {c.partition for c in done}
        return [self.row(meta.name, p.partition, began, SUCCEEDED, records_in=p.records,
                         records_out=sum(f[1] for f in written.get(p.partition, [])),
                         bytes_in=p.size_bytes,
                         bytes_out=sum(f[5] for f in written.get(p.partition, [])),
                         detail=f"offsets {p.state.start_offset}..{p.cleaned_to - 1}: {p.reason}")
                for p in plans if p.partition in ok]

    def _rewrite(self, spark: SparkSession, uri: str, plans: list[CompactPlan],
                 config: TopicConfig, out_dir: str
                 ) -> dict[int, list[tuple[str, int, int, int, str, int]]]:
        """Step 2: the Spark job; per partition, the files written (path, rows, first and
        last offset, stats, bytes) in offset order."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        paths = [f.path for plan in plans for f in plan.files]
        df = spark.read.schema(FILE_DDL).option("basePath", uri).parquet(*paths)
        in_range = functools.reduce(operator.or_, [
            (F.col("partition") == plan.partition) & (F.col("offset") >= plan.state.start_offset)
            for plan in plans])
        horizon = datetime.fromtimestamp((self.now_ms - config.delete_retention_ms) / 1000, UTC)
        latest = F.max("offset").over(Window.partitionBy("partition", "key"))
        kept = (df.where(in_range & F.col("key").isNotNull())
                .withColumn("_latest", latest)
                .where((F.col("offset") == F.col("_latest"))
                       & ~(F.col("value").isNull() & (F.col("timestamp") < F.lit(horizon))))
                .drop("_latest"))
        target = os.path.join(out_dir, "spark")
        (kept.repartition(len(plans), "partition").sortWithinPartitions("partition", "offset")
         .write.mode("overwrite").option("maxRecordsPerFile", MAX_RECORDS_PER_FILE)
         .partitionBy("partition").parquet(target))
        out: dict[int, list[tuple[str, int, int, int, str, int]]] = {}
        for plan in plans:
            files = []
            for path in glob.glob(os.path.join(target, f"partition={plan.partition}", "*.parquet")):
                rows, lo, hi, stats = parquet_file_stats(path)
                if rows:
                    files.append((path, rows, lo, hi, stats, os.path.getsize(path)))
            out[plan.partition] = sorted(files, key=lambda f: f[2])
        return out
