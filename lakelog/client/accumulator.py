"""The records a producer holds until a request takes them (Kafka's RecordAccumulator).

``send`` appends a record to ``incoming`` without a lock (a deque's append is atomic)
and wakes the sender thread only when it asked to be woken (``sleeping``) or a batch may
have filled (``wake_count``). The sender thread, under ``cond``, moves what came in to
the partitions' queues in bulk (``drain``: murmur2 over numpy for all the keys at once),
finds the partitions that are ready (``batch_records``, ``batch_size``, ``linger_ms``, a
flush or close) and takes their batches. ``max_buffered_records`` bounds the incoming and
the queued records together; records in requests are not counted (the requests are
bounded).

Waking without a race: the sender thread raises ``sleeping`` before it looks at
``incoming`` a last time and waits, and ``send`` reads the flag after its append, so
either the thread sees the record or ``send`` sees the flag. While anything is queued or
in flight the thread sleeps no longer than ``linger_ms`` (answers wake it sooner), so the
records sent meanwhile are seen within their linger without a wake-up each.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from operator import add, attrgetter

import numpy as np

from lakelog.client.batches import Batch, key_bytes
from lakelog.client.errors import LakelogTimeoutError
from lakelog.client.futures import Deliveries, FutureRecordMetadata
from lakelog.client.structs import TopicPartition
from log_tables.partitioner import partitions_for_keys, partitions_for_same_length_keys

log = logging.getLogger(__name__)

MIN_WAIT_S = 0.0005  # the sender thread's shortest sleep
DATA_TYPES = frozenset({bytes, str, type(None), bytearray, memoryview})
"""What a key or value may be (``send`` does not look: the sender thread does, in bulk)."""
DRAIN_AT = 512
"""Records in ``incoming`` at which ``send`` moves them to their partitions' queues itself
(as Kafka's producer partitions on the caller's thread): on one core the sender thread
would find them evicted from the CPU's caches by the records sent after them."""
VECTOR_KEYS = 256
"""From this many keys of one length, murmur2 runs over their bytes joined (0.05 us a key
at 1,000, against 0.12 us for ``partitions_for_keys``, which is faster below). Not over
an Arrow array: making one from Python objects loads pandas (0.2-0.4 s, once)."""
_size = attrgetter("_size")
_enqueued_at = attrgetter("_enqueued_at")
_key = attrgetter("_key")
_value = attrgetter("_value")


