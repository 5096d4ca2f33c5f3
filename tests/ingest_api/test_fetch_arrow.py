"""Fetch and group poll as Arrow (``Accept: application/vnd.apache.arrow.stream``) on a
real server: the same records as the JSON answers, record for record, the paging in
``Lakelog-*`` headers, errors still JSON; across the hot/Delta boundary and compacted
gaps too."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import httpx
import pyarrow as pa
import pytest

from log_tables.cold.topic_reader import SPARK_SCHEMA
from tests.server import ServerProcess

pytestmark = pytest.mark.slow

ARROW = "application/vnd.apache.arrow.stream"
Row = tuple[int, datetime, str, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _entry(i: int, key: bytes | None, value: bytes | None,
           headers: list[tuple[str, bytes | None]] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": str(i), "partition_id": 0}
    if key is not None:
        entry["key"] = {"type": "BINARY", "data": _b64(key)}
    if value is not None:
        entry["value"] = {"type": "BINARY", "data": _b64(value)}
    if headers is not None:
        entry["headers"] = [{"name": n, "value": None if v is None else _b64(v)}
                            for n, v in headers]
    return entry


def _produce(client: httpx.Client, topic: str, entries: list[dict[str, Any]]) -> None:
    r = client.post(f"/topics/{topic}/records:batch", params={"acks": "1"},
                    json={"entries": entries})
    assert r.status_code == 207 and not r.json()["failures"], r.text


def _mixed(n: int, start: int = 0, key_of: Callable[[int], bytes | None] | None = None
           ) -> list[dict[str, Any]]:
    """Records with every shape: keys and null keys, tombstones, empty values, headers
    (with null values, repeated names) and none; ``key_of(i)``: record i's key instead."""
    out = []
    for i in range(start, start + n):
        key = key_of(i) if key_of else None if i % 5 == 3 else f"k{i}".encode()
        value = None if i % 7 == 4 else (b"" if i % 11 == 6 else bytes([i % 256]) * (i % 40 + 1))
        headers: list[tuple[str, bytes | None]] | None = None
        if i % 3 == 1:
            headers = [("h", f"v{i}".encode()), ("nul", None), ("h", b"\x00\xff")]
        elif i % 3 == 2:
            headers = []
        out.append(_entry(i, key, value, headers))
    return out


def _from_json(records: list[dict[str, Any]]) -> list[Row]:
    def data(d: dict[str, Any] | None) -> bytes | None:
        return None if d is None else base64.b64decode(d["data"])

    return [(r["offset"], datetime.fromisoformat(r["timestamp"]), r["timestamp_type"],
             data(r["key"]), data(r["value"]),
             [(h["name"], None if h["value"] is None else base64.b64decode(h["value"]))
              for h in r["headers"]])
            for r in records]


def _from_arrow(table: pa.Table) -> list[Row]:
    types = {0: "CREATE_TIME", 1: "LOG_APPEND_TIME"}
    return [(r["offset"], r["timestamp"], types[r["timestampType"]], r["key"], r["value"],
             [(h["key"], h["value"]) for h in r["headers"] or []])
            for r in table.to_pylist()]


def _read_arrow(r: httpx.Response) -> pa.Table:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == ARROW
    reader = pa.ipc.open_stream(r.content)
    assert reader.schema == SPARK_SCHEMA
    table = reader.read_all()
    assert int(r.headers["lakelog-record-count"]) == table.num_rows
    return table


def _both(client: httpx.Client, path: str, **params: Any
          ) -> tuple[dict[str, Any], httpx.Response, pa.Table]:
    """The same request as JSON (BINARY) and as Arrow."""
    js = client.get(path, params={**params, "format": "BINARY"})
    assert js.status_code == 200, js.text
    ar = client.get(path, params=params, headers={"accept": ARROW})
    return js.json(), ar, _read_arrow(ar)


def _same_fetch(client: httpx.Client, topic: str, offset: int, **params: Any) -> list[Row]:
    """Fetch ``offset`` both ways; assert they agree record for record and on paging."""
    body, ar, table = _both(client, f"/topics/{topic}/partitions/0/records", offset=offset,
                            **params)
    rows = _from_arrow(table)
    assert rows == _from_json(body["records"]), (offset, params)
    assert table.column("topic").to_pylist() == [topic] * table.num_rows
    assert table.column("partition").to_pylist() == [0] * table.num_rows
    assert int(ar.headers["lakelog-next-offset"]) == body["next_offset"]
    assert int(ar.headers["lakelog-high-watermark"]) == body["high_watermark"]
    assert int(ar.headers["lakelog-log-start-offset"]) == body["log_start_offset"]
    return rows


