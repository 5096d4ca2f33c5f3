"""The transaction coordinator as an object, on real logs and a real state log: what a
producer hears while an end cannot write its markers.

The fault, a partition leader that cannot take a marker for longer than the coordinator
retries, is made here by a ``Markers`` that refuses while told to: on a cluster it is a
leader stalled past ``MARKER_RETRY_S`` but short of its session, which a loaded machine
cannot aim at reliably (the nemesis met it, and its producers were told
``producer_fenced``, fatal, for a transaction the coordinator was still aborting)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ingest_api.broker.transactions.coordinator import TransactionCoordinator
from ingest_api.broker.transactions.state_log import LocalStateLog
from log_tables.clock import ManualClock
from log_tables.errors import (
    BrokerNotAvailableError,
    ConcurrentTransactionsError,
    TransactionAbortableError,
)
from log_tables.hot.log_manager import LogManager
from log_tables.hot.producer_ids import ProducerIdManager


class StalledMarkers:
    """Markers into the real logs, refused (as an unreachable leader's) while ``stalled``."""

    def __init__(self, manager: LogManager) -> None:
        self.manager = manager
        self.stalled = False
        self.written: list[tuple[str, int]] = []

    async def write(self, topic: str, partition: int, producer_id: int, producer_epoch: int,
                    commit: bool, coordinator_epoch: int) -> None:
        if self.stalled:
            raise BrokerNotAvailableError(f"the leader of {topic}-{partition} did not answer")
        plog = self.manager.log(topic, partition)
        if plog.append_marker(producer_id, producer_epoch, commit, coordinator_epoch) is not None:
            self.written.append((topic, partition))


def test_a_transaction_the_coordinator_is_still_aborting_is_concurrent_not_fenced(
        manager: LogManager, tmp_path: Path) -> None:
    async def run() -> None:
        clock = ManualClock()
        markers = StalledMarkers(manager)
        coordinator = TransactionCoordinator(
            LocalStateLog(manager, 4), ProducerIdManager(tmp_path / "data"), markers,
            max_timeout_ms=60_000, abort_interval_ms=3_600_000,
            require_partition=manager.log, clock=clock)
        await coordinator.start()
        try:
            pid, epoch = await coordinator.init_producer("slow", 1000)
            await coordinator.add_partitions("slow", pid, epoch, [("t", 0)])
            clock.advance(2000)  # past its timeout; its one partition's leader stalls
            markers.stalled = True
            with pytest.raises(BrokerNotAvailableError):
                await coordinator.expire_once()
            assert coordinator.describe("slow").state == "PrepareAbort"
            with pytest.raises(ConcurrentTransactionsError):  # retry: not fenced
                await coordinator.add_partitions("slow", pid, epoch, [("t", 0)])
            markers.stalled = False
            await coordinator.expire_once()  # the coordinator tries again, and finishes
            assert coordinator.describe("slow").state == "CompleteAbort"
            assert markers.written == [("t", 0)]
            with pytest.raises(TransactionAbortableError):
                await coordinator.add_partitions("slow", pid, epoch, [("t", 0)])
            assert await coordinator.end("slow", pid, epoch, commit=False) == (pid, epoch + 1)
            await coordinator.add_partitions("slow", pid, epoch + 1, [("t", 0)])
        finally:
            await coordinator.stop()

    asyncio.run(run())
