"""Typed rows written by the tiering job itself: the fast path of a typed topic
(``delta.table.mode=typed``; ``compaction_jobs.typed`` is the path that always works).

The tiering tasks hold each segment's rows in memory already; reading them back from the
topic's table to decode them costs as much again (docs/benchmarks.md). So where a
partition's typed table has caught up with its log's table (its typed offset is the
tiered offset the run starts from), each task also decodes the segment's values and
writes them as a typed file, and after the raw commit the job commits those files to
the typed table with the new typed offsets, in one commit checked against the offsets
it planned on. A segment is typed here only when it types cleanly: every record decodes,
no schema is new to this data directory's registry, and the table's columns do not
change. Anything else (and an upsert topic, whose rows need a MERGE) is left to the
typed job, which reads it from the log's table as always; so is everything when this job
is killed between its two commits, or its typed commit loses to another job.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import AddAction

from compaction_jobs.staging import Outputs, clean_orphans
from log_tables.cold.commit import PartitionChange, commit_changes
from log_tables.cold.table import open_table, table_topic_id
from log_tables.layout import Layout, is_local, local_path
from log_tables.registry import TopicMetadata
from log_tables.storage import filesystem, storage_options
from log_tables.typed.catalog import Catalog
from log_tables.typed.columns import META_FIELDS, META_NAMES, typed_app_id
from log_tables.typed.decode import Decoder, has_key_schema, table_fields
from log_tables.typed.rows import DLQ, type_rows

log = logging.getLogger(__name__)
MODE = "mode=typed"
"""What a typed table's description says after its topic id (``compaction_jobs.typed``)."""


class TypedWork(NamedTuple):
    """What a tiering task needs to type a segment."""

    data_dir: str
    fields: bytes
    """The typed table's value columns (an Arrow schema, IPC)."""
    path: str
    """Where the task writes the typed file (``Outputs.path``)."""
    final: str
    """Its name in the typed table (relative)."""
    keys: bool


class TypedStaged(NamedTuple):
    size_bytes: int
    """0: no record (nothing written)."""
    stats: str


class TypedPlan(NamedTuple):
    table: DeltaTable
    outputs: Outputs
    versions: dict[int, int]
    """The partitions typed here: their typed offset, equal to their tiered one."""
    fields: bytes
    keys: bool


_DECODERS: dict[str, Decoder] = {}
"""Per Spark worker process: schemas read once, then only what is new."""


Staged = tuple[TypedWork | None, TypedStaged | None, int, int]
"""A staged segment as the typed commit sees it: its typed work and file, where its raw
file ends and where its segment ends (``tier_tasks.StagedFile``, which imports this)."""


def type_segment(rows: Sequence[pa.RecordBatch], partition: int, end: int, work: TypedWork,
                 env: tuple[tuple[str, str], ...]) -> TypedStaged | None:
    """A segment's rows (cold rows, in offset order) as one typed file, or None when they do
    not type cleanly or anything fails (the typed job takes them: this never fails the
    tiering task)."""
    try:
        return _type_segment(rows, partition, end, work, env)
    except Exception:
        log.exception("typing %s in the tiering task failed: left to the typed job", work.path)
        return None


def _type_segment(rows: Sequence[pa.RecordBatch], partition: int, end: int, work: TypedWork,
                  env: tuple[tuple[str, str], ...]) -> TypedStaged | None:
    if not rows:
        return TypedStaged(0, "")
    decoder = _DECODERS.get(work.data_dir)
    if decoder is None:
        layout = Layout(work.data_dir, "")
        decoder = _DECODERS[work.data_dir] = Decoder(Catalog(layout, float("inf")))
    raw = pa.Table.from_batches(rows)
    decoded = decoder.decode(raw.column("value"))
    keys = decoder.decode(raw.column("key")) if work.keys else None
    if decoded.errors or decoded.wait_at is not None or (
            keys is not None and (keys.errors or keys.wait_at is not None)):
        return None
    fields = list(pa.ipc.read_schema(pa.py_buffer(work.fields)))
    typed = type_rows(raw, partition, end, decoded, fields, DLQ, False, keys)
    if typed.fields != fields or typed.rows.num_rows != raw.num_rows or typed.end != end:
        return None  # new columns (the typed job evolves the table), or rows left out
    table = typed.rows.drop_columns(["partition"])  # (a Delta partition column: in the path)
    # Dictionaries for the columns that repeat (the values', the timestamps), none for the
    # key, offset and headers columns: trying them cost a quarter of the write.
    dictionary = [f.name for f in fields] + ["timestamp"]
    options = {"compression": "snappy", "write_statistics": ["offset", "timestamp"],
               "use_dictionary": dictionary}
    if is_local(work.path):
        pq.write_table(table, local_path(work.path), **options)
        size = os.path.getsize(local_path(work.path))
    else:
        fs, path = filesystem(work.path, env or None)
        pq.write_table(table, path, filesystem=fs, **options)
        size = int(fs.get_file_info(path).size)
    offsets = table.column("offset")
    stats = json.dumps({"numRecords": table.num_rows,
                        "minValues": {"offset": offsets[0].as_py()},
                        "maxValues": {"offset": offsets[-1].as_py()}, "nullCount": {}})
    return TypedStaged(size, stats)


