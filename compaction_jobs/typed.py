"""The typed tables' job: a topic's tiered records decoded into ``typed/<topic>``
(``delta.table.mode=typed``: a row per record) or merged into it (``upsert``: the
latest value per key, a tombstone deleting its key's row), exactly once.

The source is the topic's own Delta table (the log's cold tier), so the typed table
follows the log as tiering commits it, whoever tiered it. Per partition, the typed
table's app transaction ``lakelog-typed-<p>`` holds the offset it covers up to; a run
reads the raw rows from there to the tiered offset (``MAX_RUN_ROWS`` at a time),
decodes them (``log_tables.typed``: schemas from this data directory's replica of the
registry), and commits the rows with the new offset in one Delta commit, checked
against the offset it planned on (delta-rs refuses a commit whose app transaction
another commit moved meanwhile: the partition is left to the next run). The records
that cannot be decoded go first to the dead-letter table ``dlq/<topic>`` (its own app
transaction ``lakelog-dlq-<p>``, so a run killed between the two commits writes no
dead letter twice), or are skipped, or suspend the partition (``delta.errors.mode``).

Kill points (``step``): ``typed-decoded``, ``dlq-committed``, ``typed-committed``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties, Transaction

from compaction_jobs.job import Led, TopicJob, step
from log_tables.cold.job_runs import FAILED, SUCCEEDED, JobRun, now_ms
from log_tables.cold.table import PartitionState, open_table, read_files, snapshot, table_topic_id
from log_tables.errors import StaleTableError
from log_tables.layout import Layout
from log_tables.registry import TopicMetadata
from log_tables.storage import storage_options
from log_tables.typed.catalog import Catalog
from log_tables.typed.columns import META_NAMES, dlq_app_id, typed_app_id
from log_tables.typed.decode import Decoder
from log_tables.typed.rows import Typed, type_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MAX_RUN_ROWS = 200_000
"""Offsets of one partition decoded and committed at a time (bounds the job's memory)."""
DELETE_FLAG = "_lakelog_delete"
UPSERT, TYPED = "upsert", "typed"


class Lost(Exception):
    """Another job moved the partition's typed offset first."""


class TypedJob(TopicJob):
    """Decode the tiered records of typed and upsert topics into their tables."""

    name = "typed"

    def __init__(self, layout: Layout, topics: Iterable[str] | None = None, *,
                 progress: Callable[[str], None] | None = None, led: Led | None = None,
                 catalog: Catalog | None = None) -> None:
        super().__init__(layout, topics, progress=progress, led=led)
        self.decoder = Decoder(catalog or Catalog(layout))

    def run_topic(self, meta: TopicMetadata,
                  spark: SparkSession | Callable[[], SparkSession] | None) -> list[JobRun]:
        config = meta.config
        if config.delta_table_mode not in (TYPED, UPSERT):
            return []
        raw = open_table(self.layout.table_uri(meta.name))
        if raw is None or table_topic_id(raw) != meta.topic_id:
            return []  # nothing tiered yet (or a stale table, which tiering reports)
        states = snapshot(raw, meta.partitions)
        target = _open_target(self.layout.typed_uri(meta.name), meta)
        runs = []
        for p in range(meta.partitions):
            if self.leads(meta.name, p):
                run, target = self._partition(meta, p, states[p], target)
                if run is not None:
                    runs.append(run)
        return runs

    def _partition(self, meta: TopicMetadata, p: int, state: PartitionState,
                   target: DeltaTable | None) -> tuple[JobRun | None, DeltaTable | None]:
        began = now_ms()
        config = meta.config
        upsert = config.delta_table_mode == UPSERT
        done = _version(target, typed_app_id(p))
        start, first = max(done, state.start_offset), max(done, state.start_offset)
        records_in = records_out = dead = skipped = 0
        suspended: tuple[int, str] | None = None
        while start < state.tiered_offset and suspended is None:
            end = min(state.tiered_offset, start + MAX_RUN_ROWS)
            raw = read_files(state.files, start, end)
            decoded = self.decoder.decode(raw.column("value"))
            step("typed-decoded")
            typed = type_rows(raw, p, end, decoded, _value_fields(target),
                              config.delta_errors_mode, upsert)
            suspended = typed.suspended
            if typed.end <= start:
                break  # waits at its first record (a schema not known here yet, suspended)
            if typed.dlq.num_rows:
                self._dead_letters(meta, p, typed)
                step("dlq-committed")
            try:
                target = self._commit(meta, p, target, done, typed, upsert)
            except Lost:
                self.progress(f"{meta.name}-{p}: another job moved its typed table first")
                break
            step("typed-committed")
            records_in += raw.num_rows
            records_out += typed.rows.num_rows
            dead += typed.dlq.num_rows
            skipped += typed.skipped
            done = start = typed.end
            if typed.end < end:
                break  # waits for a schema
        if start == first and suspended is None:
            return None, target
        detail = (f"typed offsets {first}..{start - 1}" if start > first else "nothing typed")
        if dead:
            detail += f"; {dead} record(s) to the dead-letter table"
        if skipped:
            detail += f"; {skipped} record(s) skipped"
        if suspended is not None:
            offset, error = suspended
            return self.row(meta.name, p, began, FAILED, records_in=records_in,
                            records_out=records_out, detail=detail,
                            error=f"suspended at offset {offset}: {error} (set "
                                  "delta.errors.mode to dlq or skip to go on)"), target
        return self.row(meta.name, p, began, SUCCEEDED, records_in=records_in,
                        records_out=records_out, detail=detail), target

    def _props(self, app: str, version: int) -> CommitProperties:
        return CommitProperties(app_transactions=[Transaction(app, version, now_ms())],
                                custom_metadata={"lakelog.job": self.name,
                                                 "lakelog.jobId": self.job_id})

    def _dead_letters(self, meta: TopicMetadata, p: int, typed: Typed) -> None:
        uri = self.layout.dlq_uri(meta.name)
        dlq = _open_target(uri, meta)
        since = _version(dlq, dlq_app_id(p))
        rows = typed.dlq.filter(pa.compute.greater_equal(typed.dlq.column("offset"), since))
        if not rows.num_rows:
            return  # written by a run killed before its typed commit
        props = self._props(dlq_app_id(p), typed.end)
        try:
            write_deltalake(dlq if dlq is not None else uri, rows, mode="append",
                            partition_by=["partition"], commit_properties=props,
                            description=f"lakelog topic_id={meta.topic_id}",
                            storage_options=storage_options(uri))
        except CommitFailedError:
            raise Lost from None

    def _commit(self, meta: TopicMetadata, p: int, target: DeltaTable | None, done: int,
                typed: Typed, upsert: bool) -> DeltaTable:
        uri = self.layout.typed_uri(meta.name)
        props = self._props(typed_app_id(p), typed.end)
        if target is None:
            rows = typed.rows if not upsert else typed.rows.schema.empty_table()
            write_deltalake(uri, rows, mode="append", partition_by=["partition"],
                            description=f"lakelog topic_id={meta.topic_id}",
                            commit_properties=None if upsert else props,
                            storage_options=storage_options(uri))
            target = _open_target(uri, meta)
            assert target is not None
            if not upsert:
                return target
        if _version(target, typed_app_id(p)) != done:
            raise Lost
        try:
            if not upsert:
                write_deltalake(target, typed.rows, mode="append", schema_mode="merge",
                                partition_by=["partition"], commit_properties=props)
            elif not typed.rows.num_rows:
                target.create_write_transaction([], "append", target.schema(),
                                                partition_by=["partition"],
                                                commit_properties=props)
            else:
                _merge(target, p, typed, props)
        except CommitFailedError:
            target.update_incremental()
            raise Lost from None
        target.update_incremental()
        return target


def _merge(target: DeltaTable, p: int, typed: Typed, props: CommitProperties) -> None:
    """The latest row of each key into the partition's rows: a delete flag deletes."""
    assert typed.deletes is not None
    source = typed.rows.append_column(DELETE_FLAG, typed.deletes)
    keep = f'NOT s."{DELETE_FLAG}"'
    (target.merge(source, f't."partition" = {p} AND t."key" = s."key"', source_alias="s",
                  target_alias="t", merge_schema=True, commit_properties=props)
     .when_matched_delete(predicate=f's."{DELETE_FLAG}"')
     .when_matched_update_all(predicate=keep, except_cols=[DELETE_FLAG])
     .when_not_matched_insert_all(predicate=keep, except_cols=[DELETE_FLAG])
     .execute())


def _open_target(uri: str, meta: TopicMetadata) -> DeltaTable | None:
    """A typed or dead-letter table of the topic, or None; refuses one of an earlier
    topic of the same name."""
    dt = open_table(uri)
    if dt is not None and table_topic_id(dt) != meta.topic_id:
        raise StaleTableError(f"{uri} belongs to an earlier topic named {meta.name} (topic id "
                              f"{table_topic_id(dt)}, now {meta.topic_id}); delete that table")
    return dt


def _version(dt: DeltaTable | None, app: str) -> int:
    return (dt.transaction_version(app) or 0) if dt is not None else 0


def _value_fields(dt: DeltaTable | None) -> list[pa.Field]:
    """The typed table's value columns (all but the metadata ones)."""
    if dt is None:
        return []
    schema = pa.schema(dt.schema().to_arrow())
    return [f for f in schema if f.name not in META_NAMES]
