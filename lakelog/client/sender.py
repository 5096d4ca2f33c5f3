"""The producer's sender thread (Kafka's Sender): it takes ready batches from the
``RecordAccumulator`` into ``records:batch`` requests, one topic and leader each, up to
``max_in_flight`` per broker and never two for one partition (``producer.py``'s
docstring says why), with the producer id, epoch and sequences of idempotence, the
retries, and what an answer changes (points 1-4 of ``producer.py``'s docstring).

One thread does all of it, as Kafka's sender does: the requests go over non-blocking
HTTP/1.1 connections (``wire.py``) that one selector watches, with the accumulator's
wake-ups (``send``, ``flush``, ``close``) on a socket pair in the same selector. A
request waiting for its retry backoff waits in the loop, not on a thread. On one core a
worker thread per request and httpx cost about twice the CPU a record (thread wake-ups
alone were a tenth of the producer's time).

A request's steps (``Flight``): ``_begin`` (records past their delivery timeout fail;
the producer id and sequences; the body, encoded once), ``_attempt`` (to the leader, or
to a bootstrap broker, which forwards), then ``_answered`` or ``_broke``, each ending in
``_finish`` or in another attempt after the backoff.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any
from urllib.parse import quote

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
from lakelog.client.futures import Deliveries, FutureRecordMetadata, in_callback
from lakelog.client.http import CLUSTER, transport_of
from lakelog.client.leaders import Leaders
from lakelog.client.retry import Attempts, RetryPolicy, call, describe, never_sent, permanent
from lakelog.client.structs import TopicPartition
from lakelog.client.wire import Address, Answer, Connection, Server, addresses

log = logging.getLogger(__name__)

MOVED = ("not_leader_or_follower", "broker_not_available")
"""Errors after which a request goes to the bootstrap broker (which forwards) while the
metadata is read again."""

ASSIST_WAIT_S = 0.05
"""How long ``send`` waits for the sender thread's turn to end before it goes on without
taking one."""
MAX_IN_FLIGHT = 5  # Kafka's bound with idempotence (its broker remembers 5 batches)
_enqueued_at = attrgetter("_enqueued_at")

Taken = list[tuple[TopicPartition, Batch]]
"""One request's records: a batch of each of its partitions."""


@dataclass(slots=True, eq=False)
class Flight:
    """One ``records:batch`` request, from its records' taking to its end."""

    id: int
    topic: str
    taken: Taken
    leader: str
    """The broker it counts against (``max_in_flight``)."""
    target: str | None = None
    """Where its attempts go: the leader, or None for the bootstrap brokers."""
    attempts: Attempts | None = None
    live: Taken = field(default_factory=list)
    every: list[FutureRecordMetadata] = field(default_factory=list)
    ident: tuple[int, int] | None = None
    firsts: dict[TopicPartition, int] = field(default_factory=dict)
    sequences: list[int] = field(default_factory=list)
    """Each entry's sequence, unbounded (modulo ``SEQUENCE_SPACE`` on the wire)."""
    body: bytes = b""
    maybe_appended: bool = False
    """An attempt whose outcome is unknown was made."""
    conn: Connection | None = None
    url: str = ""
    """The broker of the current attempt."""
    deadline: float = 0.0
    """When the current attempt times out."""
    due: float | None = None
    """When the next attempt goes (after a backoff)."""
    tried: int = 0
    """Bootstrap brokers that refused the current attempt's connection."""


