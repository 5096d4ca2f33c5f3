"""One ``records:batch`` request of the producer's sender (``sender.py``), from its
records' taking to its end: ``_begin`` (records past their delivery timeout fail; the
producer id and sequences; the body, encoded once), ``_attempt`` (to the leader, or to
a bootstrap broker, which forwards), then ``_answered`` or ``_broke``, each ending in
``_finish`` or in another attempt after the backoff; what an answer or a failure
changes for the producer's id, epoch and sequences is points 1-4 of ``producer.py``'s
docstring.
"""

from __future__ import annotations

import contextlib
import selectors
import time
from dataclasses import dataclass, field
from operator import attrgetter
from urllib.parse import quote

import httpx

from lakelog.client.accumulator import RecordAccumulator
from lakelog.client.batches import (
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
from lakelog.client.connections import Connections
from lakelog.client.errors import (
    LakelogClientError,
    LakelogConnectionError,
    LakelogTimeoutError,
    entry_error,
    error_from,
    raise_for,
)
from lakelog.client.futures import Deliveries, FutureRecordMetadata
from lakelog.client.http import CLUSTER, transport_of
from lakelog.client.leaders import Leaders
from lakelog.client.retry import Attempts, RetryPolicy, call, describe, never_sent, permanent
from lakelog.client.structs import TopicPartition
from lakelog.client.transactions import TransactionManager
from lakelog.client.wire import Answer, Connection

MOVED = ("not_leader_or_follower", "broker_not_available")
"""Errors after which a request goes to the bootstrap broker (which forwards) while the
metadata is read again."""
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


class FlightSteps:
    """The steps of a request, as methods of the ``Sender`` (which owns the state they
    share: the producer's id and sequences, the connections, the selector)."""

    accumulator: RecordAccumulator
    deliveries: Deliveries
    leaders: Leaders
    http: httpx.Client
    policy: RetryPolicy
    url: str
    acks: str
    idempotent: bool
    delivery_timeout_ms: float
    requests_sent: int
    _headers: list[tuple[str, str]]
    _in_flight: dict[int, Batch]
    _busy: set[TopicPartition]
    _producer: tuple[int, int] | None
    _new_epoch: bool
    _sequences: dict[TopicPartition, int]
    _pool: Connections
    _selector: selectors.BaseSelector
    txn: TransactionManager | None
    _txn_query: str

    def _finish(self, flight: Flight) -> None:
        raise NotImplementedError  # the Sender's: the request's partitions may go again

    def _producer_id(self, attempts: Attempts) -> tuple[int, int]:
        """The producer id and epoch; a new epoch first when the sequences may be off. A
        transactional producer's are its transactional id's (sequences start again at 0
        with each new epoch its transactions end with)."""
        if self.txn is not None:
            ident = self.txn.ident
            if ident is None:
                raise self.txn.error if isinstance(self.txn.error, LakelogClientError) else \
                    LakelogClientError(0, "invalid_txn_state",
                                       "call init_transactions before sending")
            if ident != self._producer:
                self._producer = ident
                self._sequences.clear()
            return ident
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

    def _queued_partitions(self) -> set[TopicPartition]:
        """The partitions with records waiting, or taken by a request (those of every
        request this turn of the loop started among them)."""
        with self.accumulator.cond:
            return set(self.accumulator.queued_partitions()) | self._busy

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
            if self.txn is not None:
                self.txn.add_partitions([tp for tp, _ in flight.live], attempts,
                                        self._queued_partitions)
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
        server = self._pool.server(url)
        try:
            conn = self._pool.get(server)
        except httpx.TransportError as exc:
            self._broke(flight, exc)
            return
        try:
            conn.start("POST", f"{server.path}{CLUSTER}/topics/"
                       f"{quote(flight.topic, safe='')}/records:batch?acks={self.acks}"
                       + self._txn_query, self._headers, flight.body)
            self._selector.register(conn, conn.want(), flight)
        except httpx.TransportError as exc:  # a kept-alive connection broke as it was used
            conn.close()
            self._broke(flight, exc)
            return
        except BaseException:
            conn.close()
            raise
        flight.conn = conn

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
        self._pool.release(conn)
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
            self._pool.unreachable(flight.url)
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
        if decoded.failures and self.txn is not None:
            self.txn.failed(entry_error(decoded.failures[0]))
        self._complete(flight.ident, settle(decoded, flight.live, flight.sequences,
                                            self.idempotent, self.url, self.deliveries))
        self._finish(flight)

    def _fail(self, flight: Flight, error: BaseException, maybe_appended: bool) -> None:
        """The request failed whole: its records fail, and the sequences are mended (a
        transaction's: it must abort, and its end brings a new epoch)."""
        if self.txn is not None:
            self.txn.failed(error)
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
            self._new_epoch = self.txn is None
        elif ident == self._producer:
            self._sequences.update(firsts)

    def _complete(self, ident: tuple[int, int] | None, outcome: Outcome) -> None:
        """Take what a request's answer changed (``batches.settle``); what it says of the
        sequences holds only for the epoch the request was sent under."""
        self._new_epoch |= outcome.new_epoch and self.txn is None
        if ident == self._producer:
            if outcome.forget_producer and self.txn is None:
                self._producer = None
            self._sequences.update(outcome.sequences)
        resend = [(tp, records) for tp, records in outcome.again if records]
        if resend:
            with self.accumulator.cond:
                for tp, records in resend:
                    self.accumulator.requeue(tp, records)
