"""Protobuf values as Arrow columns.

The table's message is the schema's first (what Confluent's serializers write as message
indexes ``[0]``); a record written as another message of the file fails alone. Messages
are structs, repeated fields lists, map fields ``map<K, V>``, enums their value's name;
integers are 64-bit (``uint64`` too: a value past 2^63 fails its record), floats
doubles; ``google.protobuf.Timestamp`` is a timestamp and the wrapper types
(``Int64Value``...) their nullable value. A message field not set is null; a scalar not
set is its default (proto3 has no presence for them). A recursive message is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2

from log_tables.typed import protobuf
from log_tables.typed.avro_arrow import UnsupportedSchema
from log_tables.typed.registry_state import Schema

F = descriptor_pb2.FieldDescriptorProto
SCALAR = {F.TYPE_DOUBLE: pa.float64(), F.TYPE_FLOAT: pa.float64(), F.TYPE_BOOL: pa.bool_(),
          F.TYPE_STRING: pa.string(), F.TYPE_BYTES: pa.binary()}
WRAPPERS = {"google.protobuf.DoubleValue": pa.float64(), "google.protobuf.FloatValue": pa.float64(),
            "google.protobuf.Int64Value": pa.int64(), "google.protobuf.UInt64Value": pa.int64(),
            "google.protobuf.Int32Value": pa.int64(), "google.protobuf.UInt32Value": pa.int64(),
            "google.protobuf.BoolValue": pa.bool_(), "google.protobuf.StringValue": pa.string(),
            "google.protobuf.BytesValue": pa.binary()}
TIMESTAMP = "google.protobuf.Timestamp"
Convert = Callable[[Any], Any]


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(data):
            raise ValueError("the message indexes end early")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def message_indexes(payload: bytes) -> tuple[list[int], int]:
    """Confluent's message indexes before a Protobuf payload (zigzag varints: a count,
    then that many indexes; a lone 0 is ``[0]``) and where the message starts."""
    raw, pos = _varint(payload, 0)
    count = (raw >> 1) ^ -(raw & 1)
    if count == 0:
        return [0], pos
    if count < 0 or count > 100:
        raise ValueError(f"{count} message indexes")
    out = []
    for _ in range(count):
        raw, pos = _varint(payload, pos)
        out.append((raw >> 1) ^ -(raw & 1))
    return out, pos


class ProtoDecoder:
    """Decodes Confluent-framed Protobuf payloads of one schema id into Arrow."""

    def __init__(self, schema: Schema, references: Mapping[str, Schema]) -> None:
        files = []
        for name, used in references.items():
            proto = protobuf.file_proto(used.text)
            proto.name = name  # imported by this name
            files.append(proto)
        proto = protobuf.file_proto(schema.text)
        pool = protobuf.pool_of(proto, files)
        self.message_class = protobuf.first_message(proto, pool)
        self._open: set[str] = set()
        self.arrow_type, self._convert = self._message(self.message_class.DESCRIPTOR)

    def _message(self, desc: Any) -> tuple[pa.DataType, Convert]:
        if desc.full_name in self._open:
            raise UnsupportedSchema(f"message {desc.full_name} contains itself: a recursive "
                                    "schema has no table shape")
        self._open.add(desc.full_name)
        try:
            parts = [(f, *self._field(f)) for f in desc.fields]
        finally:
            self._open.discard(desc.full_name)

        def convert(message: Any) -> Any:
            out: dict[str, Any] = {}
            for f, _, conv in parts:
                if f.message_type is not None and not _repeated(f) and \
                        not message.HasField(f.name):
                    out[f.name] = None
                else:
                    out[f.name] = conv(getattr(message, f.name))
            return out
        return pa.struct([pa.field(f.name, t) for f, t, _ in parts]), convert

    def _field(self, f: Any) -> tuple[pa.DataType, Convert]:
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key_t, key_c = self._single(f.message_type.fields_by_name["key"])
            val_t, val_c = self._single(f.message_type.fields_by_name["value"])
            return pa.map_(key_t, val_t), lambda m: [(key_c(k), val_c(v)) for k, v in m.items()]
        item_t, item_c = self._single(f)
        if _repeated(f):
            return pa.list_(item_t), lambda v: [item_c(x) for x in v]
        return item_t, item_c

    def _single(self, f: Any) -> tuple[pa.DataType, Convert]:
        if f.type == F.TYPE_ENUM:
            values = f.enum_type.values_by_number
            return pa.string(), lambda v: values[v].name if v in values else str(v)
        if f.message_type is not None:
            name = f.message_type.full_name
            if name == TIMESTAMP:
                return pa.timestamp("us", "UTC"), lambda m: m.ToMicroseconds()
            if name in WRAPPERS:
                return WRAPPERS[name], lambda m: m.value
            return self._message(f.message_type)
        return SCALAR.get(f.type, pa.int64()), _same

    def decode_one(self, payload: bytes) -> Any:
        indexes, start = message_indexes(payload)
        if indexes != [0]:
            raise ValueError(f"written as message indexes {indexes}: only the schema's first "
                             "message ([0]) is typed")
        message = self.message_class()
        message.ParseFromString(payload[start:])
        return self._convert(message)

    def to_arrow(self, values: list[Any]) -> pa.Array:
        return pa.array(values, type=self.arrow_type)


def _repeated(f: Any) -> bool:
    return bool(f.is_repeated)


def _same(v: Any) -> Any:
    return v
