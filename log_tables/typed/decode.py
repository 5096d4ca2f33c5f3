"""Values in Confluent's wire format (magic byte 0, a 4-byte schema id, the payload)
decoded into Arrow, batch by batch, with each record that cannot be decoded named.

Per schema id a decoder is made once (Avro: ``avro_arrow``, JSON Schema:
``json_arrow``, Protobuf: ``proto_arrow``); a batch's records are grouped by id and each group becomes one Arrow
array of that schema's type. A record fails alone (its bytes are not in the wire format,
its schema is deleted or has no table shape, its payload does not decode or fit its
type); a record whose schema id this replica of the registry does not hold yet stops
the batch there (``Decoded.wait_at``): the job takes it on a later run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from log_tables.cold.table import open_table
from log_tables.layout import Layout
from log_tables.typed.avro_arrow import AvroDecoder
from log_tables.typed.catalog import Catalog, NotYetKnown
from log_tables.typed.columns import META_NAMES, TYPED_KEY, TypeConflict, merge_fields, value_fields
from log_tables.typed.json_arrow import JsonDecoder
from log_tables.typed.proto_arrow import ProtoDecoder
from log_tables.typed.registry_state import Reference, Schema

MAGIC = 0
SUBJECT = "{}-value"
"""The topic's value subject (TopicNameStrategy)."""
MAX_DECODERS = 1000


class FormatDecoder(Protocol):
    """A schema's decoder; it may also have ``decode_many(payloads) -> pa.Array | None``
    (many at once; None: one by one)."""

    arrow_type: pa.DataType

    def decode_one(self, payload: bytes) -> Any: ...

    def to_arrow(self, values: list[Any]) -> pa.Array: ...


@dataclass
class Group:
    """The records of one schema id: their rows in the batch and their values."""

    schema_id: int
    rows: np.ndarray
    """Ascending row numbers (int64)."""
    values: pa.Array


@dataclass
class Decoded:
    groups: list[Group] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)
    """Row → why it cannot be decoded."""
    nulls: list[int] = field(default_factory=list)
    """Rows whose value is null (tombstones)."""
    wait_at: int | None = None
    """The first row whose schema is not known here yet: rows from it on are not decoded."""