class Sender:
    """The thread that runs one producer's requests."""

    def __init__(self, accumulator: RecordAccumulator, deliveries: Deliveries,
                 leaders: Leaders, http: httpx.Client, policy: RetryPolicy, *, url: str,
                 acks: str, idempotent: bool, delivery_timeout_ms: float,
                 max_in_flight: int, authorization: str | None = None,
                 verify: bool | ssl.SSLContext = True) -> None:
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
        self._headers = [("content-type", "application/json")]
        if authorization is not None:
            self._headers.append(("authorization", authorization))
        self._verify = verify
        self._tls: ssl.SSLContext | None = None
        """Made for the first https broker (httpx's defaults for ``verify``)."""
        self._in_flight: dict[int, Batch] = {}
        self._flights: dict[int, Flight] = {}
        self._busy: set[TopicPartition] = set()
        """Partitions with a request awaiting its answer: one each."""
        self._requests_by_leader: dict[str, int] = {}
        self._request_ids = itertools.count()
        self._producer: tuple[int, int] | None = None
        self._new_epoch = False
        """The sequences may disagree with the server's: take a new epoch before the next send."""
        self._sequences: dict[TopicPartition, int] = {}
        self._servers: dict[str, Server] = {}
        self._addresses: dict[str, tuple[list[Address], int]] = {}
        """Each server's addresses, the one to try first first, and how many were tried."""
        self._idle: dict[str, list[Connection]] = {}
        self._sleep_until = math.inf
        """When the sender thread's current wait ends (``assist`` wakes it sooner if a
        request it started needs it)."""
        self._stopped = False
        self._turn = threading.Lock()
        """Held by whichever thread runs a turn of the loop (the sender thread, or a
        ``send`` assisting): everything below is the turn's."""
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        accumulator.waker = self._wake
        self._thread = threading.Thread(target=self._run, name="lakelog-producer", daemon=True)
        self._thread.start()

    def in_flight(self) -> list[FutureRecordMetadata]:
        """The records of the requests awaiting their answers (under the accumulator's
        ``cond``)."""
        return [r for batch in self._in_flight.values() for r in batch]

    def alive(self) -> bool:
        return self._thread.is_alive()

    def on_thread(self) -> bool:
        """The caller is the sender thread (a record's callback runs there)."""
        return threading.current_thread() is self._thread

    def join(self) -> None:
        """Wait for the sender thread (after the accumulator is closed) and the requests."""
        self._wake()
        self._thread.join()

    def _wake(self) -> None:
        # Full (a wake-up is pending anyway) or closed (the thread ended): nothing to do.
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    # -- the loop ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            with self._turn:
                self._stopped = True
                self._close_all()

    def _close_all(self) -> None:
            for conns in self._idle.values():
                for conn in conns:
                    conn.close()
            for flight in list(self._flights.values()):
                if flight.conn is not None:
                    flight.conn.close()
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _loop(self) -> None:
        """Start requests as partitions become ready, up to ``max_in_flight`` per broker
        and one per partition; then wait for sockets, wake-ups, backoffs and lingers."""
        acc = self.accumulator
        while True:
            with self._turn:
                started, wait_s, stop = self._start(assist=False)
                if stop:
                    self._stopped = True  # a send's turn after this finds nothing to do
                    return
                for flight in started:
                    self._guarded(self._begin, flight)
                timeout = 0 if started else self._timeout(wait_s)
                self._sleep_until = math.inf if timeout is None else time.monotonic() + timeout
            events = self._selector.select(timeout)
            acc.sleeping = False
            with self._turn:
                self._handle(events, assist=False)

    def assist(self) -> None:
        """A turn of the loop on the caller's thread (``send``, every ``DRAIN_AT``
        records), unless the sender thread is in one: the batches that are ready go, and
        the answers that came are read, while the records are still in the CPU's caches.
        Nothing here waits: a request that needs the metadata or a producer id first is
        left to the sender thread."""
        if in_callback() or not self._turn.acquire(timeout=ASSIST_WAIT_S):
            return  # in a callback, this thread's turn is the one running
        try:
            if self._stopped or (self.idempotent and (
                    self._producer is None or self._new_epoch)):
                return
            started, _, _ = self._start(assist=True)
            for flight in started:
                self._guarded(self._begin, flight)
            flights = len(self._flights)
            self._handle(self._selector.select(0), assist=True)
            # Wake the sender thread if it would otherwise wait too long: a deadline or
            # backoff set here ends before its wait does, or requests ended here (their
            # partitions may go again) while it waits past a linger.
            now = time.monotonic()
            wait_s = self._timeout(None)
            if (wait_s is not None and now + wait_s < self._sleep_until) or (
                    len(self._flights) < flights and
                    self._sleep_until - now > self.accumulator.linger_s):
                self._wake()
        finally:
            self._turn.release()

    def _start(self, *, assist: bool) -> tuple[list[Flight], float | None, bool]:
        """Under ``_turn``: the requests that can start now, how long the sender thread
        may sleep, and whether it is done (closed, nothing left)."""
        acc = self.accumulator
        started: list[Flight] = []
        with acc.cond:
            acc.drain()
            now = time.monotonic()
            ready = acc.ready(now, self._busy)
            while ready and (job := self._take(ready, assist)) is not None:
                started.append(self._register(*job))
                ready = acc.ready(now, self._busy)
            if started:
                acc.room_freed.notify_all()
            stop = acc.closed and acc.empty() and not self._flights
            wait_s = None
            if not (assist or stop):
                wait_s = acc.wait_s(now, ready, self._busy, bool(self._flights))
                acc.sleeping = wait_s is None or wait_s > acc.linger_s
                if acc.incoming:  # sent before the flag was up: take it first
                    acc.sleeping, wait_s = False, 0.0
        acc.deliver_refusals()  # their callbacks run without the accumulator's lock
        return started, wait_s, stop

    def _handle(self, events: list[tuple[selectors.SelectorKey, int]], *, assist: bool) -> None:
        """Under ``_turn``: what the selector reported, then the timers. An event another
        turn handled first (its request is over, or its connection moved on) is passed
        over; the wake-ups are the sender thread's (it must see a close)."""
        for key, mask in events:
            flight = key.data
            if flight is None:
                if not assist:
                    with contextlib.suppress(OSError):
                        while self._wake_r.recv(4096):
                            pass
            elif flight.id in self._flights and flight.conn is key.fileobj:
                self._guarded(self._on_event, flight, mask)
        self._timers(time.monotonic())

    def _timeout(self, wait_s: float | None) -> float | None:
        """How long the selector may wait: the accumulator's wait, the next backoff's end,
        the next attempt's deadline."""
        now = time.monotonic()
        ends = [f.due if f.due is not None else f.deadline
                for f in self._flights.values() if f.due is not None or f.conn is not None]
        if ends:
            first = max(0.0, min(ends) - now)
            wait_s = first if wait_s is None else min(wait_s, first)
        return wait_s

    def _timers(self, now: float) -> None:
        for flight in list(self._flights.values()):
            if flight.due is not None and now >= flight.due:
                self._guarded(self._attempt, flight)
            elif flight.conn is not None and now >= flight.deadline:
                failure = flight.conn.timed_out()  # whether any of it left: before closing
                self._drop(flight)
                self._guarded(self._broke, flight, failure)

    def _guarded(self, step: Callable[..., None], flight: Flight, *args: Any) -> None:
        try:
            step(flight, *args)
        except Exception as exc:  # a bug: fail the request's records rather than the thread
            log.exception("lakelog producer: a request to %s failed", flight.url or self.url)
            self.deliveries.fail(self._in_flight.get(flight.id, ()), exc)
            self._finish(flight)

    def _take(self, ready: list[TopicPartition], assist: bool = False
              ) -> tuple[str, str, Taken] | None:
        """One request's records: a batch of each of its share of the ready partitions of
        one topic that one broker leads (in a cluster, straight to the leader), if that
        broker has room for another request in flight. The share spreads the ready
        partitions over the requests the broker has room for, so that they go in parallel
        rather than in one request that keeps every partition busy."""
        for first in ready:
            if assist and not self.leaders.cached(first.topic):
                continue  # reading the metadata would wait: the sender thread's to do
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

    def _register(self, topic: str, leader: str, taken: Taken) -> Flight:
        """A request's records are in flight (under ``cond``)."""
        flight = Flight(next(self._request_ids), topic, taken, leader)
        self._flights[flight.id] = flight
        self._in_flight[flight.id] = [r for _, batch in taken for r in batch]
        self._busy.update(tp for tp, _ in taken)
        self._requests_by_leader[leader] = self._requests_by_leader.get(leader, 0) + 1
        return flight

    def _finish(self, flight: Flight) -> None:
        """The request is over: its partitions may go again (after ``_complete`` re-queued
        what goes again, so that their next request carries those records first)."""
        if self._flights.pop(flight.id, None) is None:
            return
        if flight.conn is not None:
            self._drop(flight)
        with self.accumulator.cond:
            self._in_flight.pop(flight.id, None)
            self._busy.difference_update(tp for tp, _ in flight.taken)
            self._requests_by_leader[flight.leader] -= 1

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

    def _begin(self, flight: Flight) -> None:
        flight.live, oldest = self._live(flight.taken)
        if not flight.live:
            self._finish(flight)
            return
        attempts = flight.attempts = Attempts(
            self.policy, oldest + self.delivery_timeout_ms / 1000,
            f"POST /topics/{flight.topic}/records:batch", self.url,
            f"delivery_timeout_ms={self.delivery_timeout_ms:g}")
        flight.every = [r for _, b in flight.live for r in b]
        try:
            ident = flight.ident = self._producer_id(attempts) if self.idempotent else None
        except LakelogClientError as exc:
            self.deliveries.fail(flight.every, exc)
            self._finish(flight)
            return
        entries: list[Entry] = []
        for tp, batch in flight.live:
            seq = flight.firsts[tp] = self._sequences.get(tp, 0)
            entries += batch_entries(batch, tp.partition, len(entries), ident, seq)
            if ident is not None:
                flight.sequences += range(seq, seq + len(batch))
                self._sequences[tp] = (seq + len(batch)) % SEQUENCE_SPACE
        flight.body = encode_body(entries)  # the whole request in one call
        flight.target = None if flight.leader == self.leaders.bootstrap else flight.leader
        self._attempt(flight)

    def _attempt(self, flight: Flight) -> None:
        """Send the request (again) to its leader, or to the bootstrap broker first in
        line."""
        assert flight.attempts is not None
        flight.due = None
        url = flight.url = flight.target or self._bootstrap()
        self.requests_sent += 1
        flight.deadline = time.monotonic() + flight.attempts.timeout_s()
        server = self._servers.get(url) or self._servers.setdefault(url, Server.of(url))
        try:
            conn = self._connection(server)
        except httpx.TransportError as exc:
            self._broke(flight, exc)
            return
        try:
            conn.start("POST", f"{server.path}{CLUSTER}/topics/"
                       f"{quote(flight.topic, safe='')}/records:batch?acks={self.acks}",
                       self._headers, flight.body)
            self._selector.register(conn, conn.want(), flight)
        except httpx.TransportError as exc:  # a kept-alive connection broke as it was used
            conn.close()
            self._broke(flight, exc)
            return
        except BaseException:
            conn.close()
            raise
        flight.conn = conn

    def _connection(self, server: Server) -> Connection:
        """An idle connection to ``server`` that may carry another request, else a new one
        (to the first of the server's addresses that did not refuse one last)."""
        idle = self._idle.get(server.url)
        while idle:
            conn = idle.pop()
            if not conn.stale():
                return conn
            conn.close()
        if server.tls and self._tls is None:
            self._tls = httpx.create_ssl_context(verify=self._verify)
        found = self._addresses.get(server.url)
        if found is None:
            found = self._addresses[server.url] = (addresses(server.host, server.port), 0)
        return Connection(server, self._tls, found[0][0])

    def _unreachable(self, url: str) -> None:
        """A connection to ``url`` failed: its next address next time (and, once each was
        tried, a new lookup)."""
        found = self._addresses.pop(url, None)
        if found is not None and found[1] + 1 < len(found[0]):
            self._addresses[url] = (found[0][1:] + found[0][:1], found[1] + 1)

    def _bootstrap(self) -> str:
        transport = transport_of(self.http)
        return transport.current if transport is not None else self.leaders.bootstrap

    def _drop(self, flight: Flight) -> None:
        """Close the request's connection (broken, or its attempt timed out)."""
        conn, flight.conn = flight.conn, None
        if conn is not None:
            with contextlib.suppress(KeyError):
                self._selector.unregister(conn)
            conn.close()

    def _on_event(self, flight: Flight, mask: int) -> None:
        conn = flight.conn
        assert conn is not None
        try:
            answer = conn.on_event(mask)
        except httpx.TransportError as exc:
            self._drop(flight)
            self._broke(flight, exc)
            return
        if answer is None:
            self._selector.modify(conn, conn.want(), flight)
            return
        self._selector.unregister(conn)
        flight.conn = None
        if conn.reusable:
            self._idle.setdefault(conn.server.url, []).append(conn)
        else:
            conn.close()
        self._answered(flight, answer)

    def _retry(self, flight: Flight, failure: BaseException) -> bool:
        """Schedule the next attempt after the backoff; False when there is none."""
        assert flight.attempts is not None
        wait_s = flight.attempts.backoff(failure)
        if wait_s is None:
            return False
        flight.due = time.monotonic() + wait_s
        return True

    def _broke(self, flight: Flight, exc: httpx.TransportError) -> None:
        """The attempt failed without an answer (as ``FailoverTransport`` and the retry
        rules say: a bootstrap broker that refuses the connection is skipped at once)."""
        assert flight.attempts is not None
        sent = not never_sent(exc)
        if not sent:
            self._unreachable(flight.url)
        if flight.target is None:
            transport = transport_of(self.http)
            if transport is not None:
                transport.failed(flight.url)
                flight.tried += 1
                if not sent and flight.tried < len(transport.urls):
                    self._attempt(flight)
                    return
        flight.tried = 0
        if flight.target is not None:  # that broker is gone: ask any (they forward)
            self.leaders.invalidate(flight.topic)
            flight.target = None
        if permanent(exc) or (sent and not self.idempotent):
            self._fail(flight, LakelogConnectionError(
                f"{flight.attempts.what} at {self.url}: {describe(exc)}" + (
                    "; whether the records were appended is unknown (a producer "
                    "with idempotent=False does not send them again)" if sent else "")),
                flight.maybe_appended or sent)
            return
        flight.maybe_appended |= sent
        if not self._retry(flight, exc):
            self._fail(flight, flight.attempts.gave_up(), flight.maybe_appended)

    def _answered(self, flight: Flight, answer: Answer) -> None:
        assert flight.attempts is not None
        status = answer.status
        error = error_from(answer.response(flight.url)) if status >= 400 else None
        if error is not None and flight.target is not None and error.code in MOVED:
            self.leaders.invalidate(flight.topic)  # the leader moved: any broker forwards
            flight.target = None
        if error is not None and again(error):
            if self.idempotent or status == 429:  # 429: refused, nothing appended
                flight.maybe_appended |= status != 429
                if self._retry(flight, error):
                    return
                error = flight.attempts.gave_up()
            self._fail(flight, error, flight.maybe_appended or status != 429)
            return
        if error is not None:  # refused whole: this attempt appended nothing
            self._fail(flight, error, flight.maybe_appended)
            return
        decoded = decode_answer(answer.body)
        retry = [f for f in decoded.failures if again(entry_error(f))]
        if retry and self.idempotent and self._retry(flight, entry_error(retry[0])):
            return
        self._complete(flight.ident, settle(decoded, flight.live, flight.sequences,
                                            self.idempotent, self.url, self.deliveries))
        self._finish(flight)

    def _fail(self, flight: Flight, error: BaseException, maybe_appended: bool) -> None:
        """The request failed whole: its records fail, and the sequences are mended."""
        self.deliveries.fail(flight.every, error)
        self._after_failure(flight.ident, flight.firsts, maybe_appended)
        self._finish(flight)

    def _after_failure(self, ident: tuple[int, int] | None, firsts: dict[TopicPartition, int],
                       maybe_appended: bool) -> None:
        """After a request failed whole: if it may have appended, a new epoch; if not, its
        partitions' sequences go back to where it started (unless another request took a
        new epoch meanwhile: then every partition starts again at 0 anyway)."""
        if not self.idempotent:
            return
        if maybe_appended:
            self._new_epoch = True
        elif ident == self._producer:
            self._sequences.update(firsts)

    def _complete(self, ident: tuple[int, int] | None, outcome: Outcome) -> None:
        """Take what a request's answer changed (``batches.settle``); what it says of the
        sequences holds only for the epoch the request was sent under."""
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
