"""The Consumer on Arrow answers: the same records as the JSON answers, decoded only as
they are read; ``poll_batch``; Kafka's fetch settings; a prefetch that never holds more
than one answer; and reading across a restart, a rebalance and a compaction."""

from __future__ import annotations

import base64
import time
from collections import Counter
from datetime import datetime
from typing import Any

import httpx
import pyarrow as pa
import pytest

from lakelog.client import Consumer, LakelogClientError, Producer, Record, TopicPartition
from lakelog.client.polled import CHUNK_ROWS, KAFKA_SCHEMA
from tests.ingest_api.helpers import fetch_all
from tests.lakelog.helpers import make_topic
from tests.server import ServerProcess

pytestmark = pytest.mark.slow


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _entries(n: int, start: int = 0) -> list[dict[str, Any]]:
    """Records of every shape, over two partitions: null keys, tombstones, empty and
    non-UTF-8 values, JSON values, headers (repeated names, null values) and none."""
    out = []
    for i in range(start, start + n):
        entry: dict[str, Any] = {"id": str(i), "partition_id": i % 2}
        if i % 5 != 3:
            entry["key"] = {"type": "BINARY", "data": _b64(f"k{i}".encode())}
        if i % 7 != 4:
            value = (b"" if i % 11 == 6 else b"\xff\xfe" + bytes([i % 256]) if i % 13 == 1
                     else f'{{"n": {i}}}'.encode() if i % 3 == 0 else f"v{i}".encode() * 3)
            entry["value"] = {"type": "BINARY", "data": _b64(value)}
        if i % 4 == 1:
            entry["headers"] = [{"name": "h", "value": _b64(b"x")},
                                {"name": "h", "value": None},
                                {"name": "z", "value": _b64(bytes([i % 256]))}]
        out.append(entry)
    return out


def _produce(server: ServerProcess, topic: str, entries: list[dict[str, Any]]) -> None:
    with server.client() as c:
        for i in range(0, len(entries), 1000):  # the server's limit a request
            r = c.post(f"/topics/{topic}/records:batch", json={"entries": entries[i:i + 1000]})
            assert r.status_code == 207 and not r.json()["failures"], r.text


def _json_records(server: ServerProcess, topic: str, fmt: str) -> list[Record]:
    """Every record of the topic as the JSON fetch answers it, as the client's Record."""
    def data(env: dict[str, Any] | None) -> Any:
        if env is None:
            return None
        return base64.b64decode(env["data"]) if env["type"] == "BINARY" else env["data"]

    out = []
    with httpx.Client(base_url=server.url + "/v3/clusters/lakelog", timeout=30) as c:
        for p in (0, 1):
            for r in fetch_all(c, topic, p, fmt=fmt):
                out.append(Record(topic, p, r["offset"], datetime.fromisoformat(r["timestamp"]),
                                  data(r["key"]), data(r["value"]),
                                  [(h["name"], None if h["value"] is None
                                    else base64.b64decode(h["value"])) for h in r["headers"]]))
    return out


def _read(consumer: Consumer, n: int, **kwargs: Any) -> list[Record]:
    got: list[Record] = []
    deadline = time.monotonic() + 60
    while len(got) < n:
        assert time.monotonic() < deadline, len(got)
        got += consumer.poll(timeout_s=0.5, **kwargs)
    return got


@pytest.mark.parametrize("fmt", ["BINARY", "STRING", "JSON"])
def test_arrow_poll_returns_the_records_of_the_json_answer(server: ServerProcess,
                                                           fmt: str) -> None:
    make_topic(server, "t", 2)
    _produce(server, "t", _entries(300))
    expected = _json_records(server, "t", fmt)
    with Consumer(server.url, "g", ["t"], auto_offset_reset="earliest",
                  format=fmt, max_poll_records=37) as consumer:  # type: ignore[arg-type]
        got = _read(consumer, 300)
    key = lambda r: (r.partition, r.offset)  # noqa: E731
    assert sorted(got, key=key) == sorted(expected, key=key)
    assert any(r.value is None for r in got) and any(r.key is None for r in got)
    assert any((h, None) in r.headers for r in got for h in ("h",))


