"""The consumer groups a transaction commits offsets of (KIP-447): a member's offsets are
checked by its group's coordinator when they are added (fenced if the member is no
longer the group's), and written by it when the transaction commits. On a broker alone
that is this broker's group coordinator; in a cluster the group's coordinator may be
another broker, asked through ``peers``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from consumer_groups.coordinator import GroupCoordinator
from ingest_api.broker.transactions.parts import GroupOffsets, Offset

if TYPE_CHECKING:
    from ingest_api.broker.cluster_link import ClusterLink


def group_offsets(groups: GroupCoordinator, link: ClusterLink | None) -> GroupOffsets:
    """Here, the offsets a transaction holds are in its own state (the coordinator's
    ``pending_partitions``); a group coordinated on another broker holds them too."""
    if link is None:
        return GroupOffsets(lambda g, m, e, o, _timeout, _tid: groups.check_commit(g, m, e, o),
                            lambda g, o, _tid: groups.commit_ended(g, o))

    async def check(group: str, member_id: str | None, epoch: int, offsets: list[Offset],
                    timeout_ms: int, tid: str) -> None:
        coordinator = await link.coordinator_of(group)
        if coordinator is None:
            groups.check_commit(group, member_id, epoch, offsets)
            return
        await link.peers.txn(coordinator, "offsets-check", {
            "group_id": group, "member_id": member_id, "member_epoch": epoch,
            "offsets": _rows(offsets), "transactional_id": tid, "timeout_ms": timeout_ms})

    async def write(group: str, offsets: list[Offset], tid: str) -> None:
        coordinator = await link.coordinator_of(group)
        if coordinator is None:
            await groups.commit_ended(group, offsets)
            return
        await link.peers.txn(coordinator, "offsets-commit", {
            "group_id": group, "offsets": _rows(offsets), "transactional_id": tid})

    async def release(group: str, tid: str) -> None:
        coordinator = await link.coordinator_of(group)
        if coordinator is not None:
            await link.peers.txn(coordinator, "offsets-release", {
                "group_id": group, "transactional_id": tid})

    return GroupOffsets(check, write, release)


def _rows(offsets: list[Offset]) -> list[dict[str, object]]:
    return [{"topic_name": t, "partition_id": p, "offset": o, "metadata": m}
            for t, p, o, m in offsets]


def offsets_of(rows: list[dict[str, object]]) -> list[Offset]:
    """The offsets of a peer's call, as ``_rows`` sent them."""
    return [(str(r["topic_name"]), int(r["partition_id"]), int(r["offset"]),  # type: ignore[call-overload]
             None if r.get("metadata") is None else str(r["metadata"])) for r in rows]
