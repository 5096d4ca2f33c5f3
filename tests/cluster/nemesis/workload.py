"""What users do while the nemesis works: the project's own clients, as a user runs them.

- ``Producing``: one idempotent acks=all ``Producer`` sending keyed records, each value
  unique (``<name>-<n>``), as fast as it can with at most ``max_outstanding`` records
  unanswered; it keeps every acknowledgement (value -> partition, offset), every
  failure, and the longest stretch without an acknowledgement.
- ``Consuming``: one member of a consumer group (auto-commit on, every second) that
  keeps what it saw per partition, in the order it saw it, cut where its assignment
  changed (a new owner may read again from the committed offset).
- ``CommitWatch``: reads the group's committed offsets through any broker every
  ``every_s`` and counts those that moved backwards.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from lakelog.client import Consumer, Producer
from lakelog.client.futures import FutureRecordMetadata
from lakelog.client.structs import TopicPartition
from tests.server import CLUSTER


class Producing(threading.Thread):
    def __init__(self, name: str, bootstrap: str | Sequence[str], topic: str, *,
                 keys: int = 1000, max_outstanding: int = 20_000) -> None:
        super().__init__(name=f"nemesis-producer-{name}", daemon=True)
        self.label = name
        self.topic = topic
        self.keys = keys
        self.producer = Producer(bootstrap, acks="all", linger_ms=5)
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.failed: dict[bytes, str] = {}
        self.sent = 0
        self.longest_gap_s = 0.0
        self._last_ack = time.monotonic()
        self._room = threading.Semaphore(max_outstanding)
        self._lock = threading.Lock()
        self._halt = threading.Event()

    def run(self) -> None:
        n = 0
        while not self._halt.is_set():
            if not self._room.acquire(timeout=0.5):
                continue
            value = f"{self.label}-{n}".encode()
            try:
                future = self.producer.send(self.topic, value, key=f"k{n % self.keys}".encode())
            except Exception as exc:  # refused at send (buffer full past max_block_ms)
                self._room.release()
                with self._lock:
                    self.failed[value] = f"send: {exc}"
                n += 1
                continue
            future.add_done_callback(functools.partial(self._answered, value))
            n += 1
            self.sent = n

    def _answered(self, value: bytes, future: FutureRecordMetadata) -> None:
        self._room.release()
        exc = future.exception()
        now = time.monotonic()
        with self._lock:
            if exc is not None:
                self.failed[value] = f"{type(exc).__name__}: {exc}"
                return
            meta = future.result()
            self.acked[value] = (meta.partition, meta.offset)
            self.longest_gap_s = max(self.longest_gap_s, now - self._last_ack)
            self._last_ack = now

    def _unanswered(self) -> int:
        with self._lock:
            return self.sent - len(self.acked) - len(self.failed)

    def stop_sending(self) -> None:
        self._halt.set()
        self.join(30)

    def finish(self, timeout_s: float) -> int:
        """Stop sending, wait for the answers (up to ``timeout_s``), close; how many
        records were left without an answer."""
        self.stop_sending()
        with contextlib.suppress(Exception):
            self.producer.flush(timeout_s)
        # A future is done before its callbacks have run (on the producer's threads).
        deadline = time.monotonic() + 10
        while self._unanswered() and time.monotonic() < deadline:
            time.sleep(0.01)
        unanswered = self._unanswered()
        with contextlib.suppress(Exception):
            self.producer.close()
        return unanswered


@dataclass
class Stretch:
    """What a consumer saw of one partition while it owned it, in order."""

    offsets: list[int] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)


class Consuming(threading.Thread):
    def __init__(self, name: str, bootstrap: str | Sequence[str], group: str,
                 topic: str) -> None:
        super().__init__(name=f"nemesis-consumer-{name}", daemon=True)
        self.label = name
        self.topic = topic
        self.stretches: list[tuple[int, Stretch]] = []
        """(partition, what was seen of it during one ownership), in the order they began."""
        self._current: dict[int, Stretch] = {}
        self.errors: list[str] = []
        self._halt = threading.Event()
        self.consumer = Consumer(bootstrap, group, [topic], auto_offset_reset="earliest",
                                 enable_auto_commit=True, auto_commit_interval_ms=1000,
                                 session_timeout_ms=10_000, default_api_timeout_ms=600_000,
                                 on_assign=self._assigned, on_revoke=self._revoked)

    def _assigned(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            self._restart(tp.partition)

    def _revoked(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            self._current.pop(tp.partition, None)

    def _restart(self, partition: int) -> Stretch:
        stretch = self._current[partition] = Stretch()
        self.stretches.append((partition, stretch))
        return stretch

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                batch = self.consumer.poll_batch(timeout_s=0.5)
            except Exception as exc:  # counted; the consumer goes on as a user's would
                self.errors.append(f"{type(exc).__name__}: {exc}")
                self._halt.wait(0.5)
                continue
            if not batch.num_rows:
                continue
            partitions = batch.column("partition").to_pylist()
            offsets = batch.column("offset").to_pylist()
            values = batch.column("value").to_pylist()
            for p, o, v in zip(partitions, offsets, values, strict=True):
                stretch = self._current.get(p) or self._restart(p)
                stretch.offsets.append(o)
                stretch.values.append(v)

    def stop(self) -> None:
        self._halt.set()
        self.join(60)
        with contextlib.suppress(Exception):
            self.consumer.close()

    def positions(self) -> dict[int, int]:
        """The next offset this consumer reads of each partition it owns."""
        out = {}
        for tp in self.consumer.assignment():
            pos = self.consumer.position(tp)
            if pos is not None:
                out[tp.partition] = pos
        return out


class CommitWatch(threading.Thread):
    """The group's committed offsets, read through any broker; counts each offset seen
    lower than one seen before for the same partition."""

    def __init__(self, urls: Sequence[str], group: str, every_s: float = 0.5) -> None:
        super().__init__(name="nemesis-commit-watch", daemon=True)
        self.urls = list(urls)
        self.group = group
        self.every_s = every_s
        self.highest: dict[tuple[str, int], int] = {}
        self.backwards: list[str] = []
        self.reads = 0
        self._halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=2) as http:
            i = 0
            while not self._halt.wait(self.every_s):
                url = self.urls[i % len(self.urls)]
                i += 1
                try:
                    r = http.get(f"{url}{CLUSTER}/consumer-groups/{self.group}/offsets")
                except httpx.HTTPError:
                    continue
                if r.status_code != 200:
                    continue
                self.reads += 1
                for row in r.json()["offsets"]:
                    key = (row["topic_name"], int(row["partition_id"]))
                    offset = int(row["offset"])
                    before = self.highest.get(key, -1)
                    if offset < before:
                        self.backwards.append(f"{key}: {before} -> {offset} via {url}")
                    self.highest[key] = max(before, offset)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


class Transacting(threading.Thread):
    """A transactional producer in Kafka's consume-transform-produce shape: each
    transaction writes ``per_txn`` records over the partitions of ``topics`` (values
    ``<name>-<txn>-<i>``) and commits the transaction's number as its group's offset of
    partition 0 of the first topic, then commits, or one in five aborts. Every tenth is
    left to a zombie: a second producer of the same id initialises meanwhile, and the
    first's commit must fail (``producer_fenced``), its records never shown.

    Each transaction's outcome as the client saw it: ``committed`` (commit returned),
    ``aborted`` (abort returned, or a zombie's commit refused), ``unknown`` (the end
    failed: either outcome may hold, but all of the transaction or none); zombie commits
    that were not refused are counted. After an error it aborts; after a fatal one (or an
    abort that fails) it starts a new producer of the id, whose ``init_transactions``
    fences the old and aborts what it left open."""

    def __init__(self, name: str, bootstrap: str | Sequence[str], topics: Sequence[str],
                 partitions: int, *, per_txn: int = 12) -> None:
        super().__init__(name=f"nemesis-txn-{name}", daemon=True)
        self.label = name
        self.bootstrap = bootstrap
        self.topics = list(topics)
        self.partitions = partitions
        self.per_txn = per_txn
        self.group = f"nemesis-txn-{name}"
        self.tid = f"nemesis-{name}"
        self.outcomes: dict[int, str] = {}
        """Transaction number -> committed | aborted | unknown."""
        self.zombie_commits = 0
        self.errors: list[str] = []
        self.producer: Producer | None = None
        self._halt = threading.Event()

    def _new(self) -> Producer:
        producer = Producer(self.bootstrap, transactional_id=self.tid,
                            linger_ms=2, delivery_timeout_ms=30_000,
                            transaction_timeout_ms=20_000)
        producer.init_transactions(timeout_s=60)
        return producer

    def _producer(self) -> Producer:
        if self.producer is None:
            self.producer = self._new()
        return self.producer

    def _drop(self) -> None:
        if self.producer is not None:
            with contextlib.suppress(Exception):
                self.producer.close()
        self.producer = None

    def _write(self, producer: Producer, n: int) -> None:
        producer.begin_transaction()
        for i in range(self.per_txn):
            producer.send(self.topics[i % len(self.topics)], f"{self.label}-{n}-{i}".encode(),
                          partition=(i // len(self.topics)) % self.partitions)
        producer.send_offsets_to_transaction({TopicPartition(self.topics[0], 0): n},
                                             self.group, timeout_s=60)

    def run(self) -> None:
        n = 0
        while not self._halt.is_set():
            try:
                producer = self._producer()
            except Exception as exc:
                self.errors.append(f"init: {type(exc).__name__}: {exc}")
                self._drop()
                self._halt.wait(0.5)
                continue
            n += 1
            commit = n % 5 != 0
            self.outcomes[n] = "unknown"
            try:
                self._write(producer, n)
                if n % 10 == 3:  # a zombie: another instance takes the id over first
                    self.producer = self._new()
                    try:
                        producer.commit_transaction(timeout_s=60)
                        self.zombie_commits += 1
                    except Exception as exc:
                        if "producer_fenced" not in str(exc) and \
                                "ProducerFenced" not in type(exc).__name__:
                            raise
                        self.outcomes[n] = "aborted"
                    with contextlib.suppress(Exception):
                        producer.close()
                    continue
                if commit:
                    producer.commit_transaction(timeout_s=60)
                    self.outcomes[n] = "committed"
                else:
                    producer.abort_transaction(timeout_s=60)
                    self.outcomes[n] = "aborted"
            except Exception as exc:
                self.errors.append(f"txn {n}: {type(exc).__name__}: {exc}")
                try:  # a commit decided before it failed makes this abort fail
                    self._producer().abort_transaction(timeout_s=60)
                    self.outcomes[n] = "aborted"
                except Exception:
                    self._drop()

    def stop(self) -> None:
        self._halt.set()
        self.join(180)
        self._drop()
