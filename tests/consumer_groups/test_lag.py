"""Which partitions a group reads and their lag, with a real coordinator and offset store
(the partition bounds are given, as a server's logs would give them)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumer_groups.coordinator import GroupCoordinator
from consumer_groups.lag import Bounds, all_group_lag, group_lag, read_topics
from consumer_groups.offsets import OffsetStore


@pytest.fixture
def partitions() -> dict[str, int]:
    return {"t": 3, "u": 2}


@pytest.fixture
def coordinator(tmp_path: Path, partitions: dict[str, int]) -> Iterator[GroupCoordinator]:
    store = OffsetStore(str(tmp_path / "warehouse"), max_wait_ms=1)
    store.start()
    yield GroupCoordinator(store, partitions.get)
    store.close()


def _bounds(partitions: dict[str, int]) -> dict[tuple[str, int], Bounds]:
    return {(t, p): Bounds(5 * p, 10 + 5 * p) for t, n in partitions.items() for p in range(n)}


def test_a_group_reads_its_subscriptions_and_committed_topics_whole(
        coordinator: GroupCoordinator, partitions: dict[str, int]) -> None:
    bounds = _bounds(partitions)
    m = coordinator.join("g", ["u"], 10_000)
    assert read_topics(coordinator, "g") == {"u"}
    rows = group_lag(coordinator, "g", lambda t, p: bounds.get((t, p)))
    assert [(r.topic, r.partition, r.committed, r.lag, r.member_id) for r in rows] == [
        ("u", 0, None, 10, m.member_id), ("u", 1, None, 10, m.member_id)]
    # One commit to another topic: the group reads all of that topic, owned by nobody.
    asyncio.run(coordinator.commit("g", m.member_id, m.epoch, [("t", 2, 30, None)]))
    rows = group_lag(coordinator, "g", lambda t, p: bounds.get((t, p)))
    assert [(r.topic, r.partition, r.committed and r.committed.offset, r.lag, r.member_id)
            for r in rows] == [("t", 0, None, 10, None), ("t", 1, None, 10, None),
                               ("t", 2, 30, 0, None),  # committed past the end: lag 0
                               ("u", 0, None, 10, m.member_id), ("u", 1, None, 10, m.member_id)]
    # The metrics' one-pass version agrees, group by group.
    coordinator.join("h", ["t"], 10_000)
    every = list(all_group_lag(coordinator, lambda t, p: bounds.get((t, p))))
    assert every == [(g, row) for g in ("g", "h")
                     for row in group_lag(coordinator, g, lambda t, p: bounds.get((t, p)))]
    assert [g for g, _ in every] == ["g"] * 5 + ["h"] * 3
    # Empty again: only the committed topic is read.
    coordinator.leave("g", m.member_id)
    assert read_topics(coordinator, "g") == {"t"}
    assert [(r.topic, r.partition) for r in group_lag(
        coordinator, "g", lambda t, p: bounds.get((t, p)))] == [("t", 0), ("t", 1), ("t", 2)]
    # A deleted topic: its committed partitions stay, with no bounds and no lag.
    del partitions["t"]
    rows = group_lag(coordinator, "g", lambda t, p: None)
    assert [(r.topic, r.partition, r.committed and r.committed.offset, r.bounds, r.lag)
            for r in rows] == [("t", 2, 30, None, None)]


def test_subscriptions_follow_membership(coordinator: GroupCoordinator) -> None:
    assert coordinator.subscriptions() == {}
    before = coordinator.membership_version
    a = coordinator.join("g", ["u"], 10_000)
    b = coordinator.join("g", ["t", "u"], 10_000, instance_id="static-1")
    coordinator.join("h", ["t"], 10_000)
    assert coordinator.subscriptions() == {"g": ["t", "u"], "h": ["t"]}
    assert coordinator.membership_version > before
    seen = coordinator.membership_version
    coordinator.leave("g", a.member_id)
    assert coordinator.membership_version > seen
    coordinator.leave("g", b.member_id)  # static: its session still holds its place
    assert coordinator.subscriptions() == {"g": ["t", "u"], "h": ["t"]}
