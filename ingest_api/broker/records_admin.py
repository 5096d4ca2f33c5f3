"""Operator changes to a topic's records: Kafka's DeleteRecords (the log start moves up in
both tiers) and the sealing of every partition's records for a tiering run now.

In a cluster each partition's leader does it for its partitions: this broker does its
own part and asks each other leader for its part through ``Peers`` (for the user who
asked, whose rights the other broker checks).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cluster.model import BrokerInfo
from ingest_api.broker.topics import TopicAdmin
from log_tables.cold.tiered_storage import TieredStorage
from log_tables.errors import InvalidTopicError, UnknownPartitionError
from log_tables.registry import INTERNAL_TOPICS

if TYPE_CHECKING:
    from ingest_api.broker.cluster_link import ClusterLink


@dataclass(frozen=True)
class DeletePlan:
    """Where each partition's records are deleted: ``local`` (partition: offset) here,
    ``elsewhere`` at each other leader, its partitions sorted."""

    local: dict[int, int]
    elsewhere: list[tuple[BrokerInfo, dict[int, int]]] = field(default_factory=list)


@dataclass(frozen=True)
class Sealed:
    """One partition sealed: whether its active segment rolled, and the offset below
    which every record is in a sealed, durable segment."""

    partition: int
    rolled: bool
    end_offset: int


class RecordsAdmin:
    """DeleteRecords and segment sealing, for the partitions this broker leads."""

    def __init__(self, tiered: TieredStorage, topics: TopicAdmin,
                 link: ClusterLink | None = None) -> None:
        self.tiered = tiered
        self.topics = topics
        self.link = link

    def plan_delete(self, topic: str, targets: Mapping[int, int], forwarded: bool
                    ) -> DeletePlan:
        """Delete every record below ``targets[p]`` in each partition ``p``: where (a
        partition the topic does not have: 404). A request another broker forwarded is
        never forwarded again (NOT_LEADER)."""
        if topic in INTERNAL_TOPICS:
            raise InvalidTopicError(f"topic {topic!r} is lakelog's own: its records are "
                                    "deleted by its coordinators only")
        meta = self.topics.describe(topic)
        for p in targets:
            if p >= meta.partitions:
                raise UnknownPartitionError(topic, p, meta.partitions)
        if self.link is None:
            return DeletePlan(dict(targets))
        local: dict[int, int] = {}
        by_leader: dict[int, dict[int, int]] = {}
        leaders: dict[int, BrokerInfo] = {}
        for p, offset in targets.items():
            where = self.link.route(topic, p, forwarded)
            if isinstance(where, int):
                local[p] = offset
            else:
                by_leader.setdefault(where.broker_id, {})[p] = offset
                leaders[where.broker_id] = where
        return DeletePlan(local, [(leaders[b], dict(sorted(parts.items())))
                                  for b, parts in by_leader.items()])

    async def delete_records(self, topic: str, targets: Mapping[int, int], forwarded: bool,
                             principal: str | None = None) -> dict[int, int]:
        """Kafka's DeleteRecords: every record below ``targets[p]`` in each partition
        ``p`` goes, here or at its leader; each partition's new log start."""
        plan = self.plan_delete(topic, targets, forwarded)
        starts: dict[int, int] = {}
        if plan.elsewhere:
            assert self.link is not None
            peers = self.link.peers
            for answer in await asyncio.gather(*(
                    peers.delete_records(broker, topic, parts, principal)
                    for broker, parts in plan.elsewhere), return_exceptions=True):
                if isinstance(answer, BaseException):
                    raise answer  # the first leader's error, in the plan's order
                starts.update(answer)
        if plan.local:
            starts.update(await asyncio.to_thread(self.tiered.delete_records, topic,
                                                  plan.local))
        return starts

    async def seal(self, topic: str, forwarded: bool, principal: str | None = None
                   ) -> list[Sealed]:
        """Seal the topic's partitions: alone, all of them; in a cluster, each broker the
        partitions it leads (this one asks the others unless it was asked by one)."""
        self.topics.describe(topic)
        sealed = [Sealed(p, rolled, end) for p, rolled, end
                  in await asyncio.to_thread(self.tiered.seal, topic)]
        if self.link is None:
            return sealed
        link = self.link
        led = link.broker.led_partitions().get(topic, [])
        sealed = [s for s in sealed if s.partition in led]
        if forwarded:
            return sealed
        others = [b for b in link.broker.view.live_brokers() if b.broker_id != link.broker_id]
        for answer in await asyncio.gather(*(link.peers.seal(b, topic, principal)
                                             for b in others), return_exceptions=True):
            if isinstance(answer, BaseException):
                raise answer  # the first broker's error, in the brokers' order
            sealed += [Sealed(p, rolled, end) for p, rolled, end in answer]
        return sealed
