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

from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

from consumer_groups.assignors import TopicPartition
from consumer_groups.coordinator import GroupCoordinator, Member
from consumer_groups.offsets import Committed
from log_tables.cold.tiered_storage import TieredStorage
from log_tables.errors import UnknownPartitionError, UnknownTopicError
from log_tables.hot.log_manager import LogManager


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
            return Bounds(tiered.log_start_offset(plog, topic, partition), plog.high_watermark)
        except (UnknownTopicError, UnknownPartitionError):  # deleted (maybe meanwhile)
            return None
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
    return _read_topics(coordinator, group_id, coordinator.committed(group_id))


def all_read_topics(coordinator: GroupCoordinator) -> set[str]:
    """The topics any known group reads (what the metrics and the dashboard need bounds of)."""
    committed = {key.topic for key in list(coordinator.store.latest)}
    subscribed = {t for group_id in list(coordinator.groups)
                  for m in _members(coordinator, group_id) for t in m.topics}
    return committed | subscribed


def group_lag(coordinator: GroupCoordinator, group_id: str, bounds_of: BoundsOf
              ) -> list[PartitionLag]:
    """Every partition of every topic the group reads, sorted by topic and partition."""
    return _rows(coordinator, group_id, coordinator.committed(group_id), bounds_of)


def all_group_lag(coordinator: GroupCoordinator, bounds_of: BoundsOf
                  ) -> Iterator[tuple[str, PartitionLag]]:
    """``group_lag`` of every known group, in one pass over the committed offsets (the
    metrics scrape: per-group lookups would scan every offset once per group)."""
    by_group: dict[str, dict[tuple[str, int], Committed]] = {}
    for key, c in list(coordinator.store.latest.items()):
        if coordinator.committed_offset(key.group, (key.topic, key.partition)) is not None:
            by_group.setdefault(key.group, {})[(key.topic, key.partition)] = c
    for group_id in sorted(set(by_group) | set(coordinator.groups)):
        for row in _rows(coordinator, group_id, by_group.get(group_id, {}), bounds_of):
            yield group_id, row


# The metrics scrape reads these from a worker thread while the event loop changes
# groups: every dict and set is copied in one C call (atomic under the GIL) before it
# is iterated.

def _members(coordinator: GroupCoordinator, group_id: str) -> list[Member]:
    group = coordinator.groups.get(group_id)
    return list(group.members.values()) if group is not None else []


def _read_topics(coordinator: GroupCoordinator, group_id: str,
                 committed: Mapping[tuple[str, int], Committed]) -> set[str]:
    subscribed = {t for m in _members(coordinator, group_id) for t in m.topics}
    return subscribed | {t for t, _ in list(committed)}


def _rows(coordinator: GroupCoordinator, group_id: str,
          committed: Mapping[tuple[str, int], Committed], bounds_of: BoundsOf
          ) -> list[PartitionLag]:
    owners = {tp: m.member_id for m in _members(coordinator, group_id)
              for tp in m.assigned | m.revoking}
    keys: set[tuple[str, int]] = set(committed) | set(owners)
    for topic in _read_topics(coordinator, group_id, committed):
        keys.update((topic, p) for p in range(coordinator.partitions_of(topic) or 0))
    return [PartitionLag(t, p, committed.get((t, p)), bounds_of(t, p),
                         owners.get(TopicPartition(t, p))) for t, p in sorted(keys)]
