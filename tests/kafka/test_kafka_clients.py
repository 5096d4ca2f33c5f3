"""The Kafka listener against clients nobody here wrote: confluent-kafka (librdkafka),
kafka-python, aiokafka and Debian's kcat, on a real ``lakelog serve``; the same records seen by
both fronts (Kafka's protocol and HTTP)."""

from __future__ import annotations

import base64
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpPartition

from lakelog.local import free_port
from tests.server import ServerProcess

pytestmark = pytest.mark.slow
CLUSTER = "/v3/clusters/lakelog"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("kafka") / "data",
                        env={"LAKELOG_KAFKA_PORT": str(free_port())}).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def bootstrap(server: ServerProcess) -> str:
    return f"127.0.0.1:{server.env['LAKELOG_KAFKA_PORT']}"


def make_topic(server: ServerProcess, name: str, partitions: int = 3) -> None:
    r = httpx.post(server.url + CLUSTER + "/topics", timeout=30,
                   json={"topic_name": name, "partitions_count": partitions})
    assert r.status_code == 201, r.text


def http_records(server: ServerProcess, topic: str, partition: int) -> list[dict[str, object]]:
    r = httpx.get(f"{server.url}{CLUSTER}/topics/{topic}/partitions/{partition}/records",
                  params={"offset": 0, "max_records": 10_000}, timeout=30)
    assert r.status_code == 200, r.text
    return list(r.json()["records"])


def consume_all(bootstrap: str, topic: str, partitions: int, want: int) -> list[object]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[object] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < want and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                got.append(m)
    finally:
        consumer.close()
    return got


def test_librdkafka_produces_with_each_codec_and_both_fronts_see_the_same_records(
        server: ServerProcess, bootstrap: str) -> None:
    make_topic(server, "orders")
    acked: dict[bytes, tuple[int, int]] = {}
    failed: list[str] = []
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec,
                             "enable.idempotence": True, "linger.ms": 5})
        def done(err: KafkaError | None, msg: object, codec: str = codec) -> None:
            if err is not None:  # (an exception raised in a librdkafka callback is lost)
                failed.append(f"{codec}: {err}")
                return
            acked[msg.key()] = (msg.partition(), msg.offset())  # type: ignore[attr-defined]
        for i in range(200):
            producer.produce("orders", key=f"{codec}-{i}".encode(), value=b"v" * (i % 50),
                             headers=[("n", bytes([i]))], on_delivery=done)
        assert producer.flush(30) == 0
    assert failed == [] and len(acked) == 1000
    got = consume_all(bootstrap, "orders", 3, 1000)
    seen = {m.key(): (m.partition(), m.offset()) for m in got}  # type: ignore[attr-defined]
    assert len(got) == 1000 and seen == acked  # every record where its ack said, once
    for m in got:
        i = int(m.key().rsplit(b"-", 1)[1])  # type: ignore[attr-defined]
        assert m.headers() == [("n", bytes([i]))] and m.value() == b"v" * (i % 50)  # type: ignore[attr-defined]
    # Kafka's traffic counts in /metrics as HTTP's does (before the HTTP reads below).
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    assert 'lakelog_records_in_total{topic="orders"} 1000.0' in metrics
    assert 'lakelog_records_out_total{topic="orders"} 1000.0' in metrics
    # The HTTP front reads the same records at the same offsets, headers and all.
    for p in range(3):
        rows = http_records(server, "orders", p)
        by_offset = {(p, int(r["offset"])): r for r in rows}  # type: ignore[call-overload]
        assert len(rows) == sum(1 for part, _ in acked.values() if part == p)
        for key, where in acked.items():
            if where[0] == p:
                r = by_offset[where]
                n = int(key.rsplit(b"-", 1)[1])
                assert base64.b64decode(r["key"]["data"]) == key  # type: ignore[index]
                assert r["headers"] == [{"name": "n",
                                         "value": base64.b64encode(bytes([n])).decode()}]


