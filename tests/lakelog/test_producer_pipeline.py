"""The Producer's batching (linger.ms, batch.size) and its requests in flight
(max.in.flight.requests.per.connection, one per partition) against a real server: the
batches are the ones the settings ask for, order per partition is kept with several
requests in flight, and a server restart with requests in flight duplicates nothing."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx
import pytest

from lakelog.client import Producer, RecordMetadata
from lakelog.client.batches import Tally
from lakelog.client.futures import FutureRecordMetadata
from lakelog.client.sender import Flight, Sender
from lakelog.client.structs import TopicPartition
from tests.lakelog.helpers import make_topic, values
from tests.server import ServerProcess

pytestmark = pytest.mark.slow
LONG_LINGER_MS = 60_000


def _batch_requests(server: ServerProcess) -> int:
    """``records:batch`` requests the server has answered (its /metrics)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("lakelog_request_seconds_count{")
               and "records:batch" in line and 'method="POST"' in line)


def test_batch_size_cuts_a_partitions_batch_in_bytes(server: ServerProcess) -> None:
    """40 records of 100 bytes to one partition with batch_size=1000: ten per request,
    four requests, as the server counts them too; the records are stored in order."""
    make_topic(server, "t", 1)
    before = _batch_requests(server)
    with Producer(server.url, linger_ms=LONG_LINGER_MS, batch_size=1000) as producer:
        futures = [producer.send("t", f"{i:03d}" + "x" * 97, partition=0) for i in range(40)]
        producer.flush()
        offsets = [f.result(timeout=30).offset for f in futures]
        assert producer.requests_sent == 4
    assert offsets == list(range(40))
    assert _batch_requests(server) - before == 4
    assert [v[:3] for v in values(server, "t", 0) if v] == [f"{i:03d}" for i in range(40)]


def test_linger_ms_holds_records_for_one_request(server: ServerProcess) -> None:
    """Five records sent at once with linger_ms=300 go in one request, not before the
    linger has passed (no flush asks for them)."""
    make_topic(server, "t", 1)
    with Producer(server.url, linger_ms=300) as producer:
        started = time.monotonic()
        futures = [producer.send("t", f"r{i}", partition=0) for i in range(5)]
        for f in futures:
            f.result(timeout=30)
        took = time.monotonic() - started
        assert producer.requests_sent == 1
    assert took >= 0.3, took
    assert values(server, "t", 0) == [f"r{i}" for i in range(5)]


def test_a_full_batch_goes_at_once_however_long_the_linger(server: ServerProcess) -> None:
    """linger_ms=60 s, batch_records=10: the first twenty records go in two requests as
    soon as their batches are full (send wakes the sender thread); the last five wait for
    their linger, or a flush."""
    make_topic(server, "t", 1)
    with Producer(server.url, linger_ms=LONG_LINGER_MS, batch_records=10) as producer:
        futures = [producer.send("t", f"r{i}", partition=0) for i in range(25)]
        assert [f.result(timeout=30).offset for f in futures[:20]] == list(range(20))
        assert not any(f.done() for f in futures[20:])
        producer.flush()
        assert [f.result(timeout=30).offset for f in futures[20:]] == list(range(20, 25))
        assert producer.requests_sent == 3