class RecordAccumulator:
    """The records waiting for a request: ``incoming`` (from ``send``) and each partition's
    queue (in send order), guarded by ``cond``."""

    def __init__(self, partitions: dict[str, int], deliveries: Deliveries, *, linger_s: float,
                 batch_records: int, batch_bytes: int, max_buffered: int) -> None:
        self.linger_s = linger_s
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self.max_buffered = max_buffered
        lock = threading.Lock()
        self.cond = threading.Condition(lock)
        self.room_freed = threading.Condition(lock)
        """What a ``send`` waiting for room waits on: a request took records."""
        self.incoming: deque[FutureRecordMetadata] = deque()
        self.room = max_buffered
        """How many records ``incoming`` may hold before ``send`` waits for room:
        ``max_buffered_records`` less the queued ones (0 once closed)."""
        self.sleeping = False
        """The sender thread waits longer than a new record's linger: ``send`` wakes it."""
        self.wake_count = batch_records
        """Records in ``incoming`` at which ``send`` wakes the sender thread: with them, a
        partition's batch may be full (``batch_records``, or ``batch_size`` at the record
        sizes seen), counting what its queue holds."""
        self._record_bytes = 1
        """The mean bytes of the records last drained."""
        self.closed = False
        self.waker: Callable[[], None] = lambda: None
        """Wakes the sender thread from its wait (set by the sender)."""
        self.flush_requested = 0
        self.queued = 0
        """Records in the partitions' queues."""
        self._partitions = partitions
        """Partition counts by topic (the producer's: ``send`` asks before it appends)."""
        self._deliveries = deliveries
        self._round_robin = itertools.count()
        self._refused: list[tuple[list[FutureRecordMetadata], BaseException]] = []
        """Records ``drain`` refused, failed by ``deliver_refusals`` after ``cond``."""
        self._queues: dict[TopicPartition, deque[FutureRecordMetadata]] = {}
        self._queued_bytes: dict[TopicPartition, int] = {}
        self._first_at: dict[TopicPartition, float] = {}

    def append_many(self, records: list[FutureRecordMetadata], topic: str,
                    max_block_ms: float, url: str, *, wait: bool = True) -> None:
        """Append records of one topic (``send_many``), in chunks of half the bound
        (waiting for room unless ``wait`` is False: a callback's, which cannot)."""
        step = max(1, self.max_buffered // 2)
        for i in range(0, len(records), step):
            chunk = records[i:i + step]
            if len(self.incoming) + len(chunk) > self.room and (wait or self.closed):
                self.wait_for_room(topic, len(chunk), max_block_ms, url)
            self.incoming.extend(chunk)
            self.wake()

    def wait_for_room(self, topic: str, n: int, max_block_ms: float, url: str) -> None:
        """Wait until ``n`` more records fit in ``max_buffered_records`` (or none wait),
        up to ``max_block_ms`` (then ``LakelogTimeoutError``)."""
        blocked_until = time.monotonic() + max_block_ms / 1000
        with self.cond:
            while True:
                if self.closed:
                    raise RuntimeError("the producer is closed")
                waiting = self.queued + len(self.incoming)
                if not waiting or waiting + n <= self.max_buffered:
                    return
                left = blocked_until - time.monotonic()
                if left <= 0:
                    raise LakelogTimeoutError(
                        f"send to {topic}: {waiting} records were still waiting to be "
                        f"sent to {url} after max_block_ms={max_block_ms:g}")
                self.sleeping = False
                self.waker()  # the sender thread may not have seen them yet
                self.room_freed.wait(left)

    def wake(self) -> None:
        self.sleeping = False
        self.waker()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.room = 0  # send takes the slow path, which says the producer is closed
            self.room_freed.notify_all()
        self.wake()

    def leftovers(self) -> list[FutureRecordMetadata]:
        """Records a ``send`` that raced with ``close`` appended after the sender thread
        looked at ``incoming`` for the last time."""
        return [self.incoming.popleft() for _ in range(len(self.incoming))]

    def waiting(self) -> list[FutureRecordMetadata]:
        """Every record not yet in a request (under ``cond``)."""
        return list(self.incoming) + [r for q in self._queues.values() for r in q]

    def empty(self) -> bool:
        return not self.queued and not self.incoming

    # -- the sender thread's side, under cond ---------------------------------------------

    def drain(self) -> None:
        """Put the records ``send`` appended into their partitions' queues."""
        incoming = self.incoming
        if not incoming:
            return
        records = [incoming.popleft() for _ in range(len(incoming))]
        if not DATA_TYPES.issuperset(map(type, map(_key, records))) or \
                not DATA_TYPES.issuperset(map(type, map(_value, records))):
            records = self._refuse_wrong_types(records)
        topics = {r._topic for r in records}
        added = 0
        for topic in topics:
            mine = records if len(topics) == 1 else [r for r in records if r._topic == topic]
            try:
                added += self._place(topic, mine)
            except Exception as exc:  # a bug: fail these records rather than the thread
                log.exception("lakelog producer: queueing records of %s failed", topic)
                self._refused.append((mine, exc))
                records = [r for r in records if r._topic != topic]
        self.queued += len(records)
        self.room -= len(records)
        self._record_bytes = max(1, added // max(1, len(records)))

    def _refuse_wrong_types(self, records: list[FutureRecordMetadata]
                            ) -> list[FutureRecordMetadata]:
        """Fail the records whose key or value is not bytes, str or None; the others."""
        ok = []
        for r in records:
            wrong = next((x for x in (r._key, r._value) if type(x) not in DATA_TYPES), None)
            if wrong is None:
                ok.append(r)
            else:
                self._refused.append(([r], TypeError(
                    f"a key or value is bytes, str or None, not {type(wrong).__name__}")))
        return ok

    def deliver_refusals(self) -> None:
        """Fail the records ``drain`` refused (not under ``cond``: their callbacks may
        send, or close the producer)."""
        while self._refused:
            records, exc = self._refused.pop(0)
            self._deliveries.fail(records, exc)

    def _place(self, topic: str, records: list[FutureRecordMetadata]) -> int:
        """Queue records of one topic, each in its partition, in order; their bytes.
        Made of whole-list calls (no Python frame per record but one attribute set)."""
        parts = self._partitions_of(topic, records)
        keys, values = list(map(_key, records)), list(map(_value, records))
        if None in keys or None in values:
            sizes = [(len(k) if k is not None else 0) + (len(v) if v is not None else 0)
                     for k, v in zip(keys, values, strict=True)]
        else:
            sizes = list(map(add, map(len, keys), map(len, values)))
        for r, size in zip(records, sizes, strict=True):
            r._size = size
        added = 0
        for partition, indexes in _groups(parts):
            group = records if indexes is None else list(map(records.__getitem__, indexes))
            size = sum(sizes) if indexes is None else sum(map(sizes.__getitem__, indexes))
            tp = TopicPartition(topic, partition)
            queue = self._queues.get(tp)
            if queue is None:
                queue = self._queues[tp] = deque()
                self._queued_bytes[tp] = 0
            if not queue:
                self._first_at[tp] = group[0]._enqueued_at
            queue.extend(group)
            self._queued_bytes[tp] += size
            added += size
        return added

    def _partitions_of(self, topic: str, records: list[FutureRecordMetadata]) -> list[int]:
        """Each record's partition: the one ``send`` was given, else its key's (Kafka's
        murmur2, over numpy for all the keys at once), else round robin."""
        given = [r._partition for r in records]
        keys = [r._key for r in records]
        if given.count(None) == len(given) and None not in keys:  # the usual: all keyed
            kinds = set(map(type, keys))
            raw: list[bytes]
            if kinds == {str}:
                raw = list(map(str.encode, keys))  # type: ignore[arg-type]
            elif kinds == {bytes}:
                raw = keys  # type: ignore[assignment]
            else:
                raw = list(map(key_bytes, keys))  # type: ignore[arg-type]
            return _partitions_for_keys(raw, self._partitions[topic])
        out: list[int] = []
        keyed: list[int] = []
        for i, (p, k) in enumerate(zip(given, keys, strict=True)):
            if p is None and k is not None:
                keyed.append(i)
            out.append(p if p is not None else -1 if k is not None
                       else next(self._round_robin) % self._partitions[topic])
        if keyed:
            picked = _partitions_for_keys(
                [key_bytes(keys[i]) for i in keyed],  # type: ignore[arg-type]
                self._partitions[topic])
            for i, p in zip(keyed, picked, strict=True):
                out[i] = p
        return out

    def queued_partitions(self) -> list[TopicPartition]:
        """The partitions with records in their queues (under ``cond``)."""
        return [tp for tp, q in self._queues.items() if q]

    def ready(self, now: float, busy: set[TopicPartition]) -> list[TopicPartition]:
        """The partitions whose batch may go: full, lingered, or flushed (or closing)."""
        go = self.flush_requested or self.closed
        return [tp for tp, q in self._queues.items() if q and tp not in busy and (
            go or len(q) >= self.batch_records or self._queued_bytes[tp] >= self.batch_bytes
            or now - self._first_at[tp] >= self.linger_s)]

    def take(self, tp: TopicPartition, most: int) -> Batch:
        """Up to ``most`` records of a partition's queue: a batch (``batch_records``, and
        Kafka's ``batch.size``: the batch ends before the record that would take it past
        ``batch_size``; a larger record goes alone)."""
        q = self._queues[tp]
        limit = min(len(q), self.batch_records, most)
        size = sum(map(_size, itertools.islice(q, limit)))
        if size <= self.batch_bytes:  # the usual case: no record-by-record check
            batch = [q.popleft() for _ in range(limit)]
        else:
            batch, size = [], 0
            while len(batch) < limit and (not batch or size + q[0]._size <= self.batch_bytes):
                size += q[0]._size
                batch.append(q.popleft())
        self._queued_bytes[tp] -= size
        if q:
            self._first_at[tp] = q[0]._enqueued_at
        self.queued -= len(batch)
        if not self.closed:  # once closed, room stays at 0 or below: send refuses
            self.room += len(batch)
        return batch

    def requeue(self, tp: TopicPartition, records: Batch) -> None:
        """Put records back at the front of their partition's queue, in order."""
        queue = self._queues.setdefault(tp, deque())
        queue.extendleft(reversed(records))
        self._first_at[tp] = min(map(_enqueued_at, queue))
        self._queued_bytes[tp] = self._queued_bytes.get(tp, 0) + sum(map(_size, records))
        self.queued += len(records)
        self.room -= len(records)

    def wait_s(self, now: float, ready: list[TopicPartition], busy: set[TopicPartition],
               in_flight: bool) -> float | None:
        """How long the sender thread may sleep: until the first linger ends of a partition
        that can go (an answer wakes it for the others), and while anything is queued or
        in flight, no longer than ``linger_ms`` (None: until woken). Sets ``wake_count``
        for the partitions that can go."""
        waiting = [tp for tp, q in self._queues.items() if q and tp not in busy]
        waits = [] if ready else [self._first_at[tp] + self.linger_s - now for tp in waiting]
        wait_s = max(MIN_WAIT_S, min(waits)) if waits else None
        if (self.queued or in_flight) and self.linger_s >= MIN_WAIT_S:
            wait_s = self.linger_s if wait_s is None else min(wait_s, self.linger_s)
        fullest = max((len(self._queues[tp]) for tp in waiting), default=0)
        most_bytes = max((self._queued_bytes[tp] for tp in waiting), default=0)
        self.wake_count = max(1, min(self.batch_records - fullest,
                                     (self.batch_bytes - most_bytes) // self._record_bytes))
        return wait_s


def _partitions_for_keys(keys: list[bytes], partitions: int) -> list[int]:
    if len(keys) >= VECTOR_KEYS:
        lengths = set(map(len, keys))
        if len(lengths) == 1 and (length := lengths.pop()) > 0:
            return partitions_for_same_length_keys(  # type: ignore[no-any-return]
                keys, length, partitions).tolist()
    return partitions_for_keys(keys, partitions)


def _groups(parts: list[int]) -> list[tuple[int, list[int] | None]]:
    """Each partition of ``parts`` with the indexes that go to it, in order (None: all
    of them), by one stable numpy sort."""
    first = parts[0]
    if parts.count(first) == len(parts):
        return [(first, None)]
    array = np.asarray(parts)
    order = np.argsort(array, kind="stable")
    ordered = array[order]
    cuts = (np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist()
    starts, ends = [0, *cuts], [*cuts, len(parts)]
    indexes = order.tolist()
    return [(int(ordered[a]), indexes[a:b]) for a, b in zip(starts, ends, strict=True)]