def test_http_records_reach_a_kafka_consumer_and_kafka_python_produces_idempotently(
        server: ServerProcess, bootstrap: str) -> None:
    make_topic(server, "mixed", 1)
    r = httpx.post(f"{server.url}{CLUSTER}/topics/mixed/records:batch", timeout=30, json={
        "entries": [{"id": str(i), "partition_id": 0,
                     "key": {"type": "STRING", "data": f"h{i}"},
                     "value": {"type": "STRING", "data": f"http-{i}"}} for i in range(5)]})
    assert r.status_code == 207 and r.json()["failures"] == [], r.text
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", compression_type="gzip",
                             enable_idempotence=True)
    futures = [producer.send("mixed", key=b"k", value=f"kp-{i}".encode(), partition=0)
               for i in range(20)]
    producer.flush(30)
    assert [f.get(30).offset for f in futures] == list(range(5, 25))
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=5000)
    tp = KpPartition("mixed", 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    values = [m.value for m in consumer]
    assert values == [f"http-{i}".encode() for i in range(5)] + \
        [f"kp-{i}".encode() for i in range(20)]
    assert consumer.end_offsets([tp]) == {tp: 25}
    found = consumer.offsets_for_times({tp: 0})[tp]
    assert found is not None and found.offset == 0 and found.timestamp > 1_700_000_000_000
    assert consumer.beginning_offsets([tp]) == {tp: 0}
    consumer.close()


def test_aiokafka_produces_idempotently_and_reads_back(server: ServerProcess,
                                                        bootstrap: str) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as AioPartition
    make_topic(server, "aio", 2)

    async def run() -> tuple[list[int], list[tuple[bytes, tuple[tuple[str, bytes], ...]]]]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True,
                                    compression_type="gzip")
        await producer.start()
        try:
            sent = [await producer.send_and_wait("aio", b"aio-%d" % i, key=b"k", partition=1,
                                                 headers=[("h", b"%d" % i)]) for i in range(10)]
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            tp = AioPartition("aio", 1)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            got: list[tuple[bytes, tuple[tuple[str, bytes], ...]]] = []
            while len(got) < 10:
                batch = await asyncio.wait_for(consumer.getmany(tp, timeout_ms=1000), 30)
                got += [(r.value, tuple(r.headers)) for r in batch.get(tp, [])]
        finally:
            await consumer.stop()
        return [m.offset for m in sent], got

    offsets, got = asyncio.run(run())
    assert offsets == list(range(10))
    assert got == [(b"aio-%d" % i, (("h", b"%d" % i),)) for i in range(10)]


def test_consumers_step_over_markers_and_aborted_records(server: ServerProcess,
                                                         bootstrap: str) -> None:
    from lakelog.client import Producer as HttpProducer
    make_topic(server, "txn", 1)
    producer = HttpProducer(server.url, transactional_id="t1")
    producer.init_transactions()
    for values, commit in ((["c0", "c1"], True), (["a0", "a1", "a2"], False), (["c2"], True)):
        producer.begin_transaction()
        for v in values:
            producer.send("txn", v, partition=0)
        producer.flush()
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
    producer.close()
    for isolation, want in (("read_committed", ["c0", "c1", "c2"]),
                            ("read_uncommitted", ["c0", "c1", "a0", "a1", "a2", "c2"])):
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                             "enable.auto.commit": False, "isolation.level": isolation})
        consumer.assign([TopicPartition("txn", 0, 0)])
        got: list[str] = []
        deadline = time.monotonic() + 30
        end = consumer.get_watermark_offsets(TopicPartition("txn", 0), timeout=10)[1]
        reached = False
        while not reached and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value().decode())  # type: ignore[union-attr]
            reached = consumer.position([TopicPartition("txn", 0)])[0].offset >= end
        consumer.close()
        assert got == want and reached, (isolation, got)  # past the last marker too
        assert end == 9  # 6 records and 3 markers


