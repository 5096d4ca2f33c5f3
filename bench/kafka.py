"""Kafka's protocol against HTTP, same server, same records (``python -m bench.kafka``).

One ``lakelog serve`` with its Kafka listener (``--kafka-port``), a topic of 4
partitions; ``--records`` records (16-byte keys, 100-byte values), each case its best of
``--rounds`` rounds, interleaved:

- produce: confluent-kafka's ``Producer`` (librdkafka; idempotent, acks=all, linger 5 ms,
  no compression) to the Kafka listener, against lakelog's ``Producer`` (HTTP, its
  defaults: idempotent, acks=all) — from producing the first record to the last
  acknowledgement;
- consume: confluent-kafka's ``Consumer`` (``assign`` from offset 0, every record polled)
  against lakelog's ``Consumer.poll_batch`` (Arrow fetch, in a group) reading the same
  topic to its end.

Goals (issue 39): produce over Kafka's protocol >= 1.0 of HTTP produce; consume >= 1.0 of
the Arrow fetch. Prints a table; writes ``bench/results/kafka.json``.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka import TopicPartition

from bench.produce import quiet_server, wait_up
from bench.report import print_table, write_json
from lakelog.client import Consumer, Producer

BIN = Path(sys.executable).parent
PORT, KAFKA_PORT = 18771, 18772
URL = f"http://127.0.0.1:{PORT}"
BASE = f"{URL}/v3/clusters/lakelog"
BOOTSTRAP = f"127.0.0.1:{KAFKA_PORT}"
PARTITIONS = 4


def records(n: int) -> list[tuple[bytes, bytes]]:
    return [(b"%016d" % i, b"v" * 100) for i in range(n)]


def kafka_produce(topic: str, rows: list[tuple[bytes, bytes]]) -> float:
    producer = KafkaProducer({"bootstrap.servers": BOOTSTRAP, "enable.idempotence": True,
                              "acks": "all", "linger.ms": 5})
    failed: list[object] = []
    started = time.perf_counter()
    for key, value in rows:
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=lambda err, _m: err and
                                 failed.append(err))
                break
            except BufferError:  # the local queue is full: serve the callbacks
                producer.poll(0.01)
        producer.poll(0)
    assert producer.flush(120) == 0 and not failed, failed[:3]
    return len(rows) / (time.perf_counter() - started)


def http_produce(topic: str, rows: list[tuple[bytes, bytes]]) -> float:
    started = time.perf_counter()
    with Producer(URL) as producer:
        tally = producer.send_many(topic, [(k, v) for k, v in rows])
        producer.flush()
    assert tally.failed == 0, tally
    return len(rows) / (time.perf_counter() - started)


def kafka_consume(topic: str, n: int) -> float:
    consumer = KafkaConsumer({"bootstrap.servers": BOOTSTRAP, "group.id": "bench-kafka",
                              "enable.auto.commit": False})
    started = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got = 0
    while got < n:
        for m in consumer.consume(10_000, 1.0):
            assert m.error() is None, m.error()
            got += 1
    rate = n / (time.perf_counter() - started)
    consumer.close()
    return rate


def arrow_consume(topic: str, n: int, group: str) -> float:
    started = time.perf_counter()
    got = 0
    with Consumer(URL, group, [topic], auto_offset_reset="earliest") as consumer:
        while got < n:
            got += consumer.poll_batch(timeout_s=1.0, max_records=10_000).num_rows
    return n / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3, help="each case's best of this many")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lakelog-bench-kafka-"))
    server = quiet_server(work, PORT, "--kafka-port", str(KAFKA_PORT))
    rows = records(args.records)
    rates: dict[str, list[float]] = {"kafka_produce": [], "http_produce": [],
                                     "kafka_consume": [], "arrow_consume": []}
    try:
        wait_up(f"{URL}/healthz")
        for r in range(args.rounds):
            print(f"round {r + 1}: produce (Kafka, HTTP), consume (Kafka, Arrow)",
                  file=sys.stderr)
            topics = (f"kafka-{r}", f"http-{r}")
            for topic in topics:
                httpx.post(f"{BASE}/topics", json={
                    "topic_name": topic, "partitions_count": PARTITIONS}).raise_for_status()
            rates["kafka_produce"].append(kafka_produce(topics[0], rows))
            rates["http_produce"].append(http_produce(topics[1], rows))
            rates["kafka_consume"].append(kafka_consume(topics[0], args.records))
            rates["arrow_consume"].append(arrow_consume(topics[0], args.records, f"bench-{r}"))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    best = {k: max(v) for k, v in rates.items()}
    table: list[dict[str, Any]] = [
        {"case": "produce, records/s", "kafka": best["kafka_produce"],
         "http": best["http_produce"], "ratio": best["kafka_produce"] / best["http_produce"],
         "goal": ">= 1.0", "kafka_is": "confluent-kafka Producer",
         "http_is": "lakelog Producer"},
        {"case": "consume, records/s", "kafka": best["kafka_consume"],
         "http": best["arrow_consume"], "ratio": best["kafka_consume"] / best["arrow_consume"],
         "goal": ">= 1.0", "kafka_is": "confluent-kafka Consumer",
         "http_is": "lakelog Consumer.poll_batch (Arrow)"},
    ]
    print_table(table, ["case", "kafka", "kafka_is", "http", "http_is", "ratio", "goal"])
    path = write_json("kafka", table, {"records": args.records, "rounds": rates})
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
