"""Where coordinators keep transactional ids durable: ``__transaction_state``, one
partition per coordinator slot, a record per change (key: the transactional id, value:
its ``TxnMeta`` as JSON). The newest record of an id is its state; a coordinator loads a
slot by reading it from its start.

``LocalStateLog`` is a broker's own: the topic is made in its log manager at first use
(an internal topic: no listing, job or table sees it), and a write is appended and
fsynced before it returns, so that a state a client was told of survives a crash.
``cleaner`` compacts the slots and expires idle ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Iterator
from typing import TYPE_CHECKING, Protocol

import msgspec
import numpy as np
import pyarrow as pa

from consumer_groups.hashing import group_slot
from ingest_api.broker.produce.request import ProduceRequest
from ingest_api.broker.produce.runs import ProduceResult, Run
from ingest_api.broker.transactions.parts import step
from ingest_api.broker.transactions.state import TxnMeta, decode, encode
from log_tables.errors import (
    CoordinatorLoadInProgressError,
    LeaderNotAvailableError,
    NotCoordinatorError,
    NotLeaderError,
    TopicExistsError,
)
from log_tables.hot.log_manager import LogManager
from log_tables.hot.partition_log import PartitionLog
from log_tables.records import RECORD_SCHEMA, null_headers
from log_tables.registry import TXN_STATE_CONFIGS, TXN_STATE_TOPIC

if TYPE_CHECKING:
    from ingest_api.broker.cluster_link import ClusterLink
    from ingest_api.broker.produce.service import ProduceService


class StateLog(Protocol):
    """The coordinators' durable state: ``slots`` partitions of ``__transaction_state``."""

    slots: int

    async def write(self, meta: TxnMeta, now_ms: int, durable: bool = True) -> None:
        """Make ``meta`` the transactional id's state, durably before returning unless
        ``durable`` is False (a ``Complete*`` state: lost in a crash, the ``Prepare*``
        before it is finished again, which writes no second marker)."""
        ...

    def load(self, slot: int) -> dict[str, TxnMeta]:
        """Every transactional id of ``slot``, as last written."""
        ...

    def records(self, slot: int) -> int:
        """How many records ``slot`` holds from its log start."""
        ...

    async def rewrite(self, slot: int, records: list[tuple[str, TxnMeta | None]],
                      now_ms: int, epoch: int) -> None:
        """Make ``records`` (each id's state; None: a tombstone, the id is gone) the whole
        of ``slot`` as loaded at coordinator ``epoch``: append them durably, then move the
        log start to the first (``cleaner``); refused (``NotCoordinatorError``) where this
        broker no longer leads the slot at ``epoch``. Below the first, every record is one
        they supersede: deleting them on any replica is safe."""
        ...


log = logging.getLogger(__name__)
REWRITE_BATCH = 1000
"""States per append of a compaction."""
READY_WAIT_S = 5.0
"""How long a state write waits for a slot this broker has just come to lead to be
replicated (a client without retries, curl, is not answered 503 by a new cluster)."""


def txn_slot(transactional_id: str, slots: int) -> int:
    """The slot of a transactional id: Kafka's ``abs(hashCode) % partitions``."""
    return group_slot(transactional_id, slots)


