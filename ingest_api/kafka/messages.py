"""Kafka protocol messages with kio: the request frame read, a response built from plain
values for whichever version the client speaks, and written.

``build`` fills a kio message class from a dict: fields the version lacks are ignored,
fields not given take their default (or zero: 0, "", False, (), None, no error), and
nested messages are dicts or lists of dicts. So one handler serves every version of
its API that the listener advertises.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import types
import typing
import uuid
from typing import Any, NamedTuple

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32Timedelta, i64Timedelta

ZERO_UUID = uuid.UUID(int=0)


class Frame(NamedTuple):
    api_key: int
    version: int
    correlation_id: int
    client_id: str | None
    body: Any
    """The kio request message."""


def peek(frame: bytes) -> tuple[int, int, int]:
    """A request frame's API key, version and correlation id (the fixed first 8 bytes)."""
    if len(frame) < 8:
        raise ValueError(f"a request of {len(frame)} bytes has no header")
    return (int.from_bytes(frame[0:2], "big", signed=True),
            int.from_bytes(frame[2:4], "big", signed=True),
            int.from_bytes(frame[4:8], "big", signed=True))


def read_request(frame: bytes) -> Frame:
    """A whole request (header and message) of an API and version kio knows."""
    api_key, version, _ = peek(frame)
    request = load_request_schema(api_key, version)
    header, used = entity_reader(request.__header_schema__)(frame, 0)
    body, size = entity_reader(request)(frame, used)
    if used + size != len(frame):
        raise ValueError(f"{len(frame) - used - size} bytes after the request")
    return Frame(api_key, version, header.correlation_id, header.client_id, body)


def write_response(api_key: int, version: int, correlation_id: int, values: dict[str, Any]
                   ) -> bytes:
    """The response frame (without its size prefix) of ``values`` in this version."""
    response = load_response_schema(api_key, version)
    out = io.BytesIO()
    header = response.__header_schema__
    entity_writer(header)(out, build(header, {"correlation_id": correlation_id}))
    entity_writer(response)(out, build(response, values))
    return out.getvalue()


def build(cls: type[Any], values: dict[str, Any]) -> Any:
    """An instance of kio message class ``cls`` from ``values`` (see the module's doc)."""
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if f.name in values:
            kwargs[f.name] = _value(kind, values[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = _zero(kind)
    return cls(**kwargs)


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    found = _HINTS.get(cls)
    if found is None:
        found = _HINTS[cls] = typing.get_type_hints(cls)
    return found


def _value(kind: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(kind)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in typing.get_args(kind) if a is not type(None)]
        return _value(inner[0], value)
    if origin is tuple:
        item = typing.get_args(kind)[0]
        return tuple(_value(item, v) for v in value)
    if dataclasses.is_dataclass(kind) and isinstance(value, dict):
        return build(typing.cast(type[Any], kind), value)
    if isinstance(kind, type):
        if issubclass(kind, i32Timedelta | i64Timedelta) and isinstance(value, int):
            return datetime.timedelta(milliseconds=value)
        if issubclass(kind, ErrorCode) and isinstance(value, int):
            return ErrorCode(value)
        if issubclass(kind, uuid.UUID) and isinstance(value, str):
            return uuid.UUID(value)
    return value


def _zero(kind: Any) -> Any:
    origin = typing.get_origin(kind)
    if origin in (types.UnionType, typing.Union):
        return None
    if origin is tuple:
        return ()
    if isinstance(kind, type):
        if issubclass(kind, bool):
            return False
        if issubclass(kind, ErrorCode):
            return ErrorCode.none
        if issubclass(kind, datetime.timedelta):
            return datetime.timedelta(0)
        if issubclass(kind, uuid.UUID):
            return ZERO_UUID
        if issubclass(kind, str):
            return ""
        if issubclass(kind, int | float):
            return kind(0)
        if issubclass(kind, bytes):
            return b""
        if dataclasses.is_dataclass(kind):
            return build(kind, {})
    raise TypeError(f"no zero value for {kind!r}")
