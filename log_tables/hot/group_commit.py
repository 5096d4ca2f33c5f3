"""Group commit: many waiters for durability share one fdatasync per partition.

Appends return once their bytes are in the page cache. A caller that needs
acks=all asks ``GroupCommit.request(log, offset)`` (or ``request_many`` for the
partitions of one request) and waits on the returned future; one flusher thread syncs each partition with waiters once per round,
so N concurrent requests on a partition cost about one sync, not N.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from log_tables.errors import LogClosedError, QueueFullError
from log_tables.hot.partition_log import PartitionLog


class GroupCommit:
    """A bounded queue of durability requests served by one flusher thread."""

    def __init__(self, max_pending: int = 100_000, name: str = "lakelog-group-commit",
                 sync_threads: int = 8) -> None:
        self.max_pending = max_pending
        # fdatasync releases the GIL: the partitions of one round sync in parallel.
        self._pool = ThreadPoolExecutor(sync_threads, thread_name_prefix=f"{name}-sync")
        self._cond = threading.Condition()
        self._pending: list[tuple[PartitionLog, int, Callable[[int | BaseException], None]]] = []
        self._closed = False
        self.rounds = 0
        self.syncs = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def request(self, log: PartitionLog, offset: int) -> Future[int]:
        """A future that completes once every offset below ``offset`` of ``log`` is durable."""
        future: Future[int] = Future()
        if log.flushed_offset >= offset:
            future.set_result(log.flushed_offset)
            return future

        def done(outcome: int | BaseException) -> None:
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        self._enqueue([(log, offset, done)])
        return future

    def request_many(self, targets: Sequence[tuple[PartitionLog, int]]
                     ) -> Future[list[BaseException | None]]:
        """One future for several logs (one wake-up for the waiter, however many partitions
        a request wrote): it completes once each log is durable up to its offset, with,
        per target in order, None or the error its sync failed with."""
        future: Future[list[BaseException | None]] = Future()
        outcomes: list[BaseException | None] = [None] * len(targets)
        waiting = [i for i, (log, offset) in enumerate(targets) if log.flushed_offset < offset]
        if not waiting:
            future.set_result(outcomes)
            return future
        left = [len(waiting)]
        lock = threading.Lock()

        def done_for(i: int) -> Callable[[int | BaseException], None]:
            def done(outcome: int | BaseException) -> None:
                if isinstance(outcome, BaseException):
                    outcomes[i] = outcome
                with lock:
                    left[0] -= 1
                    finished = left[0] == 0
                if finished:
                    future.set_result(outcomes)
            return done
        self._enqueue([(targets[i][0], targets[i][1], done_for(i)) for i in waiting])
        return future

    def _enqueue(self, items: list[tuple[PartitionLog, int, Callable[[int | BaseException], None]]]
                 ) -> None:
        with self._cond:
            if self._closed:
                raise LogClosedError("group commit is closed")
            if len(self._pending) + len(items) > self.max_pending:
                raise QueueFullError(
                    f"{len(self._pending)} durability requests are waiting; try again shortly")
            self._pending.extend(items)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending and self._closed:
                    return
                batch, self._pending = self._pending, []
            self.rounds += 1
            by_log: dict[PartitionLog, list[tuple[int, Callable[[int | BaseException], None]]]] = (
                defaultdict(list))
            for log, offset, done in batch:
                by_log[log].append((offset, done))
            jobs = [(waiters, log.flushed_offset,
                     self._pool.submit(log.flush, max(offset for offset, _ in waiters)))
                    for log, waiters in by_log.items()]
            for waiters, before, job in jobs:
                outcome: int | BaseException
                try:
                    outcome = job.result()
                except Exception as exc:  # every waiter must hear of the failure
                    outcome = exc
                else:
                    if outcome != before:
                        self.syncs += 1
                for _, done in waiters:
                    done(outcome)

    def close(self) -> None:
        """Serve what is queued, then stop the flusher thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
        self._pool.shutdown()