class LocalStateLog:
    """The state log of a broker alone: partitions of its own log manager."""

    def __init__(self, manager: LogManager, slots: int) -> None:
        self.manager = manager
        self.slots = slots
        self._lock = threading.Lock()

    def _log(self, slot: int) -> PartitionLog:
        if TXN_STATE_TOPIC not in self.manager.registry:
            with self._lock, contextlib.suppress(TopicExistsError):
                self.manager.create_topic(TXN_STATE_TOPIC, self.slots, dict(TXN_STATE_CONFIGS))
        return self.manager.log(TXN_STATE_TOPIC, slot)

    async def write(self, meta: TxnMeta, now_ms: int, durable: bool = True) -> None:
        await asyncio.to_thread(self._write, meta, now_ms, durable)

    def _write(self, meta: TxnMeta, now_ms: int, durable: bool) -> None:
        plog = self._log(txn_slot(meta.transactional_id, self.slots))
        info = plog.append(_batch([(meta.transactional_id, meta)], now_ms))
        if durable:
            plog.flush(info.last_offset + 1)

    def load(self, slot: int) -> dict[str, TxnMeta]:
        if TXN_STATE_TOPIC not in self.manager.registry:
            return {}
        return _replay(_records(self._log(slot)), slot)

    def records(self, slot: int) -> int:
        if TXN_STATE_TOPIC not in self.manager.registry:
            return 0  # (asking does not make the topic)
        plog = self._log(slot)
        return plog.log_end_offset - plog.log_start_offset

    async def rewrite(self, slot: int, records: list[tuple[str, TxnMeta | None]],
                      now_ms: int, epoch: int) -> None:
        await asyncio.to_thread(self._rewrite, slot, records, now_ms)

    def _rewrite(self, slot: int, records: list[tuple[str, TxnMeta | None]],
                 now_ms: int) -> None:
        plog = self._log(slot)
        first = plog.log_end_offset
        for i in range(0, len(records), REWRITE_BATCH):
            plog.append(_batch(records[i:i + REWRITE_BATCH], now_ms))
        plog.flush(plog.log_end_offset)
        step("txn-state-rewritten")
        plog.delete_records(first)


def _batch(records: list[tuple[str, TxnMeta | None]], now_ms: int) -> pa.RecordBatch:
    keys, values = _columns(records)
    return pa.record_batch([pa.array([now_ms] * len(records), pa.int64()),
                            pa.array(keys, pa.binary()), pa.array(values, pa.binary()),
                            null_headers(len(records))], schema=RECORD_SCHEMA)


def _columns(records: list[tuple[str, TxnMeta | None]]
             ) -> tuple[list[bytes | None], list[bytes | None]]:
    return ([tid.encode() for tid, _ in records],
            [None if m is None else encode(m) for _, m in records])


def _replay(records: Iterator[tuple[str, bytes | None]], slot: int) -> dict[str, TxnMeta]:
    """The newest state of each id; a record that is not one (written by other means) is
    logged and passed over, so that one bad record never stops a coordinator loading."""
    found: dict[str, TxnMeta] = {}
    for key, value in records:
        if value is None:
            found.pop(key, None)
            continue
        try:
            found[key] = decode(value)
        except msgspec.DecodeError as exc:
            log.warning("%s-%d: a record of %r is not a transaction's state (%s); passed "
                        "over", TXN_STATE_TOPIC, slot, key, exc)
    return found


def _records(plog: PartitionLog) -> Iterator[tuple[str, bytes | None]]:
    """Every record of a slot, its key as text (``read_all``)."""
    for k, v in read_all(plog):
        yield k.decode(), v


def read_all(plog: PartitionLog) -> Iterator[tuple[bytes, bytes | None]]:
    """Every keyed record of an internal partition, to its log end: a new leader's high
    watermark may lag the records it has (as Kafka's coordinators, it loads them all: a
    state not yet on every replica was not answered, and finishing it is allowed). The
    coordinators' state log and the schema registry load this way."""
    offset = plog.log_start_offset
    end = plog.log_end_offset
    while offset < end:
        result = plog.read(offset, max_bytes=8 << 20, to_log_end=True)
        for batch in result.batches:
            keys = batch.records.column(1).to_pylist()
            values = batch.records.column(2).to_pylist()
            for k, v in zip(keys, values, strict=True):
                if k is not None:
                    yield k, v
        nxt = result.next_offset
        if nxt is None or nxt <= offset:
            return
        offset = nxt