def test_hot_fetch_in_arrow_equals_json(client: httpx.Client,
                                        make_topic: Callable[..., str]) -> None:
    topic = make_topic()
    _produce(client, topic, _mixed(40))
    for i in range(40, 45):  # single-record batches: coalesced into one IPC message
        _produce(client, topic, _mixed(1, start=i))
    _produce(client, topic, _mixed(30, start=45))
    all_rows = _same_fetch(client, topic, 0, max_records=1000)
    assert [r[0] for r in all_rows] == list(range(75))
    assert any(r[3] is None for r in all_rows) and any(r[4] is None for r in all_rows)
    assert any((n, None) in r[5] for r in all_rows for n in ["nul"])
    for offset in (0, 1, 17, 39, 40, 42, 44, 45, 74, 75):
        for max_records in (1, 3, 10, 500):
            _same_fetch(client, topic, offset, max_records=max_records)
        for max_bytes in (1, 100, 2000):
            _same_fetch(client, topic, offset, max_bytes=max_bytes)


def test_empty_answer_is_a_stream_of_the_schema(client: httpx.Client,
                                                make_topic: Callable[..., str]) -> None:
    topic = make_topic()
    empty = _same_fetch(client, topic, 0)
    assert empty == []
    _produce(client, topic, _mixed(3))
    r = client.get(f"/topics/{topic}/partitions/0/records", params={"offset": 3},
                   headers={"accept": ARROW})
    assert _read_arrow(r).num_rows == 0 and r.headers["lakelog-next-offset"] == "3"


