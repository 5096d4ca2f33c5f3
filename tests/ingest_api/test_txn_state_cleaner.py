"""``__transaction_state`` kept small (``transactions.cleaner``): a slot compacted to one
record per id keeps every state (for this coordinator and the next to load it), idle ids
expire and stay expired across a restart, and writes racing a compaction are never lost.
A real coordinator on real logs, one slot (every id in it)."""

from __future__ import annotations

import asyncio

import pytest

from ingest_api.broker.transactions.coordinator import TransactionCoordinator
from ingest_api.broker.transactions.state import TxnMeta
from ingest_api.broker.transactions.state_log import LocalStateLog
from log_tables.clock import ManualClock
from log_tables.errors import TransactionalIdNotFoundError
from log_tables.hot.log_manager import LogManager
from log_tables.hot.producer_ids import ProducerIdManager
from tests.ingest_api.test_txn_coordinator import StalledMarkers


class LateStateLog(LocalStateLog):
    """Answers a write a moment after it is appended (as a cluster's does once the
    followers have it): the window a compaction must not read the slot in."""

    async def write(self, meta: TxnMeta, now_ms: int, durable: bool = True) -> None:
        await super().write(meta, now_ms, durable)
        await asyncio.sleep(0.002)


def _coordinator(manager: LogManager, clock: ManualClock, *, min_records: int = 1000,
                 expiration_ms: int = 604_800_000, late: bool = False
                 ) -> TransactionCoordinator:
    c = TransactionCoordinator(
        (LateStateLog if late else LocalStateLog)(manager, 1),
        ProducerIdManager(manager.data_dir), StalledMarkers(manager),
        max_timeout_ms=600_000, abort_interval_ms=3_600_000, require_partition=manager.log,
        clock=clock, expiration_ms=expiration_ms)
    c.cleaner.min_records = min_records
    return c


async def _transaction(c: TransactionCoordinator, tid: str, pid: int, epoch: int,
                       partition: int = 0) -> int:
    """One committed transaction; the producer's next epoch."""
    await c.add_partitions(tid, pid, epoch, [("t", partition)])
    return (await c.end(tid, pid, epoch, commit=True))[1]


def test_a_compacted_slot_keeps_every_state_and_loads_them(manager: LogManager) -> None:
    async def run() -> None:
        clock = ManualClock()
        c = _coordinator(manager, clock, min_records=20)
        await c.start()
        epochs = {f"id-{i}": await c.init_producer(f"id-{i}", 60_000) for i in range(5)}
        pid, epoch = epochs["id-0"]
        for _ in range(30):  # each: Ongoing, PrepareCommit, CompleteCommit
            epoch = await _transaction(c, "id-0", pid, epoch)
        await c.add_partitions("id-1", *epochs["id-1"], [("t", 1)])  # one left open
        state_log = c.state_log
        assert state_log.records(0) > 90
        await c.expire_once()
        assert c.cleaner.compactions == 1
        assert state_log.records(0) == 5  # one state per id
        states = {m.transactional_id: m for m in c.list()}
        assert state_log.load(0) == states
        assert states["id-1"].state == "Ongoing"
        await c.expire_once()  # not due again
        assert c.cleaner.compactions == 1
        epoch = await _transaction(c, "id-0", pid, epoch)  # the producer goes on
        await c.stop()
        again = _coordinator(manager, clock)
        await again.start()
        assert {m.transactional_id: m for m in again.list()} == \
            {m.transactional_id: m for m in c.list()}
        await again.end("id-1", *epochs["id-1"], commit=True)  # the open one, committed
        await again.stop()

    asyncio.run(run())


def test_an_idle_transactional_id_expires_and_stays_expired(manager: LogManager) -> None:
    async def run() -> None:
        clock = ManualClock()
        c = _coordinator(manager, clock, expiration_ms=60_000)
        await c.start()
        idle = await c.init_producer("idle", 120_000)
        busy = await c.init_producer("busy", 120_000)
        clock.advance(61_000)
        await c.add_partitions("busy", *busy, [("t", 0)])  # a transaction under way
        await c.expire_once()
        assert c.cleaner.expired == 1
        assert [m.transactional_id for m in c.list()] == ["busy"]
        with pytest.raises(TransactionalIdNotFoundError, match="expired"):
            await c.add_partitions("idle", *idle, [("t", 0)])
        await c.stop()
        again = _coordinator(manager, clock, expiration_ms=60_000)
        await again.start()  # the tombstone and the log start keep it gone
        assert [m.transactional_id for m in again.list()] == ["busy"]
        pid, epoch = await again.init_producer("idle", 120_000)  # a new producer id
        assert pid != idle[0]
        await _transaction(again, "idle", pid, epoch)
        await again.stop()

    asyncio.run(run())


def test_state_writes_racing_compactions_are_never_lost(manager: LogManager) -> None:
    """Eight producers commit while the slot is compacted again and again (every pass is
    due): a state written while a compaction read the slot's states would be put back by
    the compaction's older copy, after it in the log, without the gate."""
    async def run() -> None:
        clock = ManualClock()
        c = _coordinator(manager, clock, min_records=1, late=True)
        await c.start()

        async def producer(i: int) -> None:
            pid, epoch = await c.init_producer(f"p{i}", 60_000)
            for _ in range(10):
                epoch = await _transaction(c, f"p{i}", pid, epoch, i % 2)

        async def compactions() -> None:
            for _ in range(60):
                await c.expire_once()
                await asyncio.sleep(0.001)

        await asyncio.gather(*(producer(i) for i in range(8)), compactions())
        assert c.cleaner.compactions > 5
        assert c.state_log.load(0) == {m.transactional_id: m for m in c.list()}
        assert all(m.state == "CompleteCommit" for m in c.list())
        await c.stop()

    asyncio.run(run())


def test_a_slot_reloaded_during_a_compaction_is_not_rewritten(manager: LogManager) -> None:
    """The slot moved away and came back (a new coordinator epoch) while the compaction
    read it: the states it holds may be older than the new leader's, so it writes
    nothing and moves no log start. (Made here by changing the loaded epoch from inside
    the state log's read: a move and a return timed inside one compaction cannot be
    aimed at on a real cluster.)"""
    async def run() -> None:
        clock = ManualClock()
        c = _coordinator(manager, clock, min_records=1)
        await c.start()
        pid, epoch = await c.init_producer("moved", 60_000)
        await _transaction(c, "moved", pid, epoch)
        state_log = c.state_log
        held = state_log.records(0)
        reads = state_log.records

        def records_then_moved(slot: int) -> int:
            c.epochs.loaded[slot] = 7  # unloaded and loaded again at a new epoch
            return reads(slot)

        state_log.records = records_then_moved  # type: ignore[method-assign]
        await c.expire_once()
        assert c.cleaner.compactions == 0 and state_log.records(0) == held
        state_log.records = reads  # type: ignore[method-assign]
        await c.expire_once()  # at the new epoch, compacted as usual
        assert c.cleaner.compactions == 1 and state_log.records(0) == 1
        await c.stop()

    asyncio.run(run())
