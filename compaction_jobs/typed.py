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
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties, Transaction

from compaction_jobs.job import Led, TopicJob, step
from compaction_jobs.staging import clean_orphans
from log_tables.cold.job_runs import FAILED, SUCCEEDED, JobRun, now_ms
from log_tables.cold.table import PartitionState, open_table, read_files, snapshot, table_topic_id
from log_tables.errors import StaleTableError
from log_tables.layout import Layout
from log_tables.registry import TopicMetadata
from log_tables.storage import storage_options
from log_tables.typed.catalog import CLUSTER_WAIT_S, Catalog
from log_tables.typed.columns import META_FIELDS, META_NAMES, conform, dlq_app_id, typed_app_id
from log_tables.typed.decode import Decoded, Decoder, has_key_schema
from log_tables.typed.rows import Typed, type_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MAX_RUN_ROWS = 1_000_000
"""Records decoded and committed in one round, all partitions together (with
``MAX_RUN_BYTES``, what bounds the job's memory)."""
MAX_RUN_BYTES = 128 << 20
"""Parquet bytes of the topic's table read in one round."""
DECODE_THREADS = 2
DELETE_FLAG = "_lakelog_delete"
MODE_KEY = "mode="
"""In a typed table's description, after its topic id: the mode it was made for."""
UPSERT, TYPED = "upsert", "typed"


class Lost(Exception):
    """Another job moved the partition's typed offset first."""


class _Part:
    """One partition's progress through a run."""

    def __init__(self, version: int, start: int, began: int) -> None:
        self.version = version
        """The typed offset (app transaction) as last committed."""
        self.first = self.start = start
        self.began = began
        self.records_in = self.records_out = self.dead = self.skipped = 0
        self.stopped = False
        self.suspended: tuple[int, str] | None = None


