"""The Python client against a real server: keyed partitioning as the server's, a group
of consumers sharing a topic, and the end-to-end test with real processes killed."""

from __future__ import annotations

import itertools
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

from lakelog.client import Consumer, Producer, TopicPartition
from tests.server import ServerProcess


def _topic(server: ServerProcess, name: str, partitions: int) -> None:
    with server.client() as c:
        r = c.post("/topics", json={"topic_name": name, "partitions_count": partitions})
        assert r.status_code == 201, r.text


def test_producer_partitions_keys_as_the_server_and_a_group_shares_the_topic(
        server: ServerProcess) -> None:
    _topic(server, "t", 4)
    with Producer(server.url, linger_ms=2) as producer:
        futures = [producer.send("t", f"v{i}", key=f"k{i % 40}") for i in range(2000)]
        producer.flush()
        sent = [f.result() for f in futures]
    with server.client() as c:  # the server partitions the same keys the same way
        for i in range(40):
            r = c.post("/topics/t/records", json={"key": {"type": "STRING", "data": f"k{i}"},
                                                  "value": {"type": "STRING", "data": "x"}})
            assert r.json()["partition_id"] == sent[i].partition
    per_partition: dict[int, list[int]] = defaultdict(list)
    for md in sent:
        per_partition[md.partition].append(md.offset)
    assert all(offs == sorted(offs) for offs in per_partition.values())

    seen: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    consumers = [Consumer(server.url, "g", ["t"], auto_offset_reset="earliest",
                          session_timeout_ms=5000, format="STRING") for _ in range(2)]
    deadline = time.monotonic() + 60
    while sum(len(v) for v in seen.values()) < 2040:
        assert time.monotonic() < deadline, {k: len(v) for k, v in seen.items()}
        for i, consumer in enumerate(consumers):
            seen[str(i)].extend((r.partition, r.offset, r.value)
                                for r in consumer.poll(timeout_s=0.2))
    assignments = [c.assignment() for c in consumers]
    assert not (assignments[0] & assignments[1])
    assert assignments[0] | assignments[1] == {TopicPartition("t", p) for p in range(4)}
    values = sorted(v for rows in seen.values() for _, _, v in rows)
    assert values == sorted([f"v{i}" for i in range(2000)] + ["x"] * 40)
    for consumer in consumers:
        consumer.commit()
    committed = consumers[0].committed()
    assert sum(committed.values()) == 2040
    for consumer in consumers:
        consumer.close()
    with server.client() as c:
        described = c.get("/consumer-groups/g").json()
        assert described["members"] == [] and all(o["lag"] == 0 for o in described["offsets"])


def _consumer(server: ServerProcess, out: Path) -> subprocess.Popen[bytes]:
    with out.with_suffix(".err").open("ab") as err:
        return subprocess.Popen([sys.executable, "-m", "tests.lakelog.consumer_proc",
                                 server.url, "chaos", "events", str(out)],
                                stdout=subprocess.DEVNULL, stderr=err)


def test_a_poll_that_beats_the_assignment_to_the_client_loses_no_record(
        server: ServerProcess) -> None:
    """The server gives a member a partition in answer to its heartbeat; a poll running
    meanwhile can return that partition's records before the client has read the answer.
    The client drops them (not its partition yet), so they must be read again later."""
    _topic(server, "t", 2)
    a = Consumer(server.url, "g", ["t"], auto_offset_reset="earliest", session_timeout_ms=5000,
                 format="STRING")
    b = Consumer(server.url, "g", ["t"], auto_offset_reset="earliest", session_timeout_ms=5000,
                 format="STRING")
    deadline = time.monotonic() + 30
    while not (a.assignment() and b.assignment()):  # one partition each (the topic is empty)
        assert time.monotonic() < deadline, (a.assignment(), b.assignment())
        assert a.poll(timeout_s=0.1) == [] and b.poll(timeout_s=0.1) == []
    with Producer(server.url, linger_ms=2) as producer:
        for i in range(200):
            producer.send("t", f"v{i}", partition=i % 2)
        producer.flush()
    # Injected timing (a slow network cannot be had on demand): the heartbeat answer that
    # gives `a` the partition `b` leaves arrives 2 s late, while `a` keeps polling.
    post = a._hb_http.post

    def late_answer(url: str, **kwargs: Any) -> httpx.Response:
        r = post(url, **kwargs)
        if url.endswith("/heartbeat") and r.status_code == 200 and \
                len(r.json()["assignment"]) > len(a.assignment()):
            time.sleep(2)
        return r
    a._hb_http.post = late_answer  # type: ignore[method-assign]
    b.close()
    values: list[str] = []
    deadline = time.monotonic() + 30
    while len(values) < 200 and time.monotonic() < deadline:
        values.extend(str(r.value) for r in a.poll(timeout_s=0.2))
    a.close()
    assert sorted(values) == sorted(f"v{i}" for i in range(200))


