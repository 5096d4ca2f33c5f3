"""DeleteRecords over HTTP, fetch below a moved log start, ``/jobs/runs``, and the server
running tier, retention and compaction on its own schedule."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.ingest_api.helpers import fetch_all, string
from tests.ingest_api.test_tiered import _create, _partition, _produce
from tests.server import ServerProcess

pytestmark = pytest.mark.slow


def _delete(client: httpx.Client, topic: str, **offsets: int) -> httpx.Response:
    return client.post(f"/topics/{topic}/records:delete", json={"partitions": [
        {"partition_id": int(p.removeprefix("p")), "offset": o} for p, o in offsets.items()]})


def test_delete_records_moves_the_log_start(client: httpx.Client,
                                            make_topic: Callable[..., str]) -> None:
    topic = make_topic(2, segment_bytes="2000")
    sent = [f"value-{i:04d}" for i in range(60)]
    for i in range(0, 60, 6):
        _produce(client, topic, 0, sent[i:i + 6])
    hw = _partition(client, topic, 0)["high_watermark"]
    r = _delete(client, topic, p0=25)
    assert r.status_code == 200, r.text
    assert r.json()["partitions"] == [{"partition_id": 0, "low_watermark": 25}]
    part = _partition(client, topic, 0)
    assert part["log_start_offset"] == 25 and part["high_watermark"] == hw
    below = client.get(f"/topics/{topic}/partitions/0/records", params={"offset": 3})
    assert below.status_code == 416, below.text
    assert below.json()["error"] == "offset_out_of_range"
    assert below.json()["log_start_offset"] == 25
    got = fetch_all(client, topic, 0, fmt="STRING", start=25)
    assert [r["value"]["data"] for r in got] == sent[25:]
    earliest = client.get(f"/topics/{topic}/partitions/0/offsets", params={"spec": "earliest"})
    assert earliest.json()["offset"] == 25
    # Backwards is a no-op; beyond the high watermark is an error; -1 is the high watermark.
    assert _delete(client, topic, p0=10).json()["partitions"][0]["low_watermark"] == 25
    too_far = _delete(client, topic, p0=hw + 1)
    assert too_far.status_code == 416 and "offset" in too_far.json()["message"]
    assert _delete(client, topic, p1=-1).json()["partitions"] == [
        {"partition_id": 1, "low_watermark": 0}]
    assert _delete(client, topic, p0=-1).json()["partitions"][0]["low_watermark"] == hw
    assert _partition(client, topic, 0)["high_watermark"] == hw
    # Bad input names what to fix.
    assert _delete(client, topic, p7=1).status_code == 404
    bad = client.post(f"/topics/{topic}/records:delete", json={"partitions": []})
    assert bad.status_code == 422 and bad.json()["error"] == "invalid_request"
    runs = client.get("/jobs/runs", params={"job": "delete-records", "topic": topic}).json()
    assert {r["partition"] for r in runs["runs"]} == {0, 1}
    assert client.get("/jobs/runs", params={"limit": 0}).status_code == 422


@pytest.fixture
def jobs_server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path / "data", env={
        "LAKELOG_TIER_INTERVAL_MS": "500", "LAKELOG_RETENTION_INTERVAL_MS": "500",
        "LAKELOG_COMPACT_INTERVAL_MS": "500", "LAKELOG_ROLL_CHECK_INTERVAL_MS": "100"}).start()
    yield proc
    proc.stop(timeout_s=90)


def test_the_server_schedules_retention_and_compaction(jobs_server: ServerProcess) -> None:
    with jobs_server.client() as client:
        _create(client, "short", 1, segment_ms="200", retention_ms="1500")
        _create(client, "table", 1, segment_ms="200", cleanup_policy="compact")
        for round_ in range(3):
            _produce(client, "short", 0, [f"s{round_}-{i}" for i in range(5)])
            r = client.post("/topics/table/records:batch", params={"acks": "1"}, json={
                "entries": [{"id": str(k), "partition_id": 0, "key": string(f"k{k}"),
                             "value": string(f"v{round_}")} for k in range(4)]})
            assert r.status_code == 207 and not r.json()["failures"]
            time.sleep(0.3)  # segment.ms rolls each round into a segment of its own
        deadline = time.monotonic() + 180
        while True:
            short = _partition(client, "short", 0)
            runs = client.get("/jobs/runs", params={"job": "compact"}).json()["runs"]
            if short["log_start_offset"] >= 10 and runs:
                break
            assert time.monotonic() < deadline, jobs_server.log()
            time.sleep(0.3)
        assert short["high_watermark"] == 15
        gone = client.get("/topics/short/partitions/0/records", params={"offset": 0})
        assert gone.status_code == 416
        retention_runs = client.get("/jobs/runs", params={"job": "retention"}).json()["runs"]
        assert retention_runs and retention_runs[0]["topic"] == "short"
        assert runs[0]["topic"] == "table" and runs[0]["records_out"] <= runs[0]["records_in"]
