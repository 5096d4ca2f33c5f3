"""Protobuf schemas as confluent-kafka's Python client registers them: a serialized
``FileDescriptorProto`` in base64 (Confluent's ``format=serialized``). The descriptor is
checked by building it, with its references and protobuf's well-known types, in a
descriptor pool of protobuf's own library. ``.proto`` text (what the Java and Go clients
send) is not parsed yet: it is refused, saying so.

Compatibility (a subset of Confluent's rules, on the descriptors): a message an earlier
schema has may not go; a field number both have keeps its wire type (the varint types
int32, int64, uint32, uint64, bool and enums together; sint32 and sint64; fixed32 and
sfixed32; fixed64 and sfixed64; string and bytes; a message field its message type) and
whether it repeats. Fields may be added or removed (readers skip unknown numbers).

Data is written as the schema's first message (message indexes ``[0]``, one zero byte in
Confluent's framing), from JSON by protobuf's own ``json_format``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from typing import Any, TypeAlias

from google.protobuf import (
    any_pb2,
    api_pb2,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    json_format,
    message_factory,
    source_context_pb2,
    struct_pb2,
    timestamp_pb2,
    type_pb2,
    wrappers_pb2,
)
from google.protobuf.message import DecodeError

from log_tables.errors import InvalidRecordError, InvalidSchemaError

FileProto: TypeAlias = Any
"""protobuf's ``FileDescriptorProto`` (its library has no type hints mypy reads)."""
WELL_KNOWN = (any_pb2, source_context_pb2, type_pb2, api_pb2, duration_pb2, empty_pb2,
              field_mask_pb2, struct_pb2, timestamp_pb2, wrappers_pb2)
F = descriptor_pb2.FieldDescriptorProto
_WIRE = {F.TYPE_INT32: "varint", F.TYPE_INT64: "varint", F.TYPE_UINT32: "varint",
         F.TYPE_UINT64: "varint", F.TYPE_BOOL: "varint", F.TYPE_ENUM: "varint",
         F.TYPE_SINT32: "zigzag", F.TYPE_SINT64: "zigzag", F.TYPE_FIXED32: "fixed32",
         F.TYPE_SFIXED32: "fixed32", F.TYPE_FIXED64: "fixed64", F.TYPE_SFIXED64: "fixed64",
         F.TYPE_FLOAT: "float", F.TYPE_DOUBLE: "double", F.TYPE_STRING: "bytes",
         F.TYPE_BYTES: "bytes", F.TYPE_MESSAGE: "message", F.TYPE_GROUP: "group"}
HINT = ("a PROTOBUF schema is taken as a serialized FileDescriptorProto in base64 (what "
        "confluent-kafka's ProtobufSerializer registers); .proto text is not parsed yet")


def file_proto(text: str) -> FileProto:
    """The descriptor a schema's text holds."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        proto = descriptor_pb2.FileDescriptorProto()
        proto.ParseFromString(raw)
    except (binascii.Error, ValueError, DecodeError):
        raise InvalidSchemaError(f"invalid Protobuf schema: {HINT}") from None
    if not proto.message_type:
        raise InvalidSchemaError("invalid Protobuf schema: it declares no message")
    return proto


def canonical_text(proto: FileProto) -> str:
    return base64.standard_b64encode(proto.SerializeToString(deterministic=True)).decode()


def pool_of(proto: FileProto, references: list[FileProto]) -> descriptor_pool.DescriptorPool:
    """A pool holding the file, its references (dependencies first) and the well-known
    types; ``InvalidSchemaError`` if they do not build."""
    pool = descriptor_pool.DescriptorPool()
    for module in WELL_KNOWN:
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    known = {m.DESCRIPTOR.name for m in WELL_KNOWN}
    try:
        for ref in [*references, proto]:
            if ref.name not in known:
                pool.Add(ref)
                known.add(ref.name)
        pool.FindFileByName(proto.name)
    except (TypeError, KeyError, ValueError) as exc:
        raise InvalidSchemaError(f"invalid Protobuf schema: {exc}") from None
    return pool


def first_name(proto: FileProto) -> str:
    """The full name of the schema's first message (what data is written as)."""
    name = proto.message_type[0].name
    return f"{proto.package}.{name}" if proto.package else str(name)


def first_message(proto: FileProto, pool: descriptor_pool.DescriptorPool) -> Any:
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(first_name(proto)))


def encode(message_class: Any, data: Any, schema_id: int, where: str) -> bytes:
    """The payload after Confluent's magic byte and id: message indexes ``[0]`` and the
    message made from JSON."""
    try:
        message = json_format.ParseDict(data, message_class())
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise InvalidRecordError(f"{where} does not fit Protobuf schema {schema_id}: "
                                 f"{exc}") from None
    if not message.IsInitialized():
        raise InvalidRecordError(f"{where} does not fit Protobuf schema {schema_id}: "
                                 f"required fields missing: "
                                 f"{', '.join(message.FindInitializationErrors())}")
    payload: bytes = message.SerializeToString()
    return b"\x00" + payload


def _messages(proto: FileProto) -> Iterator[tuple[str, Any]]:
    prefix = f".{proto.package}" if proto.package else ""

    def walk(scope: str, messages: Any) -> Iterator[tuple[str, Any]]:
        for m in messages:
            name = f"{scope}.{m.name}"
            yield name, m
            yield from walk(name, m.nested_type)

    yield from walk(prefix, proto.message_type)


def reads(reader: FileProto, writer: FileProto) -> list[str]:
    """Why data written with ``writer`` would not read with ``reader`` (the subset of
    Confluent's rules in the module's docstring)."""
    mine = dict(_messages(reader))
    out: list[str] = []
    for name, w in _messages(writer):
        r = mine.get(name)
        if r is None:
            out.append(f"message {name.lstrip('.')} removed")
            continue
        fields = {f.number: f for f in r.field}
        for f in w.field:
            g = fields.get(f.number)
            if g is None:
                continue
            where = f"{name.lstrip('.')}.{f.name} (field {f.number})"
            if _WIRE.get(f.type) != _WIRE.get(g.type) or (
                    f.type == F.TYPE_MESSAGE and f.type_name != g.type_name):
                out.append(f"{where}: {F.Type.Name(f.type).lower()[5:]} became "
                           f"{F.Type.Name(g.type).lower()[5:]}")
            elif (f.label == F.LABEL_REPEATED) != (g.label == F.LABEL_REPEATED):
                out.append(f"{where}: repeated in one and not the other")
    return out

