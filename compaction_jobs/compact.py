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
2. staged: Spark keeps the latest record per (partition, key) and writes each
   partition sorted by offset under ``_stage/<job>/``: one task per partition
   (pyarrow in the task) when each fits in ``task_max_bytes``, else a Spark SQL
   shuffle over all of them; file stats come from the written rows or files.
   On an object store the tasks write straight to final, job-unique names
   (``staging.Outputs``), always one task per partition: Spark's own Parquet
   writer would need ``hadoop-aws``;
3. moved: manifest, then the files move into ``partition=<p>/`` (on an object
   store nothing moves);
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
import logging
import operator
import os
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.transaction import AddAction

from compaction_jobs.job import TopicJob, session_of, step
from compaction_jobs.staging import Outputs, clean_orphans
from log_tables.cold.commit import PartitionChange, commit_changes, open_topic_table, relative_path
from log_tables.cold.job_runs import SUCCEEDED, JobRun, now_ms
from log_tables.cold.rows import TIMESTAMP_TYPE, file_stats, parquet_file_stats, write_rows_at
from log_tables.cold.table import (
    ColdFile,
    PartitionState,
    cleaned_app_id,
    files_app_id,
    open_table,
    read_files,
    snapshot,
)
from log_tables.config import TopicConfig
from log_tables.layout import Layout
from log_tables.registry import TopicMetadata
from log_tables.spark.read import FILE_DDL
from log_tables.typed.columns import typed_app_id

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

MAX_RECORDS_PER_FILE = 4_000_000
"""Bound on one output file; a partition's compacted range may span several."""
TASK_MAX_BYTES = 1 << 30
"""A partition whose cleanable files are larger than this is compacted by a Spark SQL
shuffle; smaller ones by one Spark task each (pyarrow in the task), which on small
clusters is an order of magnitude faster."""

Written = tuple[str, int, int, int, str, int]
"""A written file: path, rows, first and last offset, Delta stats, bytes."""


class PartitionTask(NamedTuple):
    """One partition's rewrite, done whole by one Spark task."""

    partition: int
    files: list[ColdFile]
    start_offset: int
    horizon_ms: int
    """Tombstones older than this go."""
    out_path: str
    """Where the i-th output file goes, ``{i}`` standing for i (``Outputs.path``)."""
    store_env: tuple[tuple[str, str], ...] = ()
    """An object store's settings (``storage.object_store_env``), in the task."""


