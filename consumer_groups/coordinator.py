"""The group coordinator, after Kafka's new consumer group protocol (KIP-848): the
server computes the assignment and hands it out in heartbeat answers.

Each group has an epoch that grows whenever its membership, subscriptions or
topics' partition counts change; members converge on its target assignment one
heartbeat at a time, cooperatively (``group``: revocation first, a member's epoch
moving only in the answer to its own call). Commits and heartbeats from an unknown
member (left, timed out, replaced) are answered 404 and from another epoch 409: a
zombie can never overwrite the offsets of the member that took over its partitions.

Members that miss heartbeats for ``session_timeout_ms`` are removed. A member
with a ``group_instance_id`` (static membership) that leaves keeps its
partitions until its session times out; joining again with the same instance id
takes them back without a rebalance, under a new member id (the old one is
fenced).

Everything here runs on the server's event loop; only offset commits wait (for
their Delta append, see ``offsets.OffsetStore``).

In a cluster a group's coordinator is the leader of its coordinator slot
(``cluster.coordinators``), and moves with it: ``epoch_of(group)`` says at which
coordinator epoch this server coordinates a group (None: it does not). A commit is
written at that epoch and answered only if the epoch still holds after the write
(else NOT_COORDINATOR: the commit may be in the table; the member commits again at the
new coordinator). The server drops the groups of a slot it no longer leads
(``unload``) and reads their offsets anew when it leads it again (``reload``); their
members join again there (their membership lives in the coordinator's memory).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping

from consumer_groups.assignors import ASSIGNORS, DEFAULT_ASSIGNOR, TopicPartition
from consumer_groups.errors import (
    GroupNotEmptyError,
    InconsistentGroupError,
    StaleMemberEpochError,
    UnknownGroupError,
    UnknownMemberError,
)
from consumer_groups.group import Group, GroupState, Member, OffsetReset
from consumer_groups.offsets import Change, Committed, OffsetKey, OffsetStore
from log_tables.errors import (
    InvalidOptionError,
    NotCoordinatorError,
    QueueFullError,
    UnknownPartitionError,
    UnknownTopicError,
    UnknownTopicIdError,
    UnstableOffsetCommitError,
)
from log_tables.hot.isolation import READ_UNCOMMITTED, Isolation

__all__ = [  # Member, Group and their types stay importable here, where callers found them
    "CLOCK_SKEW_MS", "MAX_HEARTBEAT_INTERVAL_MS", "MAX_SESSION_TIMEOUT_MS",
    "MIN_SESSION_TIMEOUT_MS", "Group", "GroupCoordinator", "GroupState", "Member",
    "OffsetReset", "heartbeat_interval_ms",
]
MIN_SESSION_TIMEOUT_MS = 1_000
MAX_SESSION_TIMEOUT_MS = 30 * 60_000
MAX_HEARTBEAT_INTERVAL_MS = 5_000
CLOCK_SKEW_MS = 1_000
"""How far a coordinator's clock may be behind the controller's: an offset committed
more than this before its topic was made belongs to an older topic of the name."""


def heartbeat_interval_ms(session_timeout_ms: int) -> int:
    """How often a member should heartbeat: a third of its session, at most 5 s."""
    return max(100, min(MAX_HEARTBEAT_INTERVAL_MS, session_timeout_ms // 3))


class GroupCoordinator:
    """Every group of one server, with their offsets in ``store``.

    ``partitions_of(topic)`` gives a topic's partition count (None: no such topic).
    """

    def __init__(self, store: OffsetStore, partitions_of: Callable[[str], int | None], *,
                 max_groups: int = 10_000, max_members: int = 1_000,
                 offsets_retention_ms: int = 7 * 24 * 3600 * 1000,
                 clock: Callable[[], float] = time.monotonic,
                 epoch_of: Callable[[str], int | None] = lambda _group: 0,
                 created_ms_of: Callable[[str], int | None] = lambda _topic: None,
                 topic_id_of: Callable[[str], str | None] = lambda _topic: None) -> None:
        self.store = store
        self.partitions_of = partitions_of
        self.created_ms_of = created_ms_of
        self.topic_id_of = topic_id_of
        self.epoch_of = epoch_of
        self.max_groups = max_groups
        self.max_members = max_members
        self.offsets_retention_ms = offsets_retention_ms
        self.clock = clock
        self.groups: dict[str, Group] = {}
        self.membership_version = 0
        """Grows whenever a group's members (so maybe its subscriptions) change."""
        self.pending: Callable[[str], set[tuple[str, int]]] | None = None
        """A group's partitions whose offsets open transactions hold (the transaction
        coordinator's ``pending_partitions``)."""
        store.expired = self._expired

    # -- membership ----------------------------------------------------------------------

    def join(self, group_id: str, topics: Iterable[str], session_timeout_ms: int,
             instance_id: str | None = None, assignor: str | None = None,
             auto_offset_reset: OffsetReset = "latest",
             isolation: Isolation = READ_UNCOMMITTED) -> Member:
        """A new member (or a static member back under a new id) with its first assignment."""
        if not MIN_SESSION_TIMEOUT_MS <= session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
            raise InvalidOptionError(
                f"session_timeout_ms {session_timeout_ms} is outside "
                f"[{MIN_SESSION_TIMEOUT_MS}, {MAX_SESSION_TIMEOUT_MS}]")
        if assignor is not None and assignor not in ASSIGNORS:
            raise InvalidOptionError(f"unknown assignor {assignor!r}: use one of "
                                     f"{', '.join(sorted(ASSIGNORS))}")
        subscribed = frozenset(topics)
        if not subscribed:
            raise InvalidOptionError("subscribe to at least one topic")
        group = self.groups.get(group_id)
        if group is None:
            if len(self.groups) >= self.max_groups:
                raise QueueFullError(f"{len(self.groups)} consumer groups are active (the "
                                     "most this server keeps): delete unused groups")
            group = self.groups[group_id] = Group(group_id, assignor or DEFAULT_ASSIGNOR)
        elif assignor is not None and assignor != group.assignor and group.members:
            raise InconsistentGroupError(
                f"consumer group {group_id!r} uses the {group.assignor!r} assignor, not "
                f"{assignor!r}: join with the same one (or none)")
        elif not group.members and assignor is not None:
            group.assignor = assignor
        now = self.clock()
        old = next((m for m in group.members.values()
                    if instance_id is not None and m.instance_id == instance_id), None)
        member = Member(uuid.uuid4().hex, instance_id, subscribed, session_timeout_ms,
                        auto_offset_reset, 0, now + session_timeout_ms / 1000,
                        isolation=isolation)
        if old is not None and old.topics == subscribed:
            # Static membership: the new instance takes the old one's place and partitions
            # (and the old member id is fenced); no rebalance.
            del group.members[old.member_id]
            member.assigned, member.revoking, member.target = old.assigned, old.revoking, old.target
            member.revocation_told = old.revocation_told
            group.members[member.member_id] = member
            member.epoch = group.epoch
            group.reconcile(member)
            return member
        if old is not None:
            del group.members[old.member_id]
        if len(group.members) >= self.max_members:
            raise InconsistentGroupError(f"consumer group {group_id!r} has {len(group.members)} "
                                         f"members, the most allowed ({self.max_members})")
        group.members[member.member_id] = member
        self._rebalance(group)
        group.reconcile(member)
        return member

    def heartbeat(self, group_id: str, member_id: str, epoch: int,
                  owned: set[TopicPartition] | None = None) -> Member:
        """Keep a member alive, take its acknowledgement of revoked partitions, and give it
        its current epoch and assignment."""
        group, member = self._member(group_id, member_id, epoch)
        member.deadline = self.clock() + member.session_timeout_ms / 1000
        member.left = False
        if member.revoking and (member.revocation_told if owned is None
                                else not (owned & member.revoking)):
            member.revoking = set()
            member.revocation_told = False
        counts = self._partition_counts(group)
        if counts != group.partitions_seen:
            self._rebalance(group)
        group.reconcile(member)
        if member.revoking:
            member.revocation_told = True
        return member

    def leave(self, group_id: str, member_id: str) -> None:
        """A member leaves: its partitions move now (a static member's wait for it until
        its session times out)."""
        group = self._group(group_id)
        member = group.members.get(member_id)
        if member is None:
            raise UnknownMemberError(group_id, member_id)
        if member.instance_id is not None:
            member.left = True
            member.positions.clear()
            return
        self._remove(group, member)

    def expire_sessions(self) -> list[tuple[str, str]]:
        """Remove members whose session timed out; returns (group, member id) of each."""
        now = self.clock()
        gone: list[tuple[str, str]] = []
        for group in list(self.groups.values()):
            for member in [m for m in group.members.values() if m.deadline < now]:
                self._remove(group, member)
                gone.append((group.name, member.member_id))
            if not group.members:
                # An empty group is only its offsets (in the store): forget the rest, so
                # that max_groups bounds live groups. Its next member starts a new epoch
                # count; every older member id is unknown, so nothing stale gets through.
                del self.groups[group.name]
        return gone

    def _remove(self, group: Group, member: Member) -> None:
        del group.members[member.member_id]
        self._rebalance(group)

    def _group(self, group_id: str) -> Group:
        group = self.groups.get(group_id)
        if group is None:
            raise UnknownMemberError(group_id, None) if group_id in self.store.groups() else \
                UnknownGroupError(group_id)
        return group

    def _member(self, group_id: str, member_id: str, epoch: int) -> tuple[Group, Member]:
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            raise UnknownMemberError(group_id, member_id)
        if epoch != member.epoch:
            raise StaleMemberEpochError(group_id, member_id, epoch, member.epoch)
        return group, member

    def member(self, group_id: str, member_id: str) -> Member:
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if member is None:
            raise UnknownMemberError(group_id, member_id)
        return member

    # -- assignment ----------------------------------------------------------------------

    def _partition_counts(self, group: Group) -> dict[str, int]:
        counts: dict[str, int] = {}
        for topic in {t for m in group.members.values() for t in m.topics}:
            n = self.partitions_of(topic)
            if n:
                counts[topic] = n
        return counts

    def _rebalance(self, group: Group) -> None:
        self.membership_version += 1
        group.rebalance(self._partition_counts(group))

    # -- offsets -------------------------------------------------------------------------

    def check_commit(self, group_id: str, member_id: str | None, epoch: int,
                     offsets: list[tuple[str, int, int, str | None]],
                     topic_ids: Mapping[str, str] | None = None) -> list[Change]:
        """Fence the committer and check the partitions; the changes to write. An offset
        given with its topic's id is refused if the topic of the name has another id now
        (deleted and made again: a position in the old one means nothing in the new)."""
        group = self.groups.get(group_id)
        if member_id is None:
            # A commit outside the group protocol (Kafka's simple consumer, admin tools):
            # only while the group has no members, with epoch -1.
            if group is not None and group.members:
                raise UnknownMemberError(group_id, None)
            if epoch != -1:
                raise InvalidOptionError("a commit without member_id must use member_epoch -1")
        else:
            self._member(group_id, member_id, epoch)
        now_ms = int(time.time() * 1000)
        changes: list[Change] = []
        for topic, partition, offset, metadata in offsets:
            count = self.partitions_of(topic)
            if count is None:
                raise UnknownTopicError(topic)
            given = (topic_ids or {}).get(topic)
            if given is not None and self.topic_id_of(topic) not in (None, given):
                raise UnknownTopicIdError(topic, given)
            if partition >= count:
                raise UnknownPartitionError(topic, partition, count)
            changes.append((OffsetKey(group_id, topic, partition),
                            Committed(offset, metadata, now_ms, member_id, epoch)))
        return changes

    async def commit(self, group_id: str, member_id: str | None, epoch: int,
                     offsets: list[tuple[str, int, int, str | None]],
                     topic_ids: Mapping[str, str] | None = None) -> None:
        changes = self.check_commit(group_id, member_id, epoch, offsets, topic_ids)
        await self._write(group_id, changes)
        # The member may have been fenced while the append ran: its offsets are in Delta
        # (they were valid when checked), exactly as Kafka's log has them.

    async def commit_ended(self, group_id: str,
                           offsets: list[tuple[str, int, int, str | None]]) -> None:
        """Offsets a transaction committed (their member was checked when they were sent
        to it, ``check_commit``): written now, whoever the group's members are."""
        now_ms = int(time.time() * 1000)
        await self._write(group_id, [(OffsetKey(group_id, t, p), Committed(o, m, now_ms, None, -1))
                                     for t, p, o, m in offsets])

    async def _write(self, group_id: str, changes: list[Change]) -> None:
        """Write at this coordinator's epoch; answered only if it still holds after."""
        at = self.epoch_of(group_id)
        if at is None:
            raise NotCoordinatorError(f"this broker does not coordinate group {group_id!r} "
                                      f"(any more); ask for its coordinator again")
        await self.store.commit(changes, at)
        if self.epoch_of(group_id) != at:
            raise NotCoordinatorError(
                f"group {group_id!r}'s coordinator moved while its offsets were written "
                f"(they may be committed); commit again at the new coordinator")

    def unload(self, wanted: Callable[[str], bool]) -> int:
        """Drop the groups ``wanted`` (another broker coordinates them now): their members
        and what the store holds of them. Returns how many groups had members here."""
        gone = [g for g in self.groups if wanted(g)]
        for g in gone:
            del self.groups[g]
        if gone:
            self.membership_version += 1
        self.store.forget_groups(wanted)
        return len(gone)

    def committed(self, group_id: str) -> dict[tuple[str, int], Committed]:
        """The group's committed offsets, without those of an older topic of the same name
        (committed before the topic was made: ``forget_topic`` missed them)."""
        return {(t, p): c for (t, p), c in self.store.group_offsets(group_id).items()
                if not self._before_topic(t, c)}

    def require_stable(self, group_id: str, tp: tuple[str, int] | None = None) -> None:
        """UnstableOffsetCommitError while an open transaction holds offsets of the group
        (of ``tp``, given one): Kafka's OffsetFetch with require_stable."""
        pending = self.pending(group_id) if self.pending is not None else set()
        if pending := (pending if tp is None else pending & {tp}):
            t, p = min(pending)
            raise UnstableOffsetCommitError(f"group {group_id!r} has an offset of {t}-{p} "
                                            "in an open transaction; ask again once it ends")

    def committed_offset(self, group_id: str, tp: tuple[str, int]) -> Committed | None:
        """``committed``'s offset of one partition (what a member starts from, after
        ``require_stable``: not while an open transaction holds one)."""
        c = self.store.latest.get(OffsetKey(group_id, *tp))
        return None if c is None or self._before_topic(tp[0], c) else c

    def _before_topic(self, topic: str, committed: Committed) -> bool:
        created = self.created_ms_of(topic)
        return created is not None and committed.commit_ms < created - CLOCK_SKEW_MS

    async def forget_topic(self, topic: str) -> int:
        """A deleted topic's committed offsets go with it, as Kafka's do: tombstones for
        the groups coordinated here, and out of memory for every group. If a topic of the
        name was made again meanwhile, only offsets committed before it go. Returns how
        many offsets went."""
        # Members' positions in it go too: a member still assigned a partition of a topic
        # made again under the name starts it from the new topic's committed offset (or
        # its reset policy), not from where it was in the old one.
        for group in self.groups.values():
            for member in group.members.values():
                for tp in [tp for tp in member.positions if tp.topic == topic]:
                    del member.positions[tp]
        stale: dict[str, list[Change]] = {}
        for key, c in list(self.store.latest.items()):
            if key.topic == topic and (self.created_ms_of(topic) is None
                                       or self._before_topic(topic, c)):
                stale.setdefault(key.group, []).append((key, None))
        for group_id, changes in stale.items():
            if self.epoch_of(group_id) is None:  # another broker's group: it writes them
                for key, _ in changes:
                    self.store.latest.pop(key, None)
            else:
                await self._write(group_id, changes)
        return sum(map(len, stale.values()))

    def subscriptions(self) -> dict[str, list[str]]:
        """Per group with members: the topics they subscribe to."""
        return {name: sorted({t for m in g.members.values() for t in m.topics})
                for name, g in sorted(self.groups.items()) if g.members}

    def known_groups(self) -> list[str]:
        return sorted(set(self.groups) | self.store.groups())

    def _expired(self, group_id: str, newest_commit_ms: int) -> bool:
        group = self.groups.get(group_id)
        if (group is not None and group.members) or self.epoch_of(group_id) is None:
            return False  # in use, or another broker's to judge
        return newest_commit_ms < time.time() * 1000 - self.offsets_retention_ms

    def require_empty(self, group_id: str, action: str) -> None:
        group = self.groups.get(group_id)
        if group is not None and group.members:
            raise GroupNotEmptyError(group_id, len(group.members), action)
        if group is None and group_id not in self.store.groups():
            raise UnknownGroupError(group_id)

    async def delete_group(self, group_id: str) -> None:
        self.require_empty(group_id, "delete it")
        changes: list[Change] = [(OffsetKey(group_id, t, p), None)
                                 for (t, p) in self.committed(group_id)]
        if changes:
            await self._write(group_id, changes)
        self.groups.pop(group_id, None)
