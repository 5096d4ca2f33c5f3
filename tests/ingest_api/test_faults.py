"""Faults on a real server: a torn Delta log entry, a paused process (a damaged segment:
``test_corrupt.py``). Each: a clear error while it lasts, nothing acknowledged lost."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import httpx

from lakelog.client import Consumer, LakelogClientError, Producer
from tests.server import ServerProcess

X = {"type": "STRING", "data": "x" * 100}


def test_torn_newest_delta_log_entry_is_set_aside_at_restart(
        spawn_server: Callable[..., ServerProcess]) -> None:
    server = spawn_server()
    with server.client() as c:
        c.post("/topics", json={"topic_name": "t", "partitions_count": 1}).raise_for_status()
        for offset in (5, 7):
            c.post("/consumer-groups/g/offsets", json={"offsets": [
                {"topic_name": "t", "partition_id": 0, "offset": offset}]}).raise_for_status()
    server.kill()
    log_dir = server.data_dir / "warehouse" / "_consumer_offsets" / "_delta_log"
    commits = sorted(log_dir.glob("*.json"))
    newest = int(commits[-1].stem)
    torn = log_dir / f"{newest + 1:020d}.json"
    torn.write_bytes(commits[-1].read_bytes()[:40])  # half a commit, as a crash could leave
    server.start()
    with server.client() as c:
        offsets = c.get("/consumer-groups/g/offsets").json()["offsets"]
        assert [o["offset"] for o in offsets] == [7]
        c.post("/consumer-groups/g/offsets", json={"offsets": [
            {"topic_name": "t", "partition_id": 0, "offset": 9}]}).raise_for_status()
    assert torn.exists()  # version newest+1 again, now a whole commit
    assert list((log_dir.parent / "_torn_commits").iterdir())
    assert "newest Delta log entry is torn" in server.log()
    server.stop()
    server.start()
    with server.client() as c:
        assert c.get("/consumer-groups/g/offsets").json()["offsets"][0]["offset"] == 9


def test_paused_server_beyond_session_timeouts_loses_nothing(
        spawn_server: Callable[..., ServerProcess]) -> None:
    server = spawn_server()
    assert server.proc is not None
    with server.client() as c:
        c.post("/topics", json={"topic_name": "t", "partitions_count": 2}).raise_for_status()
    sent: set[str] = set()
    with Producer(server.url, acks="all") as producer:
        for i in range(200):
            producer.send("t", f"before {i}", key=str(i))
            sent.add(f"before {i}")
    got: list[str] = []
    consumer = Consumer(server.url, "g", ["t"], auto_offset_reset="earliest", format="STRING",
                        session_timeout_ms=2000, timeout_s=3)
    try:
        while len(got) < 100:
            got += [r.value for r in consumer.poll(timeout_s=1.0, max_records=50)]
        first_member = consumer.member_id
        server.proc.send_signal(signal.SIGSTOP)
        try:
            # While it is paused a request fails with a timeout, not a wrong answer.
            try:
                httpx.get(server.url + "/healthz", timeout=1)
                raise AssertionError("a paused server answered")
            except httpx.TimeoutException:
                pass
            time.sleep(4)  # twice the session timeout
        finally:
            server.proc.send_signal(signal.SIGCONT)
        with Producer(server.url, acks="all") as producer:
            for i in range(200):
                producer.send("t", f"after {i}", key=str(i))
                sent.add(f"after {i}")
        deadline = time.monotonic() + 60
        while set(got) != sent and time.monotonic() < deadline:
            try:
                got += [r.value for r in consumer.poll(timeout_s=1.0)]
            except (LakelogClientError, httpx.HTTPError):  # once, while the member rejoins
                time.sleep(0.2)
        rejoined_as = consumer.member_id
    finally:
        consumer.close()
    assert set(got) == sent  # every acknowledged record
    # Whether the resumed server expired the session before the queued heartbeats
    # arrived (then the member was fenced and joined again) is a race; either way the
    # member holds a valid membership and lost nothing.
    assert rejoined_as is not None and first_member is not None
    with server.client() as c:
        assert c.get("/consumer-groups/g").json()["state"] in ("Empty", "Stable")
