"""Schemas by type: parsing (with their references), and the form that identifies one.

A schema is kept as its canonical text: its JSON written compactly (``normalize``: with
keys sorted too), so that the same schema sent with other whitespace finds its id, as
Confluent's does. Avro is parsed by Apache Avro's library (whose checker also decides
compatibility, ``compatibility``), JSON Schema by ``jsonschema`` (the schema checked
against its draft's meta-schema).
Protobuf (``protobuf``) is taken as confluent-kafka's Python client registers it: a
serialized FileDescriptorProto in base64.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import avro.errors
import avro.name
import avro.schema
import fastavro
import fastavro.schema
import jsonschema
import jsonschema.exceptions
import jsonschema.validators

from log_tables.errors import InvalidSchemaError
from log_tables.typed import protobuf
from log_tables.typed.registry_state import Reference as Reference
from log_tables.typed.registry_state import Resolve as Resolve
from log_tables.typed.registry_state import Schema as Schema

AVRO, JSON, PROTOBUF = "AVRO", "JSON", "PROTOBUF"
SCHEMA_TYPES = (AVRO, JSON, PROTOBUF)
"""The types served (``GET /schemas/types``)."""


def canonical(schema_type: str, text: str, references: Sequence[Reference], resolve: Resolve,
              normalize: bool = False) -> Schema:
    """The schema, checked, in the form it is kept in; ``InvalidSchemaError`` says why
    it is not one."""
    if schema_type not in SCHEMA_TYPES:
        raise InvalidSchemaError(f"schemaType must be one of {', '.join(SCHEMA_TYPES)}; got "
                                 f"{schema_type!r}")
    if schema_type == PROTOBUF:
        proto = protobuf.file_proto(text)
        out = Schema(PROTOBUF, protobuf.canonical_text(proto), tuple(references))
        protobuf_pool(out, resolve)
        return out
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, TypeError, RecursionError) as exc:
        raise InvalidSchemaError(f"the {schema_type} schema is not JSON (or nested too "
                                 f"deep): {type(exc).__name__}") from None
    if schema_type == AVRO and isinstance(doc, str):
        doc = {"type": doc}  # "string" and {"type": "string"} are one schema
    out = Schema(schema_type, json.dumps(doc, separators=(",", ":"), sort_keys=normalize,
                                         ensure_ascii=False), tuple(references))
    try:
        if schema_type == AVRO:
            avro_schema(out, resolve)
            writable(out, resolve)
        else:
            json_schema(out)
            for ref in out.references:  # each must exist (resolve raises if not)
                json_schema(resolve(ref))
    except RecursionError:
        raise InvalidSchemaError(f"the {schema_type} schema is nested too deep") from None
    return out


def writable(schema: Schema, resolve: Resolve) -> None:
    """An Avro schema fastavro, which writes the records, reads too (it refuses some that
    Apache Avro's parser takes: a default of the wrong type, say)."""
    named: dict[str, Any] = {}
    try:
        for used in _avro_references(schema, resolve, set()):
            fastavro.parse_schema(json.loads(used.text), named_schemas=named)
        fastavro.parse_schema(json.loads(schema.text), named_schemas=named)
    except (fastavro.schema.SchemaParseException, fastavro.schema.UnknownType, ValueError,
            TypeError, KeyError) as exc:
        raise InvalidSchemaError(f"invalid Avro schema: {exc}") from None


def _avro_references(schema: Schema, resolve: Resolve, seen: set[tuple[str, int]]
                     ) -> list[Schema]:
    out: list[Schema] = []
    for ref in schema.references:
        if (ref.subject, ref.version) in seen:
            continue
        seen.add((ref.subject, ref.version))
        used = resolve(ref)
        out += _avro_references(used, resolve, seen)
        out.append(used)
    return out


def avro_schema(schema: Schema, resolve: Resolve) -> avro.schema.Schema:
    """The Avro schema, its references' named types known while it is parsed."""
    names = avro.name.Names()
    _add_references(schema, resolve, names, set())
    try:
        return avro.schema.make_avsc_object(json.loads(schema.text), names)
    except (avro.errors.AvroException, TypeError, ValueError, KeyError) as exc:
        raise InvalidSchemaError(f"invalid Avro schema: {exc}") from None


def _add_references(schema: Schema, resolve: Resolve, names: avro.name.Names,
                    seen: set[tuple[str, int]]) -> None:
    for ref in schema.references:
        if (ref.subject, ref.version) in seen:
            continue
        seen.add((ref.subject, ref.version))
        used = resolve(ref)
        _add_references(used, resolve, names, seen)
        try:
            avro.schema.make_avsc_object(json.loads(used.text), names)
        except avro.errors.SchemaParseException as exc:
            if "redefine" not in str(exc).lower():  # known already through another path
                raise InvalidSchemaError(f"reference {ref.name!r} ({ref.subject} version "
                                         f"{ref.version}) is not a valid Avro schema: {exc}"
                                         ) from None


def json_schema(schema: Schema) -> dict[str, Any] | bool:
    """The JSON Schema document, checked against its draft's meta-schema."""
    doc = json.loads(schema.text)
    if not isinstance(doc, dict | bool):
        raise InvalidSchemaError("a JSON Schema is an object (or true/false)")
    try:
        jsonschema.validators.validator_for(doc).check_schema(doc)
    except jsonschema.exceptions.SchemaError as exc:
        raise InvalidSchemaError(f"invalid JSON Schema: {exc.message}") from None
    return doc


def protobuf_files(schema: Schema, resolve: Resolve, seen: set[str] | None = None
                   ) -> list[protobuf.FileProto]:
    """The descriptors a Protobuf schema imports (by their import names), dependencies
    first."""
    seen = set() if seen is None else seen
    out: list[protobuf.FileProto] = []
    for ref in schema.references:
        if ref.name in seen:
            continue
        seen.add(ref.name)
        used = resolve(ref)
        out += protobuf_files(used, resolve, seen)
        proto = protobuf.file_proto(used.text)
        proto.name = ref.name  # imported by this name
        out.append(proto)
    return out


def protobuf_pool(schema: Schema, resolve: Resolve) -> tuple[protobuf.FileProto, Any]:
    """The schema's descriptor and a pool it is built in (with its imports)."""
    proto = protobuf.file_proto(schema.text)
    return proto, protobuf.pool_of(proto, protobuf_files(schema, resolve))
