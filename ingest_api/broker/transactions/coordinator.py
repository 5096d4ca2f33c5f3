"""The transaction coordinator: Kafka's protocol for transactional ids.

- ``init_producer``: a transactional id gets its producer id (the same one every time)
  and a new epoch, which fences every older instance; a transaction it left open is
  aborted first, one being completed is finished first.
- ``add_partitions`` / ``add_offsets``: the transaction goes ``Ongoing`` with them (its
  timeout runs from the first); a transactional write to a partition it did not add is
  refused (``verify``: KIP-890's defense against a late write landing in the next
  transaction). ``add_offsets`` also holds the group's offsets, fenced by the group's
  member and epoch (KIP-447), until the transaction ends.
- ``end``: the epoch goes up (KIP-890: a late write of the ended transaction is fenced),
  ``PrepareCommit`` or ``PrepareAbort`` is made durable (the outcome is decided), a marker
  goes to every partition, the offsets to their groups, and ``Complete*`` is written. A
  coordinator that dies on the way leaves the ``Prepare*`` state, which the next one to
  load it finishes: every partition gets one marker, and the outcome is the one the
  client was told, or the client was told nothing.
- A transaction ``Ongoing`` past its ``timeout_ms`` is aborted by the coordinator; its
  producer's next call hears ``transaction_abortable`` (abort, then begin again).

An id's calls run one at a time (a lock per id), their states logged before answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from ingest_api.broker.transactions.cleaner import StateCleaner
from ingest_api.broker.transactions.markers import Markers
from ingest_api.broker.transactions.parts import (
    MAX_OFFSETS,
    MAX_PARTITIONS,
    GroupOffsets,
    Offset,
    SlotEpochs,
    SlotServing,
    check_id,
    flatten,
    grouped,
    step,
)
from ingest_api.broker.transactions.state import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    ONGOING,
    PREPARE_ABORT,
    PREPARE_COMMIT,
    PREPARING,
    TxnMeta,
)
from ingest_api.broker.transactions.state_log import StateLog
from log_tables.clock import SYSTEM_CLOCK, Clock
from log_tables.errors import (
    ConcurrentTransactionsError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidRequestError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionalIdNotFoundError,
)
from log_tables.hot.producer_ids import MAX_EPOCH, ProducerIds

log = logging.getLogger(__name__)
class TransactionCoordinator:
    """The coordinator of the transactional ids of the slots it serves: every slot on a
    broker alone (``serving`` None, at coordinator epoch 0); in a cluster, the slots of
    ``__transaction_state`` this broker leads, each loaded at the leader epoch it leads
    it at (``load_slot``), which its markers carry."""

    def __init__(self, state_log: StateLog, producer_ids: ProducerIds, markers: Markers, *,
                 max_timeout_ms: int, abort_interval_ms: int,
                 require_partition: Callable[[str, int], object],
                 expiration_ms: int = 604_800_000,
                 groups: GroupOffsets | None = None, clock: Clock = SYSTEM_CLOCK,
                 serving: SlotServing | None = None) -> None:
        self.state_log = state_log
        self.producer_ids = producer_ids
        self.markers = markers
        self.max_timeout_ms = max_timeout_ms
        self.abort_interval_ms = abort_interval_ms
        self.require_partition = require_partition
        self.groups = groups
        self.clock = clock
        self.serving = serving
        self.epochs = SlotEpochs(state_log.slots, serving)
        self.cleaner = StateCleaner(state_log, expiration_ms)
        self.pending_offsets: dict[str, dict[str, list[Offset]]] = {}
        """Transactional id -> group -> offsets it will commit (also in its state)."""
        self._txns: dict[str, TxnMeta] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._task: asyncio.Task[None] | None = None
        self.aborted_by_timeout = 0

    # -- life ------------------------------------------------------------------------
    async def start(self) -> None:
        """Alone: load every slot, finishing the commits and aborts that were under way.
        Then abort transactions past their timeout, from now on."""
        if self.serving is None:
            for slot in range(self.state_log.slots):
                await self.load_slot(slot, 0)
        self._task = asyncio.create_task(self._expire())

    async def load_slot(self, slot: int, epoch: int) -> None:
        """Serve ``slot`` at coordinator ``epoch``: its transactional ids as its state log
        has them, the ends under way finished (left to the expiry pass if that fails)."""
        loaded = await asyncio.to_thread(self.state_log.load, slot)
        self.unload_slot(slot)
        for tid, meta in loaded.items():
            self._txns[tid] = meta
            if meta.offsets:
                self.pending_offsets[tid] = grouped(meta.offsets)
        self.epochs.loaded[slot] = epoch
        for meta in loaded.values():
            if meta.state in PREPARING:
                try:
                    async with self._lock(meta.transactional_id):
                        await self._complete(self._txns[meta.transactional_id])
                except Exception:
                    log.exception("finishing transactional id %r's end at load failed; "
                                  "trying again", meta.transactional_id)

    def unload_slot(self, slot: int) -> None:
        """Another broker serves ``slot`` now: its ids leave this broker's memory."""
        self.epochs.loaded.pop(slot, None)
        for tid in [t for t in self._txns if self.epochs.slot(t) == slot]:
            del self._txns[tid]
            self.pending_offsets.pop(tid, None)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _lock(self, tid: str) -> asyncio.Lock:
        return self._locks.setdefault(tid, asyncio.Lock())

    # -- the protocol -------------------------------------------------------------------
    async def init_producer(self, tid: str, timeout_ms: int) -> tuple[int, int]:
        """InitProducerId of a transactional id: its producer id and a new epoch."""
        check_id(tid)
        if not 1 <= timeout_ms <= self.max_timeout_ms:
            raise InvalidTransactionTimeoutError(
                f"transaction_timeout_ms {timeout_ms} is outside 1..{self.max_timeout_ms} "
                "(the broker's transaction_max_timeout_ms)")
        async with self._lock(tid):
            self.epochs.serve(tid)
            meta = self._txns.get(tid)
            if meta is not None and meta.state in PREPARING:
                meta = await self._complete(meta)
            if meta is not None and meta.state == ONGOING:
                meta = await self._end(meta, commit=False)  # what the old instance left
            pid, epoch = await asyncio.to_thread(self._bump, meta)
            now = self.clock.now_ms()
            fresh = TxnMeta(transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                            timeout_ms=timeout_ms, updated_ms=now)
            await self._write(fresh)
            return pid, epoch

    async def add_partitions(self, tid: str, producer_id: int, epoch: int,
                             partitions: Iterable[tuple[str, int]]) -> None:
        """AddPartitionsToTxn: the transaction writes to these partitions."""
        wanted = set(partitions)
        for topic, partition in wanted:
            self.require_partition(topic, partition)
        async with self._lock(tid):
            self.epochs.serve(tid)
            meta = self._ready(tid, producer_id, epoch)
            have = set(meta.partitions) if meta.state == ONGOING else set()
            if meta.state == ONGOING and wanted <= have:
                return
            if len(have | wanted) > MAX_PARTITIONS:
                raise InvalidRequestError(f"a transaction adds at most {MAX_PARTITIONS} "
                                          "partitions")
            await self._write(self._ongoing(meta).with_(
                partitions=tuple(sorted(have | wanted))))

    async def add_offsets(self, tid: str, producer_id: int, epoch: int, group: str,
                          member_id: str | None, member_epoch: int,
                          offsets: list[Offset]) -> None:
        """AddOffsetsToTxn and TxnOffsetCommit in one: the group's offsets commit when the
        transaction does, if the member (at ``member_epoch``) is still the group's now."""
        if self.groups is None:
            raise InvalidTxnStateError("this broker has no consumer groups")
        async with self._lock(tid):
            self.epochs.serve(tid)
            meta = self._ready(tid, producer_id, epoch)
            held = self.pending_offsets.get(tid, {}) if meta.state == ONGOING else {}
            merged = {(t, p): (t, p, o, m) for t, p, o, m in held.get(group, [])}
            merged.update({(t, p): (t, p, o, m) for t, p, o, m in offsets})
            if sum(len(v) for g, v in held.items() if g != group) + len(merged) > MAX_OFFSETS:
                raise InvalidRequestError(f"a transaction holds at most {MAX_OFFSETS} offsets")
            # Checked (and held, by a group coordinated elsewhere) once the call is sure.
            await self.groups.checked(group, member_id, member_epoch, offsets,
                                      meta.timeout_ms, tid)
            pending = {**held, group: sorted(merged.values())}
            ongoing = self._ongoing(meta)
            await self._write(ongoing.with_(groups=tuple(sorted(pending)),
                                            offsets=flatten(pending)))

    async def end(self, tid: str, producer_id: int, epoch: int, commit: bool
                  ) -> tuple[int, int]:
        """EndTxn: commit or abort; the producer's id and new epoch."""
        async with self._lock(tid):
            self.epochs.serve(tid)
            meta = self._txns.get(tid)
            if meta is not None and (producer_id, epoch) == (
                    meta.last_producer_id, meta.last_producer_epoch) and meta.state in (
                    PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT, COMPLETE_ABORT):
                if meta.commits != commit:
                    raise InvalidTxnStateError(
                        f"transactional id {tid!r}'s transaction was already "
                        f"{'committed' if meta.commits else 'aborted'} (the answer may have "
                        f"been lost); it cannot be {'committed' if commit else 'aborted'} "
                        "now: end it as it was ended")
                # A retry of the end that bumped the epoch (its answer was lost), or an
                # abort of a transaction the coordinator aborted: done, or finished now.
                if meta.state in PREPARING:
                    meta = await self._complete(meta)
                return meta.producer_id, meta.producer_epoch
            meta = self._check(tid, producer_id, epoch)
            if meta.state in PREPARING:
                raise ConcurrentTransactionsError(
                    f"transactional id {tid!r} is completing its last transaction; retry")
            if meta.state != ONGOING:
                raise InvalidTxnStateError(
                    f"transactional id {tid!r} has no transaction to "
                    f"{'commit' if commit else 'abort'} (state {meta.state}): a transaction "
                    "begins with its first partition or group")
            done = await self._end(meta, commit)
            return done.producer_id, done.producer_epoch

    def verify(self, tid: str, producer_id: int, epoch: int, topic: str,
               partition: int) -> None:
        """A transactional write to ``topic``-``partition`` belongs to the producer's
        open transaction, which added the partition (KIP-890)."""
        self.epochs.serve(tid)
        meta = self._check(tid, producer_id, epoch)
        if meta.state != ONGOING or (topic, partition) not in meta.partitions:
            raise InvalidTxnStateError(
                f"partition {partition} of topic {topic!r} is not in transactional id "
                f"{tid!r}'s open transaction: add it to the transaction before writing")

    def pending_partitions(self, group: str) -> set[tuple[str, int]]:
        """Partitions of ``group`` whose offsets an open transaction will commit."""
        return {(t, p) for txn in self.pending_offsets.values()
                for t, p, _, _ in txn.get(group, [])}

    def describe(self, tid: str) -> TxnMeta:
        self.epochs.serve(tid)
        meta = self._txns.get(tid)
        if meta is None:
            raise TransactionalIdNotFoundError(f"no transactional id {tid!r}")
        return meta

    def list(self) -> list[TxnMeta]:
        return [self._txns[t] for t in sorted(self._txns)]

    # -- the steps -----------------------------------------------------------------------
    def _check(self, tid: str, producer_id: int, epoch: int) -> TxnMeta:
        meta = self._txns.get(tid)
        if meta is None:
            raise TransactionalIdNotFoundError(
                f"no transactional id {tid!r} (never initialised, or expired after "
                "transactional_id_expiration_ms idle): initialise the producer first")
        if (producer_id, epoch) == (meta.last_producer_id, meta.last_producer_epoch):
            if meta.state == COMPLETE_ABORT:
                raise TransactionAbortableError(
                    f"transactional id {tid!r}'s transaction was aborted (it ran past its "
                    f"{meta.timeout_ms} ms); abort it, then begin another")
            if meta.state in PREPARING:  # (its markers are being written: not fenced)
                raise ConcurrentTransactionsError(
                    f"transactional id {tid!r}'s transaction is being ended (it ran past "
                    f"its {meta.timeout_ms} ms, or its end is finishing); retry")
        if meta.producer_id != producer_id:
            raise InvalidProducerIdMappingError(
                f"transactional id {tid!r} has producer id {meta.producer_id}, not "
                f"{producer_id}")
        if epoch < meta.producer_epoch:
            raise ProducerFencedError(
                f"producer {producer_id} of transactional id {tid!r} at epoch {epoch} is "
                f"fenced: another instance initialised at epoch {meta.producer_epoch}")
        if epoch > meta.producer_epoch:
            raise InvalidProducerEpochError(
                f"epoch {epoch} of transactional id {tid!r} was never given (it is at "
                f"{meta.producer_epoch})")
        return meta

    def _ready(self, tid: str, producer_id: int, epoch: int) -> TxnMeta:
        meta = self._check(tid, producer_id, epoch)
        if meta.state in PREPARING:
            raise ConcurrentTransactionsError(
                f"transactional id {tid!r} is completing its last transaction; retry")
        return meta

    def _ongoing(self, meta: TxnMeta) -> TxnMeta:
        if meta.state == ONGOING:
            return meta.with_(updated_ms=self.clock.now_ms())
        now = self.clock.now_ms()
        return meta.with_(state=ONGOING, partitions=(), groups=(), offsets=(),
                          started_ms=now, updated_ms=now)

    def _bump(self, meta: TxnMeta | None) -> tuple[int, int]:
        """A new epoch of the id's producer (a new producer id at first, or when its
        epochs ran out)."""
        if meta is None:
            return self.producer_ids.init_producer()
        try:
            pid, epoch = self.producer_ids.init_producer(meta.producer_id)
        except InvalidProducerEpochError:  # exhausted (or forgotten): a new id
            return self.producer_ids.init_producer()
        if epoch >= MAX_EPOCH - 1:  # no room for a transaction's end bump: a new id
            return self.producer_ids.init_producer()
        return pid, epoch

    async def _end(self, meta: TxnMeta, commit: bool) -> TxnMeta:
        """Decide: a new epoch (every end has one, KIP-890), the outcome made durable."""
        _, epoch = await asyncio.to_thread(self.producer_ids.init_producer, meta.producer_id)
        prepared = meta.with_(producer_epoch=epoch,
                              state=PREPARE_COMMIT if commit else PREPARE_ABORT,
                              last_producer_id=meta.producer_id,
                              last_producer_epoch=meta.producer_epoch,
                              updated_ms=self.clock.now_ms())
        await self._write(prepared)
        step("txn-prepared")
        return await self._complete(prepared)

    async def _complete(self, meta: TxnMeta) -> TxnMeta:
        """Write the markers and the offsets of a decided transaction; then Complete."""
        commit = meta.state == PREPARE_COMMIT
        coordinator_epoch = self.epochs.serve(meta.transactional_id)
        # Every partition's marker at once; the first failure is raised once all ended.
        failures = [r for r in await asyncio.gather(*(
            self._marker(t, p, meta, commit, coordinator_epoch) for t, p in meta.partitions),
            return_exceptions=True) if isinstance(r, BaseException)]
        if failures:
            raise failures[0]
        if self.groups is not None:
            await self.groups.ended(meta, commit)
        step("txn-markers")
        done = meta.with_(state=COMPLETE_COMMIT if commit else COMPLETE_ABORT, partitions=(),
                          groups=(), offsets=(), started_ms=-1, updated_ms=self.clock.now_ms())
        rotated = meta.producer_epoch >= MAX_EPOCH - 1
        if rotated:  # no epoch left for another end: a new id (its state must last)
            pid, epoch = await asyncio.to_thread(self.producer_ids.init_producer)
            done = done.with_(producer_id=pid, producer_epoch=epoch)
        await self._write(done, durable=rotated)
        return done

    async def _marker(self, topic: str, partition: int, meta: TxnMeta, commit: bool,
                      coordinator_epoch: int) -> None:
        await self.markers.write(topic, partition, meta.producer_id, meta.producer_epoch,
                                 commit, coordinator_epoch)
        step("txn-marker")

    async def _write(self, meta: TxnMeta, durable: bool = True) -> None:
        async with self.cleaner.writing(self.epochs.slot(meta.transactional_id)):
            await self.state_log.write(meta, self.clock.now_ms(), durable)
            self._txns[meta.transactional_id] = meta
            if meta.offsets:
                self.pending_offsets[meta.transactional_id] = grouped(meta.offsets)
            else:
                self.pending_offsets.pop(meta.transactional_id, None)

    async def _expire(self) -> None:
        while True:
            await asyncio.sleep(self.abort_interval_ms / 1000)
            try:
                await self.expire_once()
            except Exception:
                log.exception("aborting timed-out transactions failed; trying again")

    async def expire_once(self) -> None:
        """Abort every transaction past its timeout; finish those left preparing; expire
        idle ids and compact the slots due (``cleaner``)."""
        now = self.clock.now_ms()
        for tid, meta in list(self._txns.items()):
            late = meta.state == ONGOING and now - meta.started_ms > meta.timeout_ms
            if not late and meta.state not in PREPARING:
                continue
            async with self._lock(tid):
                meta = self._txns.get(tid)  # type: ignore[assignment]
                if meta is None:
                    continue  # its slot moved away meanwhile
                if meta.state in PREPARING:
                    await self._complete(meta)
                elif meta.state == ONGOING and now - meta.started_ms > meta.timeout_ms:
                    log.info("transactional id %r: aborting its transaction, open for "
                             "%d ms (timeout %d ms)", tid, now - meta.started_ms,
                             meta.timeout_ms)
                    await self._end(meta, commit=False)
                    self.aborted_by_timeout += 1
        for slot in sorted(self.epochs.loaded):
            await self.cleaner.clean(slot, self._txns, self.epochs, self.clock.now_ms())
