"""The light future ``Producer.send`` returns (``FutureRecordMetadata``), its producer's
one condition (``Deliveries``) and ``Tally``, without a server: what callers of a
``concurrent.futures.Future`` use works the same, and a request's records are completed
together."""

from __future__ import annotations

import gc
import threading
import time
from datetime import UTC, datetime

import pytest

from lakelog.client import RecordMetadata, Tally
from lakelog.client.futures import Deliveries, FutureRecordMetadata, Success


def _record(deliveries: Deliveries, tally: Tally | None = None) -> FutureRecordMetadata:
    return FutureRecordMetadata(deliveries, "t", time.monotonic(), b"k", b"v", _tally=tally)


def _stored(offset: int) -> Success:
    return Success(str(offset), 3, offset, "2026-11-25T09:47:41.690000Z")


def test_result_builds_the_record_metadata_from_the_answer() -> None:
    deliveries = Deliveries()
    future = _record(deliveries)
    assert not future.done() and future.running()
    deliveries.complete([future], [_stored(7)])
    assert future.done() and not future.running()
    md = future.result(timeout=0)
    assert md == RecordMetadata("t", 3, 7, datetime(2026, 11, 25, 9, 47, 41, 690000,
                                                    tzinfo=UTC))
    assert future.result() is md  # made once
    assert future.exception() is None


def test_a_failed_record_raises_its_error_and_exception_returns_it() -> None:
    deliveries = Deliveries()
    future = _record(deliveries)
    error = ValueError("refused")
    deliveries.fail([future], error)
    assert future.exception(timeout=0) is error
    with pytest.raises(ValueError, match="refused"):
        future.result()


def test_result_and_exception_time_out_while_there_is_no_answer() -> None:
    future = _record(Deliveries())
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        future.result(timeout=0.05)
    with pytest.raises(TimeoutError):
        future.exception(timeout=0)
    assert time.monotonic() - started >= 0.05


def test_a_waiter_wakes_when_another_thread_completes_the_record() -> None:
    deliveries = Deliveries()
    future = _record(deliveries)
    answer = threading.Timer(0.05, deliveries.complete, ([future], [_stored(1)]))
    answer.start()
    assert future.result(timeout=30).offset == 1
    answer.join()


def test_callbacks_run_once_on_completion_and_at_once_when_added_after() -> None:
    deliveries = Deliveries()
    future = _record(deliveries)
    calls: list[tuple[str, FutureRecordMetadata]] = []
    future.add_done_callback(lambda f: calls.append(("before", f)))
    assert calls == []
    deliveries.complete([future], [_stored(1)])
    assert calls == [("before", future)]
    future.add_done_callback(lambda f: calls.append(("after", f)))
    assert calls == [("before", future), ("after", future)]
    deliveries.complete([future], [ValueError("late")])  # a second outcome is ignored
    assert len(calls) == 2 and future.result().offset == 1


def test_a_failing_callback_is_logged_and_the_others_still_run(
        caplog: pytest.LogCaptureFixture) -> None:
    deliveries = Deliveries()
    future = _record(deliveries)
    ran: list[int] = []

    def broken(f: FutureRecordMetadata) -> None:
        raise RuntimeError("callback bug")

    future.add_done_callback(broken)
    future.add_done_callback(lambda f: ran.append(1))
    deliveries.complete([future], [_stored(1)])
    assert ran == [1]
    assert "exception calling callback" in caplog.text and "callback bug" in caplog.text


def test_a_record_cannot_be_cancelled() -> None:
    future = _record(Deliveries())
    assert future.cancel() is False and future.cancelled() is False
    assert future.running()


def test_one_complete_answers_every_waiter_on_a_requests_records() -> None:
    deliveries = Deliveries()
    futures = [_record(deliveries) for _ in range(50)]
    done = threading.Barrier(51)
    results: list[int] = []
    lock = threading.Lock()

    def wait(f: FutureRecordMetadata) -> None:
        offset = f.result(timeout=30).offset
        with lock:
            results.append(offset)
        done.wait(30)

    threads = [threading.Thread(target=wait, args=(f,)) for f in futures]
    for t in threads:
        t.start()
    deliveries.complete(futures, [_stored(i) for i in range(50)])
    done.wait(30)
    assert sorted(results) == list(range(50))


def test_deliveries_wait_for_many_records_with_a_deadline() -> None:
    deliveries = Deliveries()
    futures = [_record(deliveries) for _ in range(3)]
    deliveries.complete(futures[:2], [_stored(0), _stored(1)])
    assert not deliveries.wait(futures, 0.02)
    deliveries.complete(futures[2:], [_stored(2)])
    assert deliveries.wait(futures, 0)


def test_a_tally_counts_its_records_before_the_waiters_wake() -> None:
    deliveries = Deliveries()
    tally = Tally()
    records = [_record(deliveries, tally) for _ in range(4)]
    tally._add(4)
    error = ValueError("refused")
    deliveries.complete(records[:3], [_stored(0), _stored(1), error])
    assert (tally.sent, tally.acked, tally.failed, tally.failures) == (4, 2, 1, [error])
    assert not tally.wait(0)
    deliveries.complete(records[3:], [_stored(3)])
    assert tally.wait(0) and tally.acked == 3


def test_a_waiting_record_is_not_tracked_by_the_garbage_collector() -> None:
    """Up to max_buffered_records of them wait in a producer: untracked, they do not make
    every collection slower; once it holds an error (or callbacks) it is tracked again,
    so that cycles through it are collected."""
    deliveries = Deliveries()
    future = _record(deliveries)
    assert not gc.is_tracked(future)
    deliveries.complete([future], [_stored(1)])
    assert not gc.is_tracked(future)
    failed = _record(deliveries)
    deliveries.fail([failed], ValueError("x"))
    assert gc.is_tracked(failed)
