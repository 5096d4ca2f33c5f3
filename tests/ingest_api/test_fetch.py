"""Fetch, long polling and ListOffsets over HTTP."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
import pytest

from ingest_api.broker.fetch import record_time
from tests.ingest_api.helpers import b64, fetch_all, string

pytestmark = pytest.mark.slow


def test_fetch_limits_and_formats(client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic()
    client.post(f"/topics/{topic}/records:batch", json={"entries": [
        {"id": str(i), "key": string(f"k{i}"), "value": string(f"v{i}")} for i in range(50)]})
    r = client.get(f"/topics/{topic}/partitions/0/records",
                   params={"offset": 10, "max_records": 5, "format": "STRING"}).json()
    assert [x["offset"] for x in r["records"]] == [10, 11, 12, 13, 14]
    assert r["records"][0]["value"] == {"type": "STRING", "data": "v10"}
    assert (r["next_offset"], r["high_watermark"], r["log_start_offset"]) == (15, 50, 0)
    small = client.get(f"/topics/{topic}/partitions/0/records", params={"offset": 0, "max_bytes": 1}).json()
    assert len(small["records"]) >= 1  # at least one batch even over max_bytes
    assert len(fetch_all(client, topic, 0)) == 50


def test_out_of_range_names_the_bounds(client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic()
    client.post(f"/topics/{topic}/records", json={"value": string("v")})
    r = client.get(f"/topics/{topic}/partitions/0/records", params={"offset": 5})
    assert r.status_code == 416
    body = r.json()
    assert (body["log_start_offset"], body["high_watermark"]) == (0, 1) and "0..1" in body["message"]
    at_end = client.get(f"/topics/{topic}/partitions/0/records", params={"offset": 1}).json()
    assert at_end["records"] == [] and at_end["next_offset"] == 1
    missing = client.get(f"/topics/{topic}/partitions/3/records", params={"offset": 0})
    assert missing.status_code == 404
    no_offset = client.get(f"/topics/{topic}/partitions/0/records")
    assert no_offset.status_code == 422 and "offset" in no_offset.json()["message"]


def test_long_poll_answers_as_soon_as_data_arrives(client: httpx.Client,
                                                   make_topic: Callable[..., str]) -> None:
    topic = make_topic()
    result: dict[str, object] = {}

    def poll() -> None:
        start = time.monotonic()
        r = client.get(f"/topics/{topic}/partitions/0/records", params={"offset": 0, "timeout_ms": 10_000})
        result["elapsed"] = time.monotonic() - start
        result["body"] = r.json()

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.3)
    with httpx.Client(base_url=client.base_url) as producer:
        producer.post(f"/topics/{topic}/records", json={"value": string("wake")})
    t.join(15)
    assert 0.25 < float(result["elapsed"]) < 5, result  # type: ignore[arg-type]
    assert [x["offset"] for x in result["body"]["records"]] == [0]  # type: ignore[index]


def test_long_poll_times_out_empty(client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic()
    start = time.monotonic()
    r = client.get(f"/topics/{topic}/partitions/0/records", params={"offset": 0, "timeout_ms": 400})
    elapsed = time.monotonic() - start
    assert r.status_code == 200 and r.json()["records"] == []
    assert 0.35 < elapsed < 3


def test_list_offsets(client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic()
    client.post(f"/topics/{topic}/records:batch", json={"entries": [
        {"id": str(i), "value": string("v"), "timestamp": 1_000_000 + 10 * i} for i in range(10)]})
    base = f"/topics/{topic}/partitions/0/offsets"
    assert client.get(base, params={"spec": "earliest"}).json()["offset"] == 0
    assert client.get(base, params={"spec": "latest"}).json()["offset"] == 10
    assert client.get(base, params={"spec": "timestamp", "timestamp": 1_000_045}).json()["offset"] == 5
    assert client.get(base, params={"spec": "timestamp", "timestamp": 2_000_000}).json()["offset"] is None
    assert client.get(base, params={"spec": "timestamp"}).status_code == 422
    latest_ms = client.get(base, params={"spec": "timestamp", "timestamp": 2**63 - 1}).json()
    assert latest_ms["offset"] is None
    too_big = client.get(base, params={"spec": "timestamp", "timestamp": 2**63})
    assert too_big.status_code == 422 and "timestamp" in too_big.json()["message"]


def test_record_times_are_exact_and_times_outside_datetime_still_render() -> None:
    assert record_time(1_700_000_000_123) == datetime(2023, 11, 14, 22, 13, 20, 123_000, UTC)
    assert record_time(253_402_300_799_999).microsecond == 999_000  # a float would give 998993
    assert record_time(-1) == datetime(1969, 12, 31, 23, 59, 59, 999_000, UTC)
    # Appends refuse such times; a log written by other means still reads.
    assert record_time(2**63 - 1) == datetime.max.replace(tzinfo=UTC)
    assert record_time(-(2**63)) == datetime.min.replace(tzinfo=UTC)


def test_json_format_gives_bytes_it_cannot_decode_back_as_binary(
        client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic()
    deep = b"[" * 5000 + b"]" * 5000  # valid JSON, nested deeper than the decoder goes
    for value in (deep, b"[1, 2]", b"{not json"):
        client.post(f"/topics/{topic}/records", json={"value": {"type": "BINARY", "data": b64(value)}})
    r = client.get(f"/topics/{topic}/partitions/0/records", params={"offset": 0, "format": "JSON"})
    assert r.status_code == 200, r.text
    values = [rec["value"] for rec in r.json()["records"]]
    assert values == [{"type": "BINARY", "data": b64(deep)}, {"type": "JSON", "data": [1, 2]},
                      {"type": "BINARY", "data": b64(b"{not json")}]

