"""Produce with schemas: a key or value given as data and a schema (Confluent REST v3's
``AVRO`` and ``JSONSCHEMA`` and ``PROTOBUF`` types, with ``schema_id``, or ``subject`` and
``schema_version``) checked against the schema and stored in Confluent's wire format: a
zero byte, the schema id (4 bytes, big-endian), then the payload (Avro's binary
encoding; JSON's compact text; for Protobuf the message indexes ``[0]`` and the
message). A Kafka consumer with Confluent's deserializer reads it.

Which schema: ``schema_id`` if given; else the subject's ``schema_version`` (the latest
if not given), the subject being ``subject`` if given, else ``<topic>-key`` or
``<topic>-value`` (Confluent's TopicNameStrategy). Schemas come from ``SchemaSource``:
the registry here where this broker serves it, else the broker that does (a schema of
an id never changes, so those are kept once read).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any, Protocol

import fastavro
import fastavro.validation
import jsonschema
import jsonschema.exceptions
import jsonschema.validators
import referencing
import referencing.exceptions
import referencing.jsonschema

from ingest_api.broker.schemas.formats import AVRO, JSON, PROTOBUF, Reference, Schema
from log_tables.errors import InvalidRecordError, InvalidSchemaError, LakelogError
from log_tables.typed import protobuf

MAGIC = b"\x00"
TYPES = {"AVRO": AVRO, "JSONSCHEMA": JSON, "PROTOBUF": PROTOBUF}
"""Confluent REST's envelope types with a schema, and the registry's type of each."""
STRATEGIES = ("TOPIC_NAME",)
"""The subject name strategies that need no ``subject`` (the others name it from the
record's schema, which is what is being looked for: give ``subject``)."""
MAX_CACHED = 10_000


@dataclass(frozen=True, slots=True)
class SchemaRef:
    """Which schema a key or value asks for (the envelope's fields)."""

    kind: str
    subject: str | None = None
    subject_name_strategy: str | None = None
    schema_id: int | None = None
    schema_version: int | None = None


class SchemaSource(Protocol):
    async def by_id(self, schema_id: int) -> Schema:
        """The schema of an id (``SchemaNotFoundError`` if none)."""
        ...

    async def by_version(self, subject: str, version: int) -> tuple[int, Schema]:
        """A subject's version (-1: the latest) as (id, schema)."""
        ...

    async def reference(self, ref: Reference) -> Schema:
        ...


@dataclass(slots=True)
class Writer:
    """One schema made ready to write with: its id, type and parsed form."""

    schema_id: int
    schema_type: str
    parsed: Any

    def encode(self, data: Any, where: str) -> bytes:
        """``data`` in Confluent's wire format; ``InvalidRecordError`` if it does not fit."""
        if self.schema_type == AVRO:
            try:
                fastavro.validation.validate(data, self.parsed, raise_errors=True)
                out = io.BytesIO()
                fastavro.schemaless_writer(out, self.parsed, data)
            except (fastavro.validation.ValidationError, ValueError, TypeError) as exc:
                raise InvalidRecordError(f"{where} does not fit Avro schema {self.schema_id}: "
                                         f"{_short(exc)}") from None
            payload = out.getvalue()
        elif self.schema_type == PROTOBUF:
            payload = protobuf.encode(self.parsed, data, self.schema_id, where)
        else:
            try:
                self.parsed.validate(data)
            except jsonschema.exceptions.ValidationError as exc:
                path = "/".join(map(str, exc.absolute_path))
                raise InvalidRecordError(f"{where} does not fit JSON Schema {self.schema_id}"
                                         f"{' at /' + path if path else ''}: {exc.message}"
                                         ) from None
            payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
        return MAGIC + self.schema_id.to_bytes(4, "big") + payload


def _short(exc: Exception) -> str:
    found = getattr(exc, "error_list", None)  # fastavro's ValidationError: one per field
    text = "; ".join(map(str, found)) if found else " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


class Writers:
    """Writers by schema id, made once each (bounded)."""

    def __init__(self, source: SchemaSource) -> None:
        self.source = source
        self._by_id: dict[int, Writer] = {}

    async def writer(self, ref: SchemaRef, topic: str, is_key: bool,
                     memo: dict[tuple[str, int], tuple[int, Schema]] | None = None) -> Writer:
        """The writer of the schema an envelope asks for; ``InvalidRecordError`` (the
        record's) or the registry's error when there is none."""
        if ref.schema_id is not None:
            schema_id = ref.schema_id
            found = self._by_id.get(schema_id)
            if found is None:
                found = await self._make(schema_id, await self.source.by_id(schema_id))
        else:
            subject = ref.subject
            if subject is None:
                strategy = (ref.subject_name_strategy or "TOPIC_NAME").upper()
                if strategy not in STRATEGIES:
                    raise InvalidRecordError(
                        f"subject_name_strategy {strategy} needs the subject: give "
                        "'subject' (or schema_id)")
                subject = f"{topic}-{'key' if is_key else 'value'}"
            key = (subject, -1 if ref.schema_version is None else ref.schema_version)
            found_version = memo.get(key) if memo is not None else None
            if found_version is None:  # asked once a request (a subject's latest moves)
                found_version = await self.source.by_version(*key)
                if memo is not None:
                    memo[key] = found_version
            schema_id, schema = found_version
            found = self._by_id.get(schema_id) or await self._make(schema_id, schema)
        want = TYPES.get(ref.kind)
        if want is not None and found.schema_type != want:
            raise InvalidRecordError(f"type {ref.kind} was given, but schema {found.schema_id} "
                                     f"is {found.schema_type}")
        return found

    async def _make(self, schema_id: int, schema: Schema) -> Writer:
        if schema.schema_type == AVRO:
            named: dict[str, Any] = {}
            for used in await self._references(schema, set()):
                fastavro.parse_schema(json.loads(used.text), named_schemas=named)
            parsed = fastavro.parse_schema(json.loads(schema.text), named_schemas=named)
        elif schema.schema_type == JSON:
            doc = json.loads(schema.text)
            registry: referencing.Registry[Any] = referencing.Registry()
            for ref, used in await self._named_references(schema, set()):
                registry = registry.with_resource(ref.name, referencing.Resource.from_contents(
                    json.loads(used.text),
                    default_specification=referencing.jsonschema.DRAFT202012))
            parsed = jsonschema.validators.validator_for(doc)(doc, registry=registry)
        elif schema.schema_type == PROTOBUF:
            files = []
            for ref, used in await self._named_references(schema, set()):
                proto = protobuf.file_proto(used.text)
                proto.name = ref.name
                files.append(proto)
            proto = protobuf.file_proto(schema.text)
            parsed = protobuf.first_message(proto, protobuf.pool_of(proto, files))
        else:  # pragma: no cover - the registry keeps no other type
            raise InvalidSchemaError(f"schema {schema_id} is {schema.schema_type}")
        writer = Writer(schema_id, schema.schema_type, parsed)
        if len(self._by_id) >= MAX_CACHED:
            self._by_id.clear()
        self._by_id[schema_id] = writer
        return writer

    async def _named_references(self, schema: Schema, seen: set[Reference]
                                ) -> list[tuple[Reference, Schema]]:
        """``_references`` with the reference each came by (a Protobuf import's name)."""
        out: list[tuple[Reference, Schema]] = []
        for ref in schema.references:
            if ref in seen:
                continue
            seen.add(ref)
            used = await self.source.reference(ref)
            out += await self._named_references(used, seen)
            out.append((ref, used))
        return out

    async def _references(self, schema: Schema, seen: set[Reference]) -> list[Schema]:
        """The schemas ``schema`` refers to, those they refer to first."""
        out: list[Schema] = []
        for ref in schema.references:
            if ref in seen:
                continue
            seen.add(ref)
            used = await self.source.reference(ref)
            out += await self._references(used, seen)
            out.append(used)
        return out


async def encode_all(writers: Writers, topic: str, items: list[tuple[int, bool, SchemaRef, Any]]
                     ) -> dict[int, bytes | LakelogError]:
    """Each (index, is_key, ref, data) encoded, or its error, by index*2+is_key."""
    out: dict[int, bytes | LakelogError] = {}
    memo: dict[tuple[str, int], tuple[int, Schema]] = {}
    for index, is_key, ref, data in items:
        where = f"record {index}'s {'key' if is_key else 'value'}"
        try:
            writer = await writers.writer(ref, topic, is_key, memo)
            out[index * 2 + is_key] = writer.encode(data, where)
        except LakelogError as exc:
            out[index * 2 + is_key] = exc
        except (ValueError, TypeError, KeyError, OverflowError, RecursionError,
                AttributeError, NotImplementedError, referencing.exceptions.Unresolvable,
                jsonschema.exceptions.SchemaError) as exc:
            # The format libraries' own errors (a schema fastavro reads otherwise than
            # Apache Avro's parser, a $ref jsonschema cannot resolve, a proto2 required
            # field missing): the record's, never the request's.
            out[index * 2 + is_key] = InvalidRecordError(
                f"{where} cannot be written with its schema: {type(exc).__name__}: "
                f"{_short(exc)}")
    return out
