"""The producer's sender thread and its requests (Kafka's Sender): it takes ready
batches from the ``RecordAccumulator`` into ``records:batch`` requests, one topic and
leader each, and runs each on a worker thread: up to ``max_in_flight`` per broker, never
two for one partition (``producer.py``'s docstring says why), with the producer id, epoch
and sequences of idempotence, the retries, and what an answer changes (points 1-4 of
``producer.py``'s docstring)."""

from __future__ import annotations

import concurrent.futures
import itertools
import math
import threading
import time
from operator import attrgetter

import httpx

from lakelog.client.accumulator import RecordAccumulator
from lakelog.client.batches import (
    MAX_BATCH_ENTRIES,
    SEQUENCE_SPACE,
    Batch,
    Entry,
    Outcome,
    again,
    batch_entries,
    decode_answer,
    encode_body,
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
from lakelog.client.futures import Deliveries, FutureRecordMetadata
from lakelog.client.leaders import Leaders
from lakelog.client.retry import Attempts, RetryPolicy, call, describe, never_sent, permanent
from lakelog.client.structs import TopicPartition

MOVED = ("not_leader_or_follower", "broker_not_available")
"""Errors after which a request goes to the bootstrap broker (which forwards) while the
metadata is read again."""

MAX_IN_FLIGHT = 5  # Kafka's bound with idempotence (its broker remembers 5 batches)
JSON_BODY = {"content-type": "application/json"}
_enqueued_at = attrgetter("_enqueued_at")

Taken = list[tuple[TopicPartition, Batch]]
"""One request's records: a batch of each of its partitions."""


class Sender:
    """Runs the requests of one producer: a thread that starts them, and workers."""

    def __init__(self, accumulator: RecordAccumulator, deliveries: Deliveries,
                 leaders: Leaders, http: httpx.Client, policy: RetryPolicy, *, url: str,
                 acks: str, idempotent: bool, delivery_timeout_ms: float,
                 max_in_flight: int) -> None:
        self.accumulator = accumulator
        self.deliveries = deliveries
        self.leaders = leaders
        self.http = http
        self.policy = policy
        self.url = url
        self.acks = acks
        self.idempotent = idempotent
        self.delivery_timeout_ms = delivery_timeout_ms
        self.max_in_flight = max_in_flight
        self.requests_sent = 0
        """``records:batch`` requests sent so far (attempts; retries included)."""
        self._in_flight: dict[int, Batch] = {}
        self._busy: set[TopicPartition] = set()
        """Partitions with a request awaiting its answer: one each."""
        self._requests_by_leader: dict[str, int] = {}
        self._request_ids = itertools.count()
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

    def in_flight(self) -> list[FutureRecordMetadata]:
        """The records of the requests awaiting their answers (under the accumulator's
        ``cond``)."""
        return [r for batch in self._in_flight.values() for r in batch]

    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self) -> None:
        """Wait for the sender thread (after the accumulator is closed) and the requests."""
        self._thread.join()
        self._workers.shutdown(wait=True)

    def _run(self) -> None:
        """Start requests as partitions become ready, up to ``max_in_flight`` per broker
        and one per partition; each runs on a worker thread."""
        acc = self.accumulator
        while True:
            with acc.cond:
                while True:
                    acc.drain()
                    now = time.monotonic()
                    ready = acc.ready(now, self._busy)
                    job = self._take(ready) if ready else None
                    if job is not None or (acc.closed and acc.empty() and not self._in_flight):
                        break
                    wait_s = acc.wait_s(now, ready, self._busy, bool(self._in_flight))
                    acc.sleeping = wait_s is None or wait_s > acc.linger_s
                    if acc.incoming:  # sent before the flag was up: take it first
                        acc.sleeping = False
                        continue
                    acc.cond.wait(wait_s)
                    acc.sleeping = False
                if job is None:
                    return
                topic, leader, taken = job
                request = next(self._request_ids)
                self._in_flight[request] = [r for _, batch in taken for r in batch]
                self._busy.update(tp for tp, _ in taken)
                self._requests_by_leader[leader] = self._requests_by_leader.get(leader, 0) + 1
                acc.room_freed.notify_all()
            self._workers.submit(self._request, request, topic, taken, leader)

    def _take(self, ready: list[TopicPartition]) -> tuple[str, str, Taken] | None:
        """One request's records: a batch of each of its share of the ready partitions of
        one topic that one broker leads (in a cluster, straight to the leader), if that
        broker has room for another request in flight. The share spreads the ready
        partitions over the requests the broker has room for, so that they go in parallel
        rather than in one request that keeps every partition busy."""
        for first in ready:
            leader = self.leaders.url(first.topic, first.partition)
            free = self.max_in_flight - self._requests_by_leader.get(leader, 0)
            if free > 0:
                break
        else:
            return None
        topic = first.topic
        mine = [tp for tp in ready
                if tp.topic == topic and self.leaders.url(tp.topic, tp.partition) == leader]
        taken: Taken = []
        count = 0
        for tp in mine[:math.ceil(len(mine) / free)]:
            if count >= MAX_BATCH_ENTRIES:
                break
            batch = self.accumulator.take(tp, MAX_BATCH_ENTRIES - count)
            count += len(batch)
            taken.append((tp, batch))
        return topic, leader, taken

    def _request(self, request: int, topic: str, taken: Taken, leader: str) -> None:
        try:
            self._send(topic, taken, leader)
        except Exception as exc:  # never leave a future waiting forever
            self.deliveries.fail(self._in_flight.get(request, ()), exc)
        finally:
            # After _send re-queued what goes again: the partitions free up only now, so
            # their next request carries the re-queued records first.
            with self.accumulator.cond:
                self._in_flight.pop(request, None)
                self._busy.difference_update(tp for tp, _ in taken)
                self._requests_by_leader[leader] -= 1
                self.accumulator.cond.notify_all()

    # -- one request ---------------------------------------------------------------------

    def _producer_id(self, attempts: Attempts) -> tuple[int, int]:
        """The producer id and epoch; a new epoch first when the sequences may be off."""
        if self._producer is not None and not self._new_epoch:
            return self._producer
        body = {"producer_id": self._producer[0]} if self._producer is not None else {}
        # Not strictly idempotent, but harmless twice: an unused id, or an epoch skipped.
        r = call(lambda t: self.http.post("/producers", json=body, timeout=t), attempts,
                 idempotent=True)
        if r.status_code == 404 and body:  # the server forgot the id: take a new one
            r = call(lambda t: self.http.post("/producers", json={}, timeout=t), attempts,
                     idempotent=True)
        raise_for(r)
        answer = r.json()
        self._producer = (int(answer["producer_id"]), int(answer["producer_epoch"]))
        self._new_epoch = False
        self._sequences.clear()
        return self._producer

    def _live(self, taken: Taken) -> tuple[Taken, float]:
        """The records of ``taken`` still within ``delivery_timeout_ms`` (the others fail:
        they waited behind retries), and when the first of them was sent."""
        now = time.monotonic()
        delivery_s = self.delivery_timeout_ms / 1000
        live: Taken = []
        oldest = now
        for tp, batch in taken:
            first = min(map(_enqueued_at, batch))
            if now >= first + delivery_s:
                self.deliveries.fail(
                    [r for r in batch if now >= r._enqueued_at + delivery_s],
                    LakelogTimeoutError(
                        f"a record for {tp.topic}-{tp.partition} waited in the producer "
                        f"longer than delivery_timeout_ms={self.delivery_timeout_ms:g} (the "
                        f"requests before it to {self.url} were being retried); it was "
                        "never sent"))
                batch = [r for r in batch if not r.done()]
                if not batch:
                    continue
                first = min(map(_enqueued_at, batch))
            live.append((tp, batch))
            oldest = min(oldest, first)
        return live, oldest

    def _send(self, topic: str, taken: Taken, leader: str) -> None:
        live, oldest = self._live(taken)
        if not live:
            return
        attempts = Attempts(self.policy, oldest + self.delivery_timeout_ms / 1000,
                            f"POST /topics/{topic}/records:batch", self.url,
                            f"delivery_timeout_ms={self.delivery_timeout_ms:g}")
        every = [r for _, b in live for r in b]
        body_entries: list[Entry] = []
        sequences: list[int] = []  # each entry's, unbounded (modulo SEQUENCE_SPACE on the wire)
        firsts: dict[TopicPartition, int] = {}
        with self._ident_lock:
            try:
                ident = self._producer_id(attempts) if self.idempotent else None
            except LakelogClientError as exc:
                self.deliveries.fail(every, exc)
                return
            for tp, batch in live:
                seq = firsts[tp] = self._sequences.get(tp, 0)
                body_entries += batch_entries(batch, tp.partition, len(body_entries), ident,
                                              seq)
                if ident is not None:
                    sequences += range(seq, seq + len(batch))
                    self._sequences[tp] = (seq + len(batch)) % SEQUENCE_SPACE
        body = encode_body(body_entries)  # the whole request in one call
        maybe_appended = False  # an attempt whose outcome is unknown was made
        http = self.leaders.client(leader)
        while True:
            try:
                self.requests_sent += 1
                r = http.post(self._url(http, topic), content=body, headers=JSON_BODY,
                              timeout=attempts.timeout_s())
            except httpx.TransportError as exc:
                sent = not never_sent(exc)
                if http is not self.http:  # that broker is gone: ask any (they forward)
                    self.leaders.invalidate(topic)
                    http = self.http
                if permanent(exc) or (sent and not self.idempotent):
                    self.deliveries.fail(every, LakelogConnectionError(
                        f"{attempts.what} at {self.url}: {describe(exc)}" + (
                            "; whether the records were appended is unknown (a producer "
                            "with idempotent=False does not send them again)" if sent else "")))
                    self._after_failure(ident, firsts, maybe_appended or sent)
                    return
                maybe_appended |= sent
                if attempts.again(exc):
                    continue
                self.deliveries.fail(every, attempts.gave_up())
                self._after_failure(ident, firsts, maybe_appended)
                return
            error = error_from(r) if r.status_code >= 400 else None
            if error is not None and http is not self.http and \
                    error.code in MOVED:  # the leader moved: any broker forwards
                self.leaders.invalidate(topic)
                http = self.http
            if error is not None and again(error):
                if self.idempotent or r.status_code == 429:  # 429: refused, nothing appended
                    maybe_appended |= r.status_code != 429
                    if attempts.again(error):
                        continue
                    error = attempts.gave_up()
                self.deliveries.fail(every, error)
                self._after_failure(ident, firsts, maybe_appended or r.status_code != 429)
                return
            if error is not None:  # refused whole: this attempt appended nothing
                self.deliveries.fail(every, error)
                self._after_failure(ident, firsts, maybe_appended)
                return
            answer = decode_answer(r.content)
            retry = [f for f in answer.failures if again(entry_error(f))]
            if retry and self.idempotent and attempts.again(entry_error(retry[0])):
                continue
            self._complete(ident, settle(answer, live, sequences, self.idempotent, self.url,
                                         self.deliveries))
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
        resend = [(tp, records) for tp, records in outcome.again if records]
        if resend:
            with self.accumulator.cond:
                for tp, records in resend:
                    self.accumulator.requeue(tp, records)
                self.accumulator.cond.notify_all()
