"""A consumer group as its coordinator holds it in memory: the members, their
assignments, and the cooperative hand-over of partitions between them (KIP-848).

Each group has an epoch that grows whenever its membership, subscriptions or topics'
partition counts change (``Group.rebalance``); the assignor then computes a target
assignment. Members converge on it one heartbeat at a time (``Group.reconcile``):

- a partition leaving a member is first *revoked*: it is no longer polled for
  that member, and is given to nobody until the member acknowledges (a heartbeat
  whose ``owned`` list no longer has it, or, for clients that send no ``owned``,
  the heartbeat after the one that told it), which gives it time to commit;
- a member's epoch moves to the group epoch only in the answer to its own
  heartbeat (or join), when it has released what it must and received what is
  free; so every call it makes carries an epoch the coordinator can check.

``coordinator.GroupCoordinator`` keeps every group of a server and decides when.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from consumer_groups.assignors import MemberSpec, TopicPartition, assign
from log_tables.hot.isolation import READ_UNCOMMITTED, Isolation

OffsetReset = Literal["earliest", "latest", "none"]
GroupState = Literal["Empty", "Reconciling", "Stable"]


@dataclass
class Member:
    member_id: str
    instance_id: str | None
    topics: frozenset[str]
    session_timeout_ms: int
    auto_offset_reset: OffsetReset
    epoch: int
    deadline: float
    assigned: set[TopicPartition] = field(default_factory=set)
    revoking: set[TopicPartition] = field(default_factory=set)
    target: set[TopicPartition] = field(default_factory=set)
    positions: dict[TopicPartition, int] = field(default_factory=dict)
    revocation_told: bool = False
    left: bool = False
    """A static member that left: its partitions wait for it until its session ends."""
    poll_turn: int = 0
    isolation: Isolation = READ_UNCOMMITTED
    """Kafka's isolation.level: ``read_committed`` polls stop at the last stable offset."""

    @property
    def order_key(self) -> str:
        return self.instance_id or self.member_id


@dataclass
class Group:
    name: str
    assignor: str
    epoch: int = 0
    members: dict[str, Member] = field(default_factory=dict)
    partitions_seen: dict[str, int] = field(default_factory=dict)

    def state(self) -> GroupState:
        if not self.members:
            return "Empty"
        converged = all(not m.revoking and m.assigned == m.target and m.epoch == self.epoch
                        for m in self.members.values() if not m.left)
        return "Stable" if converged else "Reconciling"

    def owned_by_others(self, member_id: str) -> set[TopicPartition]:
        out: set[TopicPartition] = set()
        for m in self.members.values():
            if m.member_id != member_id:
                out |= m.assigned | m.revoking
        return out

    def rebalance(self, partition_counts: dict[str, int]) -> None:
        """A new group epoch and target assignment over the subscribed topics'
        ``partition_counts``; revocations take effect at once."""
        self.epoch += 1
        self.partitions_seen = partition_counts
        specs = {m.member_id: MemberSpec(m.order_key, m.topics) for m in self.members.values()}
        previous = {m.member_id: m.target for m in self.members.values()}
        target = assign(self.assignor, specs, self.partitions_seen, previous)
        for member in self.members.values():
            member.target = target[member.member_id]
            if member.assigned - member.target:
                revoke(member)
                member.revocation_told = False

    def reconcile(self, member: Member) -> None:
        """Move ``member`` toward its target (only in answer to its own call)."""
        revoke(member)
        if member.revoking:
            return  # nothing new until it has let go
        free = (member.target - member.assigned) - self.owned_by_others(member.member_id)
        if free:
            member.assigned |= free
            member.epoch = self.epoch
        elif member.assigned == member.target:
            member.epoch = self.epoch


def revoke(member: Member) -> None:
    """Take from ``member`` what its target no longer has: not polled, given to nobody
    until it acknowledges."""
    revoke = member.assigned - member.target
    member.assigned -= revoke
    member.revoking |= revoke
    for tp in revoke:
        member.positions.pop(tp, None)
