"""Consumer groups over HTTP: join, heartbeat, leave, poll, seek, commit, describe, reset
and delete (KIP-848-style: the server assigns; see ``consumer_groups.coordinator``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import msgspec
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from consumer_groups.assignors import TopicPartition
from consumer_groups.coordinator import Member, heartbeat_interval_ms
from consumer_groups.offsets import Committed
from ingest_api.broker.group_admin import GroupSummary, OffsetReset
from ingest_api.http.arrow_headers import ARROW_RESPONSE, arrow_response, wants_arrow
from ingest_api.http.auth import may, require
from ingest_api.http.body import decode, read_body
from ingest_api.http.forwarding import forwarded, principal_of
from ingest_api.http.models import (
    CommitRequest,
    HeartbeatRequest,
    JoinRequest,
    ResetRequest,
    SeekRequest,
)
from ingest_api.http.resources import CLUSTER, collection, related, resource
from ingest_api.http.routers.cluster import check_cluster, forward
from ingest_api.http.state import (
    CLUSTER_ID,
    json_body,
    json_response,
    state,
)
from log_tables.hot.isolation import Isolation

router = APIRouter(tags=["consumer groups"])
BASE = "/v3/clusters/{cluster_id}/consumer-groups"
GroupId = Annotated[str, Path(min_length=1, max_length=249)]
MemberId = Annotated[str, Path(min_length=1, max_length=64)]
MAX_BODY = 4 << 20
_join = msgspec.json.Decoder(JoinRequest)
_heartbeat = msgspec.json.Decoder(HeartbeatRequest)
_commit = msgspec.json.Decoder(CommitRequest)
_seek = msgspec.json.Decoder(SeekRequest)
_reset = msgspec.json.Decoder(ResetRequest)


def _tps(tps: set[TopicPartition]) -> list[dict[str, Any]]:
    return [{"topic_name": t, "partition_id": p} for t, p in sorted(tps)]


def _member_body(member: Member) -> dict[str, Any]:
    return {"member_id": member.member_id, "member_epoch": member.epoch,
            "assignment": _tps(member.assigned), "revoking": _tps(member.revoking),
            "heartbeat_interval_ms": heartbeat_interval_ms(member.session_timeout_ms)}


def group_url(group_id: str) -> str:
    return f"{CLUSTER}/consumer-groups/{group_id}"


def _summary_body(s: GroupSummary) -> dict[str, Any]:
    """Confluent's ``ConsumerGroupData`` with lakelog's fields (``state`` keeps Kafka's
    state names, ``assignor`` lakelog's assignor names)."""
    url = group_url(s.group_id)
    return {**resource("KafkaConsumerGroup", url, f"consumer-group={s.group_id}"),
            "cluster_id": CLUSTER_ID, "consumer_group_id": s.group_id, "is_simple": False,
            "partition_assignor": s.assignor or "",
            "coordinator": related(f"{CLUSTER}/brokers/{s.coordinator_id}"),
            "consumers": related(f"{url}/consumers"),
            "lag_summary": related(f"{url}/lag-summary"),
            "state": s.state, "assignor": s.assignor, "group_epoch": s.group_epoch,
            "members": s.members}


async def to_coordinator(request: Request, group_id: str) -> Response | None:
    """In a cluster, a group's requests are its coordinator's: its answer, unless this
    broker coordinates the group (None)."""
    coordinator = await state(request).group_admin.coordinator_elsewhere(
        group_id, forwarded(request))
    return None if coordinator is None else await forward(request, coordinator)


@router.get(BASE)
async def list_groups(cluster_id: str, request: Request) -> Response:
    """Every group with members or committed offsets."""
    check_cluster(cluster_id)
    st = state(request)
    mine = [g for g in st.groups.known_groups() if may(request, "group", g, "describe")]
    # In a cluster each broker answers for the groups it coordinates; the first broker
    # asks the others and merges.
    groups = await st.group_admin.list_groups(mine, forwarded(request), principal_of(request))
    return json_response(collection("KafkaConsumerGroupList", f"{CLUSTER}/consumer-groups",
                                    [_summary_body(s) for s in groups]))


@router.get(BASE + "/{group_id}")
async def describe_group(cluster_id: str, group_id: GroupId, request: Request) -> Response:
    """State, members with their assignments, and every partition the group reads (its
    members' subscriptions and its committed topics): the committed offset (null where
    none), the log start and end offsets, the lag (from the log start where nothing is
    committed) and the owner; in a cluster the offsets of a partition led elsewhere are
    its leader's (``ingest_api.broker.leader_bounds``)."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, group_id)) is not None:
        return answer
    st = state(request)
    st.group_admin.require_group(group_id)
    group = st.groups.groups.get(group_id)
    members = [{"member_id": m.member_id, "group_instance_id": m.instance_id,
                "member_epoch": m.epoch, "topics": sorted(m.topics),
                "assignment": _tps(m.assigned), "revoking": _tps(m.revoking),
                "session_timeout_ms": m.session_timeout_ms, "left": m.left}
               for m in (group.members.values() if group is not None else ())]
    rows = [{"topic_name": r.topic, "partition_id": r.partition,
             "committed_offset": r.committed.offset if r.committed else None,
             "metadata": r.committed.metadata if r.committed else None,
             "log_start_offset": r.bounds.log_start_offset if r.bounds else None,
             "log_end_offset": r.bounds.high_watermark if r.bounds else None,
             "lag": r.lag, "member_id": r.member_id}
            for r in await st.group_admin.lag(group_id)]
    return json_response({**_summary_body(st.group_admin.summary(group_id)), "members": members,
                          "offsets": rows})


@router.get(BASE + "/{group_id}/coordinator")
async def find_coordinator(cluster_id: str, group_id: GroupId, request: Request) -> Response:
    """Kafka's FindCoordinator: the broker that coordinates the group (a client sends the
    group's requests there; any other broker forwards them)."""
    check_cluster(cluster_id)
    info = await state(request).group_admin.find_coordinator(group_id)
    return json_response({"broker_id": info.broker_id, "host": info.host, "port": info.port})


@router.delete(BASE + "/{group_id}", status_code=204)
async def delete_group(cluster_id: str, group_id: GroupId, request: Request) -> Response:
    """Delete a group without members and its committed offsets."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, group_id)) is not None:
        return answer
    await state(request).groups.delete_group(group_id)
    return Response(status_code=204)


@router.post(BASE + "/{group_id}/members", openapi_extra=json_body(JoinRequest))
async def join(cluster_id: str, group_id: GroupId, request: Request) -> Response:
    """Join: a member id, its epoch and its first assignment (heartbeat for the rest)."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, group_id)) is not None:
        return answer
    body = decode(await read_body(request, MAX_BODY), _join)
    for topic in body.topics:  # the group's consume ACL is checked before routing
        require(request, "topic", topic, "consume")
    member = state(request).groups.join(group_id, body.topics, body.session_timeout_ms,
                                        body.group_instance_id, body.assignor,
                                        body.auto_offset_reset,
                                        Isolation(body.isolation_level))
    return json_response(_member_body(member))


@router.post(BASE + "/{group_id}/members/{member_id}/heartbeat",
             openapi_extra=json_body(HeartbeatRequest))
async def heartbeat(cluster_id: str, group_id: GroupId, member_id: MemberId,
                    request: Request) -> Response:
    """Stay in the group; the answer carries the current epoch and assignment."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, group_id)) is not None:
        return answer
    body = decode(await read_body(request, MAX_BODY), _heartbeat)
    owned = None if body.owned is None else {
        TopicPartition(o.topic_name, o.partition_id) for o in body.owned}
    member = state(request).groups.heartbeat(group_id, member_id, body.member_epoch, owned)
    return json_response(_member_body(member))


@router.delete(BASE + "/{group_id}/members/{member_id}", status_code=204)
async def leave(cluster_id: str, group_id: GroupId, member_id: MemberId,
                request: Request) -> Response:
    """Leave the group; its partitions move to the other members."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, group_id)) is not None:
        return answer
    state(request).groups.leave(group_id, member_id)
    return Response(status_code=204)


@router.get(BASE + "/{group_id}/members/{member_id}/records", responses=ARROW_RESPONSE)
async def poll(
    cluster_id: str, group_id: GroupId, member_id: MemberId, request: Request,
    max_records: Annotated[int | None, Query(ge=1)] = None,
    max_bytes: Annotated[int | None, Query(ge=1)] = None,
    timeout_ms: Annotated[int, Query(ge=0)] = 0,
    format: Annotated[Literal["BINARY", "STRING", "JSON"], Query()] = "BINARY",
    max_partition_bytes: Annotated[int | None, Query(ge=1)] = None,
) -> Response:
    """Records of the member's partitions from its positions (then past them); with none,
    waits up to ``timeout_ms``. ``max_partition_bytes`` bounds each partition's share of
    ``max_bytes`` (Kafka's ``max.partition.fetch.bytes``; the first record of a partition
    comes even when larger). With ``Accept: application/vnd.apache.arrow.stream``: an
    Arrow stream, the member epoch in ``Lakelog-Member-Epoch``."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, group_id)) is not None:
        return answer
    st = state(request)
    s = st.settings
    limits = (min(max_records or 500, s.max_fetch_records),
              min(max_bytes or s.default_fetch_bytes, s.max_fetch_bytes),
              min(timeout_ms, s.max_fetch_wait_ms))
    if wants_arrow(request.headers.get("accept")):
        arrow = await st.poll.poll_arrow(group_id, member_id, *limits, max_partition_bytes)
        return arrow_response(arrow)
    body = await st.poll.poll(group_id, member_id, *limits, format, max_partition_bytes)
    return Response(body, media_type="application/json")


@router.post(BASE + "/{group_id}/members/{member_id}/positions",
             openapi_extra=json_body(SeekRequest))
async def seek(cluster_id: str, group_id: GroupId, member_id: MemberId,
               request: Request) -> Response:
    """Move the member's positions (Kafka's seek); an offset of null goes back to the
    committed offset. Only partitions assigned to the member."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, group_id)) is not None:
        return answer
    body = decode(await read_body(request, MAX_BODY), _seek)
    positions = state(request).group_admin.seek(group_id, member_id, [
        (p.topic_name, p.partition_id, p.offset) for p in body.positions])
    return json_response({"positions": [
        {"topic_name": tp.topic, "partition_id": tp.partition, "offset": offset}
        for tp, offset in positions]})


