"""Confluent's compatibility levels, and whether a new schema keeps one against earlier
versions.

BACKWARD: the new schema reads data written with the last one; FORWARD: the last one
reads data written with the new; FULL: both; ``_TRANSITIVE``: against every earlier
version, not just the last; NONE: no check. Avro's rules are Apache Avro's own schema
resolution checker. JSON Schema's are a conservative subset of Confluent's: types may
widen (an integer read as a number), a reader may drop an optional property of an open
model or add an optional one, enums may grow on the reading side, arrays' items and
objects' properties are checked in depth; anything else must be unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

from ingest_api.broker.schemas.formats import AVRO, PROTOBUF, Resolve, Schema, avro_schema
from log_tables.errors import InvalidCompatibilityLevelError
from log_tables.typed import protobuf

LEVELS = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL",
          "FULL_TRANSITIVE")
DEFAULT_LEVEL = "BACKWARD"
"""Confluent's default."""


def level(value: object) -> str:
    """A compatibility level as given (any case), checked."""
    name = str(value).upper() if isinstance(value, str) else ""
    if name not in LEVELS:
        raise InvalidCompatibilityLevelError(
            f"invalid compatibility level {value!r}; one of {', '.join(LEVELS)}")
    return name


def problems(compat: str, new: Schema, earlier: Sequence[Schema], resolve: Resolve) -> list[str]:
    """Why ``new`` breaks ``compat`` against ``earlier`` (oldest first); [] when it does
    not. A schema of another type than an earlier one is incompatible with it."""
    if compat == "NONE" or not earlier:
        return []
    against = list(earlier) if compat.endswith("_TRANSITIVE") else [earlier[-1]]
    backward = compat.startswith(("BACKWARD", "FULL"))
    forward = compat.startswith(("FORWARD", "FULL"))
    found: list[str] = []
    for old in against:
        if old.schema_type != new.schema_type:
            found.append(f"the new schema is {new.schema_type}, an earlier one "
                         f"{old.schema_type}")
            continue
        if backward:
            found += [f"{m} (the new schema reading data of an earlier one)"
                      for m in _reads(new, old, resolve)]
        if forward:
            found += [f"{m} (an earlier schema reading data of the new one)"
                      for m in _reads(old, new, resolve)]
    return found


def _reads(reader: Schema, writer: Schema, resolve: Resolve) -> list[str]:
    """Why ``reader`` cannot read what ``writer`` wrote."""
    if reader.schema_type == AVRO:
        result = ReaderWriterCompatibilityChecker().get_compatibility(  # type: ignore[no-untyped-call]
            avro_schema(reader, resolve), avro_schema(writer, resolve))
        if result.compatibility is SchemaCompatibilityType.compatible:
            return []
        kinds = ", ".join(sorted({k.name.lower() for k in result.incompatibilities}))
        return [f"{kinds} at {', '.join(sorted(map(str, result.locations)))}: "
                f"{'; '.join(sorted(map(str, result.messages)))}"]
    if reader.schema_type == PROTOBUF:
        return protobuf.reads(protobuf.file_proto(reader.text), protobuf.file_proto(writer.text))
    out: list[str] = []
    _json_reads(json.loads(reader.text), json.loads(writer.text), "#", out)
    return out


def _types(doc: dict[str, Any]) -> set[str] | None:
    kind = doc.get("type")
    if kind is None:
        return None
    return {kind} if isinstance(kind, str) else set(kind)


def _json_reads(reader: Any, writer: Any, where: str, out: list[str]) -> None:
    if reader is True or reader == {} or reader == writer:
        return
    if not isinstance(reader, dict) or not isinstance(writer, dict):
        out.append(f"{where}: the reader accepts less than the writer writes")
        return
    rt, wt = _types(reader), _types(writer)
    if rt is not None:
        widened = {"integer"} if "number" in rt else set()
        if wt is None or not wt <= rt | widened:
            out.append(f"{where}: type {sorted(wt or ['any'])} written, {sorted(rt)} read")
            return
    if "enum" in reader and not set(map(json.dumps, writer.get("enum", [None]))) <= set(
            map(json.dumps, reader["enum"])):
        out.append(f"{where}: the reader's enum lacks values the writer may write")
    rprops, wprops = reader.get("properties", {}), writer.get("properties", {})
    required_new = set(reader.get("required", [])) - set(writer.get("required", []))
    for name in sorted(required_new):
        out.append(f"{where}/properties/{name}: required by the reader, not by the writer")
    closed = reader.get("additionalProperties") is False
    for name in sorted(set(wprops) - set(rprops)):
        if closed:
            out.append(f"{where}/properties/{name}: written, and the reader's closed "
                       "model has no such property")
    for name in sorted(set(wprops) & set(rprops)):
        _json_reads(rprops[name], wprops[name], f"{where}/properties/{name}", out)
    if "items" in reader or "items" in writer:
        _json_reads(reader.get("items", True), writer.get("items", True), f"{where}/items",
                    out)
    known = {"type", "enum", "properties", "required", "additionalProperties", "items",
             "title", "description", "$schema", "$id", "default", "examples"}
    for name in sorted((set(reader) | set(writer)) - known):
        if reader.get(name) != writer.get(name):
            out.append(f"{where}: {name!r} changed (only a change this check understands "
                       "is allowed)")
