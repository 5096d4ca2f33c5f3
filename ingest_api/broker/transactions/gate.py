"""Transactional writes in a cluster, checked before they are planned: each partition
this broker leads is asked of the transactional id's coordinator, wherever it is, unless
the producer's transaction is open there at that epoch already (KIP-890's check; on a
broker alone, and for a coordinator here, the produce service asks it itself). The
records name their partitions (the Python ``Producer`` always does)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingest_api.broker.produce.request import ProduceRequest
from log_tables.errors import InvalidRecordError, LakelogError
from log_tables.hot.log_manager import LogManager

if TYPE_CHECKING:
    from ingest_api.broker.cluster_link import ClusterLink


async def check_remote(link: ClusterLink, manager: LogManager, tid: str, topic: str,
                       request: ProduceRequest) -> None:
    """Mark the partitions the coordinator (another broker) said the write belongs to
    (``request.verified``); the coordinator's error is raised."""
    if request.partitions is None or request.producers is None or \
            int(request.partitions.min()) < 0 or int(request.producers.ids.min()) < 0:
        raise InvalidRecordError("a transactional write names each record's partition_id and "
                                 "carries its producer's fields")
    coordinator = await link.txn_coordinator_of(tid)
    if coordinator is None:
        return  # here: the produce service asks it
    pid, epoch = int(request.producers.ids[0]), int(request.producers.epochs[0])
    verified: set[int] = set()
    for p in sorted(set(request.partitions.tolist())):
        try:
            here = isinstance(link.route(topic, p, False), int)
        except LakelogError:  # no leader now: the produce service answers for it
            continue
        if not here:
            continue  # forwarded to its leader, which checks it
        producers = manager.log(topic, p).producers
        entry = producers.producers.get(pid)
        if pid not in producers.txns.open or entry is None or entry.epoch != epoch:
            await link.peers.txn(coordinator, "verify", {
                "transactional_id": tid, "producer_id": pid, "producer_epoch": epoch,
                "topic_name": topic, "partition_id": p})
        verified.add(p)
    request.verified = verified
