"""Spark into a topic, exactly once: ``df.write.format("lakelog")`` as one transaction,
``writeStream.format("lakelog")`` writing each micro-batch once though Spark retries it
or the query restarts from its checkpoint; a real server, a real SparkSession."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lakelog.client import Consumer
from log_tables.spark.sink import Rows, SinkStreamWriter, target_of
from tests.lakelog.helpers import make_topic
from tests.server import ServerProcess

pytestmark = pytest.mark.slow


def _committed(server: ServerProcess, topic: str, want: int) -> list[tuple[bytes | None, bytes]]:
    out: list[tuple[bytes | None, bytes]] = []
    deadline = time.monotonic() + 30
    with Consumer(server.url, f"check-{uuid.uuid4().hex[:6]}", [topic],
                  auto_offset_reset="earliest", isolation_level="read_committed",
                  enable_auto_commit=False) as consumer:
        while time.monotonic() < deadline:
            out += [(r.key, r.value or b"") for r in consumer.poll(timeout_s=0.5)]
            if len(out) >= want:
                time.sleep(0.5)
                out += [(r.key, r.value or b"") for r in consumer.poll(timeout_s=0.5)]
                break
    return sorted(out, key=lambda kv: kv[1])


def test_a_dataframe_is_written_as_one_transaction_and_a_version_once(
        spark: SparkSession, server: ServerProcess) -> None:
    make_topic(server, "out", 3)
    df = spark.createDataFrame([(f"k{i}", f"v{i:02d}") for i in range(20)], ["key", "value"])
    df.write.format("lakelog").mode("append").option("topic", "out").option("url", server.url).save()
    got = _committed(server, "out", 20)
    assert [v for _, v in got] == [f"v{i:02d}".encode() for i in range(20)]
    # Keyed records land where Kafka's partitioner puts them: the same key, one partition.
    with Consumer(server.url, "where", ["out"], auto_offset_reset="earliest",
                  isolation_level="read_committed") as consumer:
        placed = {r.key: r.partition for r in consumer.poll(timeout_s=2.0)}
    assert len(placed) == 20
    for _ in range(2):  # txnVersion: the second write of version 7 is skipped
        (df.limit(3).write.format("lakelog").mode("append").option("topic", "out")
         .option("url", server.url)
         .option("kafka.transactional.id", "versioned").option("txnVersion", "7").save())
    assert len(_committed(server, "out", 23)) == 23


def test_a_micro_batch_retried_or_replayed_is_written_once(
        spark: SparkSession, server: ServerProcess, tmp_path: Path) -> None:
    make_topic(server, "in", 2)
    make_topic(server, "out", 2)
    with server.client() as c:
        r = c.post("/topics/in/records:batch", json={"entries": [
            {"id": str(i), "key": {"type": "STRING", "data": f"k{i}"},
             "value": {"type": "STRING", "data": f"in-{i:02d}"}} for i in range(30)]})
        assert r.status_code == 207 and not r.json()["failures"], r.text
    checkpoint = tmp_path / "checkpoint"

    def run_once() -> None:
        query = (spark.readStream.format("lakelog").option("subscribe", "in")
                 .option("startingOffsets", "earliest").load()
                 .selectExpr("key", "concat('out-', substring(cast(value AS STRING), 4))"
                             " AS value")
                 .writeStream.format("lakelog").option("topic", "out")
                 .option("url", server.url).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()

    run_once()
    run_once()  # restarted from its checkpoint: nothing new, nothing again
    got = _committed(server, "out", 30)
    assert [v for _, v in got] == [f"out-{i:02d}".encode() for i in range(30)]
    # Spark retrying a batch the sink committed (its commit ran, the answer was lost):
    # the same batch id again is skipped; the next one is written.
    target = target_of({"topic": "out", "url": server.url}, None)
    writer = SinkStreamWriter(target)
    rows = writer.write(iter(spark.createDataFrame([("k", "again")], ["key", "value"])
                             .collect()))
    assert isinstance(rows, Rows)
    writer.commit([rows], 1000)
    writer.commit([rows], 1000)
    writer.commit([rows], 999)
    assert [v for _, v in _committed(server, "out", 31)].count(b"again") == 1
