"""What the transaction coordinator is made with and keeps to itself: its bounds, the
consumer groups and slots it is given, its kill points, and small conversions."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

from consumer_groups.hashing import group_slot
from log_tables.errors import (
    CoordinatorLoadInProgressError,
    InvalidRequestError,
    NotCoordinatorError,
)

if TYPE_CHECKING:
    from ingest_api.broker.transactions.state import TxnMeta

MAX_TRANSACTIONAL_ID_CHARS = 249
MAX_PARTITIONS = 10_000
"""Partitions one transaction may add (a bound on its state record)."""
log = logging.getLogger(__name__)
MAX_OFFSETS = 10_000
"""Offsets one transaction may hold for its groups."""

Offset = tuple[str, int, int, str | None]
"""(topic, partition, offset, metadata)."""


step_hook: Callable[[str], None] | None = None
"""Called with each step of an end as the coordinator completes it: ``txn-prepared`` (the
outcome durable), ``txn-marker`` (after each partition's marker), ``txn-markers`` (every
marker and offset written, before ``Complete*``); and ``txn-state-rewritten`` (a
compaction's states appended, the log start not yet moved: ``cleaner``). Tests kill the
process there."""


def step(name: str) -> None:
    if step_hook is not None:
        step_hook(name)


class GroupOffsets:
    """What the coordinator needs of the consumer groups: ``check`` fences a member's
    offsets as a commit would (raising what a commit raises; a group coordinated on
    another broker also holds them, ``consumer_groups.held``, for the transaction's
    timeout at most); ``write`` commits offsets a transaction committed, ``release``
    drops the offsets of an aborted one. Each may be a coroutine function (a group
    coordinated by another broker of a cluster is asked through peers); each takes the
    transactional id last."""

    def __init__(self, check: Callable[[str, str | None, int, list[Offset], int, str], object],
                 write: Callable[[str, list[Offset], str], object],
                 release: Callable[[str, str], object] | None = None) -> None:
        self.check = check
        self.write = write
        self.release = release

    async def checked(self, group: str, member_id: str | None, epoch: int,
                      offsets: list[Offset], timeout_ms: int, tid: str) -> None:
        await maybe_await(self.check(group, member_id, epoch, offsets, timeout_ms, tid))

    async def ended(self, meta: TxnMeta, commit: bool) -> None:
        """A decided transaction's offsets: written to their groups, or released (at
        best: a hold not released ends by itself, and must not stop the abort)."""
        for group, offsets in grouped(meta.offsets).items():
            if commit:
                await maybe_await(self.write(group, offsets, meta.transactional_id))
            elif self.release is not None:
                try:
                    await maybe_await(self.release(group, meta.transactional_id))
                except Exception as exc:  # any failure: the hold times out by itself
                    log.warning("releasing group %r's offsets held for transactional id %r "
                                "failed (%s); they stay held until the hold times out", group,
                                meta.transactional_id, exc)


class SlotServing(Protocol):
    """Which coordinator slots this broker serves (``cluster.coordinators``'s)."""

    def epoch(self, slot: int) -> int | None: ...

    def loading(self, slot: int) -> bool: ...


class SlotEpochs:
    """The coordinator epoch of each slot loaded here (the markers carry it), and
    whether this broker serves a transactional id now (``serving`` None: a broker alone,
    every slot loaded)."""

    def __init__(self, slots: int, serving: SlotServing | None) -> None:
        self.slots = slots
        self.serving = serving
        self.loaded: dict[int, int] = {}

    def slot(self, tid: str) -> int:
        return group_slot(tid, self.slots)

    def serve(self, tid: str) -> int:
        """The coordinator epoch at which this broker serves ``tid`` now."""
        slot = self.slot(tid)
        loaded = self.loaded.get(slot)
        if self.serving is None and loaded is not None:
            return loaded
        led = self.serving.epoch(slot) if self.serving is not None else None
        if led is not None and led == loaded:
            return led
        if self.serving is not None and (self.serving.loading(slot) or led is not None):
            raise CoordinatorLoadInProgressError(
                f"transactional id {tid!r}'s state (slot {slot}) is being loaded; try again")
        raise NotCoordinatorError(f"this broker does not coordinate transactional id {tid!r} "
                                  "(any more); ask for its coordinator again")


def check_id(tid: str) -> None:
    if not tid or len(tid) > MAX_TRANSACTIONAL_ID_CHARS:
        raise InvalidRequestError(
            f"a transactional id is 1 to {MAX_TRANSACTIONAL_ID_CHARS} characters")


def flatten(pending: Mapping[str, list[Offset]]) -> tuple[tuple[str, str, int, int,
                                                                  str | None], ...]:
    return tuple((g, t, p, o, m) for g in sorted(pending) for t, p, o, m in pending[g])


def grouped(offsets: Iterable[tuple[str, str, int, int, str | None]]
             ) -> dict[str, list[Offset]]:
    out: dict[str, list[Offset]] = {}
    for g, t, p, o, m in offsets:
        out.setdefault(g, []).append((t, p, o, m))
    return out


async def maybe_await(value: object) -> None:
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
        await value
