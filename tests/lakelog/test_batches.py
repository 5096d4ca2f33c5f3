"""How a request's records go on the wire (``batches.entries``): the one-format path of
bytes keys and values writes what the general path writes, and any other record in a
batch (a str or None key or value, headers, a timestamp) is written in full."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from lakelog.client.batches import SEQUENCE_SPACE, entries
from lakelog.client.futures import Deliveries, FutureRecordMetadata


def _record(key: bytes | str | None, value: bytes | str | None,
            extra: tuple[tuple[tuple[str, bytes], ...], int | None] | None = None
            ) -> FutureRecordMetadata:
    return FutureRecordMetadata(Deliveries(), "t", time.monotonic(), key, value, None, extra)


def _envelope(data: bytes | str | None) -> dict[str, str] | None:
    if data is None:
        return None
    if isinstance(data, str):
        return {"type": "STRING", "data": data}
    return {"type": "BINARY", "data": base64.b64encode(data).decode()}


def _decoded(batch: list[FutureRecordMetadata], producer: tuple[int, int] | None,
             first_sequence: int = 0) -> list[dict[str, Any]]:
    out = [json.loads(e) for e in entries(batch, 3, 10, producer, first_sequence)]
    for i, (entry, r) in enumerate(zip(out, batch, strict=True)):
        assert entry["partition_id"] == 3 and entry["id"] == str(10 + i)
        assert entry["key"] == _envelope(r._key) and entry["value"] == _envelope(r._value)
    return out


def test_bytes_records_take_one_format_with_the_producers_fields() -> None:
    batch = [_record(b"k%d" % i, bytes(range(i))) for i in range(5)]
    out = _decoded(batch, (7, 2), first_sequence=SEQUENCE_SPACE - 2)
    assert [(e["producer_id"], e["producer_epoch"]) for e in out] == [(7, 2)] * 5
    assert [e["sequence"] for e in out] == [SEQUENCE_SPACE - 2, SEQUENCE_SPACE - 1, 0, 1, 2]
    assert all("producer_id" not in e for e in _decoded(batch, None))


def test_any_other_record_in_a_batch_is_written_in_full() -> None:
    batch = [_record(b"k", b"v"), _record("str key", "str value"), _record(None, b"v"),
             _record(b"k", None), _record(b"k", b"v", ((("h", b"\x00"),), 1234))]
    for producer in ((1, 0), None):
        out = _decoded(batch, producer)
        assert out[4]["headers"] == [{"name": "h", "value": "AA=="}]
        assert out[4]["timestamp"] == 1234
        assert all("headers" not in e and "timestamp" not in e for e in out[:4])
    headers_only = [_record(b"k", b"v"), _record(b"k", b"v", ((("h", b"x"),), None))]
    assert "headers" in _decoded(headers_only, (1, 0))[1]
