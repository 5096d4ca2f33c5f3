"""Which bounds group lag counts to (``ingest_api.broker.leader_bounds``), against a fake
cluster: this broker's logs for the partitions it leads, the leader's for the rest (a
follower's own high watermark lags), one request per (leader, topic), and no bounds
(None, never 0) where the leader is offline, silent or no longer leads. The real
brokers are in ``tests/cluster/test_group_lag.py``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cluster.model import BrokerInfo, TopicAssignment
from consumer_groups.lag import Bounds
from ingest_api.broker import leader_bounds as module
from ingest_api.broker.leader_bounds import LeaderBounds
from ingest_api.broker.peers import PartitionBounds

ME = 1
LEADERS = {("a", 0): 1, ("a", 1): 2, ("a", 2): 3, ("a", 3): -1,
           ("b", 0): 2, ("b", 1): 2}
"""Partition -> its leader (-1: offline) as this broker's view has it."""
LOCAL = {(t, p): Bounds(0, 5) for t, p in LEADERS}
"""This broker's replicas: it follows ("a", 1) and ("b", 0), its high watermark behind."""
REMOTE = {2: {"a": {1: (1, 9)}, "b": {0: (0, 7), 1: (2, 8)}}, 3: {"a": {2: (0, 4)}}}
"""What each leader answers for its partitions: (log start, high watermark)."""


class _View:
    def __init__(self) -> None:
        self.leaders = dict(LEADERS)

    def topic(self, name: str) -> TopicAssignment | None:
        n = sum(1 for t, _ in self.leaders if t == name)
        return TopicAssignment([[1]] * n) if n else None

    def leader(self, topic: str, partition: int) -> int:
        return self.leaders.get((topic, partition), -1)

    def broker(self, broker_id: int) -> BrokerInfo | None:
        return BrokerInfo(broker_id, "127.0.0.1", 9000 + broker_id)


class _Link:
    def __init__(self, silent: frozenset[int] = frozenset(),
                 moved: frozenset[tuple[str, int]] = frozenset()) -> None:
        self.broker_id = ME
        self.broker = self
        self.view = _View()
        self.sent: list[tuple[int, str]] = []
        self.silent = silent
        self.moved = moved

        self.peers = self  # ingest_api.broker.peers.Peers: only ``partitions`` is asked

    async def partitions(self, info: BrokerInfo, topic: str) -> list[PartitionBounds]:
        self.sent.append((info.broker_id, topic))
        if info.broker_id in self.silent:
            await asyncio.sleep(3600)
        return [PartitionBounds(p, 3 if (topic, p) in self.moved else info.broker_id, s, hw)
                for p, (s, hw) in REMOTE.get(info.broker_id, {}).get(topic, {}).items()]


class _Log:
    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.high_watermark = LOCAL[key].high_watermark


class _Manager:
    def log(self, topic: str, partition: int) -> _Log:
        return _Log((topic, partition))


class _Tiered:
    def log_start_offset(self, plog: _Log, topic: str, partition: int) -> int:
        return LOCAL[plog.key].log_start_offset


def _bounds(link: Any) -> LeaderBounds:
    return LeaderBounds(_Manager(), _Tiered(), link)  # type: ignore[arg-type]


def test_led_here_is_local_and_the_rest_is_the_leader_s() -> None:
    link = _Link()
    bounds_of = asyncio.run(_bounds(link).ask(["a", "b", "a"]))
    assert {key: bounds_of(*key) for key in LEADERS} == {
        ("a", 0): Bounds(0, 5),   # led here
        ("a", 1): Bounds(1, 9),   # followed here at 5: the leader's 9
        ("a", 2): Bounds(0, 4),
        ("a", 3): None,           # offline
        ("b", 0): Bounds(0, 7), ("b", 1): Bounds(2, 8)}
    assert sorted(link.sent) == [(2, "a"), (2, "b"), (3, "a")]  # one per leader and topic


def test_a_silent_leader_or_one_that_moved_gives_no_bounds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module, "TIMEOUT_S", 0.2)
    link = _Link(silent=frozenset({3}), moved=frozenset({("b", 1)}))

    async def ask() -> tuple[Any, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        bounds_of = await _bounds(link).ask(["a", "b"])
        return bounds_of, loop.time() - started

    bounds_of, took = asyncio.run(ask())
    assert took < 1.0
    assert bounds_of("a", 2) is None and bounds_of("b", 1) is None
    assert bounds_of("a", 1) == Bounds(1, 9) and bounds_of("b", 0) == Bounds(0, 7)


def test_refresh_asks_again_only_when_old_or_for_new_topics() -> None:
    link = _Link()
    bounds = _bounds(link)

    async def run() -> None:
        assert bounds.latest("a", 1) is None  # nothing asked yet: unknown, not 0
        await bounds.refresh(["a"], max_age_s=60)
        assert bounds.latest("a", 1) == Bounds(1, 9) and bounds.latest("a", 0) == Bounds(0, 5)
        await asyncio.gather(*(bounds.refresh(["a"], max_age_s=60) for _ in range(5)))
        assert len(link.sent) == 2  # young enough: shared
        await bounds.refresh(["a", "b"], max_age_s=60)  # a topic it did not cover: all again
        assert len(link.sent) == 5 and bounds.latest("b", 1) == Bounds(2, 8)
        await bounds.refresh(["b"], max_age_s=0)
        assert len(link.sent) == 6 and bounds.latest("a", 1) is None  # "a" not asked

    asyncio.run(run())


def test_a_server_that_is_no_cluster_reads_its_own_logs() -> None:
    bounds = _bounds(None)
    assert asyncio.run(bounds.ask(["a"]))("a", 2) == Bounds(0, 5)
    assert bounds.latest("b", 1) == Bounds(0, 5)
