"""Produce: requests to planned runs, runs to appenders, and the acknowledgement.

``ProducePlanner`` checks the records and cuts them into runs, each partition's
``PartitionAppender`` appends them, and the service answers per ``acks``: acks=all
waits for the group commit (and, for a partition with more than one replica, for every
in-sync replica), acks=1 for the append, acks=0 for neither.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from ingest_api.broker.notifier import AppendNotifier
from ingest_api.broker.produce.appender import PartitionAppender
from ingest_api.broker.produce.planner import ProducePlanner
from ingest_api.broker.produce.request import ProduceRequest
from ingest_api.broker.produce.runs import Piece, ProduceResult, Run
from log_tables.errors import (
    InvalidRecordError,
    InvalidTxnStateError,
    LakelogError,
    NotLeaderError,
    RequestTimedOutError,
)
from log_tables.hot.log_manager import LogManager
from log_tables.hot.partition_log import PartitionLog
from log_tables.registry import TopicMetadata

if TYPE_CHECKING:
    from cluster.replica_manager import ReplicaManager
    from cluster.replicas import LeaderPartition

log = logging.getLogger(__name__)

Acks = Literal["0", "1", "all"]


class ProduceService:
    """Turns decoded produce requests into appends and per-record results."""

    def __init__(self, manager: LogManager, notifier: AppendNotifier, max_queued: int, *,
                 acks_all_fsync: str = "when-alone", timeout_s: float = 30.0) -> None:
        self.manager = manager
        self.notifier = notifier
        self.max_queued = max_queued
        self.acks_all_fsync = acks_all_fsync
        self.timeout_s = timeout_s
        self.planner = ProducePlanner(manager)
        self.replicas: ReplicaManager | None = None
        """A cluster's: the partitions this broker leads with more than one replica."""
        self.transactions: TxnVerifier | None = None
        """Says whether a transactional write belongs to an open transaction."""
        self._appenders: dict[str, PartitionAppender] = {}

    def appender(self, plog: PartitionLog, topic: str = "", partition: int = 0
                 ) -> PartitionAppender:
        appender = self._appenders.get(plog.name)
        if appender is None or appender.plog is not plog:
            appender = PartitionAppender(plog, self.notifier, self.max_queued,
                                         lambda: self._appended(topic, partition))
            self._appenders[plog.name] = appender
        return appender

    def appended(self, topic: str, partition: int) -> None:
        """Records (or a marker) were appended to a partition this broker leads: a
        replicated one's high watermark may move now (its only in-sync replica)."""
        self._appended(topic, partition)

    def _appended(self, topic: str, partition: int) -> None:
        lp = self.replicas.leader(topic, partition) if self.replicas is not None else None
        if lp is not None and lp.maybe_advance() and self.replicas is not None:
            self.replicas.published(lp.plog)

    async def produce(self, meta: TopicMetadata, request: ProduceRequest, acks: Acks,
                      route: Route | None = None, *, atomic: bool = False) -> ProduceResult:
        """Append the records; per record a partition and offset, or an error. ``atomic``:
        if the plan refuses any record, none is appended (a Kafka batch is all or none)."""
        return await self.start(meta, request, acks, route, atomic=atomic)

    def start(self, meta: TopicMetadata, request: ProduceRequest, acks: Acks,
              route: Route | None = None, *, atomic: bool = False
              ) -> Coroutine[Any, Any, ProduceResult]:
        """Plan and queue the records now; await the result for the acknowledgement.

        What is awaited holds no reference to ``request``: a caller that drops its
        own can let the request go while the appends and syncs are waited for.
        In a cluster, ``route`` sends the runs of partitions led elsewhere to their
        leaders and checks this broker still leads the others before they are answered.
        """
        result, runs = self.planner.plan(meta, request)
        if atomic and result.errors:
            runs = []
        submitted: list[tuple[Run, asyncio.Future[list[Piece]]]] = []
        elsewhere: list[Run] = []
        epochs: dict[int, int] = {}
        leaders: dict[int, LeaderPartition] = {}
        tid = request.transactional_id
        for run in runs:
            try:
                epoch = None
                if route is not None:
                    epoch = route.local_epoch(meta.name, run.partition)
                    if epoch is None:
                        elsewhere.append(run)  # its leader checks a transactional one
                        continue
                    epochs[run.partition] = epoch
                if tid is not None:
                    self._transactional(tid, meta.name, run, request.verified)
                plog = self.manager.log(meta.name, run.partition)
                if self.replicas is not None and (lp := self.replicas.for_append(
                        meta.name, run.partition, epoch)) is not None:
                    if acks == "all":
                        self.replicas.check_min_isr(lp)
                    leaders[run.partition] = lp
                submitted.append((run, self.appender(plog, meta.name, run.partition).submit(run)))
            except LakelogError as exc:
                _fail_run(result, run, exc)
        # The other leaders' parts are sent now, beside the local appends.
        forwarded = asyncio.ensure_future(route.forward(meta.name, request, elsewhere, result,
                                                        acks)) \
            if route is not None and elsewhere else None
        return self._finish(meta, result, submitted, acks, route, epochs, forwarded, leaders)

    def _transactional(self, tid: str, topic: str, run: Run, verified: set[int]) -> None:
        """A run of a transactional write: its partition must be in the producer's open
        transaction (KIP-890), which the coordinator says (``TxnVerifier``)."""
        if run.producer is None:
            raise InvalidRecordError("a transactional write needs producer_id, "
                                     "producer_epoch and sequence on every record")
        if self.transactions is None:
            raise InvalidTxnStateError("this broker has no transaction coordinator")
        pid, epoch, _ = run.producer
        if run.partition not in verified:
            self.transactions.verify(tid, pid, epoch, topic, run.partition)
        run.transactional = True

    async def _finish(self, meta: TopicMetadata, result: ProduceResult,
                      submitted: list[tuple[Run, asyncio.Future[list[Piece]]]],
                      acks: Acks, route: Route | None = None,
                      epochs: dict[int, int] | None = None,
                      forwarded: Awaitable[None] | None = None,
                      leaders: dict[int, LeaderPartition] | None = None) -> ProduceResult:
        try:
            await self._finish_local(meta, result, submitted, acks, leaders or {})
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
                            acks: Acks, leaders: dict[int, LeaderPartition]) -> None:
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
                    end = int(offsets.max()) + 1
                else:
                    first_offset = info.base_offset + start
                    end = first_offset + count
                    offsets = np.arange(first_offset, end)
                result.offsets[indices] = offsets
                if info.log_append_time_ms >= 0:
                    result.timestamps[indices] = info.log_append_time_ms
                if acks != "all":  # nothing waits for a sync
                    continue
                prev = durable.get(run.partition)
                if prev is None or end > prev[1]:
                    durable[run.partition] = (self.manager.log(meta.name, run.partition), end)
        if acks == "all" and durable:
            await self._wait_acked(meta.name, durable, result, leaders)

    async def _wait_acked(self, topic: str, targets: dict[int, tuple[PartitionLog, int]],
                          result: ProduceResult, leaders: dict[int, LeaderPartition]) -> None:
        """acks=all: a replicated partition's records once every in-sync replica has them
        (and the leader's fsync, per ``acks_all_fsync``), under the leader state they were
        appended under (a new one, at another epoch, fails them: the producer sends them
        again); one replica's once fsynced."""
        synced: dict[int, tuple[PartitionLog, int]] = {}
        replicated: list[tuple[int, asyncio.Future[int]]] = []
        for p, (plog, end) in targets.items():
            lp = leaders.get(p)
            if lp is None:
                synced[p] = (plog, end)
                continue
            assert self.replicas is not None
            replicated.append((p, asyncio.wrap_future(
                lp.wait(end, self.replicas.broker.min_insync_replicas(topic)))))
            if self.acks_all_fsync == "always" or lp.isr == {lp.broker_id}:
                synced[p] = (plog, end)
        fsynced = asyncio.ensure_future(self._wait_durable(synced, result)) if synced else None
        if replicated:
            _, pending = await asyncio.wait([f for _, f in replicated],
                                            timeout=self.timeout_s)
            for p, fut in replicated:
                if fut in pending:
                    fut.cancel()
                    err: BaseException | None = RequestTimedOutError(
                        f"{topic}-{p}: the in-sync replicas did not all have the records "
                        f"within {self.timeout_s:g} s; not acknowledged (they may still be)")
                else:
                    err = fut.exception()
                if err is not None:
                    _fail_partition(result, p, err if isinstance(err, LakelogError)
                                    else LakelogError(f"{topic}-{p}: {err}"))
        if fsynced is not None:
            await fsynced

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
                _fail_partition(result, p, outcome if isinstance(outcome, LakelogError)
                                else LakelogError(f"flush of partition {p} failed: {outcome}"))


