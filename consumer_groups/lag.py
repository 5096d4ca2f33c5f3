"""Lag: every partition a group reads, with its committed offset (if any) and lag.

A group *reads* the topics its live members subscribe to, plus the topics it has
committed offsets for (all that is left of an empty group, and what Kafka's
``kafka-consumer-groups --describe`` lists for one). Every partition of those
topics is listed, committed or not: a partition without a committed offset has
``committed`` None (Kafka's CURRENT-OFFSET ``-``) and its lag counts from the log
start offset, because all of its records are still unread by the group. Listing
only the committed partitions would hide exactly the partitions a group has not
reached (issue 19: lag 27,995 shown, 72,000 unread records not).

The same rule is written in SQL for the ``consumer_lag`` view (``views.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from consumer_groups.assignors import TopicPartition
from consumer_groups.coordinator import GroupCoordinator
from consumer_groups.offsets import Committed
from log_tables.errors import UnknownPartitionError, UnknownTopicError
from log_tables.log_manager import LogManager
from log_tables.tiered_storage import TieredStorage


class Bounds(NamedTuple):
    log_start_offset: int
    high_watermark: int


BoundsOf = Callable[[str, int], Bounds | None]
"""(topic, partition) -> the partition's log start and high watermark; None: no such topic."""


def log_bounds(manager: LogManager, tiered: TieredStorage) -> BoundsOf:
    """Bounds from a server's logs: the log start across both tiers, the high watermark."""
    def bounds_of(topic: str, partition: int) -> Bounds | None:
        try:
            plog = manager.log(topic, partition)
        except (UnknownTopicError, UnknownPartitionError):
            return None
        return Bounds(tiered.log_start_offset(plog, topic, partition), plog.high_watermark)
    return bounds_of


class PartitionLag(NamedTuple):
    """One partition a group reads, as ``kafka-consumer-groups --describe`` shows it."""

    topic: str
    partition: int
    committed: Committed | None
    """None: the group has committed nothing here (CURRENT-OFFSET ``-``)."""
    bounds: Bounds | None
    """None: the topic was deleted after the group committed to it."""
    member_id: str | None
    """The live member the partition is assigned to (or being revoked from)."""

    @property
    def lag(self) -> int | None:
        """High watermark - committed offset (at least 0); from the log start offset when
        nothing is committed; None for a deleted topic."""
        if self.bounds is None:
            return None
        if self.committed is None:
            return max(0, self.bounds.high_watermark - self.bounds.log_start_offset)
        return max(0, self.bounds.high_watermark - self.committed.offset)


def read_topics(coordinator: GroupCoordinator, group_id: str) -> set[str]:
    """The topics the group reads: its live members' subscriptions and its committed topics."""
    group = coordinator.groups.get(group_id)
    subscribed = {t for m in group.members.values() for t in m.topics} if group else set()
    return subscribed | {t for t, _ in coordinator.committed(group_id)}


def group_lag(coordinator: GroupCoordinator, group_id: str, bounds_of: BoundsOf
              ) -> list[PartitionLag]:
    """Every partition of every topic the group reads, sorted by topic and partition."""
    committed = coordinator.committed(group_id)
    group = coordinator.groups.get(group_id)
    owners = {tp: m.member_id for m in (group.members.values() if group else ())
              for tp in m.assigned | m.revoking}
    keys: set[tuple[str, int]] = set(committed) | set(owners)
    for topic in read_topics(coordinator, group_id):
        keys.update((topic, p) for p in range(coordinator.partitions_of(topic) or 0))
    return [PartitionLag(t, p, committed.get((t, p)), bounds_of(t, p),
                         owners.get(TopicPartition(t, p))) for t, p in sorted(keys)]
