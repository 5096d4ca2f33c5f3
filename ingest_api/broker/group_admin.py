"""Consumer group administration beside the coordinator (``consumer_groups.coordinator``):
which broker answers for a group, a member's seeks and the reset of a group's committed
offsets.

In a cluster a group's requests are its coordinator's, the leader of the group's slot of
``__consumer_offsets``: a front asks ``coordinator_elsewhere`` first and hands the
request to that broker (the HTTP front forwards it; Kafka's answers NOT_COORDINATOR).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from cluster.model import BrokerInfo
from consumer_groups.assignors import TopicPartition
from consumer_groups.coordinator import GroupCoordinator
from consumer_groups.lag import PartitionLag, group_lag, read_topics
from consumer_groups.offsets import Change, Committed, OffsetKey
from ingest_api.broker.leader_bounds import LeaderBounds
from ingest_api.broker.peers import GroupSummary as GroupSummary
from ingest_api.broker.topics import TopicAdmin
from log_tables.cold.tiered_storage import TieredStorage
from log_tables.errors import InvalidOptionError, LakelogError, NotCoordinatorError
from log_tables.hot.isolation import READ_UNCOMMITTED
from log_tables.hot.log_manager import LogManager

if TYPE_CHECKING:
    from ingest_api.broker.cluster_link import ClusterLink

ALONE_BROKER_ID = 1
"""A broker that runs alone answers as broker 1 (``ingest_api.broker.metadata``)."""


@dataclass(frozen=True)
class Coordinator:
    """Kafka's FindCoordinator answer: host and port None when alone (the client keeps
    the address it used)."""

    broker_id: int
    host: str | None
    port: int | None


@dataclass(frozen=True)
class GroupListing:
    """The groups this broker answers for, and the brokers to ask for theirs (a
    cluster's first broker asks every other live one)."""

    local: list[str]
    ask: list[BrokerInfo] = field(default_factory=list)


@dataclass(frozen=True)
class OffsetReset:
    """Reset a group's committed offsets (``topics`` empty: those it has offsets for)."""

    to: Literal["earliest", "latest", "offset", "datetime"]
    topics: tuple[str, ...] = ()
    offset: int | None = None
    datetime: datetime | None = None
    dry_run: bool = False


class GroupAdmin:
    """Where a group's requests go, and the group changes that are not a member's
    heartbeat (seek, offset reset)."""

    def __init__(self, groups: GroupCoordinator, manager: LogManager, tiered: TieredStorage,
                 topics: TopicAdmin, bounds: LeaderBounds,
                 link: ClusterLink | None = None) -> None:
        self.groups = groups
        self.bounds = bounds
        self.manager = manager
        self.tiered = tiered
        self.topics = topics
        self.link = link

    @property
    def broker_id(self) -> int:
        return ALONE_BROKER_ID if self.link is None else self.link.broker_id

    # -- where -----------------------------------------------------------------------
    async def coordinator_elsewhere(self, group_id: str, forwarded: bool) -> BrokerInfo | None:
        """The group's coordinator when that is another broker; None: this one. A request
        another broker forwarded is never forwarded again (NOT_COORDINATOR)."""
        if self.link is None:
            return None
        coordinator = await self.link.coordinator_of(group_id)
        if coordinator is not None and forwarded:
            raise NotCoordinatorError(f"broker {self.link.broker_id} does not coordinate group "
                                      f"{group_id!r}; broker {coordinator.broker_id} does")
        return coordinator

    async def find_coordinator(self, group_id: str) -> Coordinator:
        """Kafka's FindCoordinator: the broker that coordinates the group."""
        if self.link is None:  # this server, at whatever address the client used
            return Coordinator(ALONE_BROKER_ID, None, None)
        info = await self.link.coordinator_of(group_id) or self.link.broker.info
        return Coordinator(info.broker_id, info.host, info.port)

    def listing(self, names: Iterable[str], forwarded: bool) -> GroupListing:
        """Of ``names`` (the groups the caller may see), those this broker answers for:
        alone, all; in a cluster, those it coordinates, plus the other live brokers to ask
        for theirs unless another broker asked."""
        if self.link is None:
            return GroupListing(list(names))
        link = self.link
        local = []
        for g in names:
            with contextlib.suppress(LakelogError):
                if link.coordinator(g) is None:
                    local.append(g)
        if forwarded:
            return GroupListing(local)
        return GroupListing(local, [b for b in link.broker.view.live_brokers()
                                    if b.broker_id != link.broker_id])

    async def list_groups(self, names: Iterable[str], forwarded: bool,
                          principal: str | None = None) -> list[GroupSummary]:
        """Of ``names`` (the groups the caller may see), those this broker coordinates;
        a cluster's first broker adds the other live brokers' (asked for ``principal``;
        a broker that does not answer: its groups are unavailable until it is back), by
        name."""
        listing = self.listing(names, forwarded)
        local = [self.summary(g) for g in listing.local]
        if not listing.ask:
            return local
        assert self.link is not None
        peers = self.link.peers
        data = {s.group_id: s for s in local}
        for answer in await asyncio.gather(*(peers.groups(b, principal) for b in listing.ask),
                                           return_exceptions=True):
            if not isinstance(answer, BaseException):
                for s in answer:
                    data.setdefault(s.group_id, s)
        return [data[g] for g in sorted(data)]

    def summary(self, group_id: str) -> GroupSummary:
        """The group as this broker (its coordinator) holds it."""
        group = self.groups.groups.get(group_id)
        if group is None:
            return GroupSummary(group_id, self.broker_id, "Empty", None, 0, 0)
        return GroupSummary(group_id, self.broker_id, group.state(), group.assignor,
                            group.epoch, len(group.members))

    def require_group(self, group_id: str) -> None:
        """The group has members or committed offsets; else 404 ``group_id_not_found``."""
        if self.groups.groups.get(group_id) is None and not self.groups.committed(group_id):
            self.groups.require_empty(group_id, "describe it")  # raises unknown group

    async def lag(self, group_id: str, *, existing_only: bool = False
                  ) -> list[PartitionLag]:
        """Every partition the group reads (its members' subscriptions and its committed
        topics): the committed offset, the bounds (in a cluster, its leader's; None where
        the leader did not answer), the lag and the owner. ``existing_only``: leave out
        partitions the topic no longer has."""
        self.require_group(group_id)
        groups = self.groups
        rows = group_lag(groups, group_id, await self.bounds.ask(read_topics(groups, group_id)))
        if not existing_only:
            return rows
        return [r for r in rows
                if r.bounds is not None or r.partition < (groups.partitions_of(r.topic) or 0)]

    # -- changes -----------------------------------------------------------------------
    def seek(self, group_id: str, member_id: str,
             positions: Sequence[tuple[str, int, int | None]]
             ) -> list[tuple[TopicPartition, int | None]]:
        """Move the member's positions ((topic, partition, offset); None: back to the
        committed offset), only in partitions assigned to it: every assigned partition and
        its position after."""
        member = self.groups.member(group_id, member_id)
        for topic, partition, _ in positions:
            if TopicPartition(topic, partition) not in member.assigned:
                raise InvalidOptionError(f"{topic}/{partition} is not assigned to member "
                                         f"{member_id!r}: seek only its own partitions")
        for topic, partition, offset in positions:
            tp = TopicPartition(topic, partition)
            if offset is None:
                member.positions.pop(tp, None)
            else:
                member.positions[tp] = offset
        return [(tp, member.positions.get(tp)) for tp in sorted(member.assigned)]

    async def reset_offsets(self, group_id: str, reset: OffsetReset
                            ) -> list[tuple[str, int, int | None]]:
        """Reset the group's committed offsets (only while it has no members): (topic,
        partition, offset) for each, committed unless ``dry_run``."""
        groups = self.groups
        group = groups.groups.get(group_id)
        if group is not None and group.members:
            groups.require_empty(group_id, "reset its offsets")
        topics = reset.topics or tuple(sorted({t for t, _ in groups.committed(group_id)}))
        if not topics:
            raise InvalidOptionError(f"consumer group {group_id!r} has no committed offsets: "
                                     "name the topics to reset")
        if reset.to == "offset" and reset.offset is None:
            raise InvalidOptionError("to=offset needs an offset")
        if reset.to == "datetime" and reset.datetime is None:
            raise InvalidOptionError("to=datetime needs a datetime (ISO 8601)")
        changes = [self._reset_change(group_id, topic, p, reset)
                   for topic in topics for p in range(self.topics.describe(topic).partitions)]
        if not reset.dry_run:
            await groups.store.commit(changes)
        return [(k.topic, k.partition, c.offset if c else None) for k, c in changes]

    def _reset_change(self, group_id: str, topic: str, partition: int,
                      reset: OffsetReset) -> Change:
        plog = self.manager.log(topic, partition)
        start = self.tiered.log_start_offset(plog, topic, partition)
        hw = plog.readable_end(READ_UNCOMMITTED)  # where a consumer reads up to
        if reset.to == "earliest":
            offset = start
        elif reset.to == "latest":
            offset = hw
        elif reset.to == "offset":
            assert reset.offset is not None
            offset = min(max(reset.offset, start), hw)  # clamped into the log, as Kafka's tool
        else:
            assert reset.datetime is not None
            if reset.datetime.tzinfo is None:
                raise InvalidOptionError("give the datetime a timezone "
                                         "(e.g. 2026-11-21T10:00:00Z)")
            found = self.tiered.offset_for_timestamp(plog, topic, partition,
                                                     int(reset.datetime.timestamp() * 1000))
            offset = hw if found is None else max(found, start)
        return (OffsetKey(group_id, topic, partition),
                Committed(offset, None, int(time.time() * 1000), None, -1))
