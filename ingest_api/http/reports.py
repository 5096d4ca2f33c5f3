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
from typing import Any, NamedTuple

import msgspec
import numpy as np

from ingest_api.broker.fetch import record_time
from ingest_api.broker.produce.runs import ProduceResult
from ingest_api.http.errors import ApiError, error_body
from ingest_api.http.models import (
    EncodedData,
    ProduceRecord,
    Success,
)
from ingest_api.http.produce_columns import envelope_bytes
from ingest_api.http.state import CLUSTER_ID

_encoder = msgspec.json.Encoder()


def _tag(env: Any) -> str | None:
    """The envelope's type, or None when it stores a null."""
    if env is None or env.data is None:
        return None
    return env.tag if env.__class__ is EncodedData else env.__struct_config__.tag


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
    """Per entry, what its delivery report says of its key and value beyond their sizes
    (``produce_columns.typed_request`` gives the types, the request the key sizes)."""

    key_types: str | list[str | None]  # one type for all, or each one's (None: a null)
    key_sizes: list[int]
    value_types: str | list[str | None]


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
