"""Committed offsets over Kafka's protocol: FindCoordinator (this broker, alone),
OffsetCommit and OffsetFetch on the broker core's group coordinator, so offsets committed
by a Kafka client are the group's offsets everywhere (HTTP, the ``Consumer``, the
``_consumer_offsets`` Delta table, ``consumer_lag`` in SQL) and the other way round.

Commits outside a group's membership only (Kafka's "simple" consumers: ``assign()`` and
``commit``; generation -1, no member id), as lakelog's own API takes them: while the
group has no members. Joining a group over Kafka's protocol (JoinGroup, SyncGroup,
Heartbeat, LeaveGroup, KIP-848's ConsumerGroupHeartbeat) is not served yet, so a
commit from a member of a group is answered UNKNOWN_MEMBER_ID.
"""

from __future__ import annotations

from typing import Any

from ingest_api.broker.core import Broker
from log_tables.errors import LakelogError

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 8, 9, 10
SUPPORTED: dict[int, tuple[int, int]] = {
    OFFSET_COMMIT: (2, 8), OFFSET_FETCH: (1, 7), FIND_COORDINATOR: (0, 3)}
COORDINATOR_NOT_AVAILABLE, UNKNOWN_MEMBER_ID = 15, 25


class GroupOffsets:
    def __init__(self, broker: Broker, node: tuple[int, str, int],
                 code_of: Any) -> None:
        self.broker = broker
        self.node = node
        self.code_of = code_of

    async def find_coordinator(self, request: Any, version: int) -> dict[str, Any]:
        if getattr(request, "key_type", 0) != 0:
            return {"error_code": COORDINATOR_NOT_AVAILABLE, "node_id": -1, "host": "",
                    "port": -1, "error_message": "transaction coordinators are not served "
                                                 "on the Kafka listener yet"}
        node_id, host, port = self.node
        return {"node_id": node_id, "host": host, "port": port}

    async def offset_commit(self, request: Any, version: int) -> dict[str, Any]:
        generation = getattr(request, "generation_id_or_member_epoch",
                             getattr(request, "generation_id", -1))
        code = 0
        if request.member_id or generation != -1:
            code = UNKNOWN_MEMBER_ID  # (no member joins a group over this listener yet)
        else:
            try:
                await self.broker.groups.commit(request.group_id, None, -1, [
                    (t.name, p.partition_index, p.committed_offset, p.committed_metadata)
                    for t in request.topics for p in t.partitions])
            except LakelogError as exc:
                code = self.code_of(exc)
        return {"topics": [{"name": t.name, "partitions": [
            {"partition_index": p.partition_index, "error_code": code}
            for p in t.partitions]} for t in request.topics]}

    async def offset_fetch(self, request: Any, version: int) -> dict[str, Any]:
        groups = self.broker.groups
        try:
            if getattr(request, "require_stable", False):
                groups.require_stable(request.group_id)
            committed = groups.committed(request.group_id)
        except LakelogError as exc:
            return {"error_code": self.code_of(exc), "topics": []}
        if request.topics is None:
            wanted: dict[str, list[int]] = {}
            for topic, partition in sorted(committed):
                wanted.setdefault(topic, []).append(partition)
        else:
            wanted = {t.name: list(t.partition_indexes) for t in request.topics}
        topics = []
        for name, partitions in wanted.items():
            rows = []
            for p in partitions:
                found = committed.get((name, p))
                rows.append({"partition_index": p, "committed_leader_epoch": -1,
                             "committed_offset": -1 if found is None else found.offset,
                             "metadata": "" if found is None else (found.metadata or "")})
            topics.append({"name": name, "partitions": rows})
        return {"topics": topics}
