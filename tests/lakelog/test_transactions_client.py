"""The Python client's transactions against a real server: Kafka's consume-transform-
produce loop exactly once (offsets committed with the output), aborts unseen by
read_committed consumers, a zombie producer fenced, a failed write making the
transaction abortable, and the errors of calls out of order."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from lakelog.client import Consumer, LakelogClientError, Producer, TopicPartition
from log_tables.errors import InvalidTxnStateError, ProducerFencedError, TransactionAbortableError
from tests.lakelog.helpers import make_topic
from tests.server import ServerProcess

INPUT, OUTPUT = "in", "out"


def _all(server: ServerProcess, topic: str, isolation: str, want: int | None = None,
         timeout_s: float = 30) -> list[tuple[int, int, bytes | None]]:
    """Every record a fresh group's consumer at ``isolation`` reads (until ``want`` came,
    or a second passes with nothing new)."""
    out: list[tuple[int, int, bytes | None]] = []
    deadline = time.monotonic() + timeout_s
    quiet = 0.0
    with Consumer(server.url, f"reader-{uuid.uuid4().hex[:6]}", [topic],
                  auto_offset_reset="earliest", isolation_level=isolation,  # type: ignore[arg-type]
                  enable_auto_commit=False) as consumer:
        while time.monotonic() < deadline:
            got = list(consumer.poll(timeout_s=0.5))
            out += [(r.partition, r.offset, r.value) for r in got]
            if want is not None and len(out) >= want:
                break
            quiet = 0.0 if got else quiet + 0.5
            if want is None and quiet >= 1.5:
                break
    return sorted(out)


def test_consume_transform_produce_is_exactly_once(server: ServerProcess) -> None:
    make_topic(server, INPUT, 2)
    make_topic(server, OUTPUT, 2)
    with Producer(server.url) as plain:
        for i in range(40):
            plain.send(INPUT, f"{i}".encode(), key=f"k{i % 5}".encode())
        plain.flush()
    group = "transformer"
    with Producer(server.url, transactional_id="xform-1", linger_ms=1) as producer, \
            Consumer(server.url, group, [INPUT], auto_offset_reset="earliest",
                     isolation_level="read_committed", enable_auto_commit=False) as consumer:
        producer.init_transactions()
        done = 0
        rounds = 0
        while done < 40:
            records = list(consumer.poll(timeout_s=1.0, max_records=7))
            if not records:
                continue
            rounds += 1
            producer.begin_transaction()
            for r in records:
                producer.send(OUTPUT, b"x" + (r.value or b""), key=r.key)
            positions = {TopicPartition(r.topic, r.partition): r.offset + 1 for r in records}
            starts: dict[TopicPartition, int] = {}
            for r in records:
                starts.setdefault(TopicPartition(r.topic, r.partition), r.offset)
            producer.send_offsets_to_transaction(positions, consumer.group_metadata())
            if rounds == 2:  # this round's output and offsets go away: read again
                producer.abort_transaction()
                for tp, start in starts.items():
                    consumer.seek(tp, start)
                continue
            producer.commit_transaction()
            done += len(records)
    out = _all(server, OUTPUT, "read_committed", want=40)
    values = sorted(int(v[1:]) for _, _, v in out if v is not None)
    assert values == list(range(40))  # each input once: the aborted round's output unseen
    everything = _all(server, OUTPUT, "read_uncommitted", want=41)
    assert len(everything) > 40  # the aborted round's records are there, uncommitted
    with Consumer(server.url, group, [INPUT], enable_auto_commit=False,
                  auto_offset_reset="none") as again:
        assert list(again.poll(timeout_s=1.0)) == []  # every offset was committed


def test_a_second_instance_fences_the_first(server: ServerProcess) -> None:
    make_topic(server, OUTPUT, 1)
    first = Producer(server.url, transactional_id="fenced", linger_ms=1)
    second = Producer(server.url, transactional_id="fenced", linger_ms=1)
    try:
        first.init_transactions()
        first.begin_transaction()
        first.send(OUTPUT, b"zombie").result(timeout=30)
        second.init_transactions()  # aborts what the first left open
        with pytest.raises(ProducerFencedError):
            first.commit_transaction()
        with pytest.raises(ProducerFencedError):  # fatal: every call after says so
            first.begin_transaction()
        second.begin_transaction()
        second.send(OUTPUT, b"alive")
        second.commit_transaction()
    finally:
        first.close()
        second.close()
    assert [v for _, _, v in _all(server, OUTPUT, "read_committed", want=1)] == [b"alive"]


def test_a_failed_write_makes_the_transaction_abortable(server: ServerProcess) -> None:
    make_topic(server, OUTPUT, 1, **{"max.message.bytes": "4096"})
    with Producer(server.url, transactional_id="too-big", linger_ms=1) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(OUTPUT, b"fine")
        big = producer.send(OUTPUT, b"x" * 10_000)
        with pytest.raises(LakelogClientError):
            big.result(timeout=30)
        with pytest.raises(TransactionAbortableError):
            producer.commit_transaction()
        producer.abort_transaction()
        # A record the producer itself refuses (not bytes, str or None) fails its
        # transaction too: commit says so rather than commit the others.
        producer.begin_transaction()
        producer.send(OUTPUT, b"kept back")
        refused = producer.send(OUTPUT, 12345)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            refused.result(timeout=30)
        with pytest.raises(TransactionAbortableError):
            producer.commit_transaction()
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send(OUTPUT, b"next")
        producer.commit_transaction()
    assert [v for _, _, v in _all(server, OUTPUT, "read_committed", want=1)] == [b"next"]


def test_calls_out_of_order_say_what_to_do(server: ServerProcess) -> None:
    make_topic(server, OUTPUT, 1)
    with Producer(server.url, transactional_id="order", linger_ms=1) as producer:
        with pytest.raises(InvalidTxnStateError, match="init_transactions"):
            producer.begin_transaction()
        producer.init_transactions()
        with pytest.raises(InvalidTxnStateError, match="begin_transaction"):
            producer.send(OUTPUT, b"outside")
        with pytest.raises(InvalidTxnStateError, match="begin_transaction"):
            producer.commit_transaction()
        producer.begin_transaction()
        with pytest.raises(InvalidTxnStateError, match="in progress"):
            producer.begin_transaction()
        producer.commit_transaction()  # nothing sent: nothing reaches the coordinator
    with pytest.raises(ValueError, match="transactional"):
        Producer(server.url, transactional_id="x", acks="1")
    with Producer(server.url) as plain, pytest.raises(ValueError, match="transactional_id"):
        plain.begin_transaction()


def test_lakelog_consume_reads_committed_records_with_its_isolation_level(
        server: ServerProcess, tmp_path: Path) -> None:
    from tests.lakelog.test_cli import _cli_env, _lakelog

    make_topic(server, OUTPUT, 1)
    with Producer(server.url, transactional_id="cli", linger_ms=1) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(OUTPUT, b"aborted")
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send(OUTPUT, b"committed")
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send(OUTPUT, b"open").result(timeout=30)
        env = _cli_env(tmp_path, LAKELOG_URL=server.url)
        for group in ([], ["--group", "cli-reader"]):
            out = _lakelog(env, "consume", OUTPUT, "--from-beginning", "--timeout-ms", "1500",
                           "--isolation-level", "read_committed", *group)
            assert out.returncode == 0, out.stderr
            assert out.stdout.splitlines() == ["committed"], (group, out.stdout)
        out = _lakelog(env, "consume", OUTPUT, "--from-beginning", "--timeout-ms", "1500")
        assert out.stdout.splitlines() == ["aborted", "committed", "open"]
        bad = _lakelog(env, "consume", OUTPUT, "--isolation-level", "sometimes")
        assert bad.returncode == 2 and "read_committed" in bad.stderr
        producer.abort_transaction()


def _partition_adds(server: ServerProcess) -> float:
    """AddPartitionsToTxn calls the server answered (its request histogram's count)."""
    with server.client() as c:
        text = c.get(server.url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("lakelog_request_seconds_count")
               and "/partitions\"" in line and "transactions" in line)


def test_one_call_adds_every_partition_with_records_waiting(server: ServerProcess) -> None:
    """As Kafka's sender: the first request of a transaction adds every partition that
    has records waiting, of every topic, in one call (the bench found one call per
    topic's request, each a durable state write the sender waited on)."""
    make_topic(server, "adds-a", 3)
    make_topic(server, "adds-b", 3)
    with Producer(server.url, transactional_id="adds", linger_ms=200) as producer:
        producer.init_transactions()
        before = _partition_adds(server)
        producer.begin_transaction()
        for topic in ("adds-a", "adds-b"):
            for p in range(3):
                producer.send(topic, b"v", partition=p)
        producer.commit_transaction()
        assert _partition_adds(server) - before == 1
