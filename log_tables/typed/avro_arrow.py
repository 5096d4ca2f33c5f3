"""Avro values as Arrow columns: a schema's Arrow type, and records decoded into it.

The types are those Spark's ``from_avro`` gives, with two choices so that Avro's own
promotions never need a table rewritten: ``int`` is a 64-bit integer (``long``'s
column takes a writer's ``int``), ``float`` a double. Records are structs, arrays
lists, maps ``map<string, T>``, enums strings, fixed bytes; a union of null and one type
is that type (nullable), a union of several types a struct of ``member0``,
``member1``... (one set). Logical types: ``timestamp-*`` timestamps (UTC),
``local-timestamp-*`` timestamps without a zone, ``date`` dates, ``decimal`` decimals,
``uuid`` strings; the ``time-*`` types stay integers (Spark has no time of day). A
recursive record has no table shape and is refused.

Decoding is many records at a time where polars reads the schema (``avro_block``), and
otherwise fastavro's ``schemaless_reader`` per record, read with the logical types taken
off (plain numbers) and cast to them column-wise after, except decimals.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from typing import Any

import fastavro
import pyarrow as pa

from log_tables.typed.avro_block import BlockDecoder
from log_tables.typed.registry_state import Schema

UNION_MEMBER = "member{}"
PRIMITIVE = {"null": pa.null(), "boolean": pa.bool_(), "int": pa.int64(), "long": pa.int64(),
             "float": pa.float64(), "double": pa.float64(), "bytes": pa.binary(),
             "string": pa.string()}
TIMESTAMPS = {"timestamp-millis": ("ms", "UTC"), "timestamp-micros": ("us", "UTC"),
              "timestamp-nanos": ("ns", "UTC"), "local-timestamp-millis": ("ms", None),
              "local-timestamp-micros": ("us", None), "local-timestamp-nanos": ("ns", None)}


class UnsupportedSchema(ValueError):
    """A schema with no table shape (a recursive record, say)."""


Normalize = Callable[[Any], Any]


class AvroShape:
    """How one Avro schema's values become Arrow: the type read with (``raw``), the
    type of the column (``final``), and a per-value fix-up (unions of several types)."""

    def __init__(self, parsed: Any, named: dict[str, Any]) -> None:
        self.named = named
        self._open: set[str] = set()
        self.raw, self.final, self.normalize = self._shape(parsed)

    def _shape(self, s: Any) -> tuple[pa.DataType, pa.DataType, Normalize | None]:
        if isinstance(s, str):
            if s in PRIMITIVE:
                return PRIMITIVE[s], PRIMITIVE[s], None
            if s in self._open:
                raise UnsupportedSchema(f"record {s} contains itself: a recursive schema has "
                                        "no table shape")
            return self._shape(self.named[s])
        if isinstance(s, list):
            return self._union(s)
        kind = s["type"]
        logical = s.get("logicalType")
        if kind == "record" or kind == "error":
            return self._record(s)
        if kind == "enum":
            return pa.string(), pa.string(), None
        if kind == "array":
            raw, final, norm = self._shape(s["items"])
            return (pa.list_(raw), pa.list_(final),
                    None if norm is None else lambda v, n=norm: None if v is None else [
                        n(x) for x in v])
        if kind == "map":
            raw, final, norm = self._shape(s["values"])
            return (pa.map_(pa.string(), raw), pa.map_(pa.string(), final),
                    (lambda v: None if v is None else list(v.items())) if norm is None else
                    lambda v, n=norm: None if v is None else [(k, n(x)) for k, x in v.items()])
        if logical == "decimal":
            t = pa.decimal128(int(s["precision"]), int(s.get("scale", 0)))
            return t, t, None
        if kind == "fixed":
            return pa.binary(), pa.binary(), None
        if logical in TIMESTAMPS and kind == "long":
            unit, tz = TIMESTAMPS[logical]  # Delta keeps microseconds
            return pa.timestamp(unit, tz), pa.timestamp("us", tz), None
        if logical == "date" and kind == "int":
            return pa.date32(), pa.date32(), None
        if isinstance(kind, str) and kind in PRIMITIVE:
            return PRIMITIVE[kind], PRIMITIVE[kind], None
        return self._shape(kind)

    def _record(self, s: dict[str, Any]) -> tuple[pa.DataType, pa.DataType, Normalize | None]:
        name = s["name"]
        self._open.add(name)
        try:
            shapes = [(f["name"], *self._shape(f["type"])) for f in s["fields"]]
        finally:
            self._open.discard(name)
        fixes = [(n, norm) for n, _, _, norm in shapes if norm is not None]

        def fix(v: Any) -> Any:
            if v is None:
                return None
            v = dict(v)
            for n, norm in fixes:
                v[n] = norm(v.get(n))
            return v

        return (pa.struct([pa.field(n, raw) for n, raw, _, _ in shapes]),
                pa.struct([pa.field(n, final) for n, _, final, _ in shapes]),
                fix if fixes else None)

    def _union(self, branches: list[Any]) -> tuple[pa.DataType, pa.DataType, Normalize | None]:
        real = [b for b in branches if b != "null"]
        if not real:
            return pa.null(), pa.null(), None
        if len(real) == 1:
            raw, final, norm = self._shape(real[0])
            if _branch_name(real[0], self.named) is None:
                return raw, final, norm

            def untag(v: Any, n: Normalize | None = norm) -> Any:
                if isinstance(v, tuple):  # a named type comes as (name, value)
                    v = v[1]
                return n(v) if n is not None else v
            return raw, final, untag
        shapes = [self._shape(b) for b in real]
        names = [_branch_name(b, self.named) for b in real]
        members = [UNION_MEMBER.format(i) for i in range(len(real))]
        checks = [_matcher(b) for b in real]

        def pick(v: Any) -> Any:
            if v is None:
                return None
            if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str):
                for i, name in enumerate(names):  # a named branch: chosen by its name
                    if name == v[0]:
                        norm = shapes[i][2]
                        return {members[i]: norm(v[1]) if norm else v[1]}
            for i, check in enumerate(checks):
                if check(v):
                    norm = shapes[i][2]
                    return {members[i]: norm(v) if norm else v}
            raise ValueError(f"a value of type {type(v).__name__} fits no branch of the union")

        return (pa.struct([pa.field(m, raw) for m, (raw, _, _) in zip(members, shapes, strict=True)]),
                pa.struct([pa.field(m, final) for m, (_, final, _) in zip(members, shapes, strict=True)]),
                pick)


def _branch_name(branch: Any, named: dict[str, Any]) -> str | None:
    """The full name of a named branch (record, enum, fixed: fastavro tags their values
    in a union, ``return_named_type``); None for the others."""
    if isinstance(branch, str):
        return branch if branch in named else None
    if isinstance(branch, dict) and branch.get("type") in ("record", "error", "enum", "fixed"):
        return str(branch["name"])
    return None


def _matcher(branch: Any) -> Callable[[Any], bool]:
    """Whether an untagged value is of this (unnamed) branch: Python's types, with bool
    apart from int and int apart from float (a double branch's values are floats)."""
    kind = branch if isinstance(branch, str) else branch.get("type")
    if kind in ("int", "long"):
        return lambda v: isinstance(v, int) and not isinstance(v, bool)
    python: tuple[type, ...] = {"boolean": (bool,), "float": (float,), "double": (float,),
                                "bytes": (bytes,), "string": (str,), "array": (list,),
                                "map": (dict,)}.get(str(kind), ())
    return lambda v: isinstance(v, python)


def _plain(s: Any) -> Any:
    """The schema read with: logical types taken off (but decimal's, whose bytes only
    fastavro turns into numbers)."""
    if isinstance(s, list):
        return [_plain(b) for b in s]
    if isinstance(s, dict):
        return {k: _plain(v) if k in ("type", "items", "values", "fields") else v
                for k, v in s.items() if k != "logicalType" or v == "decimal"}
    return s


class AvroDecoder:
    """Decodes Confluent-framed Avro payloads (the bytes after the schema id) of one
    schema id into Arrow."""

    def __init__(self, schema: Schema, references: Sequence[Schema]) -> None:
        named: dict[str, Any] = {}
        for used in references:
            fastavro.parse_schema(json.loads(used.text), named_schemas=named)
        parsed = fastavro.parse_schema(json.loads(schema.text), named_schemas=named)
        self.shape = AvroShape(parsed, named)
        plain_named: dict[str, Any] = {}
        for used in references:
            fastavro.parse_schema(_plain(json.loads(used.text)), named_schemas=plain_named)
        self.reader = fastavro.parse_schema(_plain(json.loads(schema.text)),
                                            named_schemas=plain_named)
        self.arrow_type = self.shape.final
        doc = json.loads(schema.text)
        self.block = BlockDecoder(doc, {}, self.arrow_type) if not references and \
            BlockDecoder.usable(doc, {}) else None

    def decode_one(self, payload: bytes) -> Any:
        value = fastavro.schemaless_reader(io.BytesIO(payload), self.reader, None,
                                           return_named_type=True)
        norm = self.shape.normalize
        return norm(value) if norm is not None else value

    def decode_many(self, payloads: pa.Array) -> pa.Array | None:
        """Many payloads at once (``avro_block``); None: decode them one by one."""
        return self.block.decode(payloads) if self.block is not None else None

    def to_arrow(self, values: list[Any]) -> pa.Array:
        raw = pa.array(values, type=self.shape.raw)
        # safe=False: nanoseconds truncate to the table's microseconds
        return raw if raw.type == self.shape.final else raw.cast(self.shape.final, safe=False)