def test_several_requests_in_flight_keep_each_partitions_order(
        server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight partitions, small batches, the server paused (SIGSTOP) while the records are
    sent: up to max_in_flight_requests_per_connection requests are out at once, never two
    for one partition, and every partition holds its records in send order, once."""
    make_topic(server, "t", 8)
    out: list[TopicPartition] = []
    seen: list[int] = []
    overlap: list[TopicPartition] = []
    register, finish = Sender._register, Sender._finish

    # Both run on the sender thread only: watched, not changed.
    def watched_register(self: Sender, topic: str, leader: str,
                         taken: list[tuple[TopicPartition, list[object]]]) -> Flight:
        tps = [tp for tp, _ in taken]
        overlap.extend(tp for tp in tps if tp in out)
        out.extend(tps)
        flight = register(self, topic, leader, taken)  # type: ignore[arg-type]
        seen.append(len(self._flights))
        return flight

    def watched_finish(self: Sender, flight: Flight) -> None:
        if flight.id in self._flights:
            for tp, _ in flight.taken:
                out.remove(tp)
        finish(self, flight)

    monkeypatch.setattr(Sender, "_register", watched_register)
    monkeypatch.setattr(Sender, "_finish", watched_finish)
    sent: dict[int, list[str]] = defaultdict(list)
    assert server.proc is not None
    with Producer(server.url, linger_ms=1, batch_records=20,
                  max_in_flight_requests_per_connection=3) as producer:
        futures = []
        for i in range(2000):
            p = i % 8
            sent[p].append(f"p{p}-{i}")
            futures.append(producer.send("t", f"p{p}-{i}", partition=p))
            if i == 0:  # the producer id and the metadata first, with the server running
                producer.flush()
                server.proc.send_signal(signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 30
            while max(seen) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            server.proc.send_signal(signal.SIGCONT)
        producer.flush()
        metas: list[RecordMetadata] = [f.result(timeout=60) for f in futures]
    assert not overlap, "two requests for one partition were in flight at once"
    assert max(seen) == 3, "not as many requests in flight as allowed"
    for p in range(8):
        assert values(server, "t", p) == sent[p]
    assert all(m.offset == sent[m.partition].index(f"p{m.partition}-{i}")
               for i, m in enumerate(metas))


def test_records_sent_from_many_threads_at_once_are_stored_once_in_order(
        server: ServerProcess) -> None:
    """Eight threads send through one producer at once (send appends without a lock):
    every record is acknowledged at the offset it is stored at, once, and the records of
    each key keep their send order."""
    make_topic(server, "t", 4)
    per_thread = 3000
    start = threading.Barrier(8)
    futures: dict[str, FutureRecordMetadata] = {}
    lock = threading.Lock()

    def send(producer: Producer, n: int) -> None:
        start.wait(30)
        mine = {f"{n}-{i}": producer.send("t", f"{n}-{i}", key=f"k{n}-{i % 5}")
                for i in range(per_thread)}
        with lock:
            futures.update(mine)

    with Producer(server.url, linger_ms=1) as producer:
        threads = [threading.Thread(target=send, args=(producer, n)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        producer.flush()
        acked = {v: f.result(timeout=60) for v, f in futures.items()}
    assert len(acked) == 8 * per_thread
    stored = {p: values(server, "t", p) for p in range(4)}
    assert sum(len(v) for v in stored.values()) == len(acked)
    for value, md in acked.items():
        assert stored[md.partition][md.offset] == value
    by_key: dict[str, list[int]] = defaultdict(list)
    for vs in stored.values():
        for v in vs:
            assert v is not None
            n, i = v.split("-")
            by_key[f"{n}-{int(i) % 5}"].append(int(i))
    assert all(vs == sorted(vs) for vs in by_key.values())


def test_a_server_restart_with_requests_in_flight_duplicates_nothing(tmp_path: Path) -> None:
    """send_many into eight partitions, five requests in flight, while the server is
    SIGKILLed and started again: every record is acknowledged once and stored once, in
    its key's order (the retries carry the same sequences; the server answers a retry of
    a stored batch with its offsets)."""
    server = ServerProcess(tmp_path / "data").start()
    make_topic(server, "t", 8)
    tally = Tally()
    stop = threading.Event()
    sent = 0

    def produce(producer: Producer) -> None:
        nonlocal sent
        while not stop.is_set() and sent < 400_000:
            producer.send_many("t", [(f"k{(sent + i) % 64}", str(sent + i))
                                     for i in range(2000)], tally)
            sent += 2000
        producer.flush()

    try:
        with Producer(server.url, linger_ms=2, delivery_timeout_ms=120_000,
                      max_in_flight_requests_per_connection=5) as producer:
            thread = threading.Thread(target=produce, args=(producer,))
            thread.start()
            deadline = time.monotonic() + 60
            while tally.acked < 20_000:
                assert time.monotonic() < deadline, "the producer did not get going"
                time.sleep(0.01)
            outstanding = tally.sent - tally.acked
            server.kill()  # SIGKILL with requests in flight
            assert outstanding > 0
            server.start()
            acked_after = tally.acked
            deadline = time.monotonic() + 120
            while tally.acked < acked_after + 20_000:
                assert time.monotonic() < deadline and not tally.failed, tally.failures[:3]
                time.sleep(0.05)
            stop.set()
            thread.join(180)
        assert not thread.is_alive()
        assert (tally.sent, tally.acked, tally.failed) == (sent, sent, 0), tally.failures[:3]
        stored = [v for p in range(8) for v in values(server, "t", p)]
        counts = Counter(stored)
        assert not [v for v, n in counts.items() if n > 1], "duplicates in the log"
        assert len(stored) == sent
        by_key: dict[int, list[int]] = defaultdict(list)
        for p in range(8):
            for v in values(server, "t", p):
                assert v is not None
                by_key[int(v) % 64].append(int(v))
        assert all(vs == sorted(vs) for vs in by_key.values()), "a key's order changed"
    finally:
        stop.set()
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