class ClusterStateLog:
    """The state log of a cluster's broker: the ``__transaction_state`` partitions it
    leads. A write is an acks=all produce to the slot's partition here (every in-sync
    replica has it when it returns; ``NotCoordinatorError`` if this broker does not lead
    the slot, or stopped leading it while writing); a load reads this broker's replica,
    which leads the slot, to its end."""

    def __init__(self, manager: LogManager, produce: ProduceService, link: ClusterLink,
                 slots: int) -> None:
        self.manager = manager
        self.produce = produce
        self.link = link
        self.slots = slots

    async def write(self, meta: TxnMeta, now_ms: int, durable: bool = True) -> None:
        await self._produce(txn_slot(meta.transactional_id, self.slots),
                            [(meta.transactional_id, meta)], now_ms, durable)

    def records(self, slot: int) -> int:
        if TXN_STATE_TOPIC not in self.manager.registry:
            return 0
        plog = self.manager.log(TXN_STATE_TOPIC, slot)
        return plog.log_end_offset - plog.log_start_offset

    async def rewrite(self, slot: int, records: list[tuple[str, TxnMeta | None]],
                      now_ms: int, epoch: int) -> None:
        first = None
        for i in range(0, len(records), REWRITE_BATCH):
            offsets = await self._produce(slot, records[i:i + REWRITE_BATCH], now_ms, True,
                                          epoch)
            first = int(offsets.min()) if first is None else first
        step("txn-state-rewritten")
        if first is not None:
            HereOnly(self.link, epoch).local_epoch(TXN_STATE_TOPIC, slot)  # raises if moved
            await asyncio.to_thread(self.manager.log(TXN_STATE_TOPIC, slot).delete_records,
                                    first)

    async def _produce(self, slot: int, records: list[tuple[str, TxnMeta | None]],
                       now_ms: int, durable: bool, epoch: int | None = None) -> np.ndarray:
        """The records' offsets."""
        tid = records[0][0]
        topic = self.manager.topic(TXN_STATE_TOPIC)
        keys, values = _columns(records)
        request = ProduceRequest(keys=keys, values=values,
                                 timestamps=np.full(len(records), now_ms, np.int64),
                                 partitions=np.full(len(records), slot, np.int64))
        deadline = time.monotonic() + READY_WAIT_S
        while True:
            result = await self.produce.produce(topic, request, "all" if durable else "1",
                                                HereOnly(self.link, epoch))
            if not result.errors:
                return result.offsets
            err = next(iter(result.errors.values()))
            if isinstance(err, LeaderNotAvailableError) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # a slot led a moment ago: replicated shortly
                continue
            if isinstance(err, LeaderNotAvailableError):
                raise CoordinatorLoadInProgressError(
                    f"transactional id {tid!r}: its coordinator slot {slot} "
                    f"is not ready here yet ({err.message}); try again") from None
            if isinstance(err, NotLeaderError):
                raise NotCoordinatorError(
                    f"transactional id {tid!r}: this broker no longer "
                    f"leads its coordinator slot {slot} ({err.message}); ask its "
                    "coordinator again") from None
            raise err

    def load(self, slot: int) -> dict[str, TxnMeta]:
        if TXN_STATE_TOPIC not in self.manager.registry:
            return {}
        return _replay(_records(self.manager.log(TXN_STATE_TOPIC, slot)), slot)


class HereOnly:
    """A state write's route (``produce.service.Route``): the slot's partition here."""

    def __init__(self, link: ClusterLink, epoch: int | None = None) -> None:
        self.link = link
        self.epoch = epoch
        """Only at this leader epoch (a compaction's: the epoch it loaded the slot at)."""

    def local_epoch(self, topic: str, partition: int) -> int | None:
        where = self.link.route(topic, partition, True)  # never elsewhere: raises there
        assert isinstance(where, int)
        if self.epoch is not None and where != self.epoch:
            raise NotLeaderError(f"{topic}-{partition} is led here at epoch {where}, not at "
                                 f"{self.epoch}, where its states were read")
        return where

    def forward(self, topic: str, request: ProduceRequest, runs: list[Run],
                result: ProduceResult, acks: str) -> Awaitable[None]:
        raise AssertionError("a coordinator's state is written where it leads")

    def still_leads(self, topic: str, partition: int, epoch: int) -> bool:
        return self.link.still_leads(topic, partition, epoch)
