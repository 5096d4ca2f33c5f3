"""Writing the markers that end a transaction in each partition it wrote (Kafka's
WriteTxnMarkers).

``LocalMarkers`` writes to the partitions of this broker's own logs: the marker is
appended and fsynced (a reader told the records committed never sees them go back to
open after a crash), and the partition's waiting fetches are woken (the last stable
offset moved). A partition deleted meanwhile needs no marker.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from ingest_api.broker.notifier import AppendNotifier
from log_tables.errors import UnknownPartitionError, UnknownTopicError
from log_tables.hot.log_manager import LogManager


class Markers(Protocol):
    async def write(self, topic: str, partition: int, producer_id: int, producer_epoch: int,
                    commit: bool, coordinator_epoch: int) -> None:
        """End the producer's transaction in the partition (nothing when none is open
        there: a marker is written once)."""
        ...


class LocalMarkers:
    def __init__(self, manager: LogManager, notifier: AppendNotifier) -> None:
        self.manager = manager
        self.notifier = notifier

    async def write(self, topic: str, partition: int, producer_id: int, producer_epoch: int,
                    commit: bool, coordinator_epoch: int) -> None:
        try:
            plog = self.manager.log(topic, partition)
        except (UnknownTopicError, UnknownPartitionError):
            return

        def append() -> int | None:
            offset = plog.append_marker(producer_id, producer_epoch, commit, coordinator_epoch)
            if offset is not None:
                plog.flush(offset + 1)
            return offset

        if await asyncio.to_thread(append) is not None:
            self.notifier.notify(plog.name)
