"""Cluster metadata as the answers show it: brokers, and each partition's leader and
replicas (the resource URLs Confluent REST v3 links them with are the HTTP front's:
``ingest_api.http.resources``).

Without ZooKeeper lakelog runs as a cluster of one: broker 1 is the controller, leads
every partition and is its only (in-sync) replica. In a cluster the answers come from the
broker's metadata view (cluster.view). Every answer that names a broker, leader or
replica asks here.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.view import ClusterView
from log_tables.moved import moved

CLUSTER_ID = "lakelog"
"""The one cluster id a broker answers to (Confluent's paths name it)."""
BROKER_ID = 1


@dataclass(frozen=True, slots=True)
class Broker:
    broker_id: int
    host: str | None
    port: int | None
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a partition lives: its leader, its replicas and those in sync."""

    leader: int
    replicas: tuple[int, ...]
    in_sync: tuple[int, ...]
    leader_epoch: int = 0


class ClusterMetadata:
    """The brokers and placements: a cluster of one, or (once ``attach``ed) what a
    cluster's metadata view says."""

    def __init__(self) -> None:
        self.view: ClusterView | None = None

    def attach(self, view: ClusterView | None) -> None:
        self.view = view

    @property
    def controller_id(self) -> int:
        if self.view is None:
            return BROKER_ID
        cid = self.view.controller_id
        return -1 if cid is None else cid

    def brokers(self, host: str | None, port: int | None) -> list[Broker]:
        """The brokers; this one is reached at ``host:port`` (where the request came in)."""
        if self.view is None:
            return [Broker(BROKER_ID, host, port)]
        return [Broker(b.broker_id, b.host, b.port, b.rack) for b in self.view.live_brokers()]

    def placement(self, topic: str, partition: int) -> Placement:
        if self.view is None:
            return Placement(BROKER_ID, (BROKER_ID,), (BROKER_ID,))
        found = self.view.placement(topic, partition)
        if found is None:
            return Placement(-1, (), ())
        return Placement(found.leader, found.replicas, found.isr, found.leader_epoch)

    def replication_factor(self, topic: str) -> int:
        if self.view is None:
            return 1
        assignment = self.view.topic(topic)
        return assignment.replication_factor if assignment is not None else 0


METADATA = ClusterMetadata()


__getattr__ = moved(__name__, {name: "ingest_api.http.resources" for name in (
    "CLUSTER", "topic_url", "partition_url", "broker_url", "related", "resource",
    "collection", "replica_body")})
"""The REST v3 URLs and resource shapes went to the HTTP front (issue 36)."""