def test_offsets_committed_by_one_client_are_the_group_s_for_every_other(
        server: ServerProcess, bootstrap: str) -> None:
    make_topic(server, "committed", 2)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "billing",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition("committed", 0, 0)])
    consumer.commit(offsets=[TopicPartition("committed", 0, 42)], asynchronous=False)
    # Over HTTP (and so in the _consumer_offsets table), and to kafka-python.
    r = httpx.get(f"{server.url}{CLUSTER}/consumer-groups/billing/offsets", timeout=30)
    assert [(o["topic_name"], o["partition_id"], o["offset"]) for o in r.json()["offsets"]] \
        == [("committed", 0, 42)]
    other = KafkaConsumer(bootstrap_servers=bootstrap, group_id="billing",
                          enable_auto_commit=False)
    assert other.committed(KpPartition("committed", 0)) == 42
    assert other.committed(KpPartition("committed", 1)) is None
    other.close()
    # And the other way round: committed over HTTP, read by librdkafka.
    r = httpx.post(f"{server.url}{CLUSTER}/consumer-groups/billing/offsets", timeout=30,
                   json={"member_epoch": -1, "offsets": [
                       {"topic_name": "committed", "partition_id": 1, "offset": 7}]})
    assert r.status_code == 200, r.text
    got = consumer.committed([TopicPartition("committed", p) for p in (0, 1)], timeout=10)
    assert [(t.partition, t.offset) for t in got] == [(0, 42), (1, 7)]
    consumer.close()


def test_errors_clients_see(server: ServerProcess, bootstrap: str) -> None:
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 3000})
    producer.produce("nowhere", value=b"x", partition=0,
                     on_delivery=lambda err, msg: errors.append(err))
    producer.flush(20)
    assert errors and errors[0] is not None and errors[0].code() in (
        KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._MSG_TIMED_OUT)
    # A batch is all or none: a record the topic refuses (no key on a compacted topic)
    # fails its whole batch, and none of it is appended.
    r = httpx.post(server.url + CLUSTER + "/topics", timeout=30, json={
        "topic_name": "compacted", "partitions_count": 1,
        "configs": [{"name": "cleanup.policy", "value": "compact"}]})
    assert r.status_code == 201, r.text
    batch_errors: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 200, "retries": 0})
    for i in range(6):
        producer.produce("compacted", value=b"v", key=None if i == 3 else b"k%d" % i,
                         partition=0, on_delivery=lambda err, msg: batch_errors.append(err))
    producer.flush(20)
    assert len(batch_errors) == 6 and all(e is not None for e in batch_errors), batch_errors
    assert http_records(server, "compacted", 0) == []
    port = int(bootstrap.rsplit(":", 1)[1])
    # ApiVersions in a version not served: answered in v0 with UNSUPPORTED_VERSION and the
    # versions served (KIP-511), the connection kept.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        header = struct.pack(">hhih", 18, 99, 7, -1)
        s.sendall(struct.pack(">i", len(header)) + header)
        size = struct.unpack(">i", _read(s, 4))[0]
        body = _read(s, size)
        correlation, error, count = struct.unpack_from(">ihi", body)
        assert (correlation, error) == (7, 35) and count >= 5
        s.sendall(struct.pack(">i", len(header)) + header)  # still open
        assert struct.unpack(">i", _read(s, 4))[0] == size
    # A request larger than the server takes, or of an API it does not serve: closed.
    for frame in (struct.pack(">i", 1 << 30), struct.pack(">ihhih", 10, 11, 0, 1, -1)):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(frame)
            assert s.recv(1) == b""
    assert "is not served" in server.log()


