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
    if link is None:
        return GroupOffsets(groups.check_commit, groups.commit_ended)

    async def check(group: str, member_id: str | None, epoch: int,
                    offsets: list[Offset]) -> None:
        coordinator = await link.coordinator_of(group)
        if coordinator is None:
            groups.check_commit(group, member_id, epoch, offsets)
            return
        await link.peers.txn(coordinator, "offsets-check", {
            "group_id": group, "member_id": member_id, "member_epoch": epoch,
            "offsets": _rows(offsets)})

    async def write(group: str, offsets: list[Offset]) -> None:
        coordinator = await link.coordinator_of(group)
        if coordinator is None:
            await groups.commit_ended(group, offsets)
            return
        await link.peers.txn(coordinator, "offsets-commit", {
            "group_id": group, "offsets": _rows(offsets)})

    return GroupOffsets(check, write)


def _rows(offsets: list[Offset]) -> list[dict[str, object]]:
    return [{"topic_name": t, "partition_id": p, "offset": o, "metadata": m}
            for t, p, o, m in offsets]


def offsets_of(rows: list[dict[str, object]]) -> list[Offset]:
    """The offsets of a peer's call, as ``_rows`` sent them."""
    return [(str(r["topic_name"]), int(r["partition_id"]), int(r["offset"]),  # type: ignore[call-overload]
             None if r.get("metadata") is None else str(r["metadata"])) for r in rows]
