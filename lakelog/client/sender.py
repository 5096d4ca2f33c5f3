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

A request's steps are ``flights.py``'s; the connections ``connections.py``'s.
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
from typing import Any
from urllib.parse import quote

import httpx

from lakelog.client.accumulator import RecordAccumulator
from lakelog.client.batches import (
    MAX_BATCH_ENTRIES,
    Batch,
)
from lakelog.client.connections import Connections
from lakelog.client.flights import Flight, FlightSteps, Taken
from lakelog.client.futures import Deliveries, FutureRecordMetadata, in_callback
from lakelog.client.leaders import Leaders
from lakelog.client.retry import RetryPolicy
from lakelog.client.structs import TopicPartition
from lakelog.client.transactions import TransactionManager

log = logging.getLogger(__name__)

MOVED = ("not_leader_or_follower", "broker_not_available")
"""Errors after which a request goes to the bootstrap broker (which forwards) while the
metadata is read again."""

ASSIST_WAIT_S = 0.05
"""How long ``send`` waits for the sender thread's turn to end before it goes on without
taking one."""
MAX_IN_FLIGHT = 5  # Kafka's bound with idempotence (its broker remembers 5 batches)



class Sender(FlightSteps):
    """The thread that runs one producer's requests."""

    def __init__(self, accumulator: RecordAccumulator, deliveries: Deliveries,
                 leaders: Leaders, http: httpx.Client, policy: RetryPolicy, *, url: str,
                 acks: str, idempotent: bool, delivery_timeout_ms: float,
                 max_in_flight: int, authorization: str | None = None,
                 verify: bool | ssl.SSLContext = True,
                 txn: TransactionManager | None = None) -> None:
        self.accumulator = accumulator
        self.txn = txn
        self._txn_query = "" if txn is None else \
            f"&transactional_id={quote(txn.transactional_id, safe='')}"
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
        self._pool = Connections(verify)
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
        self._pool.close()
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
            if self._stopped or (self.txn is not None and not self.txn.added) or (
                    self.idempotent and self.txn is None and (
                        self._producer is None or self._new_epoch)):
                return  # (a transaction's first partitions are added over the network)
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