@pytest.mark.skipif(shutil.which("kcat") is None, reason="Debian's kcat is not installed")
def test_kcat_metadata_produce_consume_and_query(server: ServerProcess, bootstrap: str,
                                                 tmp_path: Path) -> None:
    make_topic(server, "kc", 2)
    def kcat(*args: str, stdin: str | None = None) -> str:
        return subprocess.run(["kcat", "-b", bootstrap, *args], input=stdin, text=True,
                              capture_output=True, timeout=60, check=True).stdout
    listing = kcat("-L", "-t", "kc")
    assert 'topic "kc" with 2 partitions' in listing and "leader 1" in listing
    kcat("-P", "-t", "kc", "-p", "1", "-K:", stdin="a:1\nb:2\n")
    out = kcat("-C", "-t", "kc", "-p", "1", "-o", "beginning", "-e", "-f", "%k=%s@%o\n")
    assert out.splitlines() == ["a=1@0", "b=2@1"]
    assert "offset 0" in kcat("-Q", "-t", "kc:1:0")


def _read(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, "closed"
        out += chunk
    return out


def test_every_version_advertised_has_kio_messages_and_an_answer_that_builds() -> None:
    from kio.index import load_request_schema, load_response_schema

    from ingest_api.kafka.handlers import SUPPORTED, api_versions_answer
    from ingest_api.kafka.messages import write_response
    for api_key, (low, high) in SUPPORTED.items():
        for version in range(low, high + 1):
            load_request_schema(api_key, version)
            assert load_response_schema(api_key, version) is not None
    frame = write_response(18, 3, 9, api_versions_answer())
    assert frame[:4] == (9).to_bytes(4, "big") and frame[4:6] == b"\0\0"


def test_the_listener_is_refused_where_it_would_bypass_api_keys_or_a_cluster() -> None:
    from pydantic import ValidationError

    from ingest_api.settings import ApiSettings
    with pytest.raises(ValidationError, match="no SASL yet"):
        ApiSettings(kafka_port=9092, auth="api-key")
    with pytest.raises(ValidationError, match="broker alone"):
        ApiSettings(kafka_port=9092, auth="none", zookeeper="127.0.0.1:2181", broker_id=1)
    with pytest.raises(ValidationError, match="loopback"):
        ApiSettings(kafka_port=9092, auth="none", host="0.0.0.0",
                    allow_insecure_non_loopback=True)
    assert ApiSettings(kafka_port=9092, auth="none").kafka_port == 9092


def test_the_listener_s_bounds_connections_and_idle_ones(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    """In-process, on a real (unstarted) broker: ApiVersions needs none of its services."""
    import asyncio

    from ingest_api.broker.core import Broker
    from ingest_api.kafka import listener as kafka_listener
    from ingest_api.settings import ApiSettings
    monkeypatch.setattr(kafka_listener, "IDLE_S", 0.5)
    header = struct.pack(">hhih", 18, 3, 1, -1) + b"\x00" + b"\x02a\x022\x00"  # v3 + tags

    async def run() -> tuple[bytes, bytes, bytes]:
        broker = Broker(ApiSettings(data_dir=tmp_path / "data", auth="none"))
        listener = kafka_listener.KafkaListener(broker, "127.0.0.1", 0, "127.0.0.1",
                                                1 << 20, max_connections=1)
        await listener.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
            writer.write(struct.pack(">i", len(header)) + header)
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            answered = await reader.readexactly(size)
            # A second connection past max_connections is closed at once.
            other, other_writer = await asyncio.open_connection("127.0.0.1", listener.port)
            refused = await asyncio.wait_for(other.read(1), 10)
            other_writer.close()
            # The first, left idle past IDLE_S, is closed.
            idle = await asyncio.wait_for(reader.read(1), 10)
            writer.close()
            return answered, refused, idle
        finally:
            await listener.stop()

    with caplog.at_level("WARNING", logger="ingest_api.kafka.listener"):
        answered, refused, idle = asyncio.run(run())
    assert struct.unpack_from(">ih", answered) == (1, 0)  # correlation id 1, no error
    assert refused == b"" and idle == b""
    assert "refused: 1 open already" in caplog.text  # (not closed for being idle)
