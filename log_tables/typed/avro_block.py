"""Avro records decoded many at a time: the fast path of ``avro_arrow``.

fastavro decodes one record per call (~4 µs for a small record here); polars' Avro
reader (Rust) decodes an object-container block of them at ~0.3 µs. Confluent's
framing has no container, so one is made: the records' payloads, each followed by a
*guard*, become one block whose schema is the record's with a last field
``GUARD_FIELD`` (bytes) added. Avro encodes a record as its fields one after another,
so a payload followed by an encoded bytes value is an encoding of the extended record.

A block has no per-record lengths: a record with trailing bytes or one cut short
would shift every record after it, silently. The guard is what makes that visible: a
fresh random 16 bytes for each block, so a shifted read finds other bytes where the
guard should be (a chance of 2^-128 per record to find it by accident). Every guard is
checked; if one is not there, or polars fails in any way, the block is decoded again
record by record by fastavro, which names the records that are bad.

Schemas polars does not read (maps, unions of several types, enums below the top level,
recursion) and schemas with references always go record by record.
"""

from __future__ import annotations

import io
import os
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from log_tables.varint import zigzag

GUARD_FIELD = "__lakelog_guard__"
GUARD_BYTES = 16
MIN_BLOCK = 64
"""Fewer records than this go record by record (a container costs more than it saves)."""


def supported(schema: Any, named: dict[str, Any], top: bool = True,
              seen: frozenset[str] = frozenset()) -> bool:
    """Whether polars reads this (parsed) schema's values as ``avro_arrow`` types them."""
    if isinstance(schema, str):
        if schema in named:
            return schema not in seen and supported(named[schema], named, top, seen)
        return True
    if isinstance(schema, list):
        real = [b for b in schema if b != "null"]
        return len(real) == 1 and len(schema) <= 2 and supported(real[0], named, False, seen)
    kind = schema.get("type")
    if kind in ("record", "error"):
        if top:
            name = schema.get("name", "")
            return all(supported(f["type"], named, False, seen | {name})
                       for f in schema["fields"])
        return all(supported(f["type"], named, False, seen | {schema.get("name", "")})
                   for f in schema["fields"])
    if kind == "enum":
        return False  # polars panics on an enum inside a struct; top-level fields are not
    if kind == "map":
        return False
    if kind == "array":
        return supported(schema["items"], named, False, seen)
    if schema.get("logicalType") in ("time-millis", "time-micros", "uuid",
                                     "local-timestamp-millis", "local-timestamp-micros",
                                     "timestamp-nanos", "local-timestamp-nanos"):
        return False
    return not isinstance(kind, dict | list) or supported(kind, named, top, seen)


def _top_fields_ok(schema: dict[str, Any], named: dict[str, Any]) -> bool:
    """A record whose fields polars reads (an enum may be one of them, at the top)."""
    def field_ok(t: Any) -> bool:
        if isinstance(t, dict) and t.get("type") == "enum":
            return True
        if isinstance(t, str) and isinstance(named.get(t), dict) and \
                named[t].get("type") == "enum":
            return True
        return supported(t, named, False, frozenset({schema.get("name", "")}))
    return all(field_ok(f["type"]) for f in schema["fields"])


class BlockDecoder:
    """Decodes many payloads of one record schema at once (``decode``), or says it cannot
    (None: decode them one by one)."""

    def __init__(self, schema: dict[str, Any], named: dict[str, Any],
                 arrow_type: pa.DataType) -> None:
        self.arrow_type = arrow_type
        extended = dict(schema, fields=[*schema["fields"],
                                        {"name": GUARD_FIELD, "type": "bytes"}])
        out = io.BytesIO()
        fastavro.writer(out, fastavro.parse_schema(extended), [], codec="null")
        self.header = out.getvalue()
        self.sync = self.header[-16:]
        self.names = [f["name"] for f in schema["fields"]]

    @staticmethod
    def usable(schema: Any, named: dict[str, Any]) -> bool:
        return isinstance(schema, dict) and schema.get("type") == "record" and \
            _top_fields_ok(schema, named) and all(f["name"] != GUARD_FIELD
                                                  for f in schema["fields"])

    def decode(self, payloads: pa.Array) -> pa.Array | None:
        import polars as pl

        if len(payloads) < MIN_BLOCK:
            return None
        try:
            guard = os.urandom(GUARD_BYTES)
            framed = b"\x20" + guard  # the bytes value: its length (16, zigzag) and the guard
            joined = pc.binary_join_element_wise(payloads, pa.scalar(framed, pa.binary()),
                                                 pa.scalar(b"", pa.binary()))
            offsets = np.frombuffer(joined.buffers()[1], np.int32)[joined.offset:
                                                                  joined.offset + len(joined) + 1]
            body = joined.buffers()[2]
            start, end = int(offsets[0]), int(offsets[-1])
            block = b"".join([self.header, zigzag(len(payloads)), zigzag(end - start),
                              memoryview(body)[start:end], self.sync])
            table = pl.read_avro(io.BytesIO(block)).to_arrow()
            guards = table.column(GUARD_FIELD)
            if table.num_rows != len(payloads) or guards.null_count or not pc.all(
                    pc.equal(guards, pa.scalar(guard, guards.type))).as_py():
                return None
            columns = [table.column(n).combine_chunks() for n in self.names]
            struct = pa.StructArray.from_arrays(columns, names=self.names)
            return struct.cast(self.arrow_type)
        except BaseException as exc:  # polars panics (PanicException) are BaseExceptions
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            return None
