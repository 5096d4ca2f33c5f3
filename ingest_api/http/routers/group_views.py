"""Confluent REST v3's read-only views of a consumer group: its consumers and their
assignments, its lag per partition and its lag summary.

Lag is computed as ``groups describe``, the ``consumer_lag`` view and the metrics compute
it (``consumer_groups.lag``): every partition the group reads is listed, and one without a
committed offset counts from the log start offset; there ``current_offset`` is the log
start offset and ``committed_offset`` (lakelog's addition) is null. Confluent lists only
committed partitions, which hides exactly the ones a group has not reached.

In a cluster a partition's log end offset is its leader's (``ingest_api.broker.leader_bounds``);
where the leader does not answer, the lag cannot be given: the request is answered 503
``leader_not_available`` (retriable, naming the partitions), as Kafka's ListOffsets fails
for a partition without a leader, rather than with a lag that leaves them out.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from consumer_groups.coordinator import GroupCoordinator, Member
from consumer_groups.lag import PartitionLag
from ingest_api.http.resources import collection, partition_url, related, resource
from ingest_api.http.routers.cluster import check_cluster
from ingest_api.http.routers.groups import BASE, GroupId, MemberId, group_url, to_coordinator
from ingest_api.http.state import CLUSTER_ID, AppState, json_response, state
from log_tables.errors import (
    CONSUMER,
    LeaderNotAvailableError,
    NoOffsetsError,
    UnknownMemberError,
    UnknownTopicError,
)

router = APIRouter(tags=["consumer groups"])
TopicName = Annotated[str, Path(min_length=1, max_length=249)]
PartitionId = Annotated[int, Path(ge=0, le=2**31 - 1)]


def _members(groups: GroupCoordinator, group_id: str) -> dict[str, Member]:
    group = groups.groups.get(group_id)
    return dict(group.members) if group is not None else {}


async def _lags(request: Request, group_id: str) -> list[PartitionLag]:
    """The partitions the group reads that still exist (bounds None: their leader, in a
    cluster, did not answer)."""
    return await state(request).group_admin.lag(group_id, existing_only=True)


def _known(rows: list[PartitionLag]) -> list[PartitionLag]:
    """``rows``, unless a partition's bounds are unknown: then 503 (retriable)."""
    unknown = [f"{r.topic}/{r.partition}" for r in rows if r.bounds is None]
    if unknown:
        raise LeaderNotAvailableError(
            f"the leaders of {', '.join(unknown[:10])}{' and more' if len(unknown) > 10 else ''}"
            f" did not give their log end offsets; try again")
    return rows


def _lag_body(group_id: str, row: PartitionLag, members: dict[str, Member]) -> dict[str, Any]:
    assert row.bounds is not None and row.lag is not None
    member = members.get(row.member_id) if row.member_id else None
    url = f"{group_url(group_id)}/lags/{row.topic}/partitions/{row.partition}"
    current = row.committed.offset if row.committed else row.bounds.log_start_offset
    return {**resource("KafkaConsumerLag", url, f"consumer-group={group_id}/lag={row.topic}/"
                                                f"partition={row.partition}"),
            "cluster_id": CLUSTER_ID, "consumer_group_id": group_id,
            "topic_name": row.topic, "partition_id": row.partition,
            "consumer_id": row.member_id or "",
            "instance_id": member.instance_id if member else None, "client_id": "",
            "current_offset": current, "log_end_offset": row.bounds.high_watermark,
            "lag": row.lag,
            "committed_offset": row.committed.offset if row.committed else None}


@router.get(BASE + "/{group_id}/lags")
async def list_lags(cluster_id: str, group_id: GroupId, request: Request) -> Response:
    """Confluent's List Consumer Lags: every partition the group reads, with its lag."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, group_id)) is not None:
        return answer
    rows = _known(await _lags(request, group_id))
    members = _members(state(request).groups, group_id)
    return json_response(collection(
        "KafkaConsumerLagList", f"{group_url(group_id)}/lags",
        [_lag_body(group_id, row, members) for row in rows]))


@router.get(BASE + "/{group_id}/lags/{topic_name}/partitions/{partition_id}")
async def get_lag(cluster_id: str, group_id: GroupId, topic_name: TopicName,
                  partition_id: PartitionId, request: Request) -> Response:
    """Confluent's Get Consumer Lag: one partition's (404 unless the group reads it)."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, group_id)) is not None:
        return answer
    for row in await _lags(request, group_id):
        if (row.topic, row.partition) == (topic_name, partition_id):
            return json_response(_lag_body(group_id, _known([row])[0],
                                           _members(state(request).groups, group_id)))
    raise UnknownTopicError.saying(f"consumer group {group_id!r} does not read {topic_name}/"
                                   f"{partition_id}", topic=topic_name)