def test_accept_picks_the_answer_and_json_stays_unchanged(
        client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic()
    _produce(client, topic, _mixed(5))
    path = f"/topics/{topic}/partitions/0/records"
    plain = client.get(path, params={"offset": 0})
    assert plain.headers["content-type"] == "application/json"
    for accept in ("*/*", "application/json", f"application/json, {ARROW};q=0.5",
                   f"{ARROW};q=0", "text/html"):
        r = client.get(path, params={"offset": 0}, headers={"accept": accept})
        assert r.headers["content-type"] == "application/json", accept
        assert r.content == plain.content, accept
    for accept in (ARROW, f"{ARROW}, application/json", f"application/json;q=0.9, {ARROW}",
                   f"*/*;q=0.1, {ARROW};q=0.5"):
        r = client.get(path, params={"offset": 0}, headers={"accept": accept})
        assert _read_arrow(r).num_rows == 5, accept


def test_errors_stay_json_with_the_same_status(client: httpx.Client,
                                               make_topic: Callable[..., str]) -> None:
    topic = make_topic()
    _produce(client, topic, _mixed(3))
    for path, params in [(f"/topics/{topic}/partitions/7/records", {"offset": 0}),
                         (f"/topics/{topic}/partitions/0/records", {"offset": 99}),
                         (f"/topics/no-such-{topic}/partitions/0/records", {"offset": 0}),
                         (f"/topics/{topic}/partitions/0/records", {"offset": -1})]:
        js = client.get(path, params=params)
        ar = client.get(path, params=params, headers={"accept": ARROW})
        assert js.status_code >= 400 and ar.status_code == js.status_code, path
        assert ar.headers["content-type"] == "application/json"
        assert ar.json() == js.json()


def _join(client: httpx.Client, group: str, topic: str) -> str:
    r = client.post(f"/consumer-groups/{group}/members",
                    json={"topics": [topic], "session_timeout_ms": 30_000,
                          "auto_offset_reset": "earliest"})
    assert r.status_code == 200, r.text
    member: str = r.json()["member_id"]
    return member


def _poll_all(client: httpx.Client, group: str, member: str, arrow: bool, total: int,
              **params: Any) -> Iterator[tuple[httpx.Response, list[Row]]]:
    got = 0
    deadline = time.monotonic() + 30
    while got < total:
        assert time.monotonic() < deadline
        r = client.get(f"/consumer-groups/{group}/members/{member}/records",
                       params={"timeout_ms": 200, **params},
                       headers={"accept": ARROW} if arrow else {})
        assert r.status_code == 200, r.text
        rows = _from_arrow(_read_arrow(r)) if arrow else _from_json(r.json()["records"])
        got += len(rows)
        yield r, rows


def test_group_poll_in_arrow_equals_json(client: httpx.Client,
                                         make_topic: Callable[..., str]) -> None:
    topic = make_topic(partitions=3)
    for p in range(3):
        entries = _mixed(25, start=100 * p)
        for e in entries:
            e["partition_id"] = p
        _produce(client, topic, entries)
    pages = {}
    for arrow in (False, True):
        group = f"g-{uuid.uuid4().hex[:10]}"
        member = _join(client, group, topic)
        pages[arrow] = list(_poll_all(client, group, member, arrow, 75, max_records=7))
        epoch = client.get(f"/consumer-groups/{group}").json()["members"][0]["member_epoch"]
        if arrow:
            assert all(int(r.headers["lakelog-member-epoch"]) == epoch for r, _ in pages[arrow])
        assert client.delete(f"/consumer-groups/{group}/members/{member}").status_code == 204
    # The same pages: the same partitions in the same turns, the same records.
    assert [rows for _, rows in pages[True]] == [rows for _, rows in pages[False]]
    assert sum(len(rows) for _, rows in pages[True]) == 75
    assert all(len(rows) <= 7 for _, rows in pages[True])
    r = client.get("/consumer-groups/g-none/members/nobody/records",
                   headers={"accept": ARROW})
    js = client.get("/consumer-groups/g-none/members/nobody/records")
    assert r.status_code == js.status_code >= 400 and r.json() == js.json()


def _offsets(client: httpx.Client, topic: str) -> list[int]:
    """Every offset of partition 0, fetched page by page in JSON."""
    out: list[int] = []
    offset = 0
    while True:
        body = client.get(f"/topics/{topic}/partitions/0/records",
                          params={"offset": offset, "max_records": 100}).json()
        out += [r["offset"] for r in body["records"]]
        if body["next_offset"] >= body["high_watermark"]:
            return out
        offset = body["next_offset"]



def test_arrow_across_the_delta_tier_and_compacted_gaps(
        jobs_server: ServerProcess) -> None:
    """Offsets 0-19 in two segments, tiered, compacted and dropped from the hot tier
    (the even ones share two keys: only 16 and 18 of them stay); 20-29 hot; every offset
    fetched both ways."""
    def key_of(i: int) -> bytes:
        return f"k{i % 4}".encode() if i % 2 == 0 and i < 20 else f"u{i}".encode()

    expected = [*range(1, 16, 2), 16, 17, 18, 19, *range(20, 30)]
    with jobs_server.client() as client:
        r = client.post("/topics", json={"topic_name": "cold", "partitions_count": 1,
                                         "configs": [
                                             {"name": "segment.ms", "value": "300"},
                                             {"name": "local.retention.ms", "value": "0"},
                                             {"name": "delta.target.lag.ms", "value": "-1"},
                                             {"name": "cleanup.policy", "value": "compact"},
                                             {"name": "min.cleanable.dirty.ratio",
                                              "value": "0.01"}]})
        assert r.status_code == 201, r.text
        for start in (0, 10):
            _produce(client, "cold", _mixed(10, start=start, key_of=key_of))
            time.sleep(0.4)  # segment.ms rolls each batch into a segment of its own
        r = client.put("/topics/cold/configs/segment.ms", json={"value": "3600000"})
        assert r.status_code == 204, r.text
        _produce(client, "cold", _mixed(10, start=20, key_of=key_of))  # stays hot
        deadline = time.monotonic() + 180
        while True:
            assert time.monotonic() < deadline, jobs_server.log()
            part = client.get("/topics/cold/partitions/0").json()
            if part["hot_log_start_offset"] >= 20 and _offsets(client, "cold") == expected:
                break
            time.sleep(0.3)
        offsets = expected
        assert client.get("/topics/cold/partitions/0").json()["hot_log_start_offset"] == 20
        # A fetch from the Delta tier stops at its end; the next one reads the hot tier.
        assert [r[0] for r in _same_fetch(client, "cold", 0, max_records=100)] == \
            offsets[:12]
        for offset in range(31):
            for max_records in (1, 4, 100):
                _same_fetch(client, "cold", offset, max_records=max_records)
            _same_fetch(client, "cold", offset, max_bytes=1)
        # A group reads across the boundary in Arrow the same as in JSON.
        pages = {}
        for arrow in (False, True):
            group = f"g-{uuid.uuid4().hex[:10]}"
            member = _join(client, group, "cold")
            pages[arrow] = [rows for _, rows in _poll_all(client, group, member, arrow,
                                                          len(offsets), max_records=6)]
        assert pages[True] == pages[False]
        assert [r[0] for page in pages[True] for r in page] == offsets
        # Nothing moved while the answers were compared.
        assert client.get("/topics/cold/partitions/0").json()["hot_log_start_offset"] == 20
