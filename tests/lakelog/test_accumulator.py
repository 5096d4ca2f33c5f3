"""The producer's RecordAccumulator without a server: what ``send`` appends is partitioned
in bulk as one record at a time would be (murmur2, the given partition, round robin),
each partition keeps the send order, batches are cut as Kafka cuts them, and the bound
on the records waiting makes ``send`` wait, then fail."""

from __future__ import annotations

import threading
import time

import pytest

from lakelog.client import LakelogTimeoutError, Producer
from lakelog.client.accumulator import RecordAccumulator
from lakelog.client.futures import Deliveries, FutureRecordMetadata
from lakelog.client.structs import TopicPartition
from log_tables.partitioner import partition_for_key

DEAD_URL = "http://127.0.0.1:9"  # nothing listens: connections are refused


def _accumulator(**settings: int | float) -> RecordAccumulator:
    kw: dict[str, int | float] = {"linger_s": 60.0, "batch_records": 1000,
                                  "batch_bytes": 1 << 20, "max_buffered": 100_000}
    kw.update(settings)
    return RecordAccumulator({"t": 4}, Deliveries(), **kw)  # type: ignore[arg-type]


def _append(acc: RecordAccumulator, key: bytes | str | None, value: bytes | str | None,
            partition: int | None = None) -> FutureRecordMetadata:
    record = FutureRecordMetadata(Deliveries(), "t", time.monotonic(), key, value, partition)
    acc.incoming.append(record)
    return record


def _queue(acc: RecordAccumulator, partition: int) -> list[FutureRecordMetadata]:
    return acc.take(TopicPartition("t", partition), 1000)


def test_drain_partitions_as_one_record_at_a_time_would_and_keeps_the_send_order() -> None:
    acc = _accumulator()
    sent = [_append(acc, f"k{i % 7}".encode() if i % 3 else None, b"v" * i,
                    partition=2 if i % 10 == 0 else None) for i in range(200)]
    sent.append(_append(acc, "k1", "a str key and value"))  # hashed as its UTF-8 bytes
    with acc.cond:
        acc.drain()
    assert acc.queued == len(sent) and not acc.incoming
    queues = {p: _queue(acc, p) for p in range(4)}
    keyless = 0
    for i, record in enumerate(sent):
        key = record._key
        if i % 10 == 0 and i < 200:
            expected = 2
        elif key is not None:
            expected = partition_for_key(key.encode() if isinstance(key, str) else key, 4)
        else:
            expected = keyless % 4  # round robin, in send order
            keyless += 1
        assert record in queues[expected], (i, expected)
    for p, queue in queues.items():  # each partition in send order
        assert [sent.index(r) for r in queue] == sorted(sent.index(r) for r in queue), p


def test_a_key_or_value_of_another_type_fails_its_record_alone() -> None:
    acc = _accumulator()
    good = _append(acc, b"k", b"v")
    wrong = _append(acc, b"k", 42)  # type: ignore[arg-type]
    also_good = _append(acc, bytearray(b"k"), memoryview(b"v"))  # type: ignore[arg-type]
    with acc.cond:
        acc.drain()
        assert not wrong.done()  # failed after the lock: its callbacks may send or close
    acc.deliver_refusals()
    assert isinstance(wrong.exception(timeout=0), TypeError)
    assert "not int" in str(wrong.exception())
    assert not good.done() and not also_good.done()
    assert acc.queued == 2


def test_take_cuts_a_batch_at_batch_records_and_before_batch_size() -> None:
    acc = _accumulator(batch_records=5, batch_bytes=250)
    records = [_append(acc, b"k", b"v" * 99, partition=0) for _ in range(12)]
    _append(acc, b"k", b"v" * 999, partition=1)
    _append(acc, b"k", b"v" * 9, partition=1)
    with acc.cond:
        acc.drain()
        tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
        assert acc.ready(time.monotonic(), set()) == [tp0, tp1]  # full: bytes, then bytes
        assert acc.take(tp0, 1000) == records[:2]  # 200 bytes; a third would pass 250
        assert acc.take(tp0, 1) == records[2:3]  # at most what the request has room for
        assert len(acc.take(tp1, 1000)) == 1  # a record over batch_size goes alone
        assert acc.queued == 14 - 4


