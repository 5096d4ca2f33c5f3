"""What a produced record's answer reaches: ``FutureRecordMetadata`` (what ``send``
returns, Kafka's light future), a ``Tally`` (what ``send_many`` counts in) and
``Deliveries``, the one condition all of a producer's records are completed under.

A ``concurrent.futures.Future`` costs a Condition and an RLock each (~3 us to make) and a
lock and a notify to complete; at hundreds of thousands of records a second that was a
fifth of the producer's time. Kafka's producer has its own future type too, completed a
batch at a time: here the records of one answer are completed together, under one lock,
with one ``notify_all``, and each waiter then checks its own record.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

import msgspec

from lakelog.client.structs import RecordMetadata

log = logging.getLogger(__name__)
_in_callback = threading.local()
"""Set on a thread while it runs records' callbacks."""



def in_callback() -> bool:
    """This thread is running records' callbacks (the sender thread, or a ``send`` that
    took a turn of its loop)."""
    return bool(getattr(_in_callback, "active", False))


MAX_TALLY_FAILURES = 10_000  # failures a Tally keeps one by one; past it, only counts


class Success(msgspec.Struct, gc=False):
    """What the producer reads of a stored record's report (the rest is skipped)."""

    id: str
    partition_id: int
    offset: int
    timestamp: str | None = None


class Tally:
    """The delivery reports of records sent with ``Producer.send_many``: counts and the
    failures, without a Future per record (what ``lakelog produce`` needs at speed)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._all_done = threading.Condition(self._lock)
        self.sent = 0
        self.acked = 0
        self.failed = 0
        self.failures: list[BaseException] = []
        """The first ``MAX_TALLY_FAILURES`` failures, in the order they came."""

    def _add(self, n: int) -> None:
        with self._lock:
            self.sent += n

    def _done(self, ok: int, failures: Sequence[BaseException] = ()) -> None:
        """``ok`` records acknowledged and one failed per exception of ``failures``."""
        with self._lock:
            self.acked += ok
            self.failed += len(failures)
            self.failures += failures[:MAX_TALLY_FAILURES - len(self.failures)]
            if self.acked + self.failed >= self.sent:
                self._all_done.notify_all()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until every record sent so far has its answer; False on timeout."""
        with self._lock:
            return self._all_done.wait_for(lambda: self.acked + self.failed >= self.sent,
                                           timeout_s)


Outcome = Success | RecordMetadata | BaseException
"""A record's answer: the server's report (made a ``RecordMetadata`` when first read) or
why it failed."""


