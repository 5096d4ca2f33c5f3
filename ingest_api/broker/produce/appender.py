"""Appending a partition's runs: coalesced into few batches, halved when too large.

Runs queued during two event-loop turns (more while each turn brings more, up to
``MAX_WAIT_TURNS``) are appended as few batches as the partition's bound allows (many
concurrent requests cost one write). Sizes were only
estimated when planning: a batch the log still finds too large is split in two and tried
again (Kafka's producer splits a batch its broker refuses as too large), so only a record
that cannot fit alone is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pyarrow as pa

from ingest_api.broker.notifier import AppendNotifier
from ingest_api.broker.produce.planner import BATCH_OVERHEAD, batch_limit
from ingest_api.broker.produce.runs import Piece, Run, rows_batch
from log_tables.errors import QueueFullError, RecordTooLargeError
from log_tables.hot.partition_log import AppendInfo, PartitionLog
from log_tables.hot.producer_state import seq_add

MAX_WAIT_TURNS = 8
"""Loop turns a queued run waits at most for others to join its batch."""


class PartitionAppender:
    """Coalesces the runs queued during two event-loop turns into batches of one partition."""

    def __init__(self, plog: PartitionLog, notifier: AppendNotifier, max_queued: int,
                 on_appended: Callable[[], None] | None = None) -> None:
        self.plog = plog
        self.notifier = notifier
        self.max_queued = max_queued
        self.on_appended = on_appended
        """Called after each round of appends (a replicated partition's leader moves its
        high watermark when it is the only in-sync replica)."""
        self._queue: list[tuple[Run, asyncio.Future[list[Piece]]]] = []
        self._queued = 0
        self._scheduled = False
        self._turns = 0
        self._seen = 0

    def submit(self, run: Run) -> asyncio.Future[list[Piece]]:
        """Queue a run; the future gives the append and the run's index in its batch."""
        count = len(run.indices)
        if self._queued + count > self.max_queued:
            raise QueueFullError(
                f"{self.plog.name}: {self._queued} records are already waiting to be appended")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Piece]] = loop.create_future()
        self._queue.append((run, future))
        self._queued += count
        if not self._scheduled:
            self._scheduled = True
            self._turns = 0
            self._seen = len(self._queue)
            loop.call_soon(self._tick)
        return future

    def _tick(self) -> None:
        """A loop turn since the first run queued: append after two turns, or while
        runs keep coming (a busy server: more requests' runs in each batch, fewer
        appends) after the first turn that adds none, at most ``MAX_WAIT_TURNS``."""
        self._turns += 1
        grew = len(self._queue) > self._seen
        self._seen = len(self._queue)
        if self._turns >= 2 and (not grew or self._turns >= MAX_WAIT_TURNS):
            self._drain()
        else:
            asyncio.get_running_loop().call_soon(self._tick)

    def _drain(self) -> None:
        items, self._queue = self._queue, []
        self._queued = 0
        self._scheduled = False
        limit = batch_limit(self.plog.config)[0] - BATCH_OVERHEAD
        i = 0
        while i < len(items):
            group = [items[i]]
            size = items[i][0].size
            i += 1
            if group[0][0].producer is None and not group[0][0].transactional:
                rows = group[0][0].rows is not None
                while i < len(items) and items[i][0].producer is None and (
                        (items[i][0].rows is not None) == rows) and (
                        size + items[i][0].size <= limit):
                    group.append(items[i])
                    size += items[i][0].size
                    i += 1
            self._append(group)
        if self.on_appended is not None:
            self.on_appended()
        self.notifier.notify(self.plog.name)

    def _append(self, group: list[tuple[Run, asyncio.Future[list[Piece]]]]) -> None:
        run0 = group[0][0]
        try:  # the batch is made inside: a failure there too reaches every waiter
            if run0.rows is not None:
                batch = rows_batch([row for r, _ in group for row in r.rows or []])
            elif len(group) == 1:
                batch = run0.to_batch()
            else:
                batch = pa.concat_batches([r.to_batch() for r, _ in group])
            info = _append_run(self.plog, batch, run0)
        except RecordTooLargeError as exc:
            if len(group) > 1:  # the estimate was off: append the runs one by one
                for item in group:
                    self._append([item])
                return
            run, future = group[0]
            if len(run.indices) == 1:
                _fail(group, exc)
            elif not future.done():
                future.set_result(self._append_halves(run, batch, 0))
            return
        except Exception as exc:  # every waiter must hear of the failure
            _fail(group, exc)
            return
        start = 0
        for run, future in group:
            if not future.done():
                future.set_result([(0, len(run.indices), info, start)])
            start += len(run.indices)

    def _append_halves(self, run: Run, batch: pa.RecordBatch, first: int) -> list[Piece]:
        """Append a run's records ``batch`` (from its ``first``) in two halves, each split
        again while the log finds it too large; one record too large alone is refused.

        An idempotent run's halves keep dense sequences; once a record is refused, the
        log refuses the rest of that producer's run as out of order, as Kafka's broker
        does for the batches after a failed one (the client re-sequences and resends).
        """
        pieces: list[Piece] = []
        half = batch.num_rows // 2
        for lo, count in ((0, half), (half, batch.num_rows - half)):
            part = batch.slice(lo, count)
            try:
                pieces.append((first + lo, count, _append_run(self.plog, part, run, first + lo),
                               0))
            except RecordTooLargeError as exc:
                if count == 1:
                    pieces.append((first + lo, 1, exc, 0))
                else:
                    pieces.extend(self._append_halves(run, part, first + lo))
            except Exception as exc:
                pieces.append((first + lo, count, exc, 0))
        return pieces


def _append_run(plog: PartitionLog, batch: pa.RecordBatch, run: Run, first: int = 0
                ) -> AppendInfo:
    """Append ``batch``, the run's records from its ``first``, with its producer's fields."""
    if run.producer is None:
        return plog.append(batch)
    pid, epoch, seq = run.producer
    return plog.append(batch, producer_id=pid, producer_epoch=epoch,
                       base_sequence=seq_add(seq, first), transactional=run.transactional)


def _fail(group: list[tuple[Run, asyncio.Future[list[Piece]]]], exc: Exception) -> None:
    for _, future in group:
        if not future.done():
            future.set_exception(exc)

