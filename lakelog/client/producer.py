"""The producer: batching, partitioning, idempotence, retries, and recovery from refusals.

Records are queued per partition and sent as one request per topic (``linger_ms``,
``batch_records``, ``batch_bytes``); one request is in flight at a time, so records
stay in order. Keyed records are partitioned client-side with Kafka's murmur2 (the
server's and Kafka's Java client's partition).

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
"""

from __future__ import annotations

import base64
import concurrent.futures
import itertools
import ssl
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Literal

import httpx

from lakelog.client.errors import (
    LakelogClientError,
    LakelogConnectionError,
    LakelogTimeoutError,
    entry_error,
    error_from,
    raise_for,
)
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
from lakelog.client.structs import RecordMetadata, TopicPartition
from lakelog.client.transport import CLUSTER, default_api_key, http_auth, tls_verify
from log_tables.partitioner import murmur2

MAX_BATCH_ENTRIES = 1000  # the server's default max_batch_entries
SEQUENCE_SPACE = 2**31
MAX_RESETS = 3  # times one record is sent again under a new epoch before it fails


def _again(error: LakelogClientError) -> bool:
    """A produce answer that says "not done, try again": a ``retriable`` error, or any 5xx
    (the server may have appended; an idempotent retry is answered with the original
    offsets)."""
    return error.retriable or error.status >= 500


def _envelope(data: bytes | str | None) -> dict[str, Any] | None:
    if data is None:
        return None
    if isinstance(data, str):
        return {"type": "STRING", "data": data}
    return {"type": "BINARY", "data": base64.b64encode(data).decode()}


def _key_bytes(key: bytes | str) -> bytes:
    return key.encode() if isinstance(key, str) else key


@dataclass(slots=True)
class _Pending:
    entry: dict[str, Any]
    size: int
    future: concurrent.futures.Future[RecordMetadata]
    enqueued_at: float
    resets: int = 0


def _fail(pendings: Iterable[_Pending], exc: BaseException) -> None:
    for p in pendings:
        if not p.future.done():
            p.future.set_exception(exc)


