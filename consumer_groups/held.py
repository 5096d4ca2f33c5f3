"""Offsets that transactions coordinated on other brokers hold in a group coordinated here
(KIP-447 in a cluster): while one is held, Kafka's OffsetFetch with ``require_stable`` and
a member starting on the partition are told ``unstable_offset_commit`` rather than given
the older offset.

A transaction's coordinator keeps its pending offsets in its own durable state; when the
group's coordinator is another broker it tells it, as it has the member's offsets checked
(``hold``), and again when the transaction commits them or aborts (``release``). A hold
lasts at most twice the transaction's timeout: one whose release was lost (a peer call
failed; the add failed after the check) ends after the transaction would have been
aborted, and a commit decided just before the timeout, whose coordinator died, is
finished by the next coordinator well within the second half. Holds live
in memory: a group coordinator that moves mid-transaction forgets them (what is left, see
docs/transactions.md).
"""

from __future__ import annotations

import threading

from log_tables.clock import SYSTEM_CLOCK, Clock

Partition = tuple[str, int]


class HeldOffsets:
    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self._held: dict[str, dict[str, tuple[frozenset[Partition], int]]] = {}
        """group -> transactional id -> (partitions, until when in ms)."""
        self._lock = threading.Lock()

    def hold(self, group: str, transactional_id: str, partitions: set[Partition],
             timeout_ms: int) -> None:
        until = self.clock.now_ms() + 2 * timeout_ms
        with self._lock:
            by_txn = self._held.setdefault(group, {})
            had = by_txn.get(transactional_id, (frozenset(), 0))[0]
            by_txn[transactional_id] = (had | frozenset(partitions), until)

    def release(self, group: str, transactional_id: str) -> None:
        with self._lock:
            by_txn = self._held.get(group, {})
            by_txn.pop(transactional_id, None)
            if not by_txn:
                self._held.pop(group, None)

    def partitions(self, group: str) -> set[Partition]:
        """The group's partitions held now (those past their timeout are dropped)."""
        now = self.clock.now_ms()
        with self._lock:
            by_txn = self._held.get(group)
            if not by_txn:
                return set()
            for tid in [t for t, (_, until) in by_txn.items() if until <= now]:
                del by_txn[tid]
            return set().union(*(parts for parts, _ in by_txn.values()))