def test_group_end_to_end_with_consumers_and_the_server_killed(
        server: ServerProcess, tmp_path: Path) -> None:
    """Producers and three consumer processes; consumers SIGKILLed and restarted at random,
    the server SIGKILLed once. Every acknowledged record is consumed at least once, each
    member's reads of a partition skip only what other members read, committed offsets
    never go backwards, and duplicates come only from members that failed."""
    _topic(server, "events", 4)
    rng = random.Random(11)
    acked: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        with Producer(server.url, linger_ms=5, retries=40) as producer:
            i = 0
            while not stop.is_set():
                futures = [(f"r{i + j}", producer.send("events", f"r{i + j}"))
                           for j in range(20)]
                i += 20
                for value, f in futures:
                    try:
                        f.result(timeout=60)
                        acked.append(value)
                    except Exception:
                        pass  # not acknowledged: may or may not be in the log
                time.sleep(0.02)

    outs = [tmp_path / f"consumer-{i}.txt" for i in range(3)]
    procs = [_consumer(server, out) for out in outs]
    failed_files: set[Path] = set()
    producer = threading.Thread(target=produce)
    producer.start()
    lines_at_server_kill: dict[Path, int] = {}
    try:
        for step in range(8):
            time.sleep(2.5)
            if step == 3:
                lines_at_server_kill = {o: len(o.read_text().splitlines()) if o.exists() else 0
                                        for o in outs}
                server.kill()
                time.sleep(0.5)
                server.start()
                continue
            victim = rng.randrange(3)
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            failed_files.add(outs[victim])
            outs[victim] = tmp_path / f"consumer-{victim}-{step}.txt"
            procs[victim] = _consumer(server, outs[victim])
        stop.set()
        producer.join(120)
        assert acked, "nothing was acknowledged"
        deadline = time.monotonic() + 90
        consumed: set[str] = set()
        while not set(acked) <= consumed:
            assert time.monotonic() < deadline, f"{len(set(acked) - consumed)} never consumed"
            time.sleep(1)
            consumed = {line.split()[3] for f in tmp_path.glob("consumer-*.txt")
                        for line in f.read_text().splitlines() if line.count(" ") == 3}
    finally:
        stop.set()
        for out in outs:
            Path(str(out) + ".stop").touch()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()

    rows = [(f, *line.split()) for f in sorted(tmp_path.glob("consumer-*.txt"))
            for line in f.read_text().splitlines() if line.count(" ") == 3]
    # Each member's reads of a partition are gap-free, except where the partition was
    # another member's in between (a partition can come back): what it skipped, others read.
    by_member: dict[tuple[str, str], list[int]] = defaultdict(list)
    read_by: dict[tuple[str, int], set[str]] = defaultdict(set)
    for _, member, partition, offset, _ in rows:
        by_member[(member, partition)].append(int(offset))
        read_by[(partition, int(offset))].add(member)
    for (member, partition), offsets in by_member.items():
        for a, b in itertools.pairwise(offsets):
            skipped = [o for o in range(a + 1, b) if not read_by[(partition, o)] - {member}]
            assert not skipped, (member, partition, a, b, skipped[:5])
    # Duplicates only from members that failed: killed processes, or any member alive
    # when the server was killed (its uncommitted reads are read again).
    failed_members = {member for f, member, *_ in rows if f in failed_files}
    failed_members |= {line.split()[0] for f, n in lines_at_server_kill.items()
                       for line in f.read_text().splitlines()[:n]}
    # The files hold no times, so which reader came first is unknown: a record read more
    # than once may have at most one reader that did not fail (the one after the failure).
    readers: dict[tuple[str, str], list[str]] = defaultdict(list)
    for _, member, partition, offset, _ in rows:
        readers[(partition, offset)].append(member)
    duplicates = 0
    for key, members in readers.items():
        duplicates += len(members) - 1
        healthy = set(members) - failed_members
        assert len(healthy) <= 1, (key, members, healthy)
    # Committed offsets never went backwards: every row ever committed, in commit order.
    # Only files some Delta commit added: the append in flight when the server was killed
    # can leave a Parquet file no commit references (never acknowledged, and its seq
    # numbers are given again after the restart).
    table = tmp_path / "data" / "warehouse" / "_consumer_offsets"
    committed = {json.loads(line)["add"]["path"] for log in table.glob("_delta_log/*.json")
                 for line in log.read_text().splitlines() if '"add"' in line}
    assert committed
    history = sorted((r["seq"], r["partition"], r["offset"])
                     for f in committed for r in pq.read_table(table / f).to_pylist())
    last: dict[int, int] = {}
    for _, partition, offset in history:
        assert offset >= last.get(partition, 0), (partition, offset, last.get(partition))
        last[partition] = offset
    with httpx.Client(base_url=server.url) as c:
        assert c.get("/healthz").status_code == 200
    print(f"{len(acked)} acknowledged, {len(rows)} consumed, {duplicates} duplicates")


def test_the_local_admin_key_is_only_sent_to_this_machine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lakelog.client import default_api_key

    (tmp_path / "security").mkdir()
    (tmp_path / "security" / "admin.key").write_text("llk_1:secret\n")
    monkeypatch.setenv("LAKELOG_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("LAKELOG_API_KEY", raising=False)
    assert default_api_key("http://127.0.0.1:8080") == "llk_1:secret"
    assert default_api_key("https://localhost:8443") == "llk_1:secret"
    assert default_api_key("https://lakelog.example.com") is None
    monkeypatch.setenv("LAKELOG_API_KEY", "llk_2:other")
    assert default_api_key("https://lakelog.example.com") == "llk_2:other"
