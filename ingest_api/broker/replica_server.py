"""The leader's end of the replica protocol (``cluster.replica_protocol``): followers fetch
stored batches and ask where leader epochs end. A front decodes the requests, checks that
a broker (not a user) asks, and encodes the answers.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from cluster.replica_protocol import (
    MAX_FETCH_BYTES,
    MAX_WAIT_MS,
    EpochAnswer,
    EpochEnd,
    EpochRequest,
    FetchAnswer,
    FetchedPartition,
    FetchPartition,
    FetchRequest,
    epochs_touching,
)
from cluster.replicas import LeaderPartition
from ingest_api.broker.notifier import AppendNotifier
from log_tables.errors import (
    FencedLeaderEpochError,
    LakelogError,
    NotAClusterError,
    NotLeaderError,
    OffsetOutOfRangeError,
    UnknownLeaderEpochError,
)

if TYPE_CHECKING:
    from cluster.replica_manager import ReplicaManager
    from ingest_api.broker.cluster_link import ClusterLink


class ReplicaServer:
    """Serves followers the partitions this broker leads, fenced by leader epoch."""

    def __init__(self, link: ClusterLink | None, notifier: AppendNotifier) -> None:
        self.link = link
        self.notifier = notifier

    def require_cluster(self) -> None:
        """This broker replicates (is a broker of a cluster); else ``not_a_cluster``."""
        if self.link is None or self.link.replicas is None:
            raise NotAClusterError("this server is not a broker of a cluster: nothing to "
                                   "replicate")

    def _replicas(self) -> tuple[ClusterLink, ReplicaManager]:
        self.require_cluster()
        assert self.link is not None and self.link.replicas is not None
        return self.link, self.link.replicas

    async def fetch(self, req: FetchRequest) -> tuple[FetchAnswer, list[bytes]]:
        """The partitions' stored batches from the follower's offsets; waits (up to
        ``max_wait_ms``) for ``min_bytes`` unless a partition fails."""
        budget = max(1, min(req.max_bytes, MAX_FETCH_BYTES))
        per_partition = max(1, min(req.partition_max_bytes, budget))
        deadline = time.monotonic() + max(0, min(req.max_wait_ms, MAX_WAIT_MS)) / 1000
        names = [f"{p.topic}-{p.partition}" for p in req.partitions]
        while True:
            answers, data, total, failed = self._serve(req.replica_id, req.partitions,
                                                       budget, per_partition)
            left = deadline - time.monotonic()
            if total >= req.min_bytes or failed or left <= 0:
                return FetchAnswer(answers), data
            await self.notifier.wait_any(names, left)

    def epoch_end(self, req: EpochRequest) -> EpochAnswer:
        """For each partition, where the asked leader epoch (or the largest below it)
        ends in this leader's log (Kafka's OffsetsForLeaderEpoch)."""
        out = []
        for q in req.partitions:
            try:
                lp = self._leader(q.topic, q.partition, q.current_leader_epoch)
            except LakelogError as exc:
                out.append(EpochEnd(q.topic, q.partition, exc.code, exc.message, -1, -1))
                continue
            found = lp.plog.leader_epochs.end_offset_for(q.leader_epoch,
                                                         lp.plog.log_end_offset)
            out.append(EpochEnd(q.topic, q.partition, None, "", found.epoch,
                                found.end_offset))
        return EpochAnswer(out)

    def _leader(self, topic: str, partition: int, epoch: int) -> LeaderPartition:
        """The partition's leader state here at exactly ``epoch``, or the error that says
        why not (Kafka's fencing of replica fetches by leader epoch)."""
        link, replicas = self._replicas()
        lp = replicas.leader(topic, partition)
        if lp is None or not link.broker.session.has_lease:
            raise NotLeaderError(f"broker {link.broker_id} does not lead {topic}-{partition}")
        if epoch < lp.leader_epoch:
            raise FencedLeaderEpochError(f"{topic}-{partition}: leader epoch {epoch} is older "
                                         f"than the leader's, {lp.leader_epoch}")
        if epoch > lp.leader_epoch:
            raise UnknownLeaderEpochError(f"{topic}-{partition}: leader epoch {epoch} is "
                                          f"newer than this broker knows, {lp.leader_epoch}")
        return lp

    def _serve(self, replica: int, parts: list[FetchPartition], budget: int,
               per_partition: int) -> tuple[list[FetchedPartition], list[bytes], int, bool]:
        """One pass over the partitions: (answers, their bytes, bytes, whether any
        failed)."""
        _, replicas = self._replicas()
        answers: list[FetchedPartition] = []
        data: list[bytes] = []
        total = 0
        failed = False
        for part in parts:
            lp = None
            try:
                lp = self._leader(part.topic, part.partition, part.leader_epoch)
                plog = lp.plog
                if lp.on_fetch(replica, part.fetch_offset):
                    replicas.published(plog)
                got = plog.read_raw(part.fetch_offset,
                                    max(1, min(per_partition, budget - total))) \
                    if total < budget else None
            except LakelogError as exc:
                answers.append(_failed(part, exc, lp))
                failed = True
                continue
            chunk = got.data if got is not None else b""
            first = got.first_offset if got is not None else part.fetch_offset
            end = got.next_offset if got is not None else part.fetch_offset
            answers.append(FetchedPartition(
                part.topic, part.partition, None, "", plog.high_watermark,
                plog.log_start_offset, plog.log_end_offset,
                epochs_touching(plog.leader_epochs.entries, first, max(end, first + 1)),
                first, len(chunk)))
            data.append(chunk)
            total += len(chunk)
        return answers, data, total, failed


def _failed(part: FetchPartition, exc: LakelogError, lp: LeaderPartition | None
            ) -> FetchedPartition:
    """A partition's error; an offset out of range says where the leader's log is."""
    start = end = -1
    if isinstance(exc, OffsetOutOfRangeError) and lp is not None:
        start, end = lp.plog.log_start_offset, lp.plog.log_end_offset
    return FetchedPartition(part.topic, part.partition, exc.code, exc.message, -1, start, end,
                            [], -1, 0)