def compact_partition(task: PartitionTask) -> tuple[int, list[Written]]:
    """Step 2 in a Spark task: the latest record per key, tombstones past the horizon and
    keyless records dropped, written sorted by offset (files of at most
    MAX_RECORDS_PER_FILE rows)."""
    table = read_files(task.files, task.start_offset, task.files[-1].max_offset + 1,
                       env=task.store_env)
    table = table.filter(pc.is_valid(table.column("key")))
    latest = table.group_by("key", use_threads=False).aggregate([("offset", "max")])
    keep = pc.is_in(table.column("offset"), value_set=latest.column("offset_max"))
    horizon = pa.scalar(task.horizon_ms * 1000, pa.int64()).cast(TIMESTAMP_TYPE)
    expired = pc.and_(pc.is_null(table.column("value")),
                      pc.less(table.column("timestamp"), horizon))
    kept = table.filter(pc.and_(keep, pc.invert(expired)))
    out: list[Written] = []
    for i in range(0, kept.num_rows, MAX_RECORDS_PER_FILE):
        chunk = kept.slice(i, MAX_RECORDS_PER_FILE)
        path = task.out_path.replace("{i}", str(i // MAX_RECORDS_PER_FILE))
        size = write_rows_at(path, chunk.to_batches(), task.store_env)
        offsets = chunk.column("offset")
        out.append((path, chunk.num_rows, offsets[0].as_py(), offsets[-1].as_py(),
                    file_stats(chunk), size))
    return task.partition, out


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


def plan_partition(partition: int, state: PartitionState, config: TopicConfig, now: int,
                   typed_to: int | None = None) -> CompactPlan | None:
    """The partition's cleanable files if it is due for compaction, else None.
    ``typed_to``: a typed or upsert topic's typed offset; records past it are not
    compacted yet (the typed table has not seen them)."""
    files = [f for f in state.files if f.max_offset >= state.start_offset]
    cleanable: list[ColdFile] = []
    for f in files:
        if now - f.max_timestamp_ms < config.min_compaction_lag_ms:
            break  # younger than min.compaction.lag.ms: this and everything after stay
        if typed_to is not None and f.max_offset >= typed_to:
            break
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


class CompactJob(TopicJob):
    """Compact every partition of every compacted topic that is due."""

    name = "compact"

    def __init__(self, layout: Layout, topics: Iterable[str] | None = None, *,
                 task_max_bytes: int = TASK_MAX_BYTES, **kwargs: Any) -> None:
        super().__init__(layout, topics, **kwargs)
        self.task_max_bytes = task_max_bytes

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
        typed = (open_table(self.layout.typed_uri(meta.name))
                 if config.delta_table_mode != "raw" else None)
        typed_to = {p: (typed.transaction_version(typed_app_id(p)) or 0) if typed else 0
                    for p in range(meta.partitions)} if config.delta_table_mode != "raw" else {}
        plans = [plan for p, st in enumerate(states) if self.leads(meta.name, p)
                 and (plan := plan_partition(p, st, config, self.now_ms, typed_to.get(p)))
                 is not None]
        for plan in plans:
            self.progress(f"{'would compact' if self.dry_run else 'compacting'} {meta.name}-"
                          f"{plan.partition} offsets {plan.state.start_offset}.."
                          f"{plan.cleaned_to - 1}: {len(plan.files)} file(s), "
                          f"{plan.records:,} records, {plan.size_bytes:,} bytes ({plan.reason})")
        if not plans or self.dry_run:
            return [self.row(meta.name, p.partition, began, SUCCEEDED, records_in=p.records,
                             bytes_in=p.size_bytes, detail=p.reason) for p in plans]
        out = Outputs(uri, self.job_id)
        try:
            session = session_of(spark)
            largest = max(p.size_bytes for p in plans)
            if largest <= self.task_max_bytes or out.direct:
                if largest > self.task_max_bytes:
                    log.warning("%s: compacting %d bytes of one partition in one task: on an "
                                "object store the Spark SQL path would need hadoop-aws",
                                meta.name, largest)
                written = self._rewrite_in_tasks(session, plans, config, out)
            else:
                written = self._rewrite(session, uri, plans, config, out.path("spark", ""))
            step("staged")
            if out.direct:
                finals = {f[0]: relative_path(uri, f[0]) for files in written.values()
                          for f in files}
            else:
                finals = {src: f"partition={p}/{lo:020d}-{hi:020d}-{self.job_id}-c{i}.parquet"
                          for p, files in written.items()
                          for i, (src, _n, lo, hi, _stats, _size) in enumerate(files)}
            out.move_in(finals)
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
                on_lost=lambda c: out.discard([finals[f[0]] for f in written.get(c.partition, [])]))
            if done:
                step("committed")
        finally:
            out.close()
        ok = {c.partition for c in done}
        return [self.row(meta.name, p.partition, began, SUCCEEDED, records_in=p.records,
                         records_out=sum(f[1] for f in written.get(p.partition, [])),
                         bytes_in=p.size_bytes,
                         bytes_out=sum(f[5] for f in written.get(p.partition, [])),
                         detail=f"offsets {p.state.start_offset}..{p.cleaned_to - 1}: {p.reason}")
                for p in plans if p.partition in ok]

    def _rewrite_in_tasks(self, spark: SparkSession, plans: list[CompactPlan],
                          config: TopicConfig, out: Outputs) -> dict[int, list[Written]]:
        """Step 2, one Spark task per partition (largest first)."""
        tasks = [PartitionTask(
            p.partition, p.files, p.state.start_offset, self.now_ms - config.delete_retention_ms,
            out.path(f"p{p.partition}-{{i}}.parquet",
                     f"partition={p.partition}/{p.state.start_offset:020d}-{self.job_id}"
                     "-c{i}.parquet"), out.env)
                 for p in sorted(plans, key=lambda p: -p.size_bytes)]
        rdd = spark.sparkContext.parallelize(tasks, len(tasks))
        return dict(rdd.map(compact_partition).collect())

    def _rewrite(self, spark: SparkSession, uri: str, plans: list[CompactPlan],
                 config: TopicConfig, out_dir: str
                 ) -> dict[int, list[Written]]:
        """Step 2 as a Spark SQL shuffle (partitions too large for one task); per partition, the files written (path, rows, first and
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
        out: dict[int, list[Written]] = {}
        for plan in plans:
            files = []
            for path in glob.glob(os.path.join(target, f"partition={plan.partition}", "*.parquet")):
                rows, lo, hi, stats = parquet_file_stats(path)
                if rows:
                    files.append((path, rows, lo, hi, stats, os.path.getsize(path)))
            out[plan.partition] = sorted(files, key=lambda f: f[2])
        return out