def plan_typed(layout: Layout, meta: TopicMetadata, tiered: dict[int, int], job_id: str,
               orphan_min_age_s: float) -> TypedPlan | None:
    """The partitions of a typed topic whose typed table is caught up (made here, empty,
    with the columns of the newest schemas, when the topic has none yet); None when there
    are none, or when anything fails (the typed job types them: this never fails tiering)."""
    if meta.config.delta_table_mode != "typed":
        return None
    try:
        return _plan_typed(layout, meta, tiered, job_id, orphan_min_age_s)
    except Exception:
        log.exception("planning the typed rows of %s in the tiering job failed: left to the "
                      "typed job", meta.name)
        return None


def _plan_typed(layout: Layout, meta: TopicMetadata, tiered: dict[int, int], job_id: str,
                orphan_min_age_s: float) -> TypedPlan | None:
    uri = layout.typed_uri(meta.name)
    dt = open_table(uri)
    if dt is None:
        _, fields = table_fields(layout, meta.name)
        write_deltalake(uri, pa.schema(META_FIELDS + fields).empty_table(), mode="append",
                        partition_by=["partition"],
                        description=f"lakelog topic_id={meta.topic_id} {MODE}",
                        storage_options=storage_options(uri))
        dt = open_table(uri)
    description = (dt.metadata().description or "").split() if dt is not None else []
    if dt is None or table_topic_id(dt) != meta.topic_id or \
            any(w.startswith("mode=") and w != MODE for w in description):
        return None  # (a table made before modes were written down says none: typed)
    clean_orphans(uri, dt, orphan_min_age_s)
    versions = {p: t for p, t in tiered.items() if (dt.transaction_version(typed_app_id(p))
                                                    or 0) == t}
    if not versions:
        return None
    fields = [f for f in pa.schema(dt.schema().to_arrow()) if f.name not in META_NAMES]
    keys = has_key_schema(Catalog(layout), meta.name, fields)
    return TypedPlan(dt, Outputs(uri, job_id), versions,
                     pa.schema(fields).serialize().to_pybytes(), keys)


def work_for(plan: TypedPlan | None, layout: Layout, partition: int, start: int, end: int,
             final: str) -> TypedWork | None:
    """The typed part of a segment's work (None: the typed job types it)."""
    if plan is None or partition not in plan.versions:
        return None
    return TypedWork(layout.data_dir, plan.fields,
                     plan.outputs.path(f"typed-p{partition}-{start:020d}-{end:020d}.parquet",
                                       final), final, plan.keys)


def commit_typed(plan: TypedPlan, staged: dict[int, list[Staged]], committed: set[int],
                 job_id: str) -> int:
    """After the raw commit: each committed partition's typed files, from its typed
    offset on while they are whole, in one commit; returns the partitions typed. The
    typed files no commit took are deleted; a failure is logged, never raised (the typed
    job types those records from the log's table)."""
    finals: dict[str, str] = {}
    taken: set[str] = set()
    try:
        changes = _changes(plan, staged, committed, finals)
        taken = set(finals.values())
        if not changes:
            return 0
        plan.outputs.move_in(finals)
        done, lost = commit_changes(
            plan.table, changes, "tier", job_id, own_schema=True)
        taken -= {a.path for c in lost for a in c.adds}
        return len(done)
    except Exception:
        # Whether the commit went in is not known: nothing is deleted (an orphan at worst,
        # never a committed file); the typed job types what is not in the table.
        log.exception("committing the typed rows of %s failed: left to the typed job",
                      plan.outputs.uri)
        taken = _written(staged)
        return 0
    finally:
        if _written(staged) - taken:  # (a stage directory goes as a whole; direct writes
            plan.outputs.discard(sorted(_written(staged) - taken))  # do not)


def _written(staged: dict[int, list[Staged]]) -> set[str]:
    return {w.final for files in staged.values() for w, t, _, _ in files
            if w is not None and t is not None and t.size_bytes}


def _changes(plan: TypedPlan, staged: dict[int, list[Staged]], committed: set[int],
             finals: dict[str, str]) -> list[PartitionChange]:
    changes = []
    now = int(time.time() * 1000)
    for p in sorted(committed & set(plan.versions)):
        taken: list[tuple[TypedWork, TypedStaged, int]] = []
        for work, typed, end, segment_end in staged.get(p, []):
            if work is None or typed is None or end != segment_end:
                break  # the rest is the typed job's
            taken.append((work, typed, end))
        if not taken:
            continue
        finals.update({w.path: w.final for w, t, _ in taken if t.size_bytes})
        changes.append(PartitionChange(
            p, [AddAction(w.final, t.size_bytes, {"partition": str(p)}, now, True, t.stats)
                for w, t, _ in taken if t.size_bytes],
            [], {typed_app_id(p): taken[-1][2]}, {typed_app_id(p): plan.versions[p]}))
    return changes
