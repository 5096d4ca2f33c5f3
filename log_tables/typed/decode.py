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

import pyarrow as pa

from log_tables.typed.avro_arrow import AvroDecoder
from log_tables.typed.catalog import Catalog, NotYetKnown
from log_tables.typed.json_arrow import JsonDecoder
from log_tables.typed.proto_arrow import ProtoDecoder
from log_tables.typed.registry_state import Reference, Schema

MAGIC = 0
MAX_DECODERS = 1000


class FormatDecoder(Protocol):
    arrow_type: pa.DataType

    def decode_one(self, payload: bytes) -> Any: ...

    def to_arrow(self, values: list[Any]) -> pa.Array: ...


@dataclass
class Group:
    """The records of one schema id: their rows in the batch and their values."""

    schema_id: int
    rows: list[int]
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

    def decode(self, values: pa.Array) -> Decoded:
        out = Decoded()
        pending: dict[int, tuple[FormatDecoder, list[int], list[Any]]] = {}
        for row, raw in enumerate(values.to_pylist()):
            if raw is None:
                out.nulls.append(row)
                continue
            if len(raw) < 5 or raw[0] != MAGIC:
                out.errors[row] = ("the value is not in Confluent's wire format (magic byte 0 "
                                   "and a 4-byte schema id first)")
                continue
            schema_id = int.from_bytes(raw[1:5], "big")
            try:
                decoder = self.for_id(schema_id)
            except NotYetKnown:
                out.wait_at = row
                break
            if isinstance(decoder, str):
                out.errors[row] = decoder
                continue
            try:
                value = decoder.decode_one(raw[5:])
            except Exception as exc:  # the format library's own errors: the record's
                out.errors[row] = f"schema id {schema_id}: cannot decode: {_short(exc)}"
                continue
            entry = pending.setdefault(schema_id, (decoder, [], []))
            entry[1].append(row)
            entry[2].append(value)
        for schema_id, (decoder, rows, decoded) in pending.items():
            out.groups.append(_group(schema_id, decoder, rows, decoded, out.errors))
        return out


def _group(schema_id: int, decoder: FormatDecoder, rows: list[int], values: list[Any],
           errors: dict[int, str]) -> Group:
    try:
        return Group(schema_id, rows, decoder.to_arrow(values))
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
    return Group(schema_id, good_rows, decoder.to_arrow(good))


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:297] + "..."
