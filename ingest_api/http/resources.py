"""Confluent REST v3's resource shapes: the URLs its answers link between, the
``Resource`` envelope, collections and relationships, and a replica's body."""

from __future__ import annotations

from ingest_api.broker.metadata import CLUSTER_ID, METADATA

CLUSTER = f"/v3/clusters/{CLUSTER_ID}"
"""The path every cluster resource is under."""


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
