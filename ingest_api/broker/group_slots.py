"""The consumer groups this broker coordinates, as leadership of their coordinator slots
moves (``cluster.coordinators``): a task on the server's event loop that, every
``TICK_S`` and whenever the metadata changes,

1. lets go of the slots this broker no longer leads: their groups' members and offsets
   leave its memory (requests for them go to the new coordinator);
2. loads the slots it leads at a new leader epoch: the groups' committed offsets are
   read from the offsets table (every broker writes the one table), their old members
   dropped (they join again here); only then is the slot served, at that epoch
   (``CoordinatorLoadInProgressError`` meanwhile).

A slot led again while it loaded is loaded again; a broker that lost its lease serves no
slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from cluster.coordinators import CoordinatorSlots
from cluster.model import OFFSETS_TOPIC
from consumer_groups.coordinator import GroupCoordinator
from consumer_groups.hashing import group_slot
from ingest_api.broker.cluster_link import ClusterLink

log = logging.getLogger(__name__)
TICK_S = 0.1


async def every_tick_or_wake(wake: asyncio.Event, step: Callable[[], Awaitable[None]],
                             what: str) -> None:
    """Run ``step`` every ``TICK_S`` and whenever ``wake`` is set, for ever; a failing
    step is logged and run again at the next tick (the slot followers' loop)."""
    while True:
        # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
        # cancellation that meets its timeout, and stop() would wait forever.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(TICK_S):
                await wake.wait()
        wake.clear()
        try:
            await step()
        except Exception:
            log.exception("%s failed; trying again", what)


class GroupSlots:
    def __init__(self, link: ClusterLink, groups: GroupCoordinator) -> None:
        self.link = link
        self.groups = groups
        self.slots = CoordinatorSlots(link.broker, OFFSETS_TOPIC, link.offsets_slots)
        self.loads = 0
        """Slots loaded so far (a slot led anew is loaded anew)."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._deleted_topics: list[str] = []
        """Topics deleted in the cluster whose offsets this broker has yet to forget."""

    def slot(self, group: str) -> int:
        return group_slot(group, self.slots.slots)

    def epoch(self, group: str) -> int | None:
        """The coordinator epoch at which this broker coordinates ``group`` now (None:
        it does not, or not yet): ``GroupCoordinator.epoch_of``."""
        return self.slots.epoch(self.slot(group))

    def start(self) -> None:
        loop = asyncio.get_running_loop()

        def changed(kind: str, name: str) -> None:  # on the view's thread
            if kind == "topic-deleted":
                loop.call_soon_threadsafe(self._topic_deleted, name)
            loop.call_soon_threadsafe(self._wake.set)

        self.link.broker.view.listeners.append(changed)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        async def step() -> None:
            await self.sync()
            await self.forget_deleted_topics()

        await every_tick_or_wake(self._wake, step, "loading or unloading coordinator slots")

    def _topic_deleted(self, name: str) -> None:  # on the loop: the list of the moment
        self._deleted_topics.append(name)

    async def forget_deleted_topics(self) -> None:
        """Delete the committed offsets of topics deleted in the cluster, of the groups
        coordinated here (every broker hears of a deletion and does its own groups)."""
        pending, self._deleted_topics = self._deleted_topics, []
        for i, topic in enumerate(pending):
            try:
                gone = await self.groups.forget_topic(topic)
            except Exception:
                # Tried again at the next pass, behind any deleted meanwhile; the others
                # of this pass go on (one failing topic holds up none of them).
                log.exception("deleting the offsets of deleted topic %s failed", topic)
                self._deleted_topics.extend(pending[i:i + 1])
                continue
            if gone:
                log.info("topic %s was deleted: %d committed offset(s) of it deleted", topic, gone)

    async def sync(self) -> None:
        """One pass: let go of what is no longer led, load what is led anew."""
        changes = self.slots.changes()
        for slot in changes.unload:
            dropped = self.groups.unload(lambda g, s=slot: self.slot(g) == s)  # type: ignore[misc]
            self.slots.unloaded(slot)
            log.info("coordinator slot %d is no longer led here: %d group(s) let go",
                     slot, dropped)
        if not changes.load:
            return
        wanted = set(changes.load)

        def mine(group: str) -> bool:
            return self.slot(group) in wanted

        started = time.monotonic()
        self.groups.unload(mine)  # members of an older incarnation join again
        read = await asyncio.to_thread(self.groups.store.reload_groups, mine)
        for slot, epoch in changes.load.items():
            self.slots.loaded(slot, epoch)
        self.loads += len(wanted)
        log.info("coordinator slot(s) %s led here: %d committed offset(s) read in %.0f ms",
                 sorted(wanted), read, (time.monotonic() - started) * 1000)
