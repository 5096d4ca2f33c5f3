"""Decoded produce bodies to the broker's columns (``broker.produce.request``).

The HTTP front decodes a body with msgspec into ``ProduceRecord`` structs (Confluent's
envelopes); here each field of all of them becomes one column, with ``map`` over the
structs (no Python frame per record) where every record has the same kind of envelope,
the usual request.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from ingest_api.broker.produce.planner import SMALL_REQUEST
from ingest_api.broker.produce.request import (
    Headers,
    ProducerColumns,
    ProduceRequest,
    binary_column,
    optional_column,
)
from ingest_api.http.models import (
    BinaryData,
    EncodedData,
    Envelope,
    JsonData,
    PlainEntry,
    ProduceRecord,
    ProducerEntry,
    StringData,
)
from log_tables.errors import InvalidRecordError, LakelogError

_json = msgspec.json.Encoder()
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)
_key_of, _value_of, _data_of = attrgetter("key"), attrgetter("value"), attrgetter("data")
_headers_of, _timestamp_of = attrgetter("headers"), attrgetter("timestamp")
_partition_of = attrgetter("partition_id")
_producer_of = (attrgetter("producer_id"), attrgetter("producer_epoch"), attrgetter("sequence"))


def envelope_bytes(env: Envelope | EncodedData | None) -> bytes | None:
    """The stored bytes of a key or value envelope (None for a null)."""
    if env is None:
        return None
    if env.__class__ is BinaryData or env.__class__ is EncodedData:
        return env.data
    if env.data is None:
        return None
    if isinstance(env, StringData):
        return env.data.encode()
    assert isinstance(env, JsonData)
    return _json.encode(env.data)


def timestamp_ms(value: int | datetime) -> int:
    """A record's time in epoch milliseconds (a time without a zone, or before 1970, is
    an ``InvalidRecordError``)."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidRecordError("timestamp needs a time zone (e.g. a trailing Z)")
        ms = (value - _EPOCH) // _MILLISECOND  # exact, where a float timestamp() is not
        if ms < 0:
            raise InvalidRecordError(f"timestamp {value.isoformat()} is before 1970-01-01T00:00:00Z; "
                                     "record times are milliseconds since the epoch, 0 or more")
        return ms
    return value


EnvelopeTypes = str | list[str | None]
"""The ``type`` of every key (or value): one for all, or each one's (None: a null)."""


Records = Sequence[ProduceRecord | PlainEntry | ProducerEntry]


def produce_request(records: Records) -> ProduceRequest:
    """The records as the produce service takes them."""
    return typed_request(records)[0]


def typed_request(records: Records) -> tuple[ProduceRequest, EnvelopeTypes, EnvelopeTypes]:
    """The records as the produce service takes them, and their keys' and values' types
    (what their delivery reports say). Entries of one of the usual shapes (``PlainEntry``,
    ``ProducerEntry``) skip the columns they cannot have."""
    keys, key_types = _column(list(map(_key_of, records)))
    values, value_types = _column(list(map(_value_of, records)))
    request = ProduceRequest(keys, values)
    shapes = set(map(type, records))
    if shapes == {PlainEntry}:
        return request, key_types, value_types
    if shapes == {ProducerEntry}:
        n = len(records)
        request.partitions = np.fromiter(map(_partition_of, records), np.int64, n)
        request.producers = ProducerColumns(
            *(np.fromiter(map(get, records), np.int64, n) for get in _producer_of))
        return request, key_types, value_types
    headers = list(map(_headers_of, records))
    if any(headers):
        request.headers = [_headers(hs) for hs in headers]
    times = list(map(_timestamp_of, records))
    if times.count(None) != len(times):
        request.timestamps = _timestamps(times, request.invalid)
    request.partitions = optional_column(records, _partition_of)
    ids, epochs, sequences = (optional_column(records, get) for get in _producer_of)
    if ids is not None or epochs is not None or sequences is not None:
        missing = np.full(len(records), -1, np.int64)
        request.producers = ProducerColumns(
            missing if ids is None else ids, missing if epochs is None else epochs,
            missing if sequences is None else sequences)
    return request, key_types, value_types


_TAGS = {BinaryData: "BINARY", StringData: "STRING", JsonData: "JSON"}


def _column(envelopes: list[Any]) -> tuple[pa.Array | list[bytes | None], EnvelopeTypes]:
    """Keys or values as a binary column, and their types: one Arrow call when all are
    BINARY or all STRING envelopes (or nulls of one of those); a list for a few records
    (planned record by record)."""
    if len(envelopes) < SMALL_REQUEST:
        return [envelope_bytes(e) for e in envelopes], list(map(_tag_of, envelopes))
    classes = set(map(type, envelopes))
    if len(classes) == 1 and (cls := classes.pop()) in (BinaryData, StringData):
        data = list(map(_data_of, envelopes))
        column = None
        if cls is BinaryData:
            column = binary_column(data)
        else:
            with contextlib.suppress(pa.ArrowException, UnicodeError):  # else: each one
                column = pa.array(data, pa.string()).cast(pa.binary())  # for its error
        if column is not None:
            tag = _TAGS[cls]
            return column, tag if not column.null_count else [
                None if d is None else tag for d in data]
    return binary_column([envelope_bytes(e) for e in envelopes]), list(map(_tag_of, envelopes))


def _tag_of(env: Any) -> str | None:
    """An envelope's type as its delivery report names it (None: it stores a null)."""
    if env is None or env.data is None:
        return None
    return env.tag if env.__class__ is EncodedData else _TAGS[env.__class__]


def _headers(headers: Any) -> Headers | None:
    if not headers:
        return None
    return [{"key": h.name, "value": h.value} for h in headers]


def _timestamps(times: list[int | datetime | None], invalid: dict[int, LakelogError]
                ) -> np.ndarray:
    """Epoch milliseconds, -1 where not given (or not readable: an error in ``invalid``)."""
    out = np.full(len(times), -1, np.int64)
    for i, value in enumerate(times):
        if value is None:
            continue
        try:
            out[i] = timestamp_ms(value)
        except LakelogError as exc:
            invalid[i] = exc
    return out


def forward_entries(request: ProduceRequest, indices: list[int], partitions: np.ndarray
                    ) -> list[bytes]:
    """``records:batch`` entries of the request's records ``indices`` for the broker that
    leads their partitions: each with its partition set, ``id`` its index in the request,
    key and value as the bytes stored (BINARY)."""
    where = pa.array(indices, pa.int64())
    keys = request.key_array().take(where).to_pylist()
    values = request.value_array().take(where).to_pylist()
    out = []
    for i, key, value in zip(indices, keys, values, strict=True):
        entry: dict[str, Any] = {"id": str(i), "partition_id": int(partitions[i]),
                                 "key": _binary(key), "value": _binary(value)}
        if request.headers is not None and (headers := request.headers[i]):
            entry["headers"] = [{"name": h["key"], "value": h["value"]} for h in headers]
        if request.timestamps is not None and request.timestamps[i] >= 0:
            entry["timestamp"] = int(request.timestamps[i])
        if request.producers is not None and (producer := request.producers.at(i)) is not None:
            entry["producer_id"], entry["producer_epoch"], entry["sequence"] = producer
        out.append(_json.encode(entry))
    return out


def _binary(data: bytes | None) -> dict[str, Any] | None:
    return None if data is None else {"type": "BINARY", "data": data}
