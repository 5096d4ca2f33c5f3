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