class TypedJob(TopicJob):
    """Decode the tiered records of typed and upsert topics into their tables: per topic,
    rounds of at most ``MAX_RUN_ROWS`` records in all, each one dead-letter commit and
    one typed commit for every partition it moves."""

    name = "typed"

    def __init__(self, layout: Layout, topics: Iterable[str] | None = None, *,
                 progress: Callable[[str], None] | None = None, led: Led | None = None,
                 catalog: Catalog | None = None, orphan_min_age_s: float = 60.0) -> None:
        super().__init__(layout, topics, progress=progress, led=led,
                         orphan_min_age_s=orphan_min_age_s)
        # A broker alone holds the registry; a cluster's may lag it a moment.
        self.decoder = Decoder(catalog or Catalog(layout, None if led is None
                                                  else CLUSTER_WAIT_S))
        self.waiting: set[tuple[str, int]] = set()
        """Partitions that stopped at a schema id this replica does not hold yet."""

    def run_topic(self, meta: TopicMetadata,
                  spark: SparkSession | Callable[[], SparkSession] | None) -> list[JobRun]:
        if meta.config.delta_table_mode not in (TYPED, UPSERT):
            return []
        raw = open_table(self.layout.table_uri(meta.name))
        if raw is None or table_topic_id(raw) != meta.topic_id:
            return []  # nothing tiered yet (or a stale table, which tiering reports)
        states = snapshot(raw, meta.partitions)
        target = _open_target(self.layout.typed_uri(meta.name), meta)
        if target is not None:  # what a tiering job killed between its commits staged
            clean_orphans(self.layout.typed_uri(meta.name), target, self.orphan_min_age_s)
        made_as = _made_as(target)
        if made_as not in (None, meta.config.delta_table_mode):
            # Rows of a typed table are not one per key, nor an upsert table's a history.
            return [self.row(meta.name, None, now_ms(), FAILED, error=(
                f"{self.layout.typed_uri(meta.name)} was made for delta.table.mode="
                f"{made_as}, and the topic is now {meta.config.delta_table_mode}: set it back, "
                "or delete that table (and its dead-letter table) to make it again"))]
        versions = {p: _version(target, typed_app_id(p)) for p in range(meta.partitions)
                    if self.leads(meta.name, p)}
        parts = {p: _Part(v, max(v, states[p].start_offset), now_ms())
                 for p, v in versions.items()}
        while True:
            todo = {p: part for p, part in parts.items()
                    if not part.stopped and part.start < states[p].tiered_offset}
            if not todo:
                break
            target = self._round(meta, states, todo, target)
        return [run for p, part in parts.items() if (run := self._row(meta, p, part))]

    def _round(self, meta: TopicMetadata, states: list[PartitionState], todo: dict[int, _Part],
               target: DeltaTable | None) -> DeltaTable | None:
        config = meta.config
        upsert = config.delta_table_mode == UPSERT
        rows, nbytes = max(1, MAX_RUN_ROWS // len(todo)), MAX_RUN_BYTES // len(todo)
        fields = _value_fields(target)
        typed: dict[int, Typed] = {}
        ends = {p: _round_end(states[p], part.start, rows, nbytes) for p, part in todo.items()}

        with_keys = has_key_schema(self.decoder.catalog, meta.name, fields)

        def read(p: int) -> tuple[pa.Table, Decoded, Decoded | None]:
            raw = read_files(states[p].files, todo[p].start, ends[p])
            return (raw, self.decoder.decode(raw.column("value")),
                    self.decoder.decode(raw.column("key")) if with_keys else None)

        # Reading and decoding release the GIL (Arrow, polars): partitions side by side.
        with ThreadPoolExecutor(DECODE_THREADS) as pool:
            read_back = dict(zip(todo, pool.map(read, todo), strict=True))
        for p, part in todo.items():
            raw, decoded, keys = read_back[p]
            end = ends[p]
            t = type_rows(raw, p, end, decoded, fields, config.delta_errors_mode, upsert, keys)
            part.suspended = t.suspended
            part.stopped = t.suspended is not None or t.end < end  # waits for a schema
            if t.suspended is None and t.end < end:
                self.waiting.add((meta.name, p))
            part.records_in += raw.num_rows
            if t.end > part.start:
                typed[p] = t
                fields = t.fields
        step("typed-decoded")
        if not typed:
            return target
        try:
            if any(t.dlq.num_rows for t in typed.values()):
                self._dead_letters(meta, typed)
                step("dlq-committed")
            target = self._commit(meta, target, {p: todo[p].version for p in typed}, typed,
                                  fields, upsert)
        except Lost:
            self.progress(f"{meta.name}: another job moved its typed table first")
            for part in todo.values():
                part.stopped = True
            return _open_target(self.layout.typed_uri(meta.name), meta)
        step("typed-committed")
        for p, t in typed.items():
            part = todo[p]
            part.records_out += t.rows.num_rows
            part.dead += t.dlq.num_rows
            part.skipped += t.skipped
            part.start = part.version = t.end
        return target

    def _row(self, meta: TopicMetadata, p: int, part: _Part) -> JobRun | None:
        if part.start == part.first and part.suspended is None:
            return None
        detail = (f"typed offsets {part.first}..{part.start - 1}" if part.start > part.first
                  else "nothing typed")
        if part.dead:
            detail += f"; {part.dead} record(s) to the dead-letter table"
        if part.skipped:
            detail += f"; {part.skipped} record(s) skipped"
        counts = {"records_in": part.records_in, "records_out": part.records_out}
        if part.suspended is not None:
            offset, error = part.suspended
            return self.row(meta.name, p, part.began, FAILED, **counts, detail=detail,
                            error=f"suspended at offset {offset}: {error} (set "
                                  "delta.errors.mode to dlq or skip to go on)")
        return self.row(meta.name, p, part.began, SUCCEEDED, **counts, detail=detail)

    def _props(self, versions: dict[str, int]) -> CommitProperties:
        now = now_ms()
        return CommitProperties(
            app_transactions=[Transaction(app, v, now) for app, v in versions.items()],
            custom_metadata={"lakelog.job": self.name, "lakelog.jobId": self.job_id})

    def _dead_letters(self, meta: TopicMetadata, typed: dict[int, Typed]) -> None:
        """Each partition's dead letters not yet written (a run killed after this and
        before its typed commit wrote them), in one commit."""
        uri = self.layout.dlq_uri(meta.name)
        dlq = _open_target(uri, meta)
        rows, versions = [], {}
        for p, t in typed.items():
            since = _version(dlq, dlq_app_id(p))
            new = t.dlq.filter(pc.greater_equal(t.dlq.column("offset"), since))
            if new.num_rows:  # (a partition's version never moves back: a later round of
                rows.append(new)  # a rerun may end below where a killed one got to)
                versions[dlq_app_id(p)] = max(since, t.end)
        if not rows:
            return
        table = pa.concat_tables(rows)
        try:
            write_deltalake(dlq if dlq is not None else uri, table, mode="append",
                            partition_by=["partition"], commit_properties=self._props(versions),
                            description=f"lakelog topic_id={meta.topic_id}",
                            storage_options=storage_options(uri))
        except CommitFailedError:
            raise Lost from None

    def _commit(self, meta: TopicMetadata, target: DeltaTable | None, done: dict[int, int],
                typed: dict[int, Typed], fields: list[pa.Field], upsert: bool) -> DeltaTable:
        """One commit of every partition's rows with their new typed offsets, checked
        against the offsets they were planned on."""
        uri = self.layout.typed_uri(meta.name)
        schema = pa.schema(META_FIELDS + fields)
        rows = pa.concat_tables([_conform(t.rows, schema) for t in typed.values()])
        props = self._props({typed_app_id(p): t.end for p, t in typed.items()})
        if target is None:
            write_deltalake(uri, schema.empty_table() if upsert else rows, mode="append",
                            partition_by=["partition"],
                            description=f"lakelog topic_id={meta.topic_id} "
                                        f"{MODE_KEY}{UPSERT if upsert else TYPED}",
                            commit_properties=None if upsert else props,
                            storage_options=storage_options(uri))
            target = _open_target(uri, meta)
            assert target is not None
            if not upsert:
                return target
        if any(_version(target, typed_app_id(p)) != v for p, v in done.items()):
            raise Lost
        try:
            if not upsert:
                write_deltalake(target, rows, mode="append", schema_mode="merge",
                                partition_by=["partition"], commit_properties=props)
            elif not rows.num_rows:
                target.create_write_transaction([], "append", target.schema(),
                                                partition_by=["partition"],
                                                commit_properties=props)
            else:
                deletes = pa.chunked_array([t.deletes for t in typed.values()
                                            if t.deletes is not None], pa.bool_())
                _merge(target, sorted(typed), rows.append_column(DELETE_FLAG, deletes), props)
        except CommitFailedError:
            target.update_incremental()
            raise Lost from None
        target.update_incremental()
        return target


def _round_end(state: PartitionState, start: int, rows: int, nbytes: int) -> int:
    """Where a partition's round ends: after the whole files that fit in ``rows`` records
    and ``nbytes`` bytes (a file read in part is read again by the next round), or
    ``rows`` on when not even one does."""
    end, used = start, 0
    for f in state.files:
        if f.max_offset < start:
            continue
        if f.max_offset + 1 - start > rows or (used + f.size_bytes > nbytes and end > start):
            return end if end > start else min(start + rows, state.tiered_offset)
        end, used = f.max_offset + 1, used + f.size_bytes
    return state.tiered_offset  # every file to the end (past the last: a hole)


def _conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """A partition's rows with every column of ``schema`` (typed with fewer fields)."""
    if rows.schema == schema:
        return rows
    return pa.Table.from_arrays([
        conform(rows.column(f.name).combine_chunks(), f.type) if f.name in rows.column_names
        else pa.nulls(rows.num_rows, f.type) for f in schema], schema=schema)


def _merge(target: DeltaTable, partitions: list[int], source: pa.Table,
           props: CommitProperties) -> None:
    """The latest row of each key into its partition's rows: a delete flag deletes."""
    keep = f'NOT s."{DELETE_FLAG}"'
    within = ", ".join(map(str, partitions))
    (target.merge(source, f't."partition" IN ({within}) AND t."partition" = s."partition" '
                  f'AND t."key" = s."key"', source_alias="s", target_alias="t",
                  merge_schema=True, commit_properties=props)
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


def _made_as(dt: DeltaTable | None) -> str | None:
    """The mode a typed table was made for (None: no table, or one that does not say)."""
    words = (dt.metadata().description or "").split() if dt is not None else []
    return next((w.removeprefix(MODE_KEY) for w in words if w.startswith(MODE_KEY)), None)


def _version(dt: DeltaTable | None, app: str) -> int:
    return (dt.transaction_version(app) or 0) if dt is not None else 0


def _value_fields(dt: DeltaTable | None) -> list[pa.Field]:
    """The typed table's value columns (all but the metadata ones)."""
    if dt is None:
        return []
    schema = pa.schema(dt.schema().to_arrow())
    return [f for f in schema if f.name not in META_NAMES]
