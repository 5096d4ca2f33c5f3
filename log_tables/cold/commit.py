"""Guarded commits to a topic's Delta table: files added and removed per partition,
with the partition's app transactions checked and advanced in the same commit.

delta-rs does not enforce app-transaction versions by itself (FINDINGS.md): a
commit is guarded by checking the versions on the handle that planned it and
committing on that same handle, so a racing writer's commit turns ours into a
``CommitFailedError``. Then the handle is refreshed, partitions whose versions
moved are given up (the caller re-plans them) and the rest is retried.

Several writers (a cluster's brokers, each on the partitions it leads) commit to one
table: commits that touch other partitions' app transactions and files do not conflict,
and delta-rs rebases ours onto theirs by itself. Each commit records the version it was
planned on (``lakelog.readVersion``): a commit at a later version than that plus one was
rebased past another writer's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from deltalake import DeltaTable, Schema
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

from log_tables.cold.rows import TABLE_SCHEMA
from log_tables.cold.table import (
    PARTITION_COLUMNS,
    ColdFile,
    PartitionState,
    create_table,
    files_app_id,
    open_table,
    snapshot,
    start_app_id,
    table_topic_id,
)
from log_tables.errors import StaleTableError, StorageError
from log_tables.layout import delta_path

MAX_COMMIT_ATTEMPTS = 8
"""Commits that lost to another writer's on the same partitions, then retried; delta-rs
itself retries (rebases) a commit that only raced commits on other partitions."""
READ_VERSION = "lakelog.readVersion"


class PartitionChange(NamedTuple):
    """What one commit does to one partition."""

    partition: int
    adds: Sequence[AddAction]
    removes: Sequence[ColdFile]
    set_versions: dict[str, int]
    """App transaction id → its new version."""
    expect_versions: dict[str, int]
    """App transaction id → the version it must still have (0: never set)."""


def relative_path(table_uri: str, path: str) -> str:
    """A data file's path relative to its table (as add and remove actions hold it)."""
    root = delta_path(table_uri).rstrip("/") + "/"
    path = delta_path(path)
    return path[len(root):] if path.startswith(root) else path


def commit_changes(dt: DeltaTable, changes: Sequence[PartitionChange], job: str, job_id: str,
                   *, data_change: bool = True,
                   on_lost: Callable[[PartitionChange], None] | None = None,
                   whole: bool = False, own_schema: bool = False
                   ) -> tuple[list[PartitionChange], list[PartitionChange]]:
    """Commit ``changes`` in one Delta commit on ``dt``; returns (committed, lost).

    A partition is lost when one of its expected versions is no longer current (another
    job committed to it first); ``on_lost`` is called for each (to delete its new files).
    ``whole``: one partition lost loses them all (the changes hold transactions that must
    not reach the table in part: what is left, planned on another job's table, may
    hold part of one that job tiered whole elsewhere). ``own_schema``: commit with the
    table's schema as of each attempt (a typed table's, which another job may widen
    meanwhile), not a topic table's.
    """
    live = {c.partition: c for c in changes}
    lost: list[PartitionChange] = []
    planned_on = dt.version()  # kept across retries: a rebase shows as a later commit version
    for _attempt in range(MAX_COMMIT_ATTEMPTS):
        for p, change in list(live.items()):
            if any((dt.transaction_version(app) or 0) != v
                   for app, v in change.expect_versions.items()):
                lost.append(live.pop(p))
                if on_lost is not None:
                    on_lost(change)
        if lost and whole:
            for change in live.values():
                lost.append(change)
                if on_lost is not None:
                    on_lost(change)
            live.clear()
        if not live:
            return [], lost
        now_ms = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = []
        txns: list[Transaction] = []
        for c in live.values():
            actions += c.adds
            actions += [RemoveAction(relative_path(dt.table_uri, f.path), data_change, now_ms,
                                     f.size_bytes, {"partition": str(f.partition)})
                        for f in c.removes]
            txns += [Transaction(app, v, now_ms) for app, v in c.set_versions.items()]
        try:
            dt.create_write_transaction(
                actions, "append", dt.schema() if own_schema else Schema.from_arrow(TABLE_SCHEMA),
                partition_by=PARTITION_COLUMNS,
                commit_properties=CommitProperties(
                    app_transactions=txns,
                    custom_metadata={"lakelog.job": job, "lakelog.jobId": job_id,
                                     READ_VERSION: str(planned_on)}))
        except CommitFailedError:
            dt.update_incremental()
            continue
        dt.update_incremental()
        return list(live.values()), lost
    raise StorageError(f"{dt.table_uri}: {job} commit failed {MAX_COMMIT_ATTEMPTS} times in a "
                       "row; rerun the job")


def start_change(state: PartitionState, partition: int, new_start: int) -> PartitionChange:
    """Move a partition's log start to ``new_start``: whole files below it go; a file that
    straddles it stays (readers skip its rows below the log start)."""
    doomed = [f for f in state.files if f.max_offset < new_start]
    versions = {start_app_id(partition): new_start}
    if doomed:
        versions[files_app_id(partition)] = state.files_version + 1
    return PartitionChange(partition, [], doomed, versions,
                           {start_app_id(partition): state.start_offset,
                            files_app_id(partition): state.files_version})


def open_topic_table(uri: str, topic: str, topic_id: str) -> DeltaTable:
    """The topic's table, created when missing; refuses a table of an earlier topic."""
    dt = open_table(uri)
    if dt is None:
        create_table(uri, topic_id)
        dt = open_table(uri)
        if dt is None:
            raise StorageError(f"{uri}: table missing right after creating it")
    found = table_topic_id(dt)
    if found != topic_id:
        raise StaleTableError(f"{uri} belongs to an earlier topic named {topic} (topic id {found}, "
                           f"now {topic_id}); delete that table")
    return dt


def delete_records(uri: str, topic: str, topic_id: str, partitions: int,
                   targets: dict[int, int], job_id: str) -> dict[int, int]:
    """Kafka's DeleteRecords on the Delta tier: move each partition's log start up to its
    target offset (never down) in one commit; returns the new log start per partition.

    The hot tier follows (``PartitionLog.delete_records``); the caller checks the
    targets against the high watermark."""
    dt = open_topic_table(uri, topic, topic_id)
    for _attempt in range(MAX_COMMIT_ATTEMPTS):
        states = snapshot(dt, partitions)
        changes = [start_change(states[p], p, offset) for p, offset in targets.items()
                   if offset > states[p].start_offset]
        if not changes:
            return {p: max(states[p].start_offset, 0) for p in targets}
        _, lost = commit_changes(dt, changes, "delete-records", job_id)
        if not lost:
            states = snapshot(dt, partitions)
            return {p: states[p].start_offset for p in targets}
        dt.update_incremental()
    raise StorageError(f"{uri}: DeleteRecords lost to other jobs' commits "
                       f"{MAX_COMMIT_ATTEMPTS} times in a row; retry")