class Decoder:
    """Decodes values with the schemas of a ``Catalog``."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._by_id: dict[int, FormatDecoder | str] = {}

    def for_id(self, schema_id: int) -> FormatDecoder | str:
        """The decoder of a schema id, or why there is none (``NotYetKnown`` raised)."""
        found = self._by_id.get(schema_id)
        if found is not None:
            return found
        made: FormatDecoder | str
        try:
            made = self._make(self.catalog.schema(schema_id))
        except NotYetKnown:
            raise
        except (LookupError, ValueError, TypeError) as exc:
            made = f"schema id {schema_id}: {exc}"
        if len(self._by_id) >= MAX_DECODERS:
            self._by_id.clear()
        self._by_id[schema_id] = made
        return made

    def _make(self, schema: Schema) -> FormatDecoder:
        if schema.schema_type == "AVRO":
            return AvroDecoder(schema, self._references(schema, set()))
        if schema.schema_type == "JSON":
            return JsonDecoder(schema, dict(self._named(schema, set())))
        if schema.schema_type == "PROTOBUF":
            return ProtoDecoder(schema, dict(self._named(schema, set())))
        raise ValueError(f"{schema.schema_type} values are not decoded into tables")

    def _references(self, schema: Schema, seen: set[Reference]) -> list[Schema]:
        return [used for _, used in self._named(schema, seen)]

    def _named(self, schema: Schema, seen: set[Reference]) -> list[tuple[str, Schema]]:
        """The schemas ``schema`` refers to (theirs first), with the names it uses."""
        out: list[tuple[str, Schema]] = []
        for ref in schema.references:
            if ref in seen:
                continue
            seen.add(ref)
            used = self.catalog.reference(ref)
            out += self._named(used, seen)
            out.append((ref.name, used))
        return out

    def decode(self, values: pa.Array | pa.ChunkedArray) -> Decoded:
        out = Decoded()
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if values.type != pa.binary():
            values = values.cast(pa.binary())
        ids, framed = schema_ids(values)
        if values.null_count:
            valid = values.is_valid().to_numpy(zero_copy_only=False)
            out.nulls = np.flatnonzero(~valid).tolist()
        else:
            valid = np.ones(len(values), bool)
        for row in np.flatnonzero(valid & ~framed):
            out.errors[int(row)] = ("the value is not in Confluent's wire format (magic byte "
                                    "0 and a 4-byte schema id first)")
        uniform = bool(len(ids)) and ids[0] >= 0 and bool((ids == ids[0]).all())  # (the usual)
        decoders: dict[int, FormatDecoder | str] = {}
        for schema_id in ([int(ids[0])] if uniform else np.unique(ids[framed]).tolist()):
            try:
                decoders[schema_id] = self.for_id(schema_id)
            except NotYetKnown:
                first = int(np.flatnonzero(framed & (ids == schema_id))[0])
                out.wait_at = first if out.wait_at is None else min(out.wait_at, first)
        stop = len(values) if out.wait_at is None else out.wait_at
        out.nulls = [r for r in out.nulls if r < stop]
        for schema_id, decoder in decoders.items():
            rows = (np.arange(len(ids), dtype=np.int64) if uniform else
                    np.flatnonzero(framed & (ids == schema_id)).astype(np.int64))
            rows = rows[:stop] if uniform else rows[rows < stop]
            if not len(rows):
                continue
            if isinstance(decoder, str):
                out.errors.update((int(r), decoder) for r in rows)
                continue
            # (an open-ended binary_slice fails on large arrays in pyarrow 26: a stop is given)
            ours = values if len(rows) == len(values) else values.take(pa.array(rows))
            payloads = pc.binary_slice(ours, 5, 2**31 - 1)
            many = getattr(decoder, "decode_many", None)
            block = many(payloads) if many is not None else None
            if block is not None:
                out.groups.append(Group(schema_id, rows, block))
                continue
            good, decoded = [], []
            for row, raw in zip(rows.tolist(), payloads.to_pylist(), strict=True):
                try:
                    decoded.append(decoder.decode_one(raw))
                    good.append(row)
                except Exception as exc:  # the format library's own errors: the record's
                    out.errors[row] = f"schema id {schema_id}: cannot decode: {_short(exc)}"
            out.groups.append(_group(schema_id, decoder, good, decoded, out.errors))
        out.groups.sort(key=lambda g: int(g.rows[0]) if len(g.rows) else 0)
        return out


def has_key_schema(catalog: Catalog, topic: str, fields: list[pa.Field]) -> bool:
    """Whether a topic's keys are decoded too: its key subject (``<topic>-key``) has a
    version, or its typed table has the column already."""
    return any(f.name == TYPED_KEY for f in fields) or \
        catalog.latest(f"{topic}-key") is not None


def schema_ids(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Per value: its schema id, and whether it is framed (magic byte 0, 5 bytes or more)."""
    n = len(values)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    offsets = np.frombuffer(values.buffers()[1], np.int32)[values.offset:values.offset + n + 1]
    starts = offsets[:-1]
    framed = np.diff(offsets) >= 5
    if values.null_count:  # (a null's slot may span bytes)
        framed &= values.is_valid().to_numpy(zero_copy_only=False)
    data = np.frombuffer(values.buffers()[2] or b"\0" * 5, np.uint8)
    last = len(data) - 1
    first, *id_bytes = (data[np.minimum(starts + i, last)] for i in range(5))
    framed &= first == MAGIC
    ids = np.zeros(n, np.int64)
    for byte in id_bytes:  # (big-endian)
        ids = (ids << 8) | byte
    return np.where(framed, ids, -1), framed


def _group(schema_id: int, decoder: FormatDecoder, rows: list[int], values: list[Any],
           errors: dict[int, str]) -> Group:
    try:
        return Group(schema_id, np.asarray(rows, np.int64), decoder.to_arrow(values))
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        pass
    good_rows, good = [], []
    for row, value in zip(rows, values, strict=True):  # find the records that do not fit
        try:
            decoder.to_arrow([value])
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
            errors[row] = f"schema id {schema_id}: does not fit its columns: {_short(exc)}"
            continue
        good_rows.append(row)
        good.append(value)
    return Group(schema_id, np.asarray(good_rows, np.int64), decoder.to_arrow(good))


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:297] + "..."


def table_fields(layout: Layout, topic: str, version: int | str | None = None,
                 latest: bool = True) -> tuple[Any, list[pa.Field]]:
    """The typed table (or None) and its value columns, with the newest schema of the
    topic's value subject merged in (``latest``)."""
    dt = open_table(layout.typed_uri(topic), version)
    fields = [] if dt is None else [f for f in pa.schema(dt.schema().to_arrow())
                                    if f.name not in META_NAMES]
    if latest:
        catalog = Catalog(layout)
        def key_fields(t: pa.DataType) -> list[pa.Field]:
            return [pa.field(TYPED_KEY, t)]
        for subject, as_fields in ((SUBJECT.format(topic), value_fields),
                                   (f"{topic}-key", key_fields)):
            found = catalog.latest(subject)
            if found is None:
                continue
            try:
                decoder = Decoder(catalog).for_id(found[0])
                if not isinstance(decoder, str):
                    fields = merge_fields(fields, as_fields(decoder.arrow_type))
            except (LookupError, TypeConflict):
                pass  # the table's columns, as they are
    return dt, fields
