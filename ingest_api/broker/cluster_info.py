"""Views of the broker and its partitions: a partition's offsets, sizes and placement,
where its leader is, and the broker's health.

In a cluster a partition's offsets and sizes are its leader's: a front asks
``leader_elsewhere`` and reads the partition there (the HTTP front asks the leader's
REST API); where the leader does not answer, this broker's own view stands.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from cluster.model import BrokerInfo
from ingest_api.broker.metadata import METADATA
from ingest_api.broker.peers import PartitionInfo as PartitionInfo
from ingest_api.broker.topics import TopicAdmin
from log_tables.cold.tiered_storage import TieredStorage
from log_tables.errors import UnknownReplicaError
from log_tables.hot.isolation import READ_UNCOMMITTED
from log_tables.hot.log_manager import LogManager

if TYPE_CHECKING:
    from ingest_api.broker.cluster_link import ClusterLink


@dataclass(frozen=True)
class ListedOffset:
    """Kafka's ListOffsets answer for one partition: ``offset`` None where no record is at
    or after the timestamp asked for."""

    offset: int | None
    log_start_offset: int
    high_watermark: int


@dataclass(frozen=True)
class BrokerHealth:
    """A broker of a cluster: its id, its cluster's, and its standing there."""

    broker_id: int
    cluster_id: str | None
    controller: bool
    zookeeper_lease: bool
    ready: bool
    """Registered, with a controller elected and its metadata loaded."""
    leads: int
    """How many partitions it leads."""


@dataclass(frozen=True)
class Health:
    topics: int
    partitions: int
    broker: BrokerHealth | None
    """None: the server runs alone."""

    @property
    def ready(self) -> bool:
        return self.broker is None or self.broker.ready


class ClusterInfo:
    """Read-only views of this broker, its partitions and where they are led."""

    def __init__(self, manager: LogManager, tiered: TieredStorage, topics: TopicAdmin,
                 link: ClusterLink | None = None) -> None:
        self.manager = manager
        self.tiered = tiered
        self.topics = topics
        self.link = link

    def partition_ids(self, topic: str) -> list[int]:
        """The topic's partitions (unknown topic: 404)."""
        self.topics.describe(topic)
        return list(range(len(self.manager.partitions(topic))))

    def require_partition(self, topic: str, partition: int) -> None:
        """The partition exists here (404 if not)."""
        self.manager.log(topic, partition)

    def partition(self, topic: str, partition: int) -> PartitionInfo:
        """The partition as this broker holds it."""
        plog = self.manager.log(topic, partition)
        cold = self.tiered.state(topic, partition)
        placement = METADATA.placement(topic, partition)
        return PartitionInfo(
            topic, partition, placement.leader, tuple(placement.replicas),
            tuple(placement.in_sync), placement.leader_epoch,
            self.tiered.log_start_offset(plog, topic, partition), plog.high_watermark,
            plog.size_bytes, len(plog.segments), plog.log_start_offset,
            cold.tiered_offset if cold else 0, cold.size_bytes if cold else 0)

    def replicas(self, topic: str, partition: int) -> tuple[int, ...]:
        """The brokers holding the partition's replicas, its leader first."""
        self.manager.log(topic, partition)
        return tuple(METADATA.placement(topic, partition).replicas)

    def require_replica(self, topic: str, partition: int, broker_id: int) -> None:
        """``broker_id`` holds a replica of the partition (404 ``unknown_replica`` if not)."""
        replicas = self.replicas(topic, partition)
        if broker_id not in replicas:
            raise UnknownReplicaError(f"broker {broker_id} holds no replica of {topic}/"
                                      f"{partition}; its replicas are on brokers "
                                      f"{list(replicas)}")

    def replicas_on(self, broker_id: int, topics: Iterable[str]) -> list[tuple[str, int]]:
        """The partitions of ``topics`` (those of this broker's registry) that
        ``broker_id`` holds a replica of."""
        wanted = set(topics)
        return [(t.name, p) for t in self.manager.registry.list() if t.name in wanted
                for p in range(t.partitions) if broker_id in METADATA.placement(t.name, p).replicas]

    async def partition_anywhere(self, topic: str, partition: int, forwarded: bool,
                                 principal: str | None = None) -> PartitionInfo:
        """The partition; in a cluster its offsets and sizes are its leader's (asked for
        ``principal``); an offline partition, or a leader that does not answer: this
        broker's own view."""
        leader = self.leader_elsewhere(topic, partition, forwarded)
        if leader is not None:
            assert self.link is not None
            got = await self.link.peers.partition(leader, topic, partition, principal)
            if got is not None:
                return got
        return self.partition(topic, partition)

    def leader_elsewhere(self, topic: str, partition: int, forwarded: bool
                         ) -> BrokerInfo | None:
        """The partition's leader, when it is another registered broker and the request
        came from no broker; None: this broker's own view answers."""
        if self.link is None or forwarded:
            return None
        view = self.link.broker.view
        leader = view.leader(topic, partition)
        return view.broker(leader) if leader != self.link.broker_id else None

    def read_leader(self, topic: str, partition: int, forwarded: bool) -> BrokerInfo | None:
        """The broker a read of the partition belongs to, when that is another (its
        leader); None: this broker leads it, or runs alone. A request another broker
        forwarded is never forwarded again (NOT_LEADER)."""
        if self.link is None:
            return None
        self.topics.describe(topic)
        where = self.link.route(topic, partition, forwarded)
        return None if isinstance(where, int) else where

    async def list_offset(self, topic: str, partition: int,
                          spec: Literal["earliest", "latest", "timestamp"],
                          timestamp: int | None = None) -> ListedOffset:
        """Kafka's ListOffsets: the log start (across both tiers), the high watermark, or
        the first offset with a timestamp at or after ``timestamp`` (epoch ms)."""
        plog = self.manager.log(topic, partition)
        log_start = self.tiered.log_start_offset(plog, topic, partition)
        if spec == "earliest":
            offset: int | None = log_start
        elif spec == "latest":
            offset = plog.readable_end(READ_UNCOMMITTED)
        else:
            assert timestamp is not None
            offset = await asyncio.to_thread(self.tiered.offset_for_timestamp, plog, topic,
                                             partition, timestamp)
        return ListedOffset(offset, log_start, plog.high_watermark)

    def health(self) -> Health:
        """Topics and partitions served; a broker of a cluster adds its standing."""
        topics, partitions = len(self.manager.registry.list()), len(self.manager.all_logs())
        if self.link is None:
            return Health(topics, partitions, None)
        broker = self.link.broker
        return Health(topics, partitions, BrokerHealth(
            broker.broker_id, getattr(broker, "cluster_id", None), broker.controller.active,
            broker.session.has_lease, broker.ready(),
            sum(len(ps) for ps in broker.led_partitions().values())))
