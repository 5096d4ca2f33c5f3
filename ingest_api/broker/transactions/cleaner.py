"""Keeps ``__transaction_state`` small: idle transactional ids expire, and a slot whose log
holds many more records than ids is written again, whole, and the records before are
deleted (what Kafka's log cleaner does for its compacted ``__transaction_state``).

- **Expiry** (Kafka's ``transactional.id.expiration.ms``): an id with no transaction
  under way (``Empty``, ``CompleteCommit``, ``CompleteAbort``) that has not changed for
  ``expiration_ms`` leaves the coordinator; a producer still using it is told
  ``transactional_id_not_found`` (fatal) and initialises again.
- **Compaction**: once a slot holds more than ``min_records`` records since its log
  start and more than twice as many as it has ids (Kafka's ``min.cleanable.dirty.ratio``
  of 0.5), the coordinator appends every id's state again (acks=all, durable) and moves
  the slot's log start to the first of them (Kafka's DeleteRecords; followers follow the
  leader's log start), so that loading a slot reads about as many records as it has ids.

The rewrite must see every state written before it: while it runs, no write of the slot
starts and those under way finish first (``writing`` is the gate every state write goes
through); and it is of the slot as loaded at one coordinator epoch: its writes and the
move of the log start are refused once this broker no longer leads the slot at that
epoch (another may have written newer states meanwhile). A crash between the appends and
the move of the log start leaves both copies, which replay to the same states.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ingest_api.broker.transactions.state import ENDED, TxnMeta

if TYPE_CHECKING:
    from ingest_api.broker.transactions.parts import SlotEpochs
    from ingest_api.broker.transactions.state_log import StateLog

log = logging.getLogger(__name__)
MIN_RECORDS = 1000
"""A slot with fewer records than this since its log start is not compacted."""


class StateCleaner:
    def __init__(self, state_log: StateLog, expiration_ms: int) -> None:
        self.state_log = state_log
        self.expiration_ms = expiration_ms
        self.min_records = MIN_RECORDS
        self.expired = 0
        self.compactions = 0
        self._writing: Counter[int] = Counter()
        self._closed: set[int] = set()
        self._cond = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def writing(self, slot: int) -> AsyncIterator[None]:
        """Around every state write of ``slot``: waits while the slot is rewritten."""
        async with self._cond:
            await self._cond.wait_for(lambda: slot not in self._closed)
            self._writing[slot] += 1
        try:
            yield
        finally:
            async with self._cond:
                self._writing[slot] -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def _alone(self, slot: int) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: slot not in self._closed)
            self._closed.add(slot)
            await self._cond.wait_for(lambda: self._writing[slot] == 0)
        try:
            yield
        finally:
            async with self._cond:
                self._closed.discard(slot)
                self._cond.notify_all()

    def expires(self, meta: TxnMeta, now_ms: int) -> bool:
        return meta.state in ENDED and now_ms - meta.updated_ms > self.expiration_ms

    async def clean(self, slot: int, txns: dict[str, TxnMeta], epochs: SlotEpochs,
                    now_ms: int) -> None:
        """Expire ``slot``'s idle ids from ``txns`` (the coordinator's) and compact the
        slot if it is due (and still loaded here: ``epochs``)."""
        async with self._alone(slot):
            epoch = epochs.loaded.get(slot)
            if epoch is None:
                return
            held = await asyncio.to_thread(self.state_log.records, slot)
            if epochs.loaded.get(slot) != epoch:  # moved away (and back?) meanwhile
                return
            mine = {tid: m for tid, m in txns.items() if epochs.slot(tid) == slot}
            gone = {tid for tid, m in mine.items() if self.expires(m, now_ms)}
            if not gone and held <= max(self.min_records, 2 * len(mine)):
                return
            # The tombstones make an expiry hold even where the log start does not move.
            live = [(tid, None if tid in gone else m) for tid, m in sorted(mine.items())]
            await self.state_log.rewrite(slot, live, now_ms, epoch)
            for tid in gone:
                txns.pop(tid, None)
            self.expired += len(gone)
            self.compactions += 1
            log.info("__transaction_state-%d: %d record(s) compacted to %d state(s)%s", slot,
                     held, len(mine) - len(gone),
                     f"; {len(gone)} idle transactional id(s) expired" if gone else "")