class Deliveries(msgspec.Struct, gc=False):
    """One producer's condition for the answers of all its records: an answered request
    completes its records under it at once and notifies once; a waiter (``result``,
    ``flush``) checks its own records again.

    A msgspec Struct not tracked by the garbage collector (nothing it holds leads back
    to a record), so that a record holding it is not tracked either (see
    ``FutureRecordMetadata``)."""

    cond: threading.Condition = msgspec.field(
        default_factory=lambda: threading.Condition(threading.Lock()))
    callbacks_running: int = 0
    """Records answered whose callbacks have not all run yet (``flush`` waits for them,
    as Kafka's does: a callback has run for every record when flush returns)."""
    on_failure: Callable[[BaseException], None] | None = None
    """Told of a record that failed, whatever failed it (a transactional producer's
    transaction can then only abort)."""

    def complete(self, records: Sequence[FutureRecordMetadata],
                 outcomes: Sequence[Outcome]) -> None:
        """Give each record its outcome (a record already answered keeps its first), then
        run the callbacks, outside the lock."""
        called: list[FutureRecordMetadata] = []
        counts: dict[int, tuple[Tally, int, list[BaseException]]] = {}
        watch = self.on_failure is not None
        failed: BaseException | None = None
        with self.cond:
            for record, outcome in zip(records, outcomes, strict=True):
                if record._outcome is not None:
                    continue
                record._outcome = outcome
                if watch and failed is None and isinstance(outcome, BaseException):
                    failed = outcome
                if record._callbacks is not None:
                    called.append(record)
                if record._tally is not None:
                    tally = record._tally
                    _, ok, failures = counts.get(id(tally)) or (tally, 0, [])
                    if isinstance(outcome, BaseException):
                        failures.append(outcome)
                    else:
                        ok += 1
                    counts[id(tally)] = (tally, ok, failures)
            # Counted before the waiters wake: a Tally read after flush() is complete.
            for tally, ok, failures in counts.values():
                tally._done(ok, failures)
            self.callbacks_running += len(called)
            self.cond.notify_all()
        if failed is not None and self.on_failure is not None:
            self.on_failure(failed)
        if not called:
            return
        _in_callback.active = True
        try:
            for record in called:
                record._run_callbacks()
        finally:
            _in_callback.active = False
            with self.cond:
                self.callbacks_running -= len(called)
                self.cond.notify_all()

    def wait_callbacks(self, timeout_s: float | None) -> bool:
        """Wait until every answered record's callbacks have run (not from a callback:
        its own would never end); False on timeout."""
        if getattr(_in_callback, "active", False):
            return True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self.cond:
            while self.callbacks_running:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.cond.wait(left)
        return True

    def fail(self, records: Iterable[FutureRecordMetadata], exc: BaseException) -> None:
        """``complete`` every record of ``records`` with ``exc``."""
        records = list(records)
        if records:
            self.complete(records, [exc] * len(records))

    def wait(self, records: Iterable[FutureRecordMetadata], timeout_s: float | None) -> bool:
        """Wait until every record of ``records`` has its answer; False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self.cond:
            for record in records:
                while record._outcome is None:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self.cond.wait(left)
        return True


class FutureRecordMetadata(msgspec.Struct, eq=False):
    """A record from ``Producer.send`` until its answer, and the Future of its
    ``RecordMetadata`` (Kafka's ``FutureRecordMetadata``).

    It has the methods of ``concurrent.futures.Future`` that callers use: ``result``,
    ``exception``, ``done``, ``add_done_callback`` (its callbacks run where the answer is
    read: on the producer's sender thread, as Kafka's, or on a thread in ``send`` taking a
    turn of the sender's loop; keep them short, since every request waits for them, and
    do not ``flush`` in them: it raises), ``cancel``/``cancelled`` (a record in the producer
    cannot be taken back: always False) and ``running``. It is not a
    ``concurrent.futures.Future``: ``concurrent.futures.wait`` and ``as_completed`` do not
    take it (``Producer.flush`` waits for every record sent before it).

    A msgspec Struct: made in C (~0.2 us, against ~0.6 us for a class with __slots__),
    and tracked by the garbage collector only while a field holds a tracked object (an
    exception, callbacks, a Tally), so that the up to ``max_buffered_records`` records
    waiting in a producer do not make every collection slower (they did: 0.75 us a
    record). Its fields are the producer's (``producer.py``, ``batches.py``).
    """

    _deliveries: Deliveries
    _topic: str
    _enqueued_at: float
    """When ``send`` took it (``time.monotonic()``): its linger and delivery timeout count
    from here."""
    _key: bytes | str | None = None
    _value: bytes | str | None = None
    _partition: int | None = None
    """The partition ``send`` was given (else its queue's: from the key, or round robin)."""
    _extra: tuple[tuple[tuple[str, bytes], ...], int | None] | None = None
    """Headers and timestamp, when the record has either."""
    _size: int = 0
    """The bytes of its key and value, for ``batch_size``."""
    _resets: int = 0
    """Times it was sent again under a new epoch (``batches.MAX_RESETS``)."""
    _outcome: Outcome | None = None
    _callbacks: list[Callable[[FutureRecordMetadata], Any]] | None = None
    _tally: Tally | None = None
    """The Tally it is counted in (``send_many``), instead of being awaited."""

    def done(self) -> bool:
        """The record has its answer: stored, or failed."""
        return self._outcome is not None

    def running(self) -> bool:
        """The record is in the producer, waiting for its answer (the opposite of done)."""
        return self._outcome is None

    def cancel(self) -> bool:
        """A record in the producer cannot be taken back: False."""
        return False

    def cancelled(self) -> bool:
        return False

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """Where the record was stored; raises why it failed, or ``TimeoutError`` when
        ``timeout`` (seconds) passes first."""
        outcome = self._wait(timeout)
        if isinstance(outcome, BaseException):
            raise outcome
        if isinstance(outcome, Success):
            # Made when first asked for: most records' metadata is never read.
            outcome = self._outcome = RecordMetadata(
                self._topic, outcome.partition_id, outcome.offset,
                datetime.fromisoformat(outcome.timestamp) if outcome.timestamp
                else datetime.now())
        return outcome

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Why the record failed (None if it was stored); ``TimeoutError`` when
        ``timeout`` (seconds) passes first."""
        outcome = self._wait(timeout)
        return outcome if isinstance(outcome, BaseException) else None

    def add_done_callback(self, fn: Callable[[FutureRecordMetadata], Any]) -> None:
        """Call ``fn(future)`` when the record has its answer (now, if it has)."""
        with self._deliveries.cond:
            if self._outcome is None:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        self._call(fn)

    def __repr__(self) -> str:
        state = ("pending" if self._outcome is None else
                 f"failed: {self._outcome!r}" if isinstance(self._outcome, BaseException)
                 else "done")
        return f"<FutureRecordMetadata {self._topic} {state}>"

    def _wait(self, timeout: float | None) -> Outcome:
        outcome = self._outcome
        if outcome is None:
            if not self._deliveries.wait((self,), timeout):
                raise TimeoutError(f"no answer for a record of {self._topic} within "
                                   f"{timeout:g} s")
            outcome = self._outcome
        assert outcome is not None
        return outcome

    def _run_callbacks(self) -> None:
        callbacks, self._callbacks = self._callbacks or [], None  # no cycle left behind
        for fn in callbacks:
            self._call(fn)

    def _call(self, fn: Callable[[FutureRecordMetadata], Any]) -> None:
        try:
            fn(self)
        except Exception:  # as concurrent.futures: a callback's error is logged
            log.exception("exception calling callback for %r", self)
