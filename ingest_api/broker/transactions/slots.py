"""The transaction coordinator slots this broker serves, as leadership of the
``__transaction_state`` partitions moves (``cluster.coordinators``): a task on the
server's loop that, every ``group_slots.TICK_S`` and on every metadata change, lets go of the slots
it no longer leads and loads those it leads at a new leader epoch (the slot's state
log read to its end; the ends under way finished), serving them only then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from cluster.coordinators import CoordinatorSlots
from ingest_api.broker.cluster_link import ClusterLink
from ingest_api.broker.group_slots import every_tick_or_wake
from ingest_api.broker.transactions.coordinator import TransactionCoordinator

log = logging.getLogger(__name__)


class TxnSlots:
    def __init__(self, link: ClusterLink, coordinator: TransactionCoordinator) -> None:
        self.link = link
        self.coordinator = coordinator
        assert isinstance(coordinator.serving, CoordinatorSlots)
        self.slots = coordinator.serving
        self.loads = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()

        def changed(kind: str, name: str) -> None:  # on the view's thread
            loop.call_soon_threadsafe(self._wake.set)

        self.link.broker.view.listeners.append(changed)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        await every_tick_or_wake(self._wake, self.sync,
                                 "loading or letting go of transaction coordinator slots")

    async def sync(self) -> None:
        changes = self.slots.changes()
        for slot in changes.unload:
            self.coordinator.unload_slot(slot)
            self.slots.unloaded(slot)
            log.info("transaction coordinator slot %d is no longer led here", slot)
        for slot, epoch in changes.load.items():
            await self.coordinator.load_slot(slot, epoch)
            self.slots.loaded(slot, epoch)
            self.loads += 1
            log.info("transaction coordinator slot %d loaded at epoch %d", slot, epoch)
