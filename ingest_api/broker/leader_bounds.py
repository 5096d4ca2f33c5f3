"""Group lag in a cluster: each partition's log start and high watermark as its leader
has them.

A group's coordinator holds replicas of some of the partitions the group reads only, and
a follower's high watermark may lag its leader's: lag counted from the coordinator's own
logs showed 0 for every partition it holds no replica of. So the bounds of a partition
this broker does not lead come from its leader: one ``Peers.partitions`` per (leader
broker, topic), asked as this broker (over HTTP a forwarded ``GET
.../topics/{t}/partitions``: the leader answers from its own logs for every partition of
the topic and forwards nothing), read only for the partitions it names that broker as
the leader of. The requests run
concurrently, at most ``MAX_REQUESTS`` at once, each within ``TIMEOUT_S`` and all within
``DEADLINE_S``. A partition whose leader did not answer (down, offline, no longer
leading it, the topic gone) has no bounds: its lag is unknown (null), never a wrong 0.

The describe and lag routes ask at each request for their group's topics (``ask``);
``/metrics`` and the dashboard read ``latest``, refreshed for every group's topics
before a scrape, a sample or a page build, at most once per ``max_age_s``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from consumer_groups.coordinator import GroupCoordinator
from consumer_groups.lag import Bounds, BoundsOf, all_read_topics, log_bounds
from log_tables.cold.tiered_storage import TieredStorage
from log_tables.errors import LakelogError
from log_tables.hot.log_manager import LogManager

if TYPE_CHECKING:
    from cluster.model import BrokerInfo
    from ingest_api.broker.cluster_link import ClusterLink

log = logging.getLogger(__name__)

TIMEOUT_S = 2.0
"""One leader's answer."""
DEADLINE_S = 5.0
"""All of one ``ask``'s answers: what has not come by then has no bounds."""
MAX_REQUESTS = 8
"""Requests of one ``ask`` in flight at once."""

Answered = Mapping[tuple[str, int], Bounds]
"""(topic, partition) -> its leader's bounds, for the partitions led elsewhere that
answered."""


class LeaderBounds:
    """The bounds group lag counts to: this broker's logs for the partitions it leads (or
    every partition, on a server that is no cluster), the leaders' for the rest."""

    def __init__(self, manager: LogManager, tiered: TieredStorage,
                 link: ClusterLink | None) -> None:
        self._local = log_bounds(manager, tiered)
        self._link = link
        self._latest: Answered = {}
        self._latest_topics: frozenset[str] = frozenset()
        self._latest_s = float("-inf")
        self._refreshing = asyncio.Lock()

    async def ask(self, topics: Iterable[str]) -> BoundsOf:
        """Bounds of the partitions of ``topics``, their leaders asked now."""
        return functools.partial(self._bounds_of, await self._ask(topics))

    def latest(self, topic: str, partition: int) -> Bounds | None:
        """Bounds as of the last ``refresh`` (a ``BoundsOf``; any thread may call it)."""
        return self._bounds_of(self._latest, topic, partition)

    async def refresh(self, topics: Iterable[str], max_age_s: float) -> None:
        """Ask the leaders again for ``latest``, unless it is younger than ``max_age_s``
        and covered ``topics`` (one refresh at a time: a scrape, a sample and a page that
        come together share one)."""
        wanted = frozenset(topics)
        async with self._refreshing:
            if wanted <= self._latest_topics and \
                    time.monotonic() - self._latest_s < max_age_s:
                return
            started = time.monotonic()
            answered = await self._ask(wanted)
            self._latest, self._latest_topics, self._latest_s = answered, wanted, started

    async def refresh_groups(self, groups: GroupCoordinator, max_age_s: float) -> None:
        """``refresh`` for every topic a known group reads."""
        if self._link is None:  # nothing to ask: ``latest`` reads this server's logs
            return
        await self.refresh(all_read_topics(groups), max_age_s)

    def _bounds_of(self, answered: Answered, topic: str, partition: int) -> Bounds | None:
        link = self._link
        if link is None or link.broker.view.leader(topic, partition) == link.broker_id:
            return self._local(topic, partition)
        return answered.get((topic, partition))

    async def _ask(self, topics: Iterable[str]) -> dict[tuple[str, int], Bounds]:
        link = self._link
        if link is None:
            return {}
        view = link.broker.view
        wanted: dict[tuple[int, str], set[int]] = {}
        for topic in sorted(set(topics)):
            assignment = view.topic(topic)
            for p in range(assignment.partitions if assignment is not None else 0):
                leader = view.leader(topic, p)
                if leader >= 0 and leader != link.broker_id:  # -1: offline, no bounds
                    wanted.setdefault((leader, topic), set()).add(p)
        if not wanted:
            return {}
        answered: dict[tuple[str, int], Bounds] = {}
        gate = asyncio.Semaphore(MAX_REQUESTS)
        tasks = [asyncio.create_task(self._ask_one(link, gate, leader, topic, ps, answered))
                 for (leader, topic), ps in wanted.items()]
        try:
            done, late = await asyncio.wait(tasks, timeout=DEADLINE_S)
        except asyncio.CancelledError:  # the server is stopping: leave no request behind
            for task in tasks:
                task.cancel()
            raise
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        for task in done:
            if (exc := task.exception()) is not None:  # an answer it could not read
                log.warning("group lag: reading a leader's bounds failed: %r", exc)
        if late:
            log.warning("group lag: %d of %d leaders' answers did not come within %.1f s; "
                        "their partitions show no bounds", len(late), len(tasks), DEADLINE_S)
        return answered

    @staticmethod
    async def _ask_one(link: ClusterLink, gate: asyncio.Semaphore, leader: int, topic: str,
                       partitions: set[int], answered: dict[tuple[str, int], Bounds]) -> None:
        info: BrokerInfo | None = link.broker.view.broker(leader)
        if info is None:  # not registered: down or restarting
            return
        async with gate:
            try:
                described = await asyncio.wait_for(link.peers.partitions(info, topic),
                                                   TIMEOUT_S)
            except (LakelogError, TimeoutError) as exc:
                log.info("group lag: broker %d did not give the bounds of %s (%s)", leader,
                         topic, exc)
                return
        for p in described:
            if p.partition in partitions and p.leader == leader:
                answered[(topic, p.partition)] = Bounds(p.log_start_offset, p.high_watermark)
