"""Wakes long-polling fetches when their partition gets new records."""

from __future__ import annotations

import asyncio

from log_tables.errors import QueueFullError


class AppendNotifier:
    """One event per partition, replaced after each notify; waits are bounded in number."""

    def __init__(self, max_waiters: int) -> None:
        self.max_waiters = max_waiters
        self.waiters = 0
        self._events: dict[str, asyncio.Event] = {}

    def notify(self, partition_name: str) -> None:
        event = self._events.pop(partition_name, None)
        if event is not None:
            event.set()

    async def wait(self, partition_name: str, timeout_s: float) -> bool:
        """Wait until the partition is appended to or ``timeout_s`` passes; True if woken."""
        if self.waiters >= self.max_waiters:
            raise QueueFullError(f"{self.waiters} fetches are already waiting for data")
        event = self._events.get(partition_name)
        if event is None:
            event = self._events[partition_name] = asyncio.Event()
        self.waiters += 1
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            self.waiters -= 1

    async def wait_any(self, partition_names: list[str], timeout_s: float) -> bool:
        """Wait until any of the partitions is appended to or ``timeout_s`` passes (one waiter
        however many partitions); True if woken."""
        if not partition_names:
            await asyncio.sleep(timeout_s)
            return False
        if self.waiters >= self.max_waiters:
            raise QueueFullError(f"{self.waiters} fetches are already waiting for data")
        events = []
        for name in partition_names:
            event = self._events.get(name)
            if event is None:
                event = self._events[name] = asyncio.Event()
            events.append(event)
        self.waiters += 1
        tasks = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            done, _ = await asyncio.wait(tasks, timeout=timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            return bool(done)
        finally:
            self.waiters -= 1
            for t in tasks:
                t.cancel()
