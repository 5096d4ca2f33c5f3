"""Consume-transform-produce in a process of its own, for the nemesis to SIGKILL and
SIGSTOP mid-transaction (``python -m tests.cluster.nemesis.ctp JOURNAL URL...``).

Kafka's exactly-once loop as a user writes it: a read_committed ``Consumer`` of the
transactional topics (group ``GROUP``), and a transactional ``Producer`` that, for each
poll, writes one output record per input record to ``OUTPUT`` (the input's partition;
value ``<topic>|<partition>|<offset>|<value>``) and commits the input's positions in the
same transaction. On any error it closes both and starts again from the group's committed
offsets (its ``init_transactions`` fences what a killed or paused instance left open).

The journal says where it was when it died: ``commit N`` is written before a commit is
asked for and ``committed N`` once it returned, so a kill that finds ``commit N`` last
struck mid-commit.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from lakelog.client import Consumer, Producer
from lakelog.client.structs import TopicPartition

GROUP = "nemesis-ctp"
OUTPUT = "nemesis-ctp-out"
TRANSACTIONAL_ID = "nemesis-ctp"
SESSION_TIMEOUT_MS = 6000
TRANSACTION_TIMEOUT_MS = 5000
"""Short, so that a pause past it has the coordinator abort the transaction (and fence
the paused instance) before the pause ends."""


def output_value(topic: str, partition: int, offset: int, value: bytes) -> bytes:
    return f"{topic}|{partition}|{offset}|".encode() + value


def parse_output(value: bytes) -> tuple[str, int, int, bytes]:
    topic, partition, offset, rest = value.split(b"|", 3)
    return topic.decode(), int(partition), int(offset), rest


def _note(journal: TextIO, line: str) -> None:
    journal.write(line + "\n")
    journal.flush()  # in the kernel's hands before the next step: SIGKILL cannot lose it


def _session(urls: Sequence[str], topics: Sequence[str], journal: TextIO) -> None:
    """One consumer and one producer, transforming until an error."""
    consumer = Consumer(urls, GROUP, topics, auto_offset_reset="earliest",
                        enable_auto_commit=False, isolation_level="read_committed",
                        session_timeout_ms=SESSION_TIMEOUT_MS, default_api_timeout_ms=60_000)
    producer = None
    try:
        producer = Producer(urls, transactional_id=TRANSACTIONAL_ID, linger_ms=2,
                            delivery_timeout_ms=30_000,
                            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS)
        producer.init_transactions(timeout_s=60)
        _note(journal, "ready")
        n = 0
        while True:
            batch = consumer.poll_batch(timeout_s=0.5, max_records=200)
            if not batch.num_rows:
                continue
            n += 1
            producer.begin_transaction()
            ends: dict[TopicPartition, int] = {}
            for t, p, o, v in zip(batch.column("topic").to_pylist(),
                                  batch.column("partition").to_pylist(),
                                  batch.column("offset").to_pylist(),
                                  batch.column("value").to_pylist(), strict=True):
                producer.send(OUTPUT, output_value(t, p, o, v), partition=p)
                ends[TopicPartition(t, p)] = o + 1
            producer.send_offsets_to_transaction(ends, consumer.group_metadata(), timeout_s=60)
            _note(journal, f"commit {n}")
            producer.commit_transaction(timeout_s=60)
            _note(journal, f"committed {n}")
    finally:
        with contextlib.suppress(Exception):
            consumer.close(commit=False)
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.close()


def main(argv: list[str]) -> int:
    journal_path, urls = Path(argv[0]), argv[1:]
    topics = os.environ["NEMESIS_CTP_TOPICS"].split(",")
    with journal_path.open("a") as journal:
        _note(journal, f"start {os.getpid()}")
        while True:
            try:
                _session(urls, topics, journal)
            except Exception as exc:  # a user's loop: start again from the committed offsets
                _note(journal, f"error {type(exc).__name__}: {str(exc)[:200]!r}")
                time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
