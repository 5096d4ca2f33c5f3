"""Delivery reports: what a produce answers for each record, in Confluent's shape.

A report is Confluent REST v3's ``ProduceResponse``: ``error_code`` 200, ``cluster_id``,
``topic_name``, ``partition_id``, ``offset``, ``timestamp``, and the key's and value's
``{"type", "size"}`` (the bytes stored; null for a null); a failure is the error body.
A ``records:batch`` answer adds each entry's ``id``; it is built for thousands of
records at a time, without a Python step per record where it can.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat
from operator import attrgetter
from typing import Any, NamedTuple

import msgspec
import numpy as np
from msgspec import StructMeta

from ingest_api.broker.fetch import record_time
from ingest_api.broker.produce.runs import ProduceResult
from ingest_api.http.errors import ApiError, error_body
from ingest_api.http.models import (
    BatchEntry,
    BinaryData,
    JsonData,
    ProduceRecord,
    StringData,
    Success,
)
from ingest_api.http.produce_columns import envelope_bytes
from ingest_api.http.state import CLUSTER_ID

_encoder = msgspec.json.Encoder()


def _tag(env: Any) -> str | None:
    """The envelope's type, or None when it stores a null."""
    return None if env is None or env.data is None else env.__struct_config__.tag


def size(env: Any) -> dict[str, Any] | None:
    """An envelope's ``{"type", "size"}``, or None for a null."""
    stored = envelope_bytes(env)
    return None if stored is None else {"type": _tag(env), "size": len(stored)}


def report(topic: str, rec: ProduceRecord, result: ProduceResult, i: int) -> dict[str, Any]:
    """Record ``i``'s report, or its error body."""
    error = result.errors.get(i)
    if error is not None:
        return error_body(error)[1]
    return {"error_code": 200, "cluster_id": CLUSTER_ID, "topic_name": topic,
            "partition_id": int(result.partitions[i]), "offset": int(result.offsets[i]),
            "timestamp": record_time(int(result.timestamps[i])),
            "key": size(rec.key), "value": size(rec.value)}


class Envelopes(NamedTuple):
    """Per entry, what its delivery report says of its key and value beyond their sizes."""

    key_types: str | list[str | None]  # one type for all, or each one's (None: a null)
    key_sizes: list[int]
    value_types: str | list[str | None]


_TAGS = {BinaryData: "BINARY", StringData: "STRING", JsonData: "JSON"}
_key_of = attrgetter("key")
_value_of = attrgetter("value")
_data_of = attrgetter("data")


def _one_class(envelopes: list[Any]) -> StructMeta | None:
    """The envelopes' class when they all have one and none stores a null (the usual
    batch): found without a Python step per record."""
    classes = set(map(type, envelopes))
    if len(classes) == 1 and (cls := classes.pop()) in _TAGS and (
            None not in map(_data_of, envelopes)):
        return cls
    return None


def _types(envelopes: list[Any], cls: StructMeta | None) -> str | list[str | None]:
    """The one type of all the envelopes, or each one's (None for a null)."""
    if cls is not None:
        return _TAGS[cls]
    return [None if e is None or e.data is None else _TAGS[e.__class__] for e in envelopes]


_STORED_SIZE: dict[StructMeta, Any] = {
    BinaryData: lambda data: map(len, data),
    StringData: lambda data: map(len, map(str.encode, data)),
    JsonData: lambda data: map(len, map(_encoder.encode, data)),
}


def envelopes(entries: list[BatchEntry]) -> Envelopes:
    """What the entries' reports need of their keys and values, taken before the decoded
    entries are let go."""
    # The value's size is the record's stored bytes less the key's (the produce result
    # has them), so only keys, which are short, are measured here.
    keys = list(map(_key_of, entries))
    values = list(map(_value_of, entries))
    key_class, value_class = _one_class(keys), _one_class(values)
    if key_class is not None:
        sizes = list(_STORED_SIZE[key_class](list(map(_data_of, keys))))
    else:
        sizes = [0 if b is None else len(b) for b in map(envelope_bytes, keys)]
    return Envelopes(_types(keys, key_class), sizes, _types(values, value_class))


def _size_raws(types: str | list[str | None], sizes: list[int]) -> list[msgspec.Raw | None]:
    """Each record's ``{"type", "size"}`` as raw JSON (None for a null); each distinct one
    is encoded once."""
    if isinstance(types, str):
        by_size = {n: msgspec.Raw(_encoder.encode({"type": types, "size": n}))
                   for n in set(sizes)}
        return list(map(by_size.__getitem__, sizes))
    pairs = list(zip(types, sizes, strict=True))
    raws = {p: None if p[0] is None else msgspec.Raw(_encoder.encode({"type": p[0], "size": p[1]}))
            for p in set(pairs)}
    return list(map(raws.__getitem__, pairs))


def batch_body(topic: str, ids: list[str], result: ProduceResult, sizes: Envelopes,
                rejected: list[tuple[str, ApiError]]) -> bytes:
    """``successes`` and ``failures`` by entry id, encoded.

    This is the hot path of a large request: the success objects are made by
    ``map`` (no Python frame per record) and each distinct timestamp and each
    distinct ``{"type", "size"}`` is encoded once and embedded as raw JSON.
    """
    ts = result.timestamps
    errors = result.errors
    failures: list[dict[str, Any]] = [{"id": i, **error_body(e)[1]} for i, e in rejected]
    if not len(ts):
        return _encoder.encode({"successes": [], "failures": failures})
    if (ts == ts[0]).all():
        times: Iterable[msgspec.Raw] = repeat(_raw_time(int(ts[0])), len(ts))
    else:
        cache: dict[int, msgspec.Raw] = {}
        times = [cache.get(t) or cache.setdefault(t, _raw_time(t)) for t in ts.tolist()]
    keys = _size_raws(sizes.key_types, sizes.key_sizes)
    values = _size_raws(sizes.value_types,
                        (result.record_bytes - np.array(sizes.key_sizes, np.int64)).tolist())
    count = len(ids)
    successes = list(map(Success, ids, repeat(200, count), repeat(CLUSTER_ID, count),
                         repeat(topic, count), result.partitions.tolist(),
                         result.offsets.tolist(), times, keys, values))
    if errors:
        failures += [{"id": ids[i], **error_body(errors[i])[1]} for i in sorted(errors)]
        successes = [s for i, s in enumerate(successes) if i not in errors]
    return _encoder.encode({"successes": successes, "failures": failures})


def _raw_time(ms: int) -> msgspec.Raw:
    return msgspec.Raw(_encoder.encode(record_time(ms)))
