"""The leader's side of replication (Kafka's ``Partition`` and ``ReplicaManager``).

For each partition it leads with more than one replica, a broker keeps a
``LeaderPartition``: every follower's log end offset, learnt from the offset its fetch
asks for (a follower fetches from its own log end), and when it last caught up.

- **High watermark**: the smallest log end offset in the ISR (the leader's own
  included). It only rises; readers (consumers, tiering, Spark) stop below it, and
  acks=all answers once it passes a request's last record.
- **ISR shrink**: a follower that has not caught up for ``replica.lag.time.max.ms``
  (caught up: its fetch asked for the leader's log end as of then, or as of its previous
  fetch) leaves the ISR.
- **ISR expand**: a follower whose log end reaches the high watermark and the start of
  the leader's epoch joins again.

ISR changes are conditional writes of the partition's state znode (``cluster.isr``,
Kafka's AlterPartition idea), made by one thread; the leader uses a new ISR only once
ZooKeeper has it (shrinking first in memory would let the high watermark pass records a
removed follower lacks, which is harmless; expanding first would not be). The roles of
every partition follow the view of ZooKeeper: ``ReplicaManager.sync_roles``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field

from log_tables.errors import (
    LakelogError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderError,
)
from log_tables.hot.partition_log import PartitionLog

log = logging.getLogger(__name__)


step_hook: Callable[[str], None] | None = None
"""Called with each replication step's name as it completes (tests kill the broker there):
``leader-isr-written`` (a leader's ISR change is in ZooKeeper, not yet in its memory),
``truncated`` (a follower cut records by leader epoch and has not fetched since) and
``becoming-leader`` (the metadata says this broker leads a partition at a new leader
epoch; its leader state is not made yet)."""


def step(name: str) -> None:
    if step_hook is not None:
        step_hook(name)


def now_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclass(slots=True)
class FollowerState:
    """What the leader knows of one follower (Kafka's ``Replica``)."""

    log_end_offset: int = -1
    """-1: not fetched since this broker started leading."""
    last_fetch_ms: int = 0
    last_fetch_leader_end: int = 0
    last_caught_up_ms: int = 0


@dataclass(slots=True, order=True)
class _Waiter:
    offset: int
    seq: int
    min_isr: int = field(compare=False)
    future: Future[int] = field(compare=False)


_seq = itertools.count()


class LeaderPartition:
    """One partition this broker leads at one leader epoch (replicated: RF > 1)."""

    def __init__(self, plog: PartitionLog, topic: str, partition: int, broker_id: int,
                 leader_epoch: int, replicas: Iterable[int], isr: Iterable[int],
                 version: int) -> None:
        self.plog = plog
        self.topic, self.partition = topic, partition
        self.broker_id = broker_id
        self.leader_epoch = leader_epoch
        self.replicas = tuple(replicas)
        self.isr = frozenset(isr) | {broker_id}
        self.version = version
        self.epoch_start = plog.log_end_offset
        started = now_ms()
        # Kafka starts every follower as caught up when a broker becomes leader: none is
        # thrown out of the ISR before it had replica.lag.time.max.ms to fetch.
        self.followers = {r: FollowerState(last_caught_up_ms=started)
                          for r in self.replicas if r != broker_id}
        self.joining: frozenset[int] = frozenset()
        """Followers being added to the ISR in ZooKeeper: counted for the high watermark
        from before the write (the "maximal ISR" of Kafka's KIP-497), so that nothing is
        acknowledged that a member of the ISR ZooKeeper holds might lack."""
        self._lock = threading.Lock()
        self._waiters: list[_Waiter] = []
        self.closed: LakelogError | None = None

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    # -- follower fetches --------------------------------------------------------------
    def on_fetch(self, follower: int, fetch_offset: int, at_ms: int | None = None) -> bool:
        """A follower asked for ``fetch_offset`` (its log end); True if the high watermark
        moved. Kafka's ``updateFollowerFetchState``."""
        state = self.followers.get(follower)
        if state is None:
            return False
        at = now_ms() if at_ms is None else at_ms
        leader_end = self.plog.log_end_offset
        if fetch_offset > leader_end:
            return False  # a log longer than the leader's: it truncates by epoch first
        with self._lock:
            if fetch_offset >= leader_end:
                state.last_caught_up_ms = max(state.last_caught_up_ms, at)
            elif fetch_offset >= state.last_fetch_leader_end:
                state.last_caught_up_ms = max(state.last_caught_up_ms, state.last_fetch_ms)
            state.log_end_offset = fetch_offset
            state.last_fetch_ms = at
            state.last_fetch_leader_end = leader_end
        return self.maybe_advance()

    def maybe_advance(self) -> bool:
        """Raise the high watermark to the smallest log end in the ISR; complete the
        acks=all waits it passes. True if it moved."""
        with self._lock:
            ends = [self.plog.log_end_offset]
            for r in self.isr | self.joining:
                if r != self.broker_id:
                    ends.append(self.followers[r].log_end_offset if r in self.followers else -1)
            target = min(ends)
            moved = target >= 0 and self.plog.advance_high_watermark(target)
            done = self._due_locked()
        self._complete(done)
        return moved

    def _due_locked(self) -> list[tuple[_Waiter, LakelogError | None]]:
        hw = self.plog.high_watermark
        out: list[tuple[_Waiter, LakelogError | None]] = []
        while self._waiters and self._waiters[0].offset <= hw:
            w = heapq.heappop(self._waiters)
            short = len(self.isr) < w.min_isr
            out.append((w, NotEnoughReplicasAfterAppendError(
                f"{self.name}: the records up to offset {w.offset - 1} were appended, but "
                f"the in-sync replicas {sorted(self.isr)} fell below min.insync.replicas="
                f"{w.min_isr} before they all had them; not acknowledged") if short else None))
        return out

    @staticmethod
    def _complete(done: list[tuple[_Waiter, LakelogError | None]]) -> None:
        for w, err in done:
            if w.future.done():
                continue
            if err is None:
                w.future.set_result(w.offset)
            else:
                w.future.set_exception(err)

    # -- acks=all ------------------------------------------------------------------------
    def check_min_isr(self, min_isr: int, isr: frozenset[int] | None = None) -> None:
        """Before an acks=all append: Kafka's NOT_ENOUGH_REPLICAS when the ISR (this
        leader's, or ``isr``) is short."""
        isr = self.isr if isr is None else isr
        if len(isr) < min_isr:
            raise NotEnoughReplicasError(
                f"{self.name}: {len(isr)} in-sync replica(s) {sorted(isr)}, fewer than "
                f"min.insync.replicas={min_isr}; the records were not appended (acks=1 is "
                f"still accepted)")

    def wait(self, end_offset: int, min_isr: int) -> Future[int]:
        """A future completed once the high watermark reaches ``end_offset``."""
        future: Future[int] = Future()
        with self._lock:
            if self.closed is not None:
                future.set_exception(self.closed)
                return future
            heapq.heappush(self._waiters, _Waiter(end_offset, next(_seq), min_isr, future))
            done = self._due_locked()
        self._complete(done)
        return future

    # -- the ISR -------------------------------------------------------------------------
    def out_of_sync(self, lag_ms: int, at_ms: int | None = None) -> set[int]:
        at = now_ms() if at_ms is None else at_ms
        with self._lock:
            return {r for r in self.isr if r != self.broker_id and r in self.followers
                    and at - self.followers[r].last_caught_up_ms > lag_ms}

    def caught_up(self, lag_ms: int, live: Iterable[int], at_ms: int | None = None
                  ) -> set[int]:
        """Followers outside the ISR whose log end reached the high watermark and the
        start of this leader's epoch, that fetched within ``lag_ms`` and whose brokers are
        ``live`` (registered): they may join. (A dead follower's last fetch may have been
        at the high watermark: without the last two, it would join again at once.)"""
        at = now_ms() if at_ms is None else at_ms
        hw = self.plog.high_watermark
        alive = set(live)
        with self._lock:
            return {r for r, f in self.followers.items() if r not in self.isr
                    and r in alive and at - f.last_fetch_ms <= lag_ms
                    and f.log_end_offset >= max(hw, self.epoch_start)}

    def set_isr(self, isr: Iterable[int], version: int) -> None:
        """The ISR ZooKeeper holds now (at znode ``version``)."""
        with self._lock:
            if version < self.version:
                return
            self.isr = frozenset(isr) | {self.broker_id}
            self.version = version
            self.joining = self.joining - self.isr
        self.maybe_advance()

    def expanding(self, joining: Iterable[int]) -> None:
        """Followers about to be written into the ISR (``joining``); empty: done."""
        with self._lock:
            self.joining = frozenset(joining)

    def close(self, why: LakelogError) -> None:
        """No longer the leader: acks=all waits fail (the producer sends again)."""
        with self._lock:
            self.closed = why
            waiting, self._waiters = self._waiters, []
        self._complete([(w, why) for w in waiting])

    def lag(self) -> dict[int, int]:
        """Each follower's records behind the leader's log end (-1: not fetched yet)."""
        end = self.plog.log_end_offset
        return {r: (end - f.log_end_offset if f.log_end_offset >= 0 else -1)
                for r, f in self.followers.items()}


def not_leader(name: str, broker_id: int) -> NotLeaderError:
    return NotLeaderError(f"broker {broker_id} stopped leading {name} before the records "
                          f"were on every in-sync replica; they are not acknowledged "
                          f"(send them again)")


HwListener = Callable[[PartitionLog], None]
