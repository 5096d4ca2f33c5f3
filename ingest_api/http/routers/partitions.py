"""Partitions, their replicas and reassignments, and their earliest and latest offsets
(Confluent REST v3 shapes)."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from ingest_api.broker.cluster_info import PartitionInfo
from ingest_api.http.forwarding import forwarded, principal_of
from ingest_api.http.resources import (
    CLUSTER,
    collection,
    partition_url,
    related,
    replica_body,
    resource,
    topic_url,
)
from ingest_api.http.routers.cluster import check_cluster
from ingest_api.http.state import CLUSTER_ID, json_response, state
from log_tables.errors import (
    InvalidOffsetTypeError,
    NoReassignmentError,
)

router = APIRouter(tags=["topics"])
BASE = "/v3/clusters/{cluster_id}/topics"
TopicName = Annotated[str, Path(min_length=1, max_length=249)]
PartitionId = Annotated[int, Path(ge=0, le=2**31 - 1)]
BrokerId = Annotated[int, Path(ge=0, le=2**31 - 1)]
OFFSET_TYPES = ("earliest_and_latest",)
"""The offset types of List Partition Offsets: Confluent has this one (its default)."""


def partition_body(p: PartitionInfo) -> dict[str, object]:
    """Confluent's ``PartitionData``, with lakelog's offsets and sizes added."""
    url = partition_url(p.topic, p.partition)
    return {**resource("KafkaPartition", url, f"topic={p.topic}/partition={p.partition}"),
            "cluster_id": CLUSTER_ID, "topic_name": p.topic, "partition_id": p.partition,
            "leader": related(f"{url}/replicas/{p.leader}"),
            "replicas": related(f"{url}/replicas"),
            "reassignment": related(f"{url}/reassignment"),
            "log_start_offset": p.log_start_offset,
            "high_watermark": p.high_watermark, "size_bytes": p.size_bytes,
            "segments": p.segments,
            "hot_log_start_offset": p.hot_log_start_offset,
            "tiered_offset": p.tiered_offset,
            "tiered_size_bytes": p.tiered_size_bytes,
            "leader_id": p.leader, "replica_ids": list(p.replicas),
            "isr_ids": list(p.in_sync), "leader_epoch": p.leader_epoch}


@router.get(BASE + "/{topic_name}/partitions")
async def list_partitions(cluster_id: str, topic_name: TopicName, request: Request) -> Response:
    check_cluster(cluster_id)
    ids = state(request).cluster_info.partition_ids(topic_name)
    bodies = await asyncio.gather(*(_partition_anywhere(request, topic_name, p) for p in ids))
    return json_response(collection("KafkaPartitionList", f"{topic_url(topic_name)}/partitions",
                                    list(bodies)))


async def _partition_anywhere(request: Request, topic: str, partition: int
                              ) -> dict[str, object]:
    """A partition's body; in a cluster its offsets and sizes are its leader's (an
    offline partition, or a leader that does not answer: this broker's view)."""
    return partition_body(await state(request).cluster_info.partition_anywhere(
        topic, partition, forwarded(request), principal_of(request)))


@router.get(BASE + "/-/partitions/-/reassignment")
async def list_all_reassignments(cluster_id: str) -> Response:
    """Replica reassignments in progress: none (one broker: partitions never move)."""
    check_cluster(cluster_id)
    return json_response(collection("KafkaReassignmentList",
                                    f"{CLUSTER}/topics/-/partitions/-/reassignment", []))


@router.get(BASE + "/{topic_name}/partitions/-/reassignment")
async def list_topic_reassignments(cluster_id: str, topic_name: TopicName,
                                   request: Request) -> Response:
    """The topic's replica reassignments in progress: none."""
    check_cluster(cluster_id)
    state(request).topic_admin.describe(topic_name)
    return json_response(collection("KafkaReassignmentList",
                                    f"{topic_url(topic_name)}/partitions/-/reassignment", []))


@router.get(BASE + "/{topic_name}/partitions/{partition_id}")
async def get_partition(cluster_id: str, topic_name: TopicName, partition_id: PartitionId,
                        request: Request) -> Response:
    check_cluster(cluster_id)
    st = state(request)
    st.topic_admin.describe(topic_name)
    st.cluster_info.require_partition(topic_name, partition_id)
    return json_response(await _partition_anywhere(request, topic_name, partition_id))


@router.get(BASE + "/{topic_name}/partitions/{partition_id}/reassignment")
async def get_reassignment(cluster_id: str, topic_name: TopicName, partition_id: PartitionId,
                           request: Request) -> Response:
    """404 as in Confluent when no reassignment is in progress, which here is always."""
    check_cluster(cluster_id)
    state(request).cluster_info.require_partition(topic_name, partition_id)
    raise NoReassignmentError(f"no replica reassignment of {topic_name}/{partition_id} is "
                              "in progress (lakelog is one broker: partitions never move)")


@router.get(BASE + "/{topic_name}/partitions/{partition_id}/replicas")
async def list_replicas(cluster_id: str, topic_name: TopicName, partition_id: PartitionId,
                        request: Request) -> Response:
    """The partition's replicas (its leader first)."""
    check_cluster(cluster_id)
    replicas = state(request).cluster_info.replicas(topic_name, partition_id)
    return json_response(collection(
        "KafkaReplicaList", f"{partition_url(topic_name, partition_id)}/replicas",
        [replica_body(topic_name, partition_id, b) for b in replicas]))


@router.get(BASE + "/{topic_name}/partitions/{partition_id}/replicas/{broker_id}")
async def get_replica(cluster_id: str, topic_name: TopicName, partition_id: PartitionId,
                      broker_id: BrokerId, request: Request) -> Response:
    check_cluster(cluster_id)
    state(request).cluster_info.require_replica(topic_name, partition_id, broker_id)
    return json_response(replica_body(topic_name, partition_id, broker_id))


@router.get(BASE + "/{topic_name}/partitions/{partition_id}/offset")
async def list_partition_offsets(
        cluster_id: str, topic_name: TopicName, partition_id: PartitionId, request: Request,
        offset_type: Annotated[str, Query(description="earliest_and_latest (the default and "
                                                      "only type)")] = OFFSET_TYPES[0],
) -> Response:
    """Confluent's List Partition Offsets: the earliest offset (the log start, across the
    hot and the Delta tier) and the latest (the high watermark: the next offset)."""
    check_cluster(cluster_id)
    if offset_type not in OFFSET_TYPES:
        raise InvalidOffsetTypeError(f"offset_type {offset_type!r} is invalid; valid: "
                                     f"{', '.join(OFFSET_TYPES)}")
    st = state(request)
    st.topic_admin.describe(topic_name)
    st.cluster_info.require_partition(topic_name, partition_id)
    part = await _partition_anywhere(request, topic_name, partition_id)
    url = f"{partition_url(topic_name, partition_id)}/offset"
    return json_response({
        **resource("KafkaPartitionWithOffsets", url,
                   f"topic={topic_name}/partition={partition_id}/offset_type={offset_type}"),
        "cluster_id": CLUSTER_ID, "topic_name": topic_name, "partition_id": partition_id,
        "earliest_offset": part["log_start_offset"], "latest_offset": part["high_watermark"]})
