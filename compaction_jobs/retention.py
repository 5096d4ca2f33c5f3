"""The retention job: ``retention.ms`` and ``retention.bytes`` on whole files and segments.

Per partition of every topic whose ``cleanup.policy`` includes ``delete``, the
log is seen as one list of units in offset order: the Delta tier's files, then
the hot tier's sealed segments not yet tiered (the active segment is never
deleted, as in Kafka, but counts towards the size). As in Kafka:

- time: units are deleted from the oldest while their newest timestamp is older
  than ``retention.ms``;
- size: then from the oldest while what remains is still at least
  ``retention.bytes`` (Kafka's rule: the log keeps at least that much).

Units are bytes as stored: Parquet file sizes in Delta, segment file sizes hot.
The new log start is the offset after the last deleted unit. One Delta commit
per topic (metadata only: whole files removed) moves each partition's log start
(its ``lakelog-start-<p>`` app transaction) and removes the files below it,
guarded by the partition's file-removal counter; the server then drops hot
segments below the new log start. No data is read, so no Spark is started.
Running it twice, or with nothing to delete, commits nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from compaction_jobs.job import TopicJob
from log_tables.cold.commit import commit_changes, open_topic_table, start_change
from log_tables.cold.job_runs import SUCCEEDED, JobRun, now_ms
from log_tables.cold.table import ColdFile, PartitionState, snapshot
from log_tables.config import TopicConfig
from log_tables.hot.hot_reader import list_segments, segment_max_timestamp
from log_tables.registry import TopicMetadata

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class Unit(NamedTuple):
    """A whole file or segment: the smallest thing retention deletes."""

    next_offset: int
    """The offset after its last record."""
    max_timestamp_ms: int
    size_bytes: int
    records: int
    cold: ColdFile | None
    """The Delta file, or None for a hot segment."""


class RetentionPlan(NamedTuple):
    partition: int
    new_start: int
    deleted: list[Unit]
    reason: str


def partition_units(state: PartitionState, directory: Path) -> tuple[list[Unit], int]:
    """(deletable units in offset order, bytes of the active segment)."""
    units = [Unit(f.max_offset + 1, f.max_timestamp_ms, f.size_bytes, f.num_records, f)
             for f in state.files if f.max_offset >= state.start_offset]
    floor = max(state.tiered_offset, state.start_offset)
    segments = list_segments(directory)
    active = 0
    for i, seg in enumerate(segments):
        size = _size(seg.path)
        if i == len(segments) - 1:
            active = size
            break
        nxt = segments[i + 1].base_offset
        if nxt <= floor:
            continue  # tiered already: the Delta file stands for it
        units.append(Unit(nxt, segment_max_timestamp(seg), size,
                          nxt - max(seg.base_offset, floor), None))
    return units, active


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def plan_partition(partition: int, state: PartitionState, units: list[Unit], active_bytes: int,
                   config: TopicConfig, now: int) -> RetentionPlan | None:
    """Which units go, by time then by size; None when nothing does."""
    i = 0
    reasons = []
    if config.retention_ms >= 0:
        while i < len(units) and now - units[i].max_timestamp_ms > config.retention_ms:
            i += 1
        if i:
            reasons.append(f"{i} older than retention.ms={config.retention_ms}")
    if config.retention_bytes >= 0:
        timed = i
        excess = sum(u.size_bytes for u in units[i:]) + active_bytes - config.retention_bytes
        while i < len(units) and excess - units[i].size_bytes >= 0:
            excess -= units[i].size_bytes
            i += 1
        if i > timed:
            reasons.append(f"{i - timed} beyond retention.bytes={config.retention_bytes}")
    if i == 0:
        return None
    return RetentionPlan(partition, units[i - 1].next_offset, units[:i], "; ".join(reasons))


class RetentionJob(TopicJob):
    """Apply ``retention.ms`` / ``retention.bytes`` to every ``delete`` topic."""

    name = "retention"

    def run_topic(self, meta: TopicMetadata,
                  spark: SparkSession | Callable[[], SparkSession] | None) -> list[JobRun]:
        config = meta.config
        if not config.delete or (config.retention_ms < 0 and config.retention_bytes < 0):
            return []
        began = now_ms()
        dt = open_topic_table(self.layout.table_uri(meta.name), meta.name, meta.topic_id)
        states = snapshot(dt, meta.partitions)
        plans: list[RetentionPlan] = []
        for p, state in enumerate(states):
            if not self.leads(meta.name, p):
                continue  # its leader's hot log (elsewhere) counts towards its size
            units, active = partition_units(state, self.layout.partition_dir(meta.name, p))
            plan = plan_partition(p, state, units, active, config, self.now_ms)
            if plan is not None:
                plans.append(plan)
        if not plans:
            return []
        for plan in plans:
            cold = [u for u in plan.deleted if u.cold is not None]
            self.progress(f"{'would delete' if self.dry_run else 'deleting'} {meta.name}-"
                          f"{plan.partition} below offset {plan.new_start} ({plan.reason}): "
                          f"{len(cold)} Delta file(s), {len(plan.deleted) - len(cold)} hot "
                          f"segment(s), {sum(u.size_bytes for u in plan.deleted):,} bytes")
        committed = plans
        if not self.dry_run:
            changes = [start_change(states[p.partition], p.partition, p.new_start) for p in plans]
            done, _lost = commit_changes(dt, changes, self.name, self.job_id)
            ok = {c.partition for c in done}
            committed = [p for p in plans if p.partition in ok]
        return [self.row(meta.name, p.partition, began, SUCCEEDED,
                         records_in=sum(u.records for u in p.deleted),
                         bytes_in=sum(u.size_bytes for u in p.deleted),
                         detail=f"log start {states[p.partition].start_offset} -> {p.new_start}: "
                                f"{p.reason}")
                for p in committed]