@router.get(BASE + "/{group_id}/lag-summary")
async def lag_summary(cluster_id: str, group_id: GroupId, request: Request) -> Response:
    """Confluent's lag summary: the total lag and the partition with the most (the first
    by topic and partition among equals); 404 when the group reads no partition."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, group_id)) is not None:
        return answer
    st = state(request)
    rows = _known(await _lags(request, group_id))
    if not rows:
        raise NoOffsetsError(f"consumer group {group_id!r} reads no partition: it has no lag "
                             "to summarize")
    top = max(rows, key=lambda r: r.lag or 0)  # max() keeps the first of equals
    members = _members(st.groups, group_id)
    member = members.get(top.member_id) if top.member_id else None
    consumer_id = top.member_id or ""
    return json_response({
        **resource("KafkaConsumerGroupLagSummary", f"{group_url(group_id)}/lag-summary",
                   f"consumer-group={group_id}/lag-summary"),
        "cluster_id": CLUSTER_ID, "consumer_group_id": group_id,
        "max_lag_consumer_id": consumer_id,
        "max_lag_instance_id": member.instance_id if member else None,
        "max_lag_client_id": "", "max_lag_topic_name": top.topic,
        "max_lag_partition_id": top.partition, "max_lag": top.lag or 0,
        "total_lag": sum(r.lag or 0 for r in rows),
        "max_lag_consumer": related(f"{group_url(group_id)}/consumers/{consumer_id}"),
        "max_lag_partition": related(partition_url(top.topic, top.partition))})


def _consumer_body(group_id: str, member: Member) -> dict[str, Any]:
    url = f"{group_url(group_id)}/consumers/{member.member_id}"
    return {**resource("KafkaConsumer", url,
                       f"consumer-group={group_id}/consumer={member.member_id}"),
            "cluster_id": CLUSTER_ID, "consumer_group_id": group_id,
            "consumer_id": member.member_id, "instance_id": member.instance_id,
            "client_id": "", "assignments": related(f"{url}/assignments")}


def _member(st: AppState, group_id: str, member_id: str) -> Member:
    st.group_admin.require_group(group_id)
    member = _members(st.groups, group_id).get(member_id)
    if member is None:
        raise UnknownMemberError.saying(f"consumer group {group_id!r} has no consumer "
                                        f"{member_id!r}", detail=CONSUMER)
    return member


def _assignment_body(group_id: str, member_id: str, topic: str, partition: int
                     ) -> dict[str, Any]:
    url = f"{group_url(group_id)}/consumers/{member_id}/assignments/{topic}/partitions/{partition}"
    return {**resource("KafkaConsumerAssignment", url,
                       f"consumer-group={group_id}/consumer={member_id}/assignment={topic}/"
                       f"partition={partition}"),
            "cluster_id": CLUSTER_ID, "consumer_group_id": group_id, "consumer_id": member_id,
            "topic_name": topic, "partition_id": partition,
            "partition": related(partition_url(topic, partition)),
            "lag": related(f"{group_url(group_id)}/lags/{topic}/partitions/{partition}")}


@router.get(BASE + "/{group_id}/consumers")
async def list_consumers(cluster_id: str, group_id: GroupId, request: Request) -> Response:
    """Confluent's List Consumers: the group's members (``consumer_id`` is the member id)."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, group_id)) is not None:
        return answer
    st = state(request)
    st.group_admin.require_group(group_id)
    return json_response(collection(
        "KafkaConsumerList", f"{group_url(group_id)}/consumers",
        [_consumer_body(group_id, m) for _, m in sorted(_members(st.groups, group_id).items())]))


@router.get(BASE + "/{group_id}/consumers/{member_id}")
async def get_consumer(cluster_id: str, group_id: GroupId, member_id: MemberId,
                       request: Request) -> Response:
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, group_id)) is not None:
        return answer
    return json_response(_consumer_body(group_id, _member(state(request), group_id, member_id)))


@router.get(BASE + "/{group_id}/consumers/{member_id}/assignments")
async def list_assignments(cluster_id: str, group_id: GroupId, member_id: MemberId,
                           request: Request) -> Response:
    """The partitions assigned to the member (those it is revoking included)."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, group_id)) is not None:
        return answer
    member = _member(state(request), group_id, member_id)
    return json_response(collection(
        "KafkaConsumerAssignmentList", f"{group_url(group_id)}/consumers/{member_id}/assignments",
        [_assignment_body(group_id, member_id, t, p)
         for t, p in sorted(member.assigned | member.revoking)]))


@router.get(BASE + "/{group_id}/consumers/{member_id}/assignments/{topic_name}/partitions/"
                   "{partition_id}")
async def get_assignment(cluster_id: str, group_id: GroupId, member_id: MemberId,
                         topic_name: TopicName, partition_id: PartitionId,
                         request: Request) -> Response:
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, group_id)) is not None:
        return answer
    member = _member(state(request), group_id, member_id)
    if (topic_name, partition_id) not in member.assigned | member.revoking:
        raise UnknownTopicError.saying(f"consumer {member_id!r} of group {group_id!r} is not "
                                       f"assigned {topic_name}/{partition_id}",
                                       topic=topic_name)
    return json_response(_assignment_body(group_id, member_id, topic_name, partition_id))
