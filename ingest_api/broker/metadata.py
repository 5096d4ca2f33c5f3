"""Cluster metadata as the HTTP answers show it: brokers, and each partition's leader and
replicas; and the resource URLs that Confluent REST v3 shapes link between.

Without ZooKeeper lakelog runs as a cluster of one: broker 1 is the controller, leads
every partition and is its only (in-sync) replica. In a cluster the answers come from the
broker's metadata view (cluster.view). Every answer that names a broker, leader or
replica asks here.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.view import ClusterView

CLUSTER_ID = "lakelog"
"""The one cluster id a broker answers to (Confluent's paths name it)."""
BROKER_ID = 1
CLUSTER = f"/v3/clusters/{CLUSTER_ID}"


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


# -- URLs and the Resource envelope ---------------------------------------------------

def topic_url(topic: str) -> str:
    return f"{CLUSTER}/topics/{topic}"


def partition_url(topic: str, partition: int) -> str:
    return f"{CLUSTER}/topics/{topic}/partitions/{partition}"


def broker_url(broker_id: int) -> str:
    return f"{CLUSTER}/brokers/{broker_id}"


def related(url: str) -> dict[str, str]:
    """A Confluent ``Relationship``."""
    return {"related": url}


def resource(kind: str, url: str, crn: str) -> dict[str, object]:
    """The ``kind`` and ``metadata`` every Confluent resource starts with."""
    name = f"crn:///kafka={CLUSTER_ID}" + (f"/{crn}" if crn else "")
    return {"kind": kind, "metadata": {"self": url, "resource_name": name}}


def collection(kind: str, url: str, data: list[dict[str, object]]) -> dict[str, object]:
    """A Confluent ``ResourceCollection`` (every list is whole: ``next`` is null)."""
    return {"kind": kind, "metadata": {"self": url, "next": None}, "data": data}


def replica_body(topic: str, partition: int, broker_id: int) -> dict[str, object]:
    placement = METADATA.placement(topic, partition)
    url = f"{partition_url(topic, partition)}/replicas/{broker_id}"
    return {**resource("KafkaReplica", url, f"topic={topic}/partition={partition}/"
                                            f"replica={broker_id}"),
            "cluster_id": CLUSTER_ID, "topic_name": topic, "partition_id": partition,
            "broker_id": broker_id, "is_leader": broker_id == placement.leader,
            "is_in_sync": broker_id in placement.in_sync, "broker": related(broker_url(broker_id))}