class Producer:
    """Batching, idempotent producer; ``send`` returns a Future of ``RecordMetadata``.

    Kafka's settings, in milliseconds: ``retries`` (default unbounded: the deadline
    bounds), ``retry_backoff_ms``, ``retry_backoff_max_ms``, ``request_timeout_ms`` (one
    attempt; ``timeout_s`` is its older spelling, in seconds), ``delivery_timeout_ms``
    (from ``send`` to the record's answer, retries included) and ``max_block_ms`` (how long
    ``send`` may wait for topic metadata or for room in the buffer).
    """

    def __init__(self, url: str, *, acks: Literal["all", "1", "0"] = "all",
                 linger_ms: float = 5.0, batch_records: int = 1000, batch_bytes: int = 1 << 20,
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
        self.url = url.rstrip("/")
        self.policy = RetryPolicy(retries, retry_backoff_ms, retry_backoff_max_ms,
                                  resolve_request_timeout_ms(request_timeout_ms, timeout_s, 30_000))
        self._http = httpx.Client(base_url=self.url + CLUSTER,
                                  timeout=self.policy.request_timeout_ms / 1000,
                                  auth=http_auth(api_key or default_api_key(url)),
                                  verify=tls_verify(verify))
        self.acks = acks
        self.linger_s = linger_ms / 1000
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self.max_buffered = max_buffered_records
        self.idempotent = idempotent
        self.retries = retries
        self.delivery_timeout_ms = delivery_timeout_ms
        self.max_block_ms = max_block_ms
        self._partitions: dict[str, int] = {}
        self._round_robin = itertools.count()
        self._queues: dict[TopicPartition, deque[_Pending]] = {}
        self._first_at: dict[TopicPartition, float] = {}
        self._buffered = 0
        self._in_flight: list[_Pending] = []
        self._cond = threading.Condition()
        self._closed = False
        self._flush_requested = 0
        self._producer: tuple[int, int] | None = None
        self._new_epoch = False
        """The sequences may disagree with the server's: take a new epoch before the next send."""
        self._sequences: dict[TopicPartition, int] = {}
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
             timestamp_ms: int | None = None) -> concurrent.futures.Future[RecordMetadata]:
        """Queue one record; waits up to ``max_block_ms`` while ``max_buffered_records``
        are waiting (then ``LakelogTimeoutError``)."""
        if partition is None:
            n = self.partitions_for(topic)
            partition = ((murmur2(_key_bytes(key)) & 0x7FFFFFFF) % n if key is not None
                         else next(self._round_robin) % n)
        entry: dict[str, Any] = {"partition_id": partition, "key": _envelope(key),
                                 "value": _envelope(value)}
        hs = [{"name": name, "value": base64.b64encode(v).decode()} for name, v in headers]
        if hs:
            entry["headers"] = hs
        if timestamp_ms is not None:
            entry["timestamp"] = timestamp_ms
        size = len(value or b"") + len(key or b"")
        future: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
        tp = TopicPartition(topic, partition)
        blocked_until = time.monotonic() + self.max_block_ms / 1000
        with self._cond:
            while self._buffered >= self.max_buffered and not self._closed:
                left = blocked_until - time.monotonic()
                if left <= 0:
                    raise LakelogTimeoutError(
                        f"send to {topic}: {self._buffered} records were still waiting to be "
                        f"sent to {self.url} after max_block_ms={self.max_block_ms:g}")
                self._cond.wait(left)
            if self._closed:
                raise RuntimeError("the producer is closed")
            queue = self._queues.setdefault(tp, deque())
            now = time.monotonic()
            if not queue:
                self._first_at[tp] = now
            queue.append(_Pending(entry, size, future, now))
            self._buffered += 1
            self._cond.notify_all()
        return future

    def flush(self, timeout_s: float | None = None) -> None:
        """Send everything queued and wait for the answers (records sent again after a
        refusal of a record before them included)."""
        with self._cond:
            futures = [p.future for q in self._queues.values() for p in q]
            futures += [p.future for p in self._in_flight]
            self._flush_requested += 1
            self._cond.notify_all()
        try:
            concurrent.futures.wait(futures, timeout_s)
        finally:
            with self._cond:
                self._flush_requested -= 1

    def _ready(self, now: float) -> list[TopicPartition]:
        return [tp for tp, q in self._queues.items() if q and (
            self._flush_requested or self._closed or len(q) >= self.batch_records
            or sum(p.size for p in itertools.islice(q, 0, self.batch_records)) >= self.batch_bytes
            or now - self._first_at[tp] >= self.linger_s)]

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    ready = self._ready(now)
                    if ready or (self._closed and not self._buffered):
                        break
                    waits = [self._first_at[tp] + self.linger_s - now
                             for tp, q in self._queues.items() if q]
                    self._cond.wait(max(0.0005, min(waits)) if waits else None)
                if not ready:
                    return
                # One request per topic: up to batch_records of each ready partition.
                topic = ready[0].topic
                taken: list[tuple[TopicPartition, list[_Pending]]] = []
                count = 0
                for tp in ready:
                    if tp.topic != topic or count >= MAX_BATCH_ENTRIES:
                        continue
                    q = self._queues[tp]
                    batch = [q.popleft() for _ in range(min(len(q), self.batch_records,
                                                              MAX_BATCH_ENTRIES - count))]
                    count += len(batch)
                    if q:
                        self._first_at[tp] = time.monotonic()
                    taken.append((tp, batch))
                self._buffered -= count
                self._in_flight = [p for _, batch in taken for p in batch]
                self._cond.notify_all()
            try:
                self._send(topic, taken)
            except Exception as exc:  # never leave a future waiting forever
                _fail(self._in_flight, exc)
            with self._cond:
                self._in_flight = []

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

    def _send(self, topic: str, taken: list[tuple[TopicPartition, list[_Pending]]]) -> None:
        now = time.monotonic()
        delivery_s = self.delivery_timeout_ms / 1000
        live: list[tuple[TopicPartition, list[_Pending]]] = []
        for tp, batch in taken:
            expired = [p for p in batch if now >= p.enqueued_at + delivery_s]
            _fail(expired, LakelogTimeoutError(
                f"a record for {tp.topic}-{tp.partition} waited in the producer longer than "
                f"delivery_timeout_ms={self.delivery_timeout_ms:g} (the requests before it "
                f"to {self.url} were being retried); it was never sent"))
            if keep := [p for p in batch if not p.future.done()]:
                live.append((tp, keep))
        if not live:
            return
        deadline = min(p.enqueued_at for _, b in live for p in b) + delivery_s
        attempts = self._attempts(f"POST /topics/{topic}/records:batch", deadline,
                                  f"delivery_timeout_ms={self.delivery_timeout_ms:g}")
        every = [p for _, b in live for p in b]
        try:
            ident = self._producer_id(attempts) if self.idempotent else None
        except LakelogClientError as exc:
            _fail(every, exc)
            return
        entries: list[dict[str, Any]] = []
        firsts: dict[TopicPartition, int] = {}
        for tp, batch in live:
            seq = firsts[tp] = self._sequences.get(tp, 0)
            for p in batch:
                entry = dict(p.entry)
                if ident is not None:
                    entry.update(producer_id=ident[0], producer_epoch=ident[1], sequence=seq)
                    seq = (seq + 1) % SEQUENCE_SPACE
                entry["id"] = str(len(entries))
                entries.append(entry)
            self._sequences[tp] = seq
        body = {"entries": entries}
        maybe_appended = False  # an attempt whose outcome is unknown was made
        while True:
            try:
                r = self._http.post(f"/topics/{topic}/records:batch", params={"acks": self.acks},
                                    json=body, timeout=attempts.timeout_s())
            except httpx.TransportError as exc:
                sent = not never_sent(exc)
                if permanent(exc) or (sent and not self.idempotent):
                    _fail(every, LakelogConnectionError(
                        f"{attempts.what} at {self.url}: {describe(exc)}" + (
                            "; whether the records were appended is unknown (a producer "
                            "with idempotent=False does not send them again)" if sent else "")))
                    self._after_failure(firsts, maybe_appended or sent)
                    return
                maybe_appended |= sent
                if attempts.again(exc):
                    continue
                _fail(every, attempts.gave_up())
                self._after_failure(firsts, maybe_appended)
                return
            error = error_from(r) if r.status_code >= 400 else None
            if error is not None and _again(error):
                if self.idempotent or r.status_code == 429:  # 429: refused, nothing appended
                    maybe_appended |= r.status_code != 429
                    if attempts.again(error):
                        continue
                    error = attempts.gave_up()
                _fail(every, error)
                self._after_failure(firsts, maybe_appended or r.status_code != 429)
                return
            if error is not None:  # refused whole: this attempt appended nothing
                _fail(every, error)
                self._after_failure(firsts, maybe_appended)
                return
            answer = r.json()
            retry = [f for f in answer["failures"] if _again(entry_error(f))]
            if retry and self.idempotent and attempts.again(entry_error(retry[0])):
                continue
            self._complete(topic, answer, live, entries)
            return

    def _after_failure(self, firsts: dict[TopicPartition, int], maybe_appended: bool) -> None:
        """After a request failed whole: if it may have appended, a new epoch; if not, its
        partitions' sequences go back to where it started."""
        if not self.idempotent:
            return
        if maybe_appended:
            self._new_epoch = True
        else:
            self._sequences.update(firsts)

    def _complete(self, topic: str, answer: dict[str, Any],
                  live: list[tuple[TopicPartition, list[_Pending]]],
                  entries: list[dict[str, Any]]) -> None:
        by_id: dict[str, _Pending] = {}
        for (_, batch), ids in zip(live, _ids_by_partition(live), strict=True):
            by_id.update(zip(ids, batch, strict=True))
        for s in answer["successes"]:
            ts = s.get("timestamp")
            by_id[s["id"]].future.set_result(RecordMetadata(
                topic, s["partition_id"], s["offset"],
                datetime.fromisoformat(ts) if isinstance(ts, str) else datetime.now()))
        failures: dict[str, dict[str, Any]] = {f["id"]: f for f in answer["failures"]}
        unanswered = [p for i, p in by_id.items() if i not in failures and not p.future.done()]
        if unanswered:  # not the server's contract: fail them rather than wait forever
            self._new_epoch = True
            _fail(unanswered, LakelogClientError(
                0, "no_answer", f"the answer from {self.url} had no result for this record"))
        if not failures:
            return
        if not self.idempotent:
            for i, f in failures.items():
                _fail([by_id[i]], entry_error(f))
            return
        seqs = {e["id"]: e["sequence"] for e in entries}
        for (tp, batch), ids in zip(live, _ids_by_partition(live), strict=True):
            failed = [(i, p) for i, p in zip(ids, batch, strict=True) if i in failures]
            if not failed:
                continue
            first = ids.index(failed[0][0])
            if any(i not in failures for i in ids[first:]):
                self._new_epoch = True  # appended past a gap: not the server's contract
            self._sequences[tp] = seqs[failed[0][0]]
            gap = False  # a record before these was refused for its own sake
            again: list[_Pending] = []
            for i, p in failed:
                f = failures[i]
                name = f.get("error")
                if name == "out_of_order_sequence" and gap:
                    again.append(p)  # refused only because of the gap
                elif name in ("out_of_order_sequence", "unknown_producer_id"):
                    self._new_epoch = True  # the sequences disagree with the server's
                    if name == "unknown_producer_id":
                        self._producer = None
                    p.resets += 1
                    if p.resets <= MAX_RESETS:
                        again.append(p)
                    else:
                        _fail([p], entry_error(f))
                elif _again(entry_error(f)):
                    self._new_epoch = True  # retries spent; whether it was appended is unknown
                    _fail([p], entry_error(f))
                else:
                    _fail([p], entry_error(f))
                    gap = True
            self._requeue(tp, again)

    def _requeue(self, tp: TopicPartition, pendings: list[_Pending]) -> None:
        """Put records back at the front of their partition's queue, in order."""
        if not pendings:
            return
        with self._cond:
            queue = self._queues.setdefault(tp, deque())
            queue.extendleft(reversed(pendings))
            self._first_at[tp] = min(p.enqueued_at for p in queue)
            self._buffered += len(pendings)
            self._cond.notify_all()

    def close(self) -> None:
        """Send what is queued (within ``delivery_timeout_ms``), then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        self._http.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _ids_by_partition(live: list[tuple[TopicPartition, list[_Pending]]]) -> list[list[str]]:
    """The entry ids ``_send`` gave each partition's records (numbered in order)."""
    out = []
    n = 0
    for _, batch in live:
        out.append([str(n + k) for k in range(len(batch))])
        n += len(batch)
    return out