class Route(Protocol):
    """Where a partition's records go in a cluster (ingest_api.broker.cluster_link)."""

    def local_epoch(self, topic: str, partition: int) -> int | None:
        """The leader epoch when this broker leads; None when another does (forward)."""

    def forward(self, topic: str, request: ProduceRequest, runs: list[Run],
                result: ProduceResult, acks: Acks) -> Awaitable[None]:
        """Send the runs' records to their leaders; fill ``result`` from the answers."""

    def still_leads(self, topic: str, partition: int, epoch: int) -> bool: ...


class TxnVerifier(Protocol):
    def verify(self, tid: str, producer_id: int, epoch: int, topic: str,
               partition: int) -> None: ...


def _unacknowledge(result: ProduceResult, partition: int, topic: str) -> None:
    """This broker lost the partition's leadership (or its ZooKeeper lease) while the
    records were appended: they are not acknowledged (the producer sends them again)."""
    err = NotLeaderError(f"{topic}-{partition}: this broker stopped leading it before the "
                         f"records were acknowledged; they are not (send them again)")
    for i in np.flatnonzero(result.partitions == partition).tolist():
        if i not in result.errors:
            result.errors[i] = err
            result.offsets[i] = -1


def _fail_partition(result: ProduceResult, partition: int, err: LakelogError) -> None:
    """The partition's appended records are not acknowledged (an error each)."""
    for i in np.flatnonzero((result.partitions == partition) & (result.offsets >= 0)).tolist():
        result.errors[i] = err
        result.offsets[i] = -1


def _fail_run(result: ProduceResult, run: Run, exc: LakelogError) -> None:
    for i in run.indices.tolist():
        result.errors[i] = exc


def _log_unacked_failure(future: asyncio.Future[list[Piece]]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("acks=0 append failed: %s", future.exception())
