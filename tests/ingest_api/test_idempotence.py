"""Idempotent producers: retries answered with original offsets, gaps and old epochs rejected,
and the state surviving a restart and a crash."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

from ingest_api.broker.produce.planner import _idempotent_runs, _next_in_run
from ingest_api.broker.produce.runs import Run
from log_tables.hot.producer_state import MAX_SEQUENCE
from log_tables.records import build_batch
from tests.ingest_api.helpers import fetch_all, string
from tests.server import ServerProcess

pytestmark = pytest.mark.slow


def entries(pid: int, epoch: int, first_seq: int, count: int, partition: int = 0) -> dict[str, Any]:
    return {"entries": [{"id": str(first_seq + i), "partition_id": partition,
                         "value": string(f"{pid}:{first_seq + i}"), "producer_id": pid,
                         "producer_epoch": epoch, "sequence": first_seq + i} for i in range(count)]}


def offsets(r: httpx.Response) -> list[int]:
    assert r.status_code == 207, r.text
    assert not r.json()["failures"], r.json()["failures"]
    return [s["offset"] for s in r.json()["successes"]]


def test_retry_gap_and_fencing(client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic()
    producer = client.post("/producers").json()
    pid, epoch = producer["producer_id"], producer["producer_epoch"]
    assert epoch == 0
    first = offsets(client.post(f"/topics/{topic}/records:batch", json=entries(pid, epoch, 0, 5)))
    assert first == [0, 1, 2, 3, 4]
    again = offsets(client.post(f"/topics/{topic}/records:batch", json=entries(pid, epoch, 0, 5)))
    assert again == first  # a retry: original offsets, nothing appended
    partial = offsets(client.post(f"/topics/{topic}/records:batch", json=entries(pid, epoch, 3, 4)))
    assert partial == [3, 4, 5, 6]  # overlapping retry: the new tail only is appended
    assert len(fetch_all(client, topic, 0)) == 7
    gap = client.post(f"/topics/{topic}/records:batch", json=entries(pid, epoch, 9, 1)).json()
    assert gap["failures"][0]["error_code"] == 40904 and "expected 7" in gap["failures"][0]["message"]
    bumped = client.post("/producers", json={"producer_id": pid}).json()
    assert bumped == {"producer_id": pid, "producer_epoch": 1}
    zombie = client.post(f"/topics/{topic}/records:batch", json=entries(pid, 0, 7, 1)).json()
    assert zombie["failures"][0]["error_code"] == 40903 and "fenced" in zombie["failures"][0]["message"]
    fresh = offsets(client.post(f"/topics/{topic}/records:batch", json=entries(pid, 1, 0, 2)))
    assert fresh == [7, 8]  # a new epoch starts at sequence 0
    unknown = client.post(f"/topics/{topic}/records", json={
        "value": string("x"), "producer_id": 10**9, "producer_epoch": 0, "sequence": 0})
    assert unknown.status_code == 404 and "unknown" in unknown.json()["message"]
    assert client.post("/producers", json={"producer_id": 10**9}).status_code == 404


@pytest.mark.parametrize("stop", ["restart", "crash"])
def test_state_survives_restart_and_crash(spawn_server: Callable[..., ServerProcess], stop: str) -> None:
    server = spawn_server()
    with server.client() as client:
        client.post("/topics", json={"topic_name": "idem", "partitions_count": 2,
                                     "configs": [{"name": "segment.bytes", "value": "4096"}]})
        pid = client.post("/producers").json()["producer_id"]
        sent = [offsets(client.post("/topics/idem/records:batch", json=entries(pid, 0, s, 3, p)))
                for s in range(0, 30, 3) for p in (0, 1)]
    if stop == "restart":
        server.stop()
    else:
        server.kill()
    server.start()
    with server.client() as client:
        for i, s in enumerate(range(0, 30, 3)):
            for j, p in enumerate((0, 1)):
                if s >= 15:  # the last 5 batches of each partition are remembered
                    assert offsets(client.post("/topics/idem/records:batch",
                                               json=entries(pid, 0, s, 3, p))) == sent[2 * i + j]
        nxt = offsets(client.post("/topics/idem/records:batch", json=entries(pid, 0, 30, 1, 0)))
        assert nxt == [30]
        assert len(fetch_all(client, "idem", 0)) == 31 and len(fetch_all(client, "idem", 1)) == 30
        bumped = client.post("/producers", json={"producer_id": pid}).json()["producer_epoch"]
        assert bumped == 1  # the epoch counter survived too


def test_a_request_whose_sequences_wrap_is_one_run() -> None:
    """The planning step keeps consecutive sequences of one producer together across the
    wrap from 2**31 - 1 to 0 (the log's own wrap handling is tested in test_partition_log)."""
    batch = build_batch([b"a", b"b", b"c", b"d", b"e"], timestamps=1)
    seqs = [MAX_SEQUENCE - 1, MAX_SEQUENCE, 0, 1, 3]  # a gap before the last one
    producers: list[tuple[int, int, int] | None] = [(7, 0, s) for s in seqs]
    runs = _idempotent_runs(0, batch, np.arange(5), np.full(5, 10), 0, producers, 1000)
    assert [(r.producer, r.indices.tolist()) for r in runs] == [
        ((7, 0, MAX_SEQUENCE - 1), [0, 1, 2, 3]), ((7, 0, 3), [4])]
    # Cut by size (two records of 10 bytes fit in 25): the sequences stay dense across
    # the cuts and the wrap, and each cut's batch holds exactly its records.
    cut = _idempotent_runs(0, batch, np.arange(5), np.full(5, 10), 0, producers, 25)
    assert [(r.producer, r.indices.tolist()) for r in cut] == [
        ((7, 0, MAX_SEQUENCE - 1), [0, 1]), ((7, 0, 0), [2, 3]), ((7, 0, 3), [4])]
    assert [r.to_batch().column(2).to_pylist() for r in cut] == [
        [b"a", b"b"], [b"c", b"d"], [b"e"]]
    small = Run(0, None, np.array([0, 1]), 20, (7, 0, MAX_SEQUENCE - 1), [])
    assert _next_in_run(small, (7, 0, 0)) and not _next_in_run(small, (7, 0, MAX_SEQUENCE + 1))