def test_send_wakes_the_sender_thread_when_a_batch_may_be_full() -> None:
    """wake_count: the incoming records that may fill a partition's batch, counting what
    the fullest queue that can go holds, in records and (at the sizes seen) in bytes."""
    acc = _accumulator(batch_records=10)
    assert acc.wake_count == 10
    for _ in range(4):
        _append(acc, b"k", b"v" * 100, partition=0)
    with acc.cond:
        acc.drain()
        acc.wait_s(time.monotonic(), [], set(), False)
        assert acc.wake_count == 6  # 4 of 10 queued in partition 0
        acc.wait_s(time.monotonic(), [], {TopicPartition("t", 0)}, True)
        assert acc.wake_count == 10  # partition 0 is in a request: its answer wakes us
        acc.batch_bytes = 650
        acc.wait_s(time.monotonic(), [], set(), False)
        assert acc.wake_count == 2  # 404 of 650 bytes queued, 101 a record


def test_send_waits_for_room_then_fails_at_max_block_ms() -> None:
    """One record is in a request (to a server that is not there: retried); the others
    wait behind it for their partition; past max_buffered_records, send waits
    max_block_ms and fails; the records taken fail at their delivery timeout."""
    producer = Producer(DEAD_URL, max_buffered_records=10, max_block_ms=300, linger_ms=0,
                        batch_records=1, delivery_timeout_ms=1500)
    sent: list[FutureRecordMetadata] = []
    try:
        started = time.monotonic()
        with pytest.raises(LakelogTimeoutError, match="max_block_ms=300"):
            for i in range(100):
                sent.append(producer.send("t", f"v{i}", partition=0))
        assert time.monotonic() - started >= 0.3
        assert 10 <= len(sent) <= 11  # the bound, and the one in its request
    finally:
        producer.close()
    assert all(isinstance(f.exception(timeout=0), LakelogTimeoutError) for f in sent)
    with pytest.raises(RuntimeError, match="closed"):
        producer.send("t", "after close", partition=0)


def test_headers_that_cannot_be_sent_raise_in_send() -> None:
    with Producer(DEAD_URL, delivery_timeout_ms=100) as producer:
        with pytest.raises(TypeError):
            producer.send("t", b"v", partition=0, headers=[("h", 5)])  # type: ignore[list-item]
        assert producer._accumulator.empty()


def test_records_sent_from_many_threads_at_once_are_each_queued_once() -> None:
    """Eight threads append at once without a lock: every record is drained exactly
    once, and each thread's records keep their order in their partition."""
    acc = _accumulator()
    per_thread = 5000
    start = threading.Barrier(8)

    def send(n: int) -> None:
        start.wait(30)
        for i in range(per_thread):
            _append(acc, None, f"{n}-{i}", partition=n % 4)

    threads = [threading.Thread(target=send, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads) or acc.incoming:
        with acc.cond:
            acc.drain()
    drained = {p: _queue(acc, p) for p in range(4)}
    while acc.queued:  # take() gives at most batch_records at a time
        for p in range(4):
            drained[p] += _queue(acc, p)
    values = [r._value for q in drained.values() for r in q]
    assert len(values) == len(set(values)) == 8 * per_thread
    for p, queue in drained.items():
        by_thread: dict[str, list[int]] = {}
        for r in queue:
            assert isinstance(r._value, str)
            n, i = r._value.split("-")
            assert int(n) % 4 == p
            by_thread.setdefault(n, []).append(int(i))
        assert all(v == sorted(v) for v in by_thread.values())
