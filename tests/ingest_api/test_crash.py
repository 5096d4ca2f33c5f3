"""The server SIGKILLed at random moments under concurrent produce, several rounds.

Every acknowledged record must be present exactly once at its acknowledged
offset, offsets must stay dense, and the retries of unacknowledged requests
(idempotent: same producer id, epoch and sequences) must create no duplicates.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from tests.ingest_api.helpers import fetch_all, string
from tests.server import ServerProcess

pytestmark = pytest.mark.slow
PARTITIONS = 3
PRODUCERS = 4
BATCH = 10


class Producer(threading.Thread):
    """Sends idempotent batches to one partition, retrying each until it is acknowledged."""

    def __init__(self, server: ServerProcess, index: int, pid: int, acks: str,
                 stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.server, self.index, self.pid, self.acks, self.stop = server, index, pid, acks, stop
        self.partition = index % PARTITIONS
        self.acked: dict[str, int] = {}  # value -> offset
        self.errors: list[str] = []
        self.retries = 0

    def run(self) -> None:
        seq = 0
        while not self.stop.is_set():
            body = {"entries": [{"id": str(seq + i), "partition_id": self.partition,
                                 "value": string(f"{self.index}:{seq + i}"), "producer_id": self.pid,
                                 "producer_epoch": 0, "sequence": seq + i} for i in range(BATCH)]}
            deadline = time.monotonic() + 60
            while True:
                if time.monotonic() > deadline:
                    self.errors.append(f"batch at {seq} never acknowledged")
                    return
                try:
                    r = httpx.post(f"{self.server.url}/v3/clusters/lakelog/topics/crash/records:batch",
                                   params={"acks": self.acks}, json=body, timeout=10)
                except httpx.TransportError:
                    self.retries += 1
                    time.sleep(0.02)
                    continue
                if r.status_code in (503, 500, 429):
                    self.retries += 1
                    time.sleep(0.02)
                    continue
                failures = r.json()["failures"]
                if r.status_code != 207 or failures:
                    self.errors.append(f"unexpected answer {r.status_code}: {r.text[:300]}")
                    return
                for s in r.json()["successes"]:
                    self.acked[f"{self.index}:{s['id']}"] = s["offset"]
                break
            seq += BATCH


@pytest.mark.parametrize("acks", ["all", "1"])
def test_sigkill_under_concurrent_produce_loses_and_duplicates_nothing(
        spawn_server: Callable[..., ServerProcess], acks: str) -> None:
    rng = random.Random(acks)
    server = spawn_server()
    with server.client() as client:
        client.post("/topics", json={"topic_name": "crash", "partitions_count": PARTITIONS,
                                     "configs": [{"name": "segment.bytes", "value": "65536"}]})
        pids = [client.post("/producers").json()["producer_id"] for _ in range(PRODUCERS)]
    stop = threading.Event()
    producers = [Producer(server, i, pid, acks, stop) for i, pid in enumerate(pids)]
    for p in producers:
        p.start()
    for _ in range(5):
        time.sleep(rng.uniform(0.3, 1.0))
        server.kill()
        server.start()
    time.sleep(0.5)
    stop.set()
    for p in producers:
        p.join(90)
    assert not [e for p in producers for e in p.errors], [e for p in producers for e in p.errors]
    assert sum(p.retries for p in producers) > 0, "no request was ever interrupted by a kill"
    with server.client() as client:
        stored = {part: fetch_all(client, "crash", part, fmt="STRING") for part in range(PARTITIONS)}
    for part, records in stored.items():
        assert [r["offset"] for r in records] == list(range(len(records))), f"gap in partition {part}"
        values = [r["value"]["data"] for r in records]
        assert len(values) == len(set(values)), f"duplicates in partition {part}"
    where = {r["value"]["data"]: (part, r["offset"]) for part, rs in stored.items() for r in rs}
    acked_total = 0
    for p in producers:
        for value, offset in p.acked.items():
            assert where.get(value) == (p.partition, offset), f"{value} acked at {offset}, found {where.get(value)}"
        acked_total += len(p.acked)
        mine = [int(v.split(":")[1]) for v in where if v.startswith(f"{p.index}:")]
        assert sorted(mine) == list(range(len(mine))), f"producer {p.index} has a sequence gap"
    assert acked_total >= PRODUCERS * BATCH
