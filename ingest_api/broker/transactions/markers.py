"""Writing the markers that end a transaction in each partition it added (Kafka's
WriteTxnMarkers).

A marker is written by the partition's leader as an acks=all write: appended, then
waited for until every in-sync replica has it (a partition of one replica: fsynced), so
that no failover and no crash takes it back once the coordinator moves on; the
partition's waiting fetches are woken (its last stable offset moved). In a cluster the
coordinator sends a partition led by another broker its marker through ``peers``; one
whose leader is moving is tried again within ``MARKER_RETRY_S`` (the transaction stays
``Prepare*`` otherwise, and the coordinator tries again later). A partition deleted
meanwhile needs no marker.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Protocol

from ingest_api.broker.notifier import AppendNotifier
from log_tables.errors import (
    BrokerNotAvailableError,
    LeaderNotAvailableError,
    NotLeaderError,
    UnknownPartitionError,
    UnknownTopicError,
)
from log_tables.hot.log_manager import LogManager

if TYPE_CHECKING:
    from ingest_api.broker.cluster_link import ClusterLink
    from ingest_api.broker.produce.service import ProduceService

MARKER_RETRY_S = 10.0
_MOVING = (NotLeaderError, LeaderNotAvailableError, BrokerNotAvailableError)


class Markers(Protocol):
    async def write(self, topic: str, partition: int, producer_id: int, producer_epoch: int,
                    commit: bool, coordinator_epoch: int) -> None:
        """End the producer's transaction in the partition (nothing when a marker of that
        epoch is there: a marker is written once)."""
        ...


class BrokerMarkers:
    """Markers through this broker: its own partitions here, the others' through peers."""

    def __init__(self, manager: LogManager, notifier: AppendNotifier, produce: ProduceService,
                 link: ClusterLink | None = None) -> None:
        self.manager = manager
        self.notifier = notifier
        self.produce = produce
        self.link = link

    async def write(self, topic: str, partition: int, producer_id: int, producer_epoch: int,
                    commit: bool, coordinator_epoch: int) -> None:
        deadline = time.monotonic() + MARKER_RETRY_S
        while True:
            try:
                where = self.link.route(topic, partition, False) if self.link else None
                if where is None or isinstance(where, int):
                    await self.write_here(topic, partition, producer_id, producer_epoch, commit,
                                          coordinator_epoch, where)
                else:
                    assert self.link is not None
                    await self.link.peers.txn(where, "marker", {
                        "topic_name": topic, "partition_id": partition,
                        "producer_id": producer_id, "producer_epoch": producer_epoch,
                        "commit": commit, "coordinator_epoch": coordinator_epoch})
                return
            except (UnknownTopicError, UnknownPartitionError):
                return  # deleted: nothing to end there
            except _MOVING:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    async def write_here(self, topic: str, partition: int, producer_id: int,
                         producer_epoch: int, commit: bool, coordinator_epoch: int,
                         leader_epoch: int | None) -> None:
        """The marker, in a partition this broker leads (at ``leader_epoch``, in a
        cluster), acknowledged as acks=all."""
        plog = self.manager.log(topic, partition)
        produce = self.produce
        lp = produce.replicas.for_append(topic, partition, leader_epoch) \
            if produce.replicas is not None else None
        offset = await asyncio.to_thread(plog.append_marker, producer_id, producer_epoch,
                                         commit, coordinator_epoch)
        if offset is None:
            return
        self.notifier.notify(plog.name)
        if lp is None:
            await asyncio.to_thread(plog.flush, offset + 1)
        else:
            assert produce.replicas is not None
            produce.appended(topic, partition)
            waited = asyncio.wrap_future(
                lp.wait(offset + 1, produce.replicas.broker.min_insync_replicas(topic)))
            try:
                await asyncio.wait_for(waited, produce.timeout_s)
            except TimeoutError:
                raise LeaderNotAvailableError(
                    f"{topic}-{partition}: the in-sync replicas did not take the marker "
                    f"within {produce.timeout_s:g} s; try again") from None
            if lp.isr == {lp.broker_id}:
                await asyncio.to_thread(plog.flush, offset + 1)
        if self.link is not None and leader_epoch is not None and \
                not self.link.still_leads(topic, partition, leader_epoch):
            raise NotLeaderError(f"{topic}-{partition}: leadership moved while its marker "
                                 "was written; written again at the new leader")