def test_records_are_made_only_as_they_are_read_and_poll_batch_gives_arrow(
        server: ServerProcess) -> None:
    make_topic(server, "t", 2)
    _produce(server, "t", _entries(2000))
    expected = {(r.partition, r.offset): r for r in _json_records(server, "t", "BINARY")}
    with Consumer(server.url, "g", ["t"], auto_offset_reset="earliest",
                  max_poll_records=1000) as consumer:
        deadline = time.monotonic() + 60
        records = consumer.poll(timeout_s=0.5)
        while len(records) < 2 * CHUNK_ROWS:
            assert time.monotonic() < deadline
            records = consumer.poll(timeout_s=0.5)
        assert records.materialized == 0
        first = records[0]
        assert records.materialized == CHUNK_ROWS
        assert first == expected[first.partition, first.offset]
        assert records[-1] == expected[records[-1].partition, records[-1].offset]
        assert len(list(records)) == len(records) == records.materialized
        # As when poll answered a list: records add up to a list.
        assert records + records[:1] == [*records, records[0]]
        assert [] + records == list(records)  # noqa: RUF005 (the + is what is tested)
    with Consumer(server.url, "b", ["t"], auto_offset_reset="earliest",
                  max_poll_records=300) as consumer:
        batches: list[pa.RecordBatch] = []
        deadline = time.monotonic() + 60
        while sum(b.num_rows for b in batches) < 2000:
            assert time.monotonic() < deadline
            batch = consumer.poll_batch(timeout_s=0.5)
            assert batch.schema == KAFKA_SCHEMA and batch.num_rows <= 300
            batches.append(batch)
        table = pa.Table.from_batches(batches)
        rows = table.to_pylist()
        assert len(rows) == 2000 and {(r["partition"], r["offset"]) for r in rows} == set(expected)
        for r in rows:
            e = expected[r["partition"], r["offset"]]
            assert (r["key"], r["value"], r["timestamp"]) == (e.key, e.value, e.timestamp)
            assert [(h["key"], h["value"]) for h in r["headers"] or []] == e.headers
        consumer.commit()
        assert consumer.committed() == {TopicPartition("t", 0): 1000,
                                        TopicPartition("t", 1): 1000}


