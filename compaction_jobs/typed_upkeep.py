"""Upkeep of a topic's typed and dead-letter tables, run by the vacuum job: the small
files that frequent typed commits leave are merged (delta-rs' ``optimize.compact``,
partition by partition, only those this broker leads), removed files are deleted after
the grace period, and the logs are checkpointed.

Two merges of the same files would both commit (delta-rs does not see two
``data_change=False`` rewrites as conflicting: FINDINGS.md), so each merge also sets an
app transaction of its partition (``lakelog-typed-files-<p>``): of two at once, one
fails and its files are left for vacuum. A merge and an upsert MERGE of the same files
could both commit too, and bring a replaced row back: so a merge also sets the
partition's typed offset (``lakelog-typed-<p>``) to the value it read, and of the two
one fails; and merges run where the typed job runs (the partition's tierer).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties, Transaction

from compaction_jobs.checkpoints import checkpoint_if_due
from log_tables.cold.job_runs import now_ms
from log_tables.cold.table import open_table
from log_tables.layout import Layout, is_local
from log_tables.registry import TopicMetadata
from log_tables.typed.columns import dlq_app_id, typed_app_id

SMALL_FILES = 8
"""A partition with more files than this is merged."""
TARGET_BYTES = 64 << 20


def files_app_id(partition: int) -> str:
    return f"lakelog-typed-files-{partition}"


def upkeep_typed(layout: Layout, meta: TopicMetadata, leads: Callable[[int], bool],
                 retention_hours: int, dry_run: bool, progress: Callable[[str], None]
                 ) -> int:
    """Merge, vacuum and checkpoint the topic's typed and dead-letter tables; returns how
    many partitions were merged."""
    merged = 0
    for uri in (layout.typed_uri(meta.name), layout.dlq_uri(meta.name)):
        dt = open_table(uri)
        if dt is None:
            continue
        merged += _merge_small_files(dt, meta.partitions, leads, dry_run, progress)
        if dry_run or not leads(0):  # the table-wide work: the tierer of partition 0
            continue
        dt.vacuum(retention_hours=retention_hours, dry_run=False,
                  enforce_retention_duration=False, full=not is_local(uri))
        checkpoint_if_due(dt)
    return merged


def _merge_small_files(dt: DeltaTable, partitions: int, leads: Callable[[int], bool],
                       dry_run: bool, progress: Callable[[str], None]) -> int:
    actions = pa.table(dt.get_add_actions(flatten=True))
    counts = Counter(str(p) for p in actions.column("partition.partition").to_pylist()) \
        if actions.num_rows else Counter[str]()
    merged = 0
    for p in range(partitions):
        if counts.get(str(p), 0) <= SMALL_FILES or not leads(p):
            continue
        progress(f"{'would merge' if dry_run else 'merging'} {counts[str(p)]} files of "
                 f"{dt.table_uri} partition {p}")
        if dry_run:
            continue
        app, now = files_app_id(p), now_ms()
        guards = [Transaction(app, (dt.transaction_version(app) or 0) + 1, now)]
        for writer in (typed_app_id(p), dlq_app_id(p)):  # what the typed job moves
            if (version := dt.transaction_version(writer)) is not None:
                guards.append(Transaction(writer, version, now))
        try:
            dt.optimize.compact(partition_filters=[("partition", "=", str(p))],
                                target_size=TARGET_BYTES,
                                commit_properties=CommitProperties(app_transactions=guards))
            merged += 1
        except CommitFailedError:
            pass  # another merge (or a typed commit's MERGE) took them: the next upkeep
        dt.update_incremental()
    return merged
