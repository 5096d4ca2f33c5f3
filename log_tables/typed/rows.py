"""A run of a partition's log as typed rows, and the dead-letter rows of the records
that cannot be typed: pure functions over Arrow, for the job and the tests.

``delta.errors.mode`` decides what a record that cannot be typed does: ``dlq`` (a row of
the dead-letter table: offset, key, the raw value, the error), ``skip`` (counted,
passed over) or ``suspend`` (the run ends before it: the table waits at that offset,
the job reports it, until the record is dealt with, for example by ``dlq`` or ``skip``
set on the topic). A record whose schema id is not known here yet also ends the run,
quietly: a later run takes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from log_tables.cold.rows import TIMESTAMP_TYPE
from log_tables.records import HEADERS_TYPE
from log_tables.typed.columns import (
    META_FIELDS,
    TYPED_KEY,
    TypeConflict,
    as_columns,
    conform,
    merge_fields,
    merge_type,
    value_fields,
)
from log_tables.typed.decode import Decoded

DLQ_SCHEMA = pa.schema([
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp", TIMESTAMP_TYPE, nullable=False),
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("headers", HEADERS_TYPE),
    pa.field("error", pa.string(), nullable=False),
])
DLQ, SUSPEND, SKIP = "dlq", "suspend", "skip"


class Typed(NamedTuple):
    rows: pa.Table
    """Meta columns and the value columns of ``fields``, in offset order."""
    fields: list[pa.Field]
    """The table's value columns with this run's merged in."""
    deletes: pa.Array | None
    """Upsert: per row, whether it deletes its key (a tombstone); rows deduplicated by key."""
    dlq: pa.Table
    end: int
    """The offset this run covers up to (exclusive)."""
    skipped: int
    suspended: tuple[int, str] | None
    """(offset, error) of the record the partition waits at (``suspend``)."""


def type_rows(raw: pa.Table, partition: int, end: int, decoded: Decoded,
              table_fields: Sequence[pa.Field], errors_mode: str, upsert: bool,
              keys: Decoded | None = None) -> Typed:
    """Raw rows (the cold file columns, offsets ascending, up to ``end``) as typed rows;
    ``keys``: the keys decoded too (the topic has a key schema), into ``TYPED_KEY``."""
    offsets = raw.column("offset").to_numpy()
    errors = dict(decoded.errors)
    stop = len(offsets) if decoded.wait_at is None else decoded.wait_at
    fields = list(table_fields)
    typed_keys = None
    if keys is not None:
        typed_keys, fields = _typed_keys(keys, fields, len(offsets), errors)
        stop = min(stop, len(offsets) if keys.wait_at is None else keys.wait_at)
    parts: list[tuple[np.ndarray, pa.StructArray]] = []
    for group in sorted(decoded.groups, key=lambda g: int(g.rows[0]) if len(g.rows) else 0):
        if not len(group.rows):
            continue
        try:
            fields = merge_fields(fields, value_fields(group.values.type))
        except TypeConflict as exc:
            for row in group.rows.tolist():
                errors[row] = f"schema id {group.schema_id}: {exc}"
            continue
        parts.append((group.rows, as_columns(group.values)))
    if upsert:
        for row in np.flatnonzero(raw.column("key").is_null().to_numpy(zero_copy_only=False)):
            errors.setdefault(int(row), "an upsert table needs a key: this record has none")
    suspended = None
    if errors_mode == SUSPEND and errors:
        first = min(errors)
        if first < stop:
            stop, suspended = first, (int(offsets[first]), errors[first])
    bad = sorted(r for r in errors if r < stop)
    value_type = pa.struct(fields)
    pieces = [conform(cols, value_type) for _, cols in parts]
    if decoded.nulls:
        pieces.append(pa.nulls(len(decoded.nulls), value_type))
    order = np.concatenate([np.asarray(rows, np.int64) for rows, _ in parts]
                           + [np.asarray(decoded.nulls, np.int64)])
    keep = np.zeros(len(offsets), bool)
    keep[order] = True
    keep[np.asarray(list(errors), np.int64)] = False
    keep[stop:] = False
    good = np.flatnonzero(keep)
    values = (pa.concat_arrays(pieces) if pieces else pa.nulls(0, value_type))
    position = np.empty(len(offsets), np.int64)
    position[order] = np.arange(len(order))
    if len(good) != len(order) or not np.array_equal(position[good], np.arange(len(good))):
        values = values.take(pa.array(position[good]))  # (in offset order, the good only)
    meta = _meta(raw, partition, good)
    columns = meta + (values.flatten() if fields else [])
    schema = pa.schema(META_FIELDS + fields)
    if typed_keys is not None:  # (the value struct holds nulls there)
        columns[schema.get_field_index(TYPED_KEY)] = typed_keys.take(pa.array(good, pa.int64()))
    rows = pa.Table.from_arrays(columns, schema=schema)
    deletes = None
    if upsert:
        deleted = pc.is_null(raw.column("value").take(pa.array(good, pa.int64())))
        rows, deletes = _latest_per_key(rows, deleted)
    run_end = end if stop == len(offsets) else int(offsets[stop])
    dlq = (_dlq_rows(raw, partition, bad, errors) if errors_mode == DLQ
           else DLQ_SCHEMA.empty_table())
    return Typed(rows, fields, deletes, dlq, run_end, len(bad) if errors_mode == SKIP else 0,
                 suspended)


def _typed_keys(keys: Decoded, fields: list[pa.Field], n: int, errors: dict[int, str]
                ) -> tuple[pa.Array | None, list[pa.Field]]:
    """Every row's decoded key (null where it has none) as one array, and the fields with
    ``TYPED_KEY`` merged in; a key that does not decode fails its record."""
    for row, error in keys.errors.items():
        errors.setdefault(row, f"key: {error}")
    have = next((f.type for f in fields if f.name == TYPED_KEY), pa.null())
    key_type = have
    kept = []
    for group in keys.groups:
        try:
            key_type = merge_type(key_type, group.values.type, TYPED_KEY)
            kept.append(group)
        except TypeConflict as exc:
            for row in group.rows.tolist():
                errors.setdefault(row, f"key: schema id {group.schema_id}: {exc}")
    if pa.types.is_null(key_type):
        return None, fields
    order = np.concatenate([g.rows for g in kept]) if kept else np.zeros(0, np.int64)
    pieces = [conform(g.values, key_type) for g in kept]
    position = np.full(n, len(order), np.int64)  # rows without a key: the null at the end
    position[order] = np.arange(len(order))
    every = pa.concat_arrays([*pieces, pa.nulls(1, key_type)])
    merged = merge_fields(fields, [pa.field(TYPED_KEY, key_type)])
    return every.take(pa.array(position)), merged


def _meta(raw: pa.Table, partition: int, rows: np.ndarray) -> list[pa.Array]:
    every = len(rows) == raw.num_rows  # (rows are ascending: all of them, as they are)
    take = pa.array(rows, pa.int64())
    return [pa.array(np.full(len(rows), partition, np.int32)),
            *(raw.column(name).combine_chunks() if every else
              raw.column(name).take(take).combine_chunks()
              for name in ("offset", "timestamp", "key", "headers"))]


def _latest_per_key(rows: pa.Table, deletes: pa.Array) -> tuple[pa.Table, pa.Array]:
    """The last row of each key (rows are in offset order), with its delete flag."""
    keys = rows.column("key").to_pylist()
    last = {k: i for i, k in enumerate(keys)}
    keep = pa.array(sorted(last.values()), pa.int64())
    return rows.take(keep), deletes.take(keep)


def _dlq_rows(raw: pa.Table, partition: int, rows: Sequence[int], errors: dict[int, str]
              ) -> pa.Table:
    if not rows:
        return DLQ_SCHEMA.empty_table()
    take = pa.array(rows, pa.int64())
    return pa.Table.from_arrays(
        [pa.array(np.full(len(rows), partition, np.int32)),
         *(raw.column(name).take(take).combine_chunks()
           for name in ("offset", "timestamp", "key", "value", "headers")),
         pa.array([errors[r] for r in rows], pa.string())], schema=DLQ_SCHEMA)
