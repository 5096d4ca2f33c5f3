"""The producer: batching, partitioning, idempotence, retries, and recovery from refusals.

Records are queued per partition; a partition's batch is ready when it holds
``batch_size`` bytes or ``batch_records`` records, or its first record has waited
``linger_ms`` (Kafka's meanings). A sender thread puts ready batches of one topic and
leader into a ``records:batch`` request and runs it on a worker thread, up to
``max_in_flight_requests_per_connection`` requests per broker at once, but never two
for one partition: Kafka keeps several of a partition's batches in flight because they
go in order on one TCP connection, and its broker refuses a batch whose sequence skips
ahead. Requests over several HTTP connections may reach the server in any order, and
the server refuses a skip just as Kafka's broker does (its dedup window of 5 runs is
for retries, not reordering), so a partition's next batch waits for its previous
answer. The ready partitions are spread over the requests a broker has room for.
Keyed records are partitioned client-side with Kafka's murmur2 (the server's and Kafka's
Java client's partition). ``send`` does as little as it can on the caller's thread: it
appends the record to an incoming queue (no lock) and answers with a light Future
(``futures.FutureRecordMetadata``, Kafka's); the sender thread moves what came in to the
partitions' queues in bulk (murmur2 over numpy for all the keys at once), and a request
encodes each record with one format (``batches.entries``). An answer completes its
request's records at once, under one lock per producer (``futures.Deliveries``). ``send_many`` counts the answers of many records
in a ``Tally`` (no Future each: ``lakelog produce``).

Idempotence (the default): every record carries the producer id, epoch and a sequence
number, consecutive per partition, so a request sent again after a broken connection
is answered with the original offsets, never appended twice. What happens after a
failure, as Kafka's producer (its TransactionManager) does it:

1. A request that gets no answer, or a "try again" answer, is sent again unchanged
   (same sequences) within ``retries``, ``retry_backoff_ms`` and ``delivery_timeout_ms``.
2. A record the server refuses for its own sake (too large, invalid) is not appended
   and uses no sequence there, so the records after it in its partition are refused as
   ``out_of_order_sequence`` (the gap). The refused record's future fails with its
   error; the partition's next sequence goes back to the first failed record's, and the
   records refused only because of the gap are queued again at the front of their
   partition (new sequences), so later records go on and nothing is duplicated.
3. A request refused whole (e.g. 404 for a topic that does not exist) appended
   nothing: its records fail and the sequences go back to where the request started.
4. When the outcome is unknown (the deadline passed after a broken connection) or the
   sequences disagree with the server's (an ``out_of_order_sequence`` no refusal
   explains, ``unknown_producer_id``), the producer takes a new epoch and starts every
   partition at sequence 0 again (Kafka's epoch bump): a record whose outcome is
   unknown fails, the others are sent again under the new epoch.

How records go on the wire, and what an answer does to each (2 and 4), is in
``batches.py``; this module queues, sends and retries.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import math
import ssl
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from operator import attrgetter
from types import TracebackType
from typing import Literal

import httpx

from lakelog.client.batches import (
    MAX_BATCH_ENTRIES,
    SEQUENCE_SPACE,
    Batch,
    Outcome,
    again,
    decode_answer,
    entries,
    key_bytes,
    settle,
)
from lakelog.client.errors import (
    LakelogClientError,
    LakelogConnectionError,
    LakelogTimeoutError,
    entry_error,
    error_from,
    raise_for,
)
from lakelog.client.futures import Deliveries, FutureRecordMetadata, Tally
from lakelog.client.http import api_client, default_api_key
from lakelog.client.leaders import Leaders
from lakelog.client.retry import (
    MAX_RETRIES,
    Attempts,
    RetryPolicy,
    call,
    describe,
    never_sent,
    permanent,
    resolve_request_timeout_ms,
)
from lakelog.client.structs import TopicPartition
from log_tables.partitioner import murmur2, partitions_for_keys

MOVED = ("not_leader_or_follower", "broker_not_available")
"""Errors after which a request goes to the bootstrap broker (which forwards) while the
metadata is read again."""

MAX_IN_FLIGHT = 5  # Kafka's bound with idempotence (its broker remembers 5 batches)
JSON_BODY = {"content-type": "application/json"}
MIN_WAIT_S = 0.0005  # the sender thread's shortest sleep
_enqueued_at = attrgetter("_enqueued_at")
_size = attrgetter("_size")


class Producer:
    """Batching, idempotent producer; ``send`` returns a Future of ``RecordMetadata``
    (a ``FutureRecordMetadata``: not a ``concurrent.futures.Future``, see its doc).

    Kafka's settings, in milliseconds: ``linger_ms`` (how long a partition's first record
    waits for more), ``batch_size`` (bytes of one partition's batch; ``batch_bytes`` is its
    older spelling; ``batch_records`` bounds the records too),
    ``max_in_flight_requests_per_connection`` (requests awaiting an answer, per broker),
    ``retries`` (default unbounded: the deadline bounds), ``retry_backoff_ms``,
    ``retry_backoff_max_ms``, ``request_timeout_ms`` (one attempt; ``timeout_s`` is its
    older spelling, in seconds), ``delivery_timeout_ms`` (from ``send`` to the record's
    answer, retries included) and ``max_block_ms`` (how long ``send`` may wait for topic
    metadata or for room in the buffer).
    """

    def __init__(self, url: str, *, acks: Literal["all", "1", "0"] = "all",
                 linger_ms: float = 5.0, batch_records: int = 1000, batch_bytes: int = 1 << 20,
                 batch_size: int | None = None, max_in_flight_requests_per_connection: int = 5,
                 max_buffered_records: int = 100_000, idempotent: bool = True,
                 retries: int = MAX_RETRIES, retry_backoff_ms: float = 100,
                 retry_backoff_max_ms: float = 1000, request_timeout_ms: float | None = None,
                 delivery_timeout_ms: float = 120_000, max_block_ms: float = 60_000,
                 timeout_s: float | None = None, api_key: str | None = None,
                 verify: str | bool | ssl.SSLContext = True) -> None:
        if not 1 <= batch_records <= MAX_BATCH_ENTRIES:
            raise ValueError(f"batch_records must be within 1..{MAX_BATCH_ENTRIES} "
                             "(the server's batch limit)")
        if delivery_timeout_ms <= 0 or max_block_ms < 0:
            raise ValueError("delivery_timeout_ms must be above 0 and max_block_ms 0 or more")
        if not 1 <= max_in_flight_requests_per_connection <= MAX_IN_FLIGHT:
            raise ValueError("max_in_flight_requests_per_connection must be within "
                             f"1..{MAX_IN_FLIGHT}")
        if batch_size is not None:
            batch_bytes = batch_size
        if batch_bytes < 1:
            raise ValueError("batch_size must be 1 or more")
        self.url = url.rstrip("/")
        self.policy = RetryPolicy(retries, retry_backoff_ms, retry_backoff_max_ms,
                                  resolve_request_timeout_ms(request_timeout_ms, timeout_s, 30_000))
        self._http = api_client(url, "", api_key, verify, self.policy.request_timeout_ms / 1000)
        self._brokers: dict[str, httpx.Client] = {}
        self._leaders = Leaders(self.url, self._http, lambda u: self._brokers.setdefault(
            u, api_client(u, "", api_key or default_api_key(url), verify,
                          self.policy.request_timeout_ms / 1000)))
        self.acks = acks
        self.linger_s = linger_ms / 1000
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self.max_in_flight = max_in_flight_requests_per_connection
        self.max_buffered = max_buffered_records
        self.idempotent = idempotent
        self.retries = retries
        self.delivery_timeout_ms = delivery_timeout_ms
        self.max_block_ms = max_block_ms
        self.requests_sent = 0
        """``records:batch`` requests sent so far (attempts; retries included)."""
        self._partitions: dict[str, int] = {}
        self._round_robin = itertools.count()
        self._deliveries = Deliveries()
        self._incoming: deque[FutureRecordMetadata] = deque()
        """Records ``send`` took that the sender thread has not yet put in their partitions'
        queues: ``send`` appends without a lock (a deque's append is atomic)."""
        self._sleeping = False
        """The sender thread waits longer than a new record's linger: ``send`` wakes it."""
        self._wake_count = batch_records
        """Records in ``_incoming`` at which ``send`` wakes the sender thread (a batch may be
        full: ``batch_records``, or ``batch_size`` at the sizes seen)."""
        self._queues: dict[TopicPartition, deque[FutureRecordMetadata]] = {}
        self._queued_bytes: dict[TopicPartition, int] = {}
        self._first_at: dict[TopicPartition, float] = {}
        self._buffered = 0
        """Records in the partitions' queues (not yet in a request)."""
        self._in_flight: dict[int, Batch] = {}
        self._busy: set[TopicPartition] = set()
        """Partitions with a request awaiting its answer: one each, see the module docstring."""
        self._requests_by_leader: dict[str, int] = {}
        self._request_ids = itertools.count()
        self._cond = threading.Condition(threading.Lock())
        """Guards the queues; the sender thread waits on it."""
        self._closed = False
        self._flush_requested = 0
        self._urls: dict[tuple[httpx.Client, str], httpx.URL] = {}
        self._ident_lock = threading.Lock()
        """Guards the producer id, the epoch and the sequences (several requests at once)."""
        self._producer: tuple[int, int] | None = None
        self._new_epoch = False
        """The sequences may disagree with the server's: take a new epoch before the next send."""
        self._sequences: dict[TopicPartition, int] = {}
        self._workers = concurrent.futures.ThreadPoolExecutor(
            MAX_IN_FLIGHT * 2, thread_name_prefix="lakelog-producer-request")
        self._thread = threading.Thread(target=self._run, name="lakelog-producer", daemon=True)
        self._thread.start()

    def _attempts(self, what: str, deadline: float, setting: str) -> Attempts:
        return Attempts(self.policy, deadline, what, self.url, setting)

    def partitions_for(self, topic: str) -> int:
        """The topic's partition count (asked once, retried within ``max_block_ms``)."""
        n = self._partitions.get(topic)
        if n is None:
            attempts = self._attempts(f"GET /topics/{topic}",
                                      time.monotonic() + self.max_block_ms / 1000,
                                      f"max_block_ms={self.max_block_ms:g}")
            r = call(lambda t: self._http.get(f"/topics/{topic}", timeout=t), attempts,
                     idempotent=True)
            raise_for(r)
            n = self._partitions[topic] = int(r.json()["partitions_count"])
        return n

    def send(self, topic: str, value: bytes | str | None, key: bytes | str | None = None,
             partition: int | None = None, headers: Iterable[tuple[str, bytes]] = (),
             timestamp_ms: int | None = None) -> FutureRecordMetadata:
        """Queue one record; waits up to ``max_block_ms`` while ``max_buffered_records``
        are waiting (then ``LakelogTimeoutError``)."""
        if partition is None and topic not in self._partitions:
            self.partitions_for(topic)  # here, so that its max_block_ms is send's
        incoming = self._incoming
        if self._closed or len(incoming) + self._buffered >= self.max_buffered:
            self._wait_for_room(topic, 1)
        record = FutureRecordMetadata(
            self._deliveries, topic, time.monotonic(), key, value, partition,
            None if not headers and timestamp_ms is None else (tuple(headers), timestamp_ms))
        incoming.append(record)
        # Read after the append: the sender thread raises the flag before it looks at
        # _incoming a last time, so either it sees the record or send sees the flag.
        if self._sleeping or len(incoming) == self._wake_count:
            self._wake()
        return record

    def send_many(self, topic: str, records: Sequence[tuple[bytes | str | None,
                                                            bytes | str | None]],
                  tally: Tally | None = None) -> Tally:
        """Queue many ``(key, value)`` records of one topic, partitioned as ``send`` does;
        their answers are counted in ``tally`` (a new one if None), not in Futures. Waits
        for room as ``send`` does."""
        tally = tally if tally is not None else Tally()
        n = self.partitions_for(topic)
        keys = [k for k, _ in records]
        if all(k is not None for k in keys):
            parts = partitions_for_keys([key_bytes(k) for k in keys if k is not None], n)
        else:
            parts = [(murmur2(key_bytes(k)) & 0x7FFFFFFF) % n if k is not None
                     else next(self._round_robin) % n for k in keys]
        now = time.monotonic()
        tally._add(len(records))
        made = [FutureRecordMetadata(self._deliveries, topic, now, k, v, p, _tally=tally)
                for p, (k, v) in zip(parts, records, strict=True)]
        step = max(1, self.max_buffered // 2)
        for i in range(0, len(made), step):
            chunk = made[i:i + step]
            if self._closed or (len(self._incoming) + self._buffered + len(chunk)
                                > self.max_buffered):
                self._wait_for_room(topic, len(chunk))
            # Through _incoming, as send's records: a partition's records keep their order.
            self._incoming.extend(chunk)
            self._wake()
        return tally

    def _wait_for_room(self, topic: str, n: int) -> None:
        """Wait until ``n`` more records fit in ``max_buffered_records`` (or none wait),
        up to ``max_block_ms``."""
        blocked_until = time.monotonic() + self.max_block_ms / 1000
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("the producer is closed")
                waiting = self._buffered + len(self._incoming)
                if not waiting or waiting + n <= self.max_buffered:
                    return
                left = blocked_until - time.monotonic()
                if left <= 0:
                    raise LakelogTimeoutError(
                        f"send to {topic}: {waiting} records were still waiting to be "
                        f"sent to {self.url} after max_block_ms={self.max_block_ms:g}")
                self._sleeping = False
                self._cond.notify_all()  # the sender thread may not have seen them yet
                self._cond.wait(left)

    def _wake(self) -> None:
        with self._cond:
            self._sleeping = False
            self._cond.notify_all()

    def _drain(self) -> None:
        """Put the records ``send`` took into their partitions' queues (under ``_cond``)."""
        incoming = self._incoming
        if not incoming:
            return
        records = [incoming.popleft() for _ in range(len(incoming))]
        topics = {r._topic for r in records}
        added = 0
        for topic in topics:
            added += self._place(topic, records if len(topics) == 1
                                 else [r for r in records if r._topic == topic])
        self._buffered += len(records)
        # Wake up for a full batch_size too, at the sizes of these records.
        self._wake_count = max(1, min(self.batch_records,
                                      self.batch_bytes * len(records) // max(1, added)))

    def _place(self, topic: str, records: list[FutureRecordMetadata]) -> int:
        """Queue records of one topic, each in its partition, in order; their bytes."""
        groups: dict[int, list[FutureRecordMetadata]] = {}
        for r, p in zip(records, self._partitions_of(topic, records), strict=True):
            k, v = r._key, r._value
            r._size = (len(k) if k is not None else 0) + (len(v) if v is not None else 0)
            group = groups.get(p)
            if group is None:
                groups[p] = [r]
            else:
                group.append(r)
        added = 0
        for partition, group in groups.items():
            tp = TopicPartition(topic, partition)
            queue = self._queues.get(tp)
            if queue is None:
                queue = self._queues[tp] = deque()
                self._queued_bytes[tp] = 0
            if not queue:
                self._first_at[tp] = group[0]._enqueued_at
            queue.extend(group)
            size = sum(map(_size, group))
            self._queued_bytes[tp] += size
            added += size
        return added

    def _partitions_of(self, topic: str, records: list[FutureRecordMetadata]) -> list[int]:
        """Each record's partition: the one ``send`` was given, else its key's (Kafka's
        murmur2, over numpy for all the keys at once), else round robin."""
        given = [r._partition for r in records]
        keys = [r._key for r in records]
        if given.count(None) == len(given) and None not in keys:  # the usual: all keyed
            return partitions_for_keys(
                [k if k.__class__ is bytes else key_bytes(k)  # type: ignore[arg-type]
                 for k in keys], self._partitions[topic])
        out: list[int] = []
        keyed: list[int] = []
        for i, (p, k) in enumerate(zip(given, keys, strict=True)):
            if p is None and k is not None:
                keyed.append(i)
            out.append(p if p is not None else -1 if k is not None
                       else next(self._round_robin) % self._partitions[topic])
        if keyed:
            picked = partitions_for_keys(
                [key_bytes(keys[i]) for i in keyed],  # type: ignore[arg-type]
                self._partitions[topic])
            for i, p in zip(keyed, picked, strict=True):
                out[i] = p
        return out

    def flush(self, timeout_s: float | None = None) -> None:
        """Send everything queued and wait for the answers (records sent again after a
        refusal of a record before them included)."""
        with self._cond:
            records = list(self._incoming)
            records += [r for q in self._queues.values() for r in q]
            records += [r for batch in self._in_flight.values() for r in batch]
            self._flush_requested += 1
            self._sleeping = False
            self._cond.notify_all()
        try:
            self._deliveries.wait(records, timeout_s)
        finally:
            with self._cond:
                self._flush_requested -= 1

    def _ready(self, now: float) -> list[TopicPartition]:
        return [tp for tp, q in self._queues.items() if q and tp not in self._busy and (
            self._flush_requested or self._closed or len(q) >= self.batch_records
            or self._queued_bytes[tp] >= self.batch_bytes
            or now - self._first_at[tp] >= self.linger_s)]

    def _take(self, ready: list[TopicPartition]
              ) -> tuple[str, str, list[tuple[TopicPartition, Batch]]] | None:
        """One request's records: a batch of each of its share of the ready partitions of
        one topic that one broker leads (in a cluster, straight to the leader), if that
        broker has room for another request in flight. The share spreads the ready
        partitions over the requests the broker has room for, so that they go in parallel
        rather than in one request that keeps every partition busy."""
        for first in ready:
            leader = self._leaders.url(first.topic, first.partition)
            free = self.max_in_flight - self._requests_by_leader.get(leader, 0)
            if free > 0:
                break
        else:
            return None
        topic = first.topic
        mine = [tp for tp in ready
                if tp.topic == topic and self._leaders.url(tp.topic, tp.partition) == leader]
        taken: list[tuple[TopicPartition, Batch]] = []
        count = 0
        for tp in mine[:math.ceil(len(mine) / free)]:
            if count >= MAX_BATCH_ENTRIES:
                break
            q = self._queues[tp]
            limit = min(len(q), self.batch_records, MAX_BATCH_ENTRIES - count)
            size = sum(r._size for r in itertools.islice(q, limit))
            if size <= self.batch_bytes:  # the usual case: no record-by-record check
                batch = [q.popleft() for _ in range(limit)]
            else:
                # Kafka's batch.size: a partition's batch ends before the record that would
                # take it past batch_size (a larger record goes alone).
                batch, size = [], 0
                while len(batch) < limit and (not batch or size + q[0]._size <= self.batch_bytes):
                    size += q[0]._size
                    batch.append(q.popleft())
            count += len(batch)
            self._queued_bytes[tp] -= size
            if q:
                self._first_at[tp] = q[0]._enqueued_at
            taken.append((tp, batch))
        self._buffered -= count
        return topic, leader, taken

    def _run(self) -> None:
        """Start requests as partitions become ready, up to ``max_in_flight`` per broker
        and one per partition; each runs on a worker thread."""
        while True:
            with self._cond:
                while True:
                    self._drain()
                    now = time.monotonic()
                    ready = self._ready(now)
                    job = self._take(ready) if ready else None
                    if job is not None or (self._closed and not self._buffered
                                           and not self._in_flight and not self._incoming):
                        break
                    wait_s = self._wait_s(now, ready)
                    self._sleeping = wait_s is None or wait_s > self.linger_s
                    if self._incoming:  # sent before the flag was up: take it first
                        self._sleeping = False
                        continue
                    self._cond.wait(wait_s)
                    self._sleeping = False
                if job is None:
                    return
                topic, leader, taken = job
                request = next(self._request_ids)
                self._in_flight[request] = [r for _, batch in taken for r in batch]
                self._busy.update(tp for tp, _ in taken)
                self._requests_by_leader[leader] = self._requests_by_leader.get(leader, 0) + 1
                self._cond.notify_all()  # send() may be waiting for room
            self._workers.submit(self._request, request, topic, taken, leader)

    def _wait_s(self, now: float, ready: list[TopicPartition]) -> float | None:
        """How long the sender thread may sleep: until the first linger ends of a partition
        that can go (an answer wakes it for the others), and while anything is queued or
        in flight, no longer than ``linger_ms``, so that what ``send`` adds meanwhile is
        seen within its linger without waking it (None: until woken)."""
        waits = [] if ready else [self._first_at[tp] + self.linger_s - now
                                  for tp, q in self._queues.items() if q and tp not in self._busy]
        wait_s = max(MIN_WAIT_S, min(waits)) if waits else None
        if (self._buffered or self._in_flight) and self.linger_s >= MIN_WAIT_S:
            wait_s = self.linger_s if wait_s is None else min(wait_s, self.linger_s)
        return wait_s

    def _request(self, request: int, topic: str,
                 taken: list[tuple[TopicPartition, Batch]], leader: str) -> None:
        try:
            self._send(topic, taken, leader)
        except Exception as exc:  # never leave a future waiting forever
            self._deliveries.fail(self._in_flight.get(request, ()), exc)
        finally:
            # After _send re-queued what goes again: the partitions free up only now, so
            # their next request carries the re-queued records first.
            with self._cond:
                self._in_flight.pop(request, None)
                self._busy.difference_update(tp for tp, _ in taken)
                self._requests_by_leader[leader] -= 1
                self._cond.notify_all()

    # -- one request ---------------------------------------------------------------------

    def _producer_id(self, attempts: Attempts) -> tuple[int, int]:
        """The producer id and epoch; a new epoch first when the sequences may be off."""
        if self._producer is not None and not self._new_epoch:
            return self._producer
        body = {"producer_id": self._producer[0]} if self._producer is not None else {}
        # Not strictly idempotent, but harmless twice: an unused id, or an epoch skipped.
        r = call(lambda t: self._http.post("/producers", json=body, timeout=t), attempts,
                 idempotent=True)
        if r.status_code == 404 and body:  # the server forgot the id: take a new one
            r = call(lambda t: self._http.post("/producers", json={}, timeout=t), attempts,
                     idempotent=True)
        raise_for(r)
        answer = r.json()
        self._producer = (int(answer["producer_id"]), int(answer["producer_epoch"]))
        self._new_epoch = False
        self._sequences.clear()
        return self._producer

    def _send(self, topic: str, taken: list[tuple[TopicPartition, Batch]],
              leader: str) -> None:
        now = time.monotonic()
        delivery_s = self.delivery_timeout_ms / 1000
        live: list[tuple[TopicPartition, Batch]] = []
        oldest = now
        for tp, batch in taken:
            first = min(map(_enqueued_at, batch))
            if now >= first + delivery_s:
                expired = [r for r in batch if now >= r._enqueued_at + delivery_s]
                self._deliveries.fail(expired, LakelogTimeoutError(
                    f"a record for {tp.topic}-{tp.partition} waited in the producer longer "
                    f"than delivery_timeout_ms={self.delivery_timeout_ms:g} (the requests "
                    f"before it to {self.url} were being retried); it was never sent"))
                batch = [r for r in batch if not r.done()]
                if not batch:
                    continue
                first = min(map(_enqueued_at, batch))
            live.append((tp, batch))
            oldest = min(oldest, first)
        if not live:
            return
        attempts = self._attempts(f"POST /topics/{topic}/records:batch", oldest + delivery_s,
                                  f"delivery_timeout_ms={self.delivery_timeout_ms:g}")
        every = [r for _, b in live for r in b]
        body_entries: list[bytes] = []
        sequences: list[int] = []  # each entry's, unbounded (modulo SEQUENCE_SPACE on the wire)
        firsts: dict[TopicPartition, int] = {}
        with self._ident_lock:
            try:
                ident = self._producer_id(attempts) if self.idempotent else None
            except LakelogClientError as exc:
                self._deliveries.fail(every, exc)
                return
            for tp, batch in live:
                seq = firsts[tp] = self._sequences.get(tp, 0)
                body_entries += entries(batch, tp.partition, len(body_entries), ident, seq)
                if ident is not None:
                    sequences += range(seq, seq + len(batch))
                    self._sequences[tp] = (seq + len(batch)) % SEQUENCE_SPACE
        body = b'{"entries":[' + b",".join(body_entries) + b"]}"
        maybe_appended = False  # an attempt whose outcome is unknown was made
        http = self._leaders.client(leader)
        while True:
            try:
                self.requests_sent += 1
                r = http.post(self._url(http, topic), content=body, headers=JSON_BODY,
                              timeout=attempts.timeout_s())
            except httpx.TransportError as exc:
                sent = not never_sent(exc)
                if http is not self._http:  # that broker is gone: ask any (they forward)
                    self._leaders.invalidate(topic)
                    http = self._http
                if permanent(exc) or (sent and not self.idempotent):
                    self._deliveries.fail(every, LakelogConnectionError(
                        f"{attempts.what} at {self.url}: {describe(exc)}" + (
                            "; whether the records were appended is unknown (a producer "
                            "with idempotent=False does not send them again)" if sent else "")))
                    self._after_failure(ident, firsts, maybe_appended or sent)
                    return
                maybe_appended |= sent
                if attempts.again(exc):
                    continue
                self._deliveries.fail(every, attempts.gave_up())
                self._after_failure(ident, firsts, maybe_appended)
                return
            error = error_from(r) if r.status_code >= 400 else None
            if error is not None and http is not self._http and \
                    error.code in MOVED:  # the leader moved: any broker forwards
                self._leaders.invalidate(topic)
                http = self._http
            if error is not None and again(error):
                if self.idempotent or r.status_code == 429:  # 429: refused, nothing appended
                    maybe_appended |= r.status_code != 429
                    if attempts.again(error):
                        continue
                    error = attempts.gave_up()
                self._deliveries.fail(every, error)
                self._after_failure(ident, firsts, maybe_appended or r.status_code != 429)
                return
            if error is not None:  # refused whole: this attempt appended nothing
                self._deliveries.fail(every, error)
                self._after_failure(ident, firsts, maybe_appended)
                return
            answer = decode_answer(r.content)
            retry = [f for f in answer.failures if again(entry_error(f))]
            if retry and self.idempotent and attempts.again(entry_error(retry[0])):
                continue
            self._complete(ident, settle(answer, live, sequences, self.idempotent, self.url,
                                         self._deliveries))
            return

    def _url(self, http: httpx.Client, topic: str) -> httpx.URL:
        """``records:batch`` of ``topic`` at ``http``'s server, made once (httpx's merging of
        a relative path and its params took a fifth of a request's client time)."""
        url = self._urls.get((http, topic))
        if url is None:
            url = self._urls[(http, topic)] = http.base_url.join(
                f"topics/{topic}/records:batch").copy_merge_params({"acks": self.acks})
        return url

    def _after_failure(self, ident: tuple[int, int] | None, firsts: dict[TopicPartition, int],
                       maybe_appended: bool) -> None:
        """After a request failed whole: if it may have appended, a new epoch; if not, its
        partitions' sequences go back to where it started (unless another request took a
        new epoch meanwhile: then every partition starts again at 0 anyway)."""
        if not self.idempotent:
            return
        with self._ident_lock:
            if maybe_appended:
                self._new_epoch = True
            elif ident == self._producer:
                self._sequences.update(firsts)

    def _complete(self, ident: tuple[int, int] | None, outcome: Outcome) -> None:
        """Take what a request's answer changed (``batches.settle``); what it says of the
        sequences holds only for the epoch the request was sent under."""
        with self._ident_lock:
            self._new_epoch |= outcome.new_epoch
            if ident == self._producer:
                if outcome.forget_producer:
                    self._producer = None
                self._sequences.update(outcome.sequences)
        for tp, resend in outcome.again:
            self._requeue(tp, resend)

    def _requeue(self, tp: TopicPartition, records: Batch) -> None:
        """Put records back at the front of their partition's queue, in order."""
        if not records:
            return
        with self._cond:
            queue = self._queues.setdefault(tp, deque())
            queue.extendleft(reversed(records))
            self._first_at[tp] = min(map(_enqueued_at, queue))
            self._queued_bytes[tp] = self._queued_bytes.get(tp, 0) + sum(r._size for r in records)
            self._buffered += len(records)
            self._cond.notify_all()

    def close(self) -> None:
        """Send what is queued (within ``delivery_timeout_ms``), then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        # A send that raced with close may have come after the sender thread's last look.
        left = [self._incoming.popleft() for _ in range(len(self._incoming))]
        self._deliveries.fail(left, RuntimeError("the producer is closed"))
        self._workers.shutdown(wait=True)
        self._http.close()
        for client in self._brokers.values():
            client.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

