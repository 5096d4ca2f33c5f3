"""The Producer against a real server: a refused record fails alone and the records
behind it go on (as Kafka's producer recovers its sequences); a request refused whole
leaves the sequences where they were; and an idempotent producer rides through a real
SIGKILL of the server with every acknowledged record stored exactly once."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from lakelog.client import (
    LakelogClientError,
    LakelogConnectionError,
    LakelogTimeoutError,
    Producer,
    RecordMetadata,
)
from lakelog.client.futures import FutureRecordMetadata
from tests.lakelog.helpers import make_topic, values
from tests.server import ServerProcess

pytestmark = pytest.mark.slow
LONG_LINGER_MS = 60_000  # records go out only on flush(): one request for all of them


def _outcomes(futures: list[FutureRecordMetadata]
              ) -> list[RecordMetadata | LakelogClientError]:
    out: list[RecordMetadata | LakelogClientError] = []
    for f in futures:
        exc = f.exception(timeout=60)
        assert exc is None or isinstance(exc, LakelogClientError), repr(exc)
        out.append(f.result() if exc is None else exc)
    return out


def test_a_refused_record_fails_alone_and_the_records_behind_it_go_on(
        server: ServerProcess) -> None:
    """Two partitions in one request; partition 0 has two records over max.message.bytes,
    partition 1 one. Each refused record fails with its own error; every other record is
    stored once, in send order; a later request to the same partitions succeeds."""
    make_topic(server, "t", 2, **{"max.message.bytes": "4096"})
    big = {(0, 3), (0, 11), (1, 7)}
    with Producer(server.url, linger_ms=LONG_LINGER_MS) as producer:
        sent = [(p, i, f"p{p}-{i}" + ("x" * 10_000 if (p, i) in big else ""))
                for i in range(20) for p in (0, 1)]
        futures = [producer.send("t", value, partition=p) for p, _, value in sent]
        producer.flush()
        outcomes = _outcomes(futures)
        later = [producer.send("t", f"later-{p}", partition=p) for p in (0, 1)]
        producer.flush()
        later_outcomes = _outcomes(later)
    for (p, i, _), outcome in zip(sent, outcomes, strict=True):
        if (p, i) in big:
            assert isinstance(outcome, LakelogClientError)
            assert (outcome.status, outcome.error) == (413, "record_too_large"), outcome
            assert "max.message.bytes" in outcome.message
        else:
            assert isinstance(outcome, RecordMetadata), ((p, i), outcome)
    assert all(isinstance(o, RecordMetadata) for o in later_outcomes), later_outcomes
    for p in (0, 1):
        expected = [v for q, i, v in sent if q == p and (q, i) not in big] + [f"later-{p}"]
        assert values(server, "t", p) == expected
        acked = [o.offset for (q, _, _), o in zip(sent, outcomes, strict=True)
                 if q == p and isinstance(o, RecordMetadata)]
        assert acked == list(range(len(expected) - 1))  # offsets answered = offsets stored


def test_a_keyless_record_to_a_compacted_topic_fails_alone(server: ServerProcess) -> None:
    make_topic(server, "state", 1, **{"cleanup.policy": "compact"})
    with Producer(server.url, linger_ms=LONG_LINGER_MS) as producer:
        keys = [f"k{i}" if i != 4 else None for i in range(10)]
        futures = [producer.send("state", f"v{i}", key=k, partition=0)
                   for i, k in enumerate(keys)]
        producer.flush()
        outcomes = _outcomes(futures)
        later = producer.send("state", "v-later", key="k-later", partition=0)
        producer.flush()
        assert later.result(timeout=60).offset == 9
    refused = outcomes[4]
    assert isinstance(refused, LakelogClientError) and refused.error == "invalid_record"
    assert "no key" in refused.message
    assert values(server, "state", 0) == [f"v{i}" for i in range(10) if i != 4] + ["v-later"]


def test_a_request_refused_whole_leaves_the_sequences_where_they_were(
        server: ServerProcess) -> None:
    """Records to a topic that does not exist (an explicit partition: no metadata asked)
    are refused whole (404); once the topic exists, the same producer's records are
    stored (before, the producer had moved its sequences on and every later request
    was refused as out of order)."""
    with Producer(server.url, linger_ms=LONG_LINGER_MS) as producer:
        early = [producer.send("late", f"early-{i}", partition=0) for i in range(3)]
        producer.flush()
        assert all(isinstance(o, LakelogClientError) and o.status == 404
                   for o in _outcomes(early))
        make_topic(server, "late", 1)
        futures = [producer.send("late", f"v{i}", partition=0) for i in range(5)]
        producer.flush()
        assert [o.offset for o in _outcomes(futures) if isinstance(o, RecordMetadata)] == \
            list(range(5))
    assert values(server, "late", 0) == [f"v{i}" for i in range(5)]


def test_an_idempotent_producer_rides_through_a_server_sigkill_without_duplicates(
        tmp_path: Path) -> None:
    """A producer sends without pause; the server is SIGKILLed mid-stream, stays down
    longer than the old client's fixed retries lasted (~11 s), and starts again on the
    same data directory and port. No record fails, and every acknowledged record is in
    the log exactly once, at the offset it was acknowledged with."""
    server = ServerProcess(tmp_path / "data").start()
    make_topic(server, "t", 3)
    acked: dict[str, RecordMetadata] = {}
    failed: list[BaseException] = []
    stop = threading.Event()
    kill_at = threading.Event()

    def produce(producer: Producer) -> None:
        i = 0
        pending: list[tuple[str, FutureRecordMetadata]] = []
        while not stop.is_set():
            value = f"v{i}"
            pending.append((value, producer.send("t", value, key=f"k{i % 50}")))
            i += 1
            if len(pending) >= 200:
                for v, f in pending:
                    try:
                        acked[v] = f.result(timeout=180)
                    except Exception as exc:
                        failed.append(exc)
                pending = []
                if len(acked) >= 3000:
                    kill_at.set()
        for v, f in pending:
            try:
                acked[v] = f.result(timeout=180)
            except Exception as exc:
                failed.append(exc)

    try:
        with Producer(server.url, linger_ms=2, delivery_timeout_ms=120_000) as producer:
            thread = threading.Thread(target=produce, args=(producer,))
            thread.start()
            assert kill_at.wait(120), "the producer did not get going"
            before = len(acked)
            server.kill()  # SIGKILL, mid-stream: requests are in flight
            # Injected outage: longer than the old client's ~11 s of fixed retries.
            down_until = time.monotonic() + 13
            while time.monotonic() < down_until:
                time.sleep(0.5)
            server.start()
            deadline = time.monotonic() + 120
            while len(acked) < before + 3000:
                assert time.monotonic() < deadline and not failed, (len(acked), failed[:3])
                time.sleep(0.1)
            stop.set()
            thread.join(180)
        assert not failed, failed[:3]
        stored: dict[int, list[str | None]] = {p: values(server, "t", p) for p in range(3)}
        counts = Counter(v for vs in stored.values() for v in vs)
        assert not [v for v, n in counts.items() if n > 1], "duplicates in the log"
        for value, md in acked.items():
            assert stored[md.partition][md.offset] == value, (value, md)
        per_partition: dict[int, int] = defaultdict(int)
        for md in acked.values():
            per_partition[md.partition] += 1
        print(f"{len(acked)} acknowledged ({before} before the kill), stored "
              f"{sum(len(v) for v in stored.values())}")
    finally:
        stop.set()
        if server.proc is not None and server.proc.poll() is None:
            server.kill()


def test_with_the_server_down_a_record_fails_with_a_lakelog_error_at_its_deadline(
        tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    make_topic(server, "t", 1)
    with Producer(server.url, delivery_timeout_ms=1500, max_block_ms=1500,
                  request_timeout_ms=1000) as producer:
        assert producer.send("t", "up").result(timeout=60).offset == 0
        server.kill()
        future = producer.send("t", "down")
        exc = future.exception(timeout=60)
        assert isinstance(exc, LakelogTimeoutError), repr(exc)
        assert server.url in str(exc) and "delivery_timeout_ms=1500" in str(exc)
        assert "records:batch" in str(exc)
        with pytest.raises(LakelogTimeoutError, match="max_block_ms=1500"):
            producer.send("other-topic", "x")  # metadata for a new topic: nobody answers


def test_flush_returns_once_every_records_callback_has_run(server: ServerProcess) -> None:
    """As Kafka's: when flush() returns, each record's callback has run (a future is done
    before its callbacks run, on the producer's thread; a program counting answers in
    callbacks read too few right after flush: the nemesis's producers did)."""
    make_topic(server, "callbacks", 2)
    answered: list[int] = []

    def slow(future: FutureRecordMetadata) -> None:
        time.sleep(0.001)
        answered.append(future.result().offset)

    with Producer(server.url, linger_ms=50, batch_records=1000) as producer:
        for i in range(1500):
            producer.send("callbacks", f"v{i}".encode(), partition=i % 2).add_done_callback(slow)
        producer.flush(60)
        assert len(answered) == 1500

        refused: list[BaseException] = []

        def inside(future: FutureRecordMetadata) -> None:  # flush from a callback: no hang
            try:
                producer.flush()
            except RuntimeError as exc:  # as Kafka's (KIP-1118): it would wait for itself
                refused.append(exc)
            answered.append(-1)

        producer.send("callbacks", b"last").add_done_callback(inside)
        producer.flush(60)
    assert answered[-1] == -1 and len(answered) == 1501
    assert len(refused) == 1 and "callback" in str(refused[0])


def test_close_from_a_callback_sends_what_is_queued_without_waiting(
        server: ServerProcess, caplog: pytest.LogCaptureFixture) -> None:
    """A callback runs on the sender thread: close() there cannot wait for that thread
    (it would wait for itself); it says so, and the thread sends what is queued, then
    ends."""
    make_topic(server, "closing", 2)
    producer = Producer(server.url, linger_ms=200)
    futures = [producer.send("closing", f"v{i}".encode(), partition=i % 2) for i in range(100)]
    futures[0].add_done_callback(lambda _: producer.close())
    deadline = time.monotonic() + 60
    while producer._sender.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not producer._sender.alive(), "the sender thread did not end after close()"
    assert all(f.exception(timeout=0) is None for f in futures)
    assert "from a record's callback" in caplog.text
    producer.close()  # again, from here: returns at once
    with pytest.raises(RuntimeError, match="closed"):
        producer.send("closing", b"after")


def test_a_callback_may_run_on_the_sending_thread_and_flush_there_is_refused(
        server: ServerProcess) -> None:
    """``send`` takes turns of the sender's loop every DRAIN_AT records, so answers that
    came meanwhile complete there and their callbacks run on the caller's thread too: a
    flush() in any callback is refused (it would wait for the turn it is in), never a
    hang, and every record is acknowledged once."""
    make_topic(server, "turns", 4)
    threads: set[str] = set()
    refused: list[BaseException] = []
    answered: list[int] = []

    def callback(future: FutureRecordMetadata) -> None:
        threads.add(threading.current_thread().name)
        answered.append(future.result().offset)
        if len(answered) % 997 == 0:
            try:
                producer.flush()
            except RuntimeError as exc:
                refused.append(exc)

    with Producer(server.url, linger_ms=0) as producer:
        for i in range(20_000):
            producer.send("turns", f"v{i}", key=f"k{i % 100}").add_done_callback(callback)
        producer.flush(60)
    assert len(answered) == 20_000
    assert len(refused) == 20_000 // 997
    print(f"\nmeasured: callbacks ran on {sorted(threads)}")
    assert threads <= {threading.current_thread().name, "lakelog-producer"}, threads


def test_records_sent_from_callbacks_are_delivered(server: ServerProcess) -> None:
    """A callback that sends (a chain of records) runs inside a turn of the sender's
    loop: its sends are delivered, and do not wait for that turn (this thread's own)."""
    make_topic(server, "chain", 2)
    chained: list[FutureRecordMetadata] = []

    def forward(future: FutureRecordMetadata) -> None:
        chained.append(producer.send("chain", b"next", partition=1))

    with Producer(server.url, linger_ms=0) as producer:
        started = time.monotonic()
        for i in range(3000):
            producer.send("chain", f"v{i}", partition=0).add_done_callback(forward)
        producer.flush(60)
        producer.flush(60)  # the chained records sent during the first flush
        took = time.monotonic() - started
    assert len(chained) == 3000 and all(f.exception(timeout=0) is None for f in chained)
    # A send in a callback that waited for the turn it runs in would cost 50 ms every
    # DRAIN_AT records: 3000 / 512 of them, about 0.3 s; far less is spent here.
    print(f"\nmeasured: 6,000 records, 3,000 of them sent from callbacks, in {took:.2f} s")


def test_a_request_that_timed_out_on_a_paused_server_is_not_sent_again_without_idempotence(
        server: ServerProcess) -> None:
    """Found in review: a request past its timeout was read as never sent, so a producer
    with idempotent=False sent its records again (a duplicate once the server went on).
    Its records fail saying the outcome is unknown, and the log holds each at most once."""
    make_topic(server, "paused", 1)
    assert server.proc is not None
    with Producer(server.url, idempotent=False, linger_ms=0, request_timeout_ms=500,
                  delivery_timeout_ms=3000) as producer:
        producer.send("paused", b"warm", partition=0).result(timeout=30)
        server.proc.send_signal(signal.SIGSTOP)
        try:
            future = producer.send("paused", b"once", partition=0)
            failure = future.exception(timeout=30)
        finally:
            server.proc.send_signal(signal.SIGCONT)
    assert isinstance(failure, LakelogConnectionError), failure
    assert "unknown" in str(failure)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "once" not in values(server, "paused", 0):
        time.sleep(0.05)  # the paused server may still append the one it received
    assert values(server, "paused", 0).count("once") <= 1


def test_a_callback_sends_even_when_the_buffer_is_full(server: ServerProcess) -> None:
    """Found in review: a send in a callback waited for room that only the turn running
    the callback could free (the answers stalled for max_block_ms). It goes over the
    bound instead, one record for each answered."""
    make_topic(server, "full", 2)
    failures: list[BaseException] = []
    chained: list[FutureRecordMetadata] = []

    def forward(future: FutureRecordMetadata) -> None:
        try:
            chained.append(producer.send("full", b"next", partition=1))
        except Exception as exc:
            failures.append(exc)

    with Producer(server.url, linger_ms=0, max_buffered_records=10,
                  max_block_ms=5000) as producer:
        for i in range(500):
            producer.send("full", f"v{i}", partition=0).add_done_callback(forward)
        producer.flush(60)
        producer.flush(60)
    assert not failures, failures[:3]
    assert len(chained) == 500 and all(f.exception(timeout=0) is None for f in chained)