def test_a_slow_application_never_holds_more_than_two_answers(server: ServerProcess) -> None:
    """The application takes 10 records a poll from answers of about 30 (fetch_max_bytes
    30,000 of 1,000-byte values): the client holds at most two answers (the buffer and one
    come meanwhile), each about fetch_max_bytes of data (a 10-record stored batch past it
    at most), whatever max_poll_records says, and a commit never covers a record not
    handed out."""
    make_topic(server, "t", 2)
    with Producer(server.url, batch_records=10) as producer:
        for i in range(2000):
            producer.send("t", b"v" * 1000, key=f"k{i}".encode(), partition=i % 2)
        producer.flush()
    with Consumer(server.url, "g", ["t"], auto_offset_reset="earliest", max_poll_records=100,
                  fetch_max_bytes=30_000, max_partition_fetch_bytes=20_000,
                  enable_auto_commit=False) as consumer:
        answer_bytes = 30_000 + 10 * 1010  # fetch_max_bytes, and a stored batch past it
        seen: list[tuple[int, int]] = []
        deadline = time.monotonic() + 120
        while len(seen) < 2000:
            assert time.monotonic() < deadline, len(seen)
            records = consumer.poll(timeout_s=0.5, max_records=10)
            assert len(records) <= 10
            seen += [(r.partition, r.offset) for r in records]
            handed = {p: max((o for q, o in seen if q == p), default=-1) + 1 for p in (0, 1)}
            for p in (0, 1):  # the positions cover what was handed out, not what is buffered
                if handed[p]:
                    assert consumer.position(TopicPartition("t", p)) == handed[p]
            if len(seen) % 200 == 0:
                consumer.commit()
                committed = consumer.committed()
                for tp, off in committed.items():
                    assert off <= handed[tp.partition]  # never past what was handed out
            assert consumer._fetcher.buffered_bytes <= 2 * answer_bytes
        fetcher = consumer._fetcher
        assert 0 < fetcher.max_buffered_records <= 2 * answer_bytes // 1000
        assert fetcher.max_buffered_bytes <= 2 * answer_bytes
        assert fetcher.requests >= 2000 * 1000 / answer_bytes
    assert sorted(seen) == sorted((i % 2, i // 2) for i in range(2000))


def test_fetch_min_bytes_waits_for_more_than_one_record(server: ServerProcess) -> None:
    """The server answers at the first record; with fetch_min_bytes the client asks again
    within fetch_max_wait_ms, so records produced meanwhile come in the same poll."""
    make_topic(server, "t", 1)
    with Consumer(server.url, "g", ["t"], auto_offset_reset="earliest",
                  fetch_min_bytes=10_000, fetch_max_wait_ms=10_000) as consumer:
        assert consumer.poll(timeout_s=0.3) == []
        with Producer(server.url, linger_ms=0) as producer:
            for _ in range(20):
                producer.send("t", b"x" * 1000, key=b"k").result(timeout=30)
                time.sleep(0.02)
        deadline = time.monotonic() + 60
        records = consumer.poll(timeout_s=0.5)
        while not records:
            assert time.monotonic() < deadline
            records = consumer.poll(timeout_s=0.5)
        assert len(records) >= 10  # one answer: 10 KB waited for, not the first record
        assert consumer._fetcher.requests >= 2



def _offsets(server: ServerProcess, topic: str) -> set[tuple[int, int]]:
    with httpx.Client(base_url=server.url + "/v3/clusters/lakelog", timeout=30) as c:
        return {(p, r["offset"]) for p in (0, 1) for r in fetch_all(c, topic, p)}


def test_reading_across_a_restart_a_rebalance_and_a_compaction_loses_nothing(
        jobs_server: ServerProcess) -> None:
    """Two consumers commit after every poll. The first reads part of the topic; the
    server is SIGKILLed and started again; older segments are tiered and compacted; a
    second consumer joins. Every record the compaction kept is read, nothing else is
    invented, and a record is read twice only as at-least-once allows: what was polled
    and whose commit was refused, or polled but not yet committed when the membership
    changed (a poll's worth a partition)."""
    server = jobs_server
    make_topic(server, "c", 2, **{"segment.ms": "300", "local.retention.ms": "0",
                                  "delta.target.lag.ms": "-1", "cleanup.policy": "compact",
                                  "min.cleanable.dirty.ratio": "0.01"})

    def batch(start: int) -> list[dict[str, Any]]:
        # Even records share six keys per partition (compaction keeps the latest), odd
        # ones have keys of their own.
        return [{"id": str(i), "partition_id": i % 2,
                 "key": {"type": "STRING", "data": f"k{i % 12}" if i % 4 < 2 else f"u{i}"},
                 "value": {"type": "STRING", "data": f"v{i}"}} for i in range(start, start + 100)]

    produced = {(p, o) for p in (0, 1) for o in range(200)}
    for start in (0, 100):
        _produce(server, "c", batch(start))
        time.sleep(0.4)  # segment.ms: each produce in a segment of its own
    counts: Counter[tuple[int, int]] = Counter()
    poll_records = 10
    settings: dict[str, Any] = {"auto_offset_reset": "earliest", "format": "STRING",
                                "session_timeout_ms": 6000, "enable_auto_commit": False,
                                "max_poll_records": poll_records}

    refused = [0]  # records of polls whose commit was refused: read again by design

    def poll(consumer: Consumer) -> None:
        got = 0
        for r in consumer.poll(timeout_s=0.3):
            counts[r.partition, r.offset] += 1
            got += 1
        try:
            consumer.commit()
        except LakelogClientError as exc:  # Kafka's CommitFailedException: read again
            assert exc.status in (404, 409), exc
            refused[0] += got

    a = Consumer(server.url, "g", ["c"], **settings)
    b: Consumer | None = None
    try:
        deadline = time.monotonic() + 60
        while sum(counts.values()) < 40:
            assert time.monotonic() < deadline
            poll(a)
        server.kill()
        server.start()
        with server.client() as c:
            r = c.put("/topics/c/configs/segment.ms", json={"value": "3600000"})
            assert r.status_code == 204, r.text
        _produce(server, "c", batch(200))  # stays hot
        deadline = time.monotonic() + 240
        while len(_offsets(server, "c")) == 300:  # until compacted
            assert time.monotonic() < deadline, server.log()
            poll(a)
            time.sleep(0.2)
        b = Consumer(server.url, "g", ["c"], **settings)
        deadline = time.monotonic() + 60
        while not (a.assignment() and b.assignment()):  # the rebalance
            assert time.monotonic() < deadline, (a.assignment(), b.assignment())
            poll(a)
            poll(b)
        _produce(server, "c", batch(300))
        kept = _offsets(server, "c")
        deadline = time.monotonic() + 120
        while not kept <= set(counts):
            assert time.monotonic() < deadline, sorted(kept - set(counts))[:10]
            poll(a)
            poll(b)
        assert a.rejoins >= 1 and b.assignment() and a.assignment()
    finally:
        a.close()
        if b is not None:
            b.close()
    assert set(counts) <= produced  # nothing invented
    twice = {k: n for k, n in counts.items() if n > 1}
    # Read again: what polls handed out whose commits were refused (while the server was
    # down the consumer went on with the answer it held, and the member was gone when
    # the commits came), and at each membership change (the restart, the join) at most
    # a poll's worth a partition polled and not yet committed.
    assert sum(n - 1 for n in twice.values()) <= refused[0] + 2 * 2 * poll_records, twice
