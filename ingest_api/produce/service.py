"""Produce: requests to planned runs, runs to appenders, and the acknowledgement.

``ProducePlanner`` checks the records and cuts them into runs, each partition's
``PartitionAppender`` appends them, and the service answers per ``acks``: acks=all
waits for the group commit, acks=1 for the append, acks=0 for neither.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Coroutine, Sequence
from typing import Any, Literal, Protocol

import numpy as np

from ingest_api.models import ProduceRecord
from ingest_api.notifier import AppendNotifier
from ingest_api.produce.appender import PartitionAppender
from ingest_api.produce.planner import ProducePlanner
from ingest_api.produce.runs import Piece, ProduceResult, Run
from log_tables.errors import LakelogError, NotLeaderError
from log_tables.hot.log_manager import LogManager
from log_tables.hot.partition_log import PartitionLog
from log_tables.registry import TopicMetadata

log = logging.getLogger(__name__)

Acks = Literal["0", "1", "all"]


class ProduceService:
    """Turns decoded produce requests into appends and per-record results."""

    def __init__(self, manager: LogManager, notifier: AppendNotifier, max_queued: int) -> None:
        self.manager = manager
        self.notifier = notifier
        self.max_queued = max_queued
        self.planner = ProducePlanner(manager)
        self._appenders: dict[str, PartitionAppender] = {}

    def appender(self, plog: PartitionLog) -> PartitionAppender:
        appender = self._appenders.get(plog.name)
        if appender is None or appender.plog is not plog:
            appender = PartitionAppender(plog, self.notifier, self.max_queued)
            self._appenders[plog.name] = appender
        return appender

    async def produce(self, meta: TopicMetadata, records: Sequence[ProduceRecord], acks: Acks,
                      route: Route | None = None) -> ProduceResult:
        """Append the records; per record a partition and offset, or an error."""
        return await self.start(meta, records, acks, route)

    def start(self, meta: TopicMetadata, records: Sequence[ProduceRecord], acks: Acks,
              route: Route | None = None) -> Coroutine[Any, Any, ProduceResult]:
        """Plan and queue the records now; await the result for the acknowledgement.

        What is awaited holds no reference to ``records``: a caller that drops its
        own can let the decoded request go while the appends and syncs are waited for.
        In a cluster, ``route`` sends the runs of partitions led elsewhere to their
        leaders and checks this broker still leads the others before they are answered.
        """
        result, runs = self.planner.plan(meta, records)
        submitted: list[tuple[Run, asyncio.Future[list[Piece]]]] = []
        elsewhere: list[Run] = []
        epochs: dict[int, int] = {}
        for run in runs:
            try:
                if route is not None:
                    epoch = route.local_epoch(meta.name, run.partition)
                    if epoch is None:
                        elsewhere.append(run)
                        continue
                    epochs[run.partition] = epoch
                plog = self.manager.log(meta.name, run.partition)
                submitted.append((run, self.appender(plog).submit(run)))
            except LakelogError as exc:
                _fail_run(result, run, exc)
        # The other leaders' parts are sent now, beside the local appends.
        forwarded = asyncio.ensure_future(route.forward(meta.name, records, elsewhere, result,
                                                        acks)) \
            if route is not None and elsewhere else None
        return self._finish(meta, result, submitted, acks, route, epochs, forwarded)

    async def _finish(self, meta: TopicMetadata, result: ProduceResult,
                      submitted: list[tuple[Run, asyncio.Future[list[Piece]]]],
                      acks: Acks, route: Route | None = None,
                      epochs: dict[int, int] | None = None,
                      forwarded: Awaitable[None] | None = None) -> ProduceResult:
        try:
            await self._finish_local(meta, result, submitted, acks)
        finally:
            if forwarded is not None:
                await forwarded
        if route is not None and epochs:
            for p, epoch in epochs.items():
                if not route.still_leads(meta.name, p, epoch):
                    _unacknowledge(result, p, meta.name)
        return result

    async def _finish_local(self, meta: TopicMetadata, result: ProduceResult,
                            submitted: list[tuple[Run, asyncio.Future[list[Piece]]]],
                            acks: Acks) -> None:
        if acks == "0":
            for _, fut in submitted:
                fut.add_done_callback(_log_unacked_failure)
            return
        durable: dict[int, tuple[PartitionLog, int]] = {}
        for run, fut in submitted:
            try:
                pieces = await fut
            except LakelogError as exc:
                _fail_run(result, run, exc)
                continue
            for first, count, outcome, start in pieces:
                indices = run.indices[first:first + count]
                if isinstance(outcome, Exception):
                    if not isinstance(outcome, LakelogError):
                        raise outcome
                    for i in indices.tolist():
                        result.errors[i] = outcome
                    continue
                info = outcome
                if info.duplicate_offsets:
                    offsets = np.array([info.offset_of(start + j) for j in range(count)],
                                       np.int64)
                else:
                    offsets = np.arange(info.base_offset + start,
                                        info.base_offset + start + count)
                result.offsets[indices] = offsets
                if info.log_append_time_ms >= 0:
                    result.timestamps[indices] = info.log_append_time_ms
                end = int(offsets.max()) + 1
                prev = durable.get(run.partition)
                if prev is None or end > prev[1]:
                    durable[run.partition] = (self.manager.log(meta.name, run.partition), end)
        if acks == "all" and durable:
            await self._wait_durable(durable, result)

    async def _wait_durable(self, targets: dict[int, tuple[PartitionLog, int]],
                            result: ProduceResult) -> None:
        """Wait for the group commit of every partition written; a failed sync fails its records."""
        partitions = list(targets)
        outcomes: list[BaseException | None]
        try:
            outcomes = await asyncio.wrap_future(
                self.manager.group_commit.request_many(list(targets.values())))
        except LakelogError as exc:
            outcomes = [exc] * len(partitions)
        for p, outcome in zip(partitions, outcomes, strict=True):
            if outcome is not None:
                err = outcome if isinstance(outcome, LakelogError) else LakelogError(
                    f"flush of partition {p} failed: {outcome}")
                for i in np.flatnonzero((result.partitions == p) & (result.offsets >= 0)).tolist():
                    result.errors[i] = err
                    result.offsets[i] = -1


class Route(Protocol):
    """Where a partition's records go in a cluster (ingest_api.cluster_link)."""

    def local_epoch(self, topic: str, partition: int) -> int | None:
        """The leader epoch when this broker leads; None when another does (forward)."""

    def forward(self, topic: str, records: Sequence[ProduceRecord], runs: list[Run],
                result: ProduceResult, acks: Acks) -> Awaitable[None]:
        """Send the runs' records to their leaders; fill ``result`` from the answers."""

    def still_leads(self, topic: str, partition: int, epoch: int) -> bool: ...


def _unacknowledge(result: ProduceResult, partition: int, topic: str) -> None:
    """This broker lost the partition's leadership (or its ZooKeeper lease) while the
    records were appended: they are not acknowledged (the producer sends them again)."""
    err = NotLeaderError(f"{topic}-{partition}: this broker stopped leading it before the "
                         f"records were acknowledged; they are not (send them again)")
    for i in np.flatnonzero(result.partitions == partition).tolist():
        if i not in result.errors:
            result.errors[i] = err
            result.offsets[i] = -1


def _fail_run(result: ProduceResult, run: Run, exc: LakelogError) -> None:
    for i in run.indices.tolist():
        result.errors[i] = exc


def _log_unacked_failure(future: asyncio.Future[list[Piece]]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("acks=0 append failed: %s", future.exception())
