"""Produce over HTTP: reports, partitioning, batching, acks and every kind of bad input."""

from __future__ import annotations

import base64
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import httpx
import pytest

from log_tables.partitioner import partition_for_key
from tests.ingest_api.helpers import b64, fetch_all, string
from tests.server import ServerProcess

pytestmark = pytest.mark.slow


def test_single_record_report_and_round_trip(client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic()
    record = {"key": {"type": "BINARY", "data": b64(b"\x00k")}, "value": {"type": "JSON", "data": {"a": [1, 2]}},
              "headers": [{"name": "h", "value": b64(b"hv")}, {"name": "empty"}],
              "timestamp": "2024-05-01T10:00:00.250Z"}
    r = client.post(f"/topics/{topic}/records", json=record)
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["error_code"] == 200 and report["offset"] == 0 and report["partition_id"] == 0
    assert report["timestamp"].startswith("2024-05-01T10:00:00.25")
    assert report["key"] == {"type": "BINARY", "size": 2} and report["value"]["type"] == "JSON"
    [got] = fetch_all(client, topic, 0)
    assert base64.b64decode(got["key"]["data"]) == b"\x00k"
    assert base64.b64decode(got["value"]["data"]) == b'{"a":[1,2]}'  # compact JSON encoding
    assert got["headers"] == [{"name": "h", "value": b64(b"hv")}, {"name": "empty", "value": None}]
    assert got["timestamp_type"] == "CREATE_TIME"
    [as_json] = fetch_all(client, topic, 0, fmt="JSON")
    assert as_json["value"] == {"type": "JSON", "data": {"a": [1, 2]}}
    assert as_json["key"]["type"] == "BINARY"  # not valid JSON: comes back as BINARY


@pytest.mark.parametrize(("key", "key_bytes"), [
    ({"type": "STRING", "data": "user-42"}, b"user-42"),
    ({"type": "BINARY", "data": b64(b"\x01\x02\x03\x04\x05")}, b"\x01\x02\x03\x04\x05"),
    ({"type": "JSON", "data": {"id": 7, "region": "eu"}}, b'{"id":7,"region":"eu"}'),
])
def test_keys_go_where_kafka_puts_them(client: httpx.Client, make_topic: Callable[..., str],
                                       key: dict[str, object], key_bytes: bytes) -> None:
    topic = make_topic(partitions=7)
    r = client.post(f"/topics/{topic}/records", json={"key": key, "value": string("v")})
    assert r.json()["partition_id"] == partition_for_key(key_bytes, 7)
    batch = client.post(f"/topics/{topic}/records:batch", json={"entries": [
        {"id": str(i), "key": {"type": "STRING", "data": f"k{i}"}} for i in range(100)]})
    for s in batch.json()["successes"]:
        assert s["partition_id"] == partition_for_key(f"k{s['id']}".encode(), 7)


def test_keyless_records_spread_evenly(client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic(partitions=4)
    counts: Counter[int] = Counter()
    for _ in range(40):
        r = client.post(f"/topics/{topic}/records:batch", json={"entries": [
            {"id": str(i), "value": string("x" * 1000)} for i in range(20)]})
        counts.update(s["partition_id"] for s in r.json()["successes"])
    assert set(counts) == {0, 1, 2, 3}
    assert max(counts.values()) <= 2 * min(counts.values()), counts


def test_records_keep_request_order_within_a_partition(client: httpx.Client,
                                                       make_topic: Callable[..., str]) -> None:
    topic = make_topic(partitions=3)
    entries = [{"id": str(i), "key": {"type": "STRING", "data": f"k{i % 5}"}, "value": string(str(i))}
               for i in range(300)]
    r = client.post(f"/topics/{topic}/records:batch", json={"entries": entries})
    assert r.status_code == 207 and not r.json()["failures"]
    by_id = {s["id"]: s for s in r.json()["successes"]}
    for p in range(3):
        values = [int(base64.b64decode(rec["value"]["data"])) for rec in fetch_all(client, topic, p)]
        assert values == sorted(values)
        for rec in fetch_all(client, topic, p):
            v = base64.b64decode(rec["value"]["data"]).decode()
            assert by_id[v]["offset"] == rec["offset"] and by_id[v]["partition_id"] == p


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize("more", [0, 30])  # 30 more records: the columnar path
def test_batch_reports_successes_and_failures_by_id(client: httpx.Client,
                                                    make_topic: Callable[..., str],
                                                    more: int, keyed: bool) -> None:
    topic = make_topic(partitions=2, max_message_bytes="2048")
    key = {"key": string("same-key")} if keyed else {}
    entries = [
        {"id": "ok", "value": string("fine"), **key},
        {"id": "too-big", "value": string("x" * 5000), **key},
        {"id": "ok2", "partition_id": 1, "value": string("fine")},
        *({"id": f"more-{i}", "value": string(str(i)), **key} for i in range(more)),
        {"id": "bad-partition", "partition_id": 5, "value": string("x")},
    ]
    r = client.post(f"/topics/{topic}/records:batch", json={"entries": entries})
    assert r.status_code == 207
    body = r.json()
    assert [s["id"] for s in body["successes"]] == ["ok", "ok2"] + [f"more-{i}" for i in range(more)]
    assert [f["id"] for f in body["failures"]] == ["too-big", "bad-partition"]
    failures = {f["id"]: f for f in body["failures"]}
    assert failures["bad-partition"]["error_code"] == 40402
    assert failures["too-big"]["error_code"] == 41301 and "max.message.bytes" in failures["too-big"]["message"]
    stored = {(p, rec["offset"]): rec["value"]["data"] for p in (0, 1)
              for rec in fetch_all(client, topic, p, fmt="STRING")}
    assert len(stored) == len(body["successes"])
    for s in body["successes"]:
        want = "fine" if s["id"] in ("ok", "ok2") else s["id"].removeprefix("more-")
        assert stored[(s["partition_id"], s["offset"])] == want


def test_batch_reports_each_record_timestamp(client: httpx.Client,
                                             make_topic: Callable[..., str]) -> None:
    topic = make_topic(partitions=3)
    given = ["2024-05-01T10:00:00.250Z", "2024-05-01T10:00:01Z", None] * 10  # columnar path
    entries = [{"id": str(i), "value": string("v"), **({"timestamp": t} if t else {})}
               for i, t in enumerate(given)]
    r = client.post(f"/topics/{topic}/records:batch", json={"entries": entries})
    successes = {s["id"]: s for s in r.json()["successes"]}
    stamps = [datetime.fromisoformat(successes[str(i)]["timestamp"]) for i in range(len(given))]
    assert stamps[0] == datetime(2024, 5, 1, 10, 0, 0, 250_000, UTC)
    assert stamps[1] == datetime(2024, 5, 1, 10, 0, 1, tzinfo=UTC)
    assert stamps[2].year >= 2026 and len(set(stamps)) == 3  # the server's time for the third
    stored = {(p, rec["offset"]): rec["timestamp"] for p in range(3) for rec in fetch_all(client, topic, p)}
    for i, stamp in enumerate(stamps):  # the report says what was stored
        s = successes[str(i)]
        assert datetime.fromisoformat(stored[(s["partition_id"], s["offset"])]) == stamp


def test_streamed_records_get_one_report_each_in_order(client: httpx.Client,
                                                       make_topic: Callable[..., str]) -> None:
    topic = make_topic()

    def body() -> Iterator[bytes]:
        yield json.dumps({"value": string("a")}).encode()
        yield b'\n{"value": {"type": "STRING", "da'
        yield b'ta": "b"}}{"value": {"type": "BINARY", "data": "%%%"}}'
        yield json.dumps({"value": string("c")}).encode()

    r = client.post(f"/topics/{topic}/records", content=body(),
                    headers={"content-type": "application/json"})
    assert r.status_code == 200
    reports = [json.loads(line) for line in r.text.splitlines()]
    assert [x["error_code"] for x in reports] == [200, 200, 400, 200]  # not base64: 400
    assert [x.get("offset") for x in reports] == [0, 1, None, 2]
    assert "$.value.data" in reports[2]["message"]
    concatenated = client.post(f"/topics/{topic}/records",
                               content=b'{"value":{"type":"STRING","data":"d"}} {"value":null}')
    assert [json.loads(x)["offset"] for x in concatenated.text.splitlines()] == [3, 4]


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_acks(client: httpx.Client, make_topic: Callable[..., str], acks: str) -> None:
    topic = make_topic()
    r = client.post(f"/topics/{topic}/records", params={"acks": acks}, json={"value": string("v")})
    assert r.status_code == 200
    assert r.json()["offset"] == (-1 if acks == "0" else 0)  # acks=0 answers before appending
    # acks=0 answered before the append, so a fetch right after may come first: wait for it.
    deadline = time.monotonic() + 30
    while len(stored := fetch_all(client, topic, 0)) < 1 and acks == "0" \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(stored) == 1
    bad = client.post(f"/topics/{topic}/records", params={"acks": "2"}, json={"value": string("v")})
    assert bad.status_code == 422 and "acks" in bad.json()["message"]


def test_log_append_time_stamps_the_broker_time(client: httpx.Client,
                                                make_topic: Callable[..., str]) -> None:
    topic = make_topic(message_timestamp_type="LogAppendTime")
    r = client.post(f"/topics/{topic}/records", json={"value": string("v"), "timestamp": 1000})
    assert not r.json()["timestamp"].startswith("1970")
    [rec] = fetch_all(client, topic, 0)
    assert rec["timestamp_type"] == "LOG_APPEND_TIME" and rec["timestamp"] == r.json()["timestamp"]


def test_compacted_topic_rejects_keyless_records(client: httpx.Client,
                                                 make_topic: Callable[..., str]) -> None:
    topic = make_topic(cleanup_policy="compact")
    r = client.post(f"/topics/{topic}/records", json={"value": string("v")})
    assert r.status_code == 422 and "needs a key" in r.json()["message"]
    # Large batches take the columnar path: all keyless, then every other record keyed.
    keyless = client.post(f"/topics/{topic}/records:batch", json={"entries": [
        {"id": str(i), "value": string("v")} for i in range(20)]}).json()
    assert not keyless["successes"] and len(keyless["failures"]) == 20
    assert all("needs a key" in f["message"] for f in keyless["failures"])
    mixed = client.post(f"/topics/{topic}/records:batch", json={"entries": [
        {"id": str(i), "value": string("v"), **({"key": string(f"k{i}")} if i % 2 else {})}
        for i in range(20)]}).json()
    assert sorted(int(s["id"]) for s in mixed["successes"]) == list(range(1, 20, 2))
    assert sorted(int(f["id"]) for f in mixed["failures"]) == list(range(0, 20, 2))
    assert len(fetch_all(client, topic, 0)) == 10


@pytest.mark.parametrize(("body", "status", "fragment"), [
    (b'{"value": {"type": "STRING", "data": "x"}', 400, "malformed JSON"),
    (b'{"value": {"type": "BINARY", "data": "not base64!"}}', 400, "$.value.data"),
    (b'{"value": {"type": "XML", "data": "x"}}', 422, "$.value.type"),
    (b'{"value": {"type": "STRING", "data": 5}}', 422, "$.value.data"),
    (b'{"vaule": {"type": "STRING", "data": "x"}}', 422, "vaule"),
    (b'{"partition_id": -1}', 422, "partition_id"),
    (b'{"timestamp": "yesterday"}', 422, "timestamp"),
    (b'{"producer_id": 1}', 422, "go together"),
    (b'[1, 2]', 422, "Expected `object`"),
    # Kafka's numbers are int64, and a record time is 0 or more: no overflow, no 500.
    (b'{"timestamp": 9223372036854775808}', 422, "$.timestamp"),
    (b'{"timestamp": 253402300800000}', 422, "$.timestamp"),  # past 9999-12-31T23:59:59.999Z
    (b'{"partition_id": 99999999999999999999999}', 422, "$.partition_id"),
    (b'{"timestamp": "1969-12-31T23:59:59Z"}', 422, "before 1970"),
    (b'{"value": {"type": "JSON", "data": ' + b"[" * 5000 + b"]" * 5000 + b"}}", 400,
     "nested deeper"),
])
def test_bad_records_name_what_to_fix(client: httpx.Client, make_topic: Callable[..., str],
                                      body: bytes, status: int, fragment: str) -> None:
    topic = make_topic()
    r = client.post(f"/topics/{topic}/records", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert fragment in r.json()["message"]
    assert fetch_all(client, topic, 0) == []  # nothing half-written


def test_batch_entries_errors_name_the_index(client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic()
    entries = [{"id": str(i), "value": string("v")} for i in range(5)]
    entries[3]["value"] = {"type": "BINARY", "data": "@@"}
    r = client.post(f"/topics/{topic}/records:batch", json={"entries": entries})
    # The bad entry fails alone, as in Confluent; the others are produced.
    assert r.status_code == 207 and [s["id"] for s in r.json()["successes"]] == ["0", "1", "2", "4"]
    [failure] = r.json()["failures"]
    assert failure["id"] == "3" and "$.entries[3].value.data" in failure["message"]
    too_many = client.post(f"/topics/{topic}/records:batch", json={"entries": [
        {"id": str(i)} for i in range(1001)]})
    assert too_many.status_code == 413 and "1000" in too_many.json()["message"]
    empty = client.post(f"/topics/{topic}/records:batch", json={"entries": []})
    assert empty.status_code == 422 and empty.json()["error_code"] == 42208
    dup = client.post(f"/topics/{topic}/records:batch", json={"entries": [{"id": "a"}, {"id": "a"}]})
    assert dup.status_code == 422 and "'a'" in dup.json()["message"]
    assert len(fetch_all(client, topic, 0)) == 4  # the first batch's good entries only


def test_batches_and_streams_refuse_what_does_not_fit_kafka_numbers_or_nests_too_deep(
        client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic()
    entries: list[dict[str, object]] = [{"id": str(i), "value": string("v")} for i in range(20)]
    entries[7]["timestamp"] = "1969-12-31T23:59:59Z"  # 20 records: the columnar plan
    r = client.post(f"/topics/{topic}/records:batch", json={"entries": entries})
    assert r.status_code == 207
    assert [f["id"] for f in r.json()["failures"]] == ["7"]
    assert "before 1970" in r.json()["failures"][0]["message"]
    assert len(r.json()["successes"]) == 19
    entries[7] = {"id": "7", "value": string("v"), "producer_id": 2**64}
    r = client.post(f"/topics/{topic}/records:batch", json={"entries": entries})
    assert r.status_code == 207 and [f["id"] for f in r.json()["failures"]] == ["7"]
    assert "$.entries[7].producer_id" in r.json()["failures"][0]["message"]
    deep = b"[" * 5000 + b"]" * 5000
    r = client.post(f"/topics/{topic}/records:batch",
                    content=b'{"entries": [{"id": "a", "value": {"type": "JSON", "data": ' + deep + b"}}]}",
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and "nested deeper" in r.json()["message"]

    def stream() -> Iterator[bytes]:  # chunked: reports go out as records are acknowledged
        yield json.dumps({"value": string("s")}).encode()
        yield b'{"value": {"type": "JSON", "data": ' + deep + b"}}"

    r = client.post(f"/topics/{topic}/records", content=stream(),
                    headers={"content-type": "application/json"})
    reports = [json.loads(line) for line in r.text.splitlines()]
    assert [x["error_code"] for x in reports] == [200, 400]
    assert "nested deeper" in reports[1]["message"]
    assert len(fetch_all(client, topic, 0)) == 39  # 19 of each batch, 1 of the stream
    for last in (253_402_300_799_999, "9999-12-31T23:59:59.999Z"):  # to the millisecond
        r = client.post(f"/topics/{topic}/records", json={"value": string("v"), "timestamp": last})
        assert r.json()["timestamp"] == "9999-12-31T23:59:59.999000Z"
        assert fetch_all(client, topic, 0)[-1]["timestamp"] == "9999-12-31T23:59:59.999000Z"


def test_unknown_topic_and_partition(client: httpx.Client, make_topic: Callable[..., str]) -> None:
    r = client.post("/topics/does-not-exist/records", json={"value": string("v")})
    assert r.status_code == 404 and r.json()["error_code"] == 40403
    topic = make_topic(partitions=2)
    r = client.post(f"/topics/{topic}/records", json={"partition_id": 2, "value": string("v")})
    assert r.status_code == 404 and "partitions 0..1" in r.json()["message"]


def test_request_and_record_limits(spawn_server: Callable[..., ServerProcess]) -> None:
    server = spawn_server(max_request_bytes="10000", max_queued_records="1000")
    with server.client() as client:
        client.post("/topics", json={"topic_name": "lim", "partitions_count": 1,
                                     "configs": [{"name": "max.message.bytes", "value": "3000"}]})
        big = client.post("/topics/lim/records", json={"value": string("x" * 20_000)})
        assert big.status_code == 413 and "10000" in big.json()["message"]
        record = client.post("/topics/lim/records", json={"value": string("x" * 5000)})
        assert record.status_code == 413 and "max.message.bytes" in record.json()["message"]

        def chunks() -> Iterator[bytes]:
            for _ in range(300):
                yield json.dumps({"value": string("y" * 50)}).encode()

        streamed = client.post("/topics/lim/records", content=chunks())
        lines = [json.loads(x) for x in streamed.text.splitlines()]
        assert lines[-1]["error_code"] == 413  # the stream is cut at the limit, with a report
        assert all(x["error_code"] == 200 for x in lines[:-1])
        assert len(fetch_all(client, "lim", 0)) == len(lines) - 1


def test_metrics_and_health(server: ServerProcess, client: httpx.Client,
                            make_topic: Callable[..., str]) -> None:
    topic = make_topic()
    client.post(f"/topics/{topic}/records", json={"value": string("hello")})
    fetch_all(client, topic, 0)
    text = httpx.get(f"{server.url}/metrics").text
    assert f'lakelog_records_in_total{{topic="{topic}"}} 1.0' in text
    assert f'lakelog_records_out_total{{topic="{topic}"}} 1.0' in text
    assert f'lakelog_bytes_in_total{{topic="{topic}"}} 5.0' in text  # key + value bytes
    assert f'lakelog_bytes_out_total{{topic="{topic}"}} 5.0' in text
    assert f'lakelog_partition_high_watermark{{partition="0",topic="{topic}"}} 1.0' in text
    latency = [line for line in text.splitlines() if line.startswith("lakelog_request_seconds_count{")
               and 'route="/v3/clusters/{cluster_id}/topics/{topic_name}/records"' in line
               and 'method="POST"' in line and 'status="200"' in line]
    assert latency and float(latency[0].rsplit(" ", 1)[1]) >= 1
    big = make_topic()  # 20 records take the columnar path
    client.post(f"/topics/{big}/records:batch", json={"entries": [
        {"id": str(i), "key": string("k"), "value": string("x" * 10)} for i in range(20)]})
    text = httpx.get(f"{server.url}/metrics").text
    assert f'lakelog_bytes_in_total{{topic="{big}"}} 220.0' in text
    health = httpx.get(f"{server.url}/healthz").json()
    assert health["status"] == "ok" and health["topics"] >= 1