@router.post(BASE + "/{group_id}/offsets", openapi_extra=json_body(CommitRequest))
async def commit(cluster_id: str, group_id: GroupId, request: Request) -> Response:
    """Commit offsets; answered once they are in the ``_consumer_offsets`` Delta table."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, group_id)) is not None:
        return answer
    body = decode(await read_body(request, MAX_BODY), _commit)
    await state(request).groups.commit(group_id, body.member_id, body.member_epoch, [
        (o.topic_name, o.partition_id, o.offset, o.metadata) for o in body.offsets],
        topic_ids={o.topic_name: o.topic_id for o in body.offsets if o.topic_id is not None})
    return json_response({"offsets": [
        {"topic_name": o.topic_name, "partition_id": o.partition_id, "offset": o.offset}
        for o in body.offsets]})


@router.get(BASE + "/{group_id}/offsets")
async def committed(cluster_id: str, group_id: GroupId, request: Request,
                    require_stable: Annotated[bool, Query()] = False) -> Response:
    """The group's committed offsets. ``require_stable`` (Kafka's OffsetFetch option, as
    its consumers send it): while an open transaction holds offsets of the group, 409
    ``unstable_offset_commit`` (retriable) rather than the older offsets."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, group_id)) is not None:
        return answer
    groups = state(request).groups
    committed = groups.committed(group_id)
    if require_stable:
        groups.require_stable(group_id)
    return json_response({"offsets": _offset_rows(committed)})


def _offset_rows(committed: dict[tuple[str, int], Committed]) -> list[dict[str, Any]]:
    return [{"topic_name": t, "partition_id": p, "offset": c.offset, "metadata": c.metadata,
             "member_id": c.member_id, "member_epoch": c.member_epoch,
             "commit_timestamp": datetime.fromtimestamp(c.commit_ms / 1000, UTC)}
            for (t, p), c in sorted(committed.items())]


@router.post(BASE + "/{group_id}/offsets:reset", openapi_extra=json_body(ResetRequest))
async def reset_offsets(cluster_id: str, group_id: GroupId, request: Request) -> Response:
    """Reset a group's committed offsets (to earliest, latest, an offset or a datetime) for
    the given topics (default: those it has offsets for); only while it has no members."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, group_id)) is not None:
        return answer
    body = decode(await read_body(request, MAX_BODY), _reset)
    offsets = await state(request).group_admin.reset_offsets(group_id, OffsetReset(
        body.to, tuple(body.topics or ()), body.offset, body.datetime, body.dry_run))
    return json_response({"dry_run": body.dry_run, "offsets": [
        {"topic_name": t, "partition_id": p, "offset": offset} for t, p, offset in offsets]})
