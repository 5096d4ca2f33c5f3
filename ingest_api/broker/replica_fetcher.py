"""The follower's side of replication: one fetcher thread per leader broker (Kafka's
``ReplicaFetcherThread``), fetching every partition this broker follows from it.

Each partition starts (and starts over at each new leader epoch) by truncating its log
by leader epoch (KIP-101/279): it asks the leader where its own latest epoch ends
(``/internal/replica/epoch-end``), cuts its log there, and asks again while the leader
answered an older epoch than the one asked for; a log with no epochs falls back to its
high watermark. Then it fetches from its log end: the leader's stored batches are
appended verbatim (``PartitionLog.append_replica``: same offsets, bytes and CRCs),
and the leader's high watermark and log start follow. A follower whose log ends below
the leader's log start starts over there (``truncate_fully``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cluster.broker import ClusterBroker
from cluster.model import BrokerInfo
from cluster.replica_protocol import (
    EpochQuery,
    EpochRequest,
    FetchPartition,
    FetchRequest,
    decode_epoch_answer,
    encode,
    split_fetch_answer,
)
from cluster.replicas import step
from ingest_api.broker.peers import ReplicaChannel
from log_tables.errors import (
    BrokerNotAvailableError,
    LakelogError,
    UnknownPartitionError,
    UnknownTopicError,
)
from log_tables.hot.leader_epochs import UNDEFINED
from log_tables.hot.partition_log import PartitionLog

log = logging.getLogger(__name__)
Partition = tuple[str, int]
BACKOFF_S = 0.2
CHECKPOINT_S = 0.1


@dataclass(slots=True)
class _Fetching:
    leader_epoch: int
    truncated: bool = False
    retry_at: float = 0.0


class Fetchers:
    """The fetcher threads of one broker, one per leader it follows partitions of
    (``cluster.replica_manager.Followers``)."""

    def __init__(self, broker: ClusterBroker, *,
                 channel: Callable[[int], ReplicaChannel], max_wait_ms: int = 500,
                 on_high_watermark: Callable[[PartitionLog], None] | None = None) -> None:
        """``channel``: a new line to leaders (given ``max_wait_ms``), one per thread."""
        self.broker = broker
        self.channel = channel
        self.max_wait_ms = max_wait_ms
        self.on_high_watermark = on_high_watermark
        self._fetchers: dict[int, LeaderFetcher] = {}
        self._where: dict[Partition, int] = {}
        self._lock = threading.Lock()

    def follow(self, tp: Partition, leader: int, leader_epoch: int) -> None:
        with self._lock:
            old = self._where.get(tp)
            if old is not None and old != leader:
                self._fetchers[old].remove(tp)
            fetcher = self._fetchers.get(leader)
            if fetcher is None:
                fetcher = self._fetchers[leader] = LeaderFetcher(self, leader)
                fetcher.start()
            fetcher.add(tp, leader_epoch)
            self._where[tp] = leader

    def unfollow(self, tp: Partition) -> None:
        with self._lock:
            old = self._where.pop(tp, None)
            if old is not None:
                self._fetchers[old].remove(tp)

    def stop(self) -> None:
        with self._lock:
            fetchers = list(self._fetchers.values())
            self._fetchers.clear()
            self._where.clear()
        for f in fetchers:
            f.stop()

    def lag(self) -> dict[Partition, int]:
        """Records behind the leader's log end as of each partition's last fetch."""
        out: dict[Partition, int] = {}
        with self._lock:
            fetchers = list(self._fetchers.values())
        for f in fetchers:
            out.update(f.lag)
        return out


class LeaderFetcher(threading.Thread):
    def __init__(self, owner: Fetchers, leader: int) -> None:
        super().__init__(name=f"replica-fetcher-{leader}", daemon=True)
        self.owner = owner
        self.leader = leader
        self.broker = owner.broker
        self.parts: dict[Partition, _Fetching] = {}
        self.lag: dict[Partition, int] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._channel = owner.channel(owner.max_wait_ms)
        self._checkpointed = 0.0
        self._moved: set[PartitionLog] = set()

    def add(self, tp: Partition, leader_epoch: int) -> None:
        with self._lock:
            self.parts[tp] = _Fetching(leader_epoch)
        self._wake.set()

    def remove(self, tp: Partition) -> None:
        with self._lock:
            self.parts.pop(tp, None)
            self.lag.pop(tp, None)

    def stop(self) -> None:
        self._halt.set()
        self._wake.set()
        if self.is_alive():
            self.join(self.owner.max_wait_ms / 1000 + 12)
        self._channel.close()

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        while not self._halt.is_set():
            now = time.monotonic()
            with self._lock:
                due = {tp: f for tp, f in self.parts.items() if f.retry_at <= now}
            info = self.broker.view.broker(self.leader)
            if not due or info is None:
                self._wake.wait(BACKOFF_S)
                self._wake.clear()
                continue
            try:
                untruncated = {tp: f for tp, f in due.items() if not f.truncated}
                if untruncated:
                    self._truncate(info, untruncated)
                ready = {tp: f for tp, f in due.items() if f.truncated}
                if ready:
                    self._fetch(info, ready)
                else:
                    self._halt.wait(0.01)
            except (BrokerNotAvailableError, ValueError) as exc:
                log.info("replica fetch from broker %d failed (%s); trying again",
                         self.leader, exc)
                self._halt.wait(BACKOFF_S)
            except Exception:
                log.exception("replica fetcher of broker %d failed; trying again", self.leader)
                self._halt.wait(BACKOFF_S)
            self._checkpoint()

    def _log(self, tp: Partition) -> PartitionLog | None:
        try:
            return self.broker.manager.log(*tp)
        except (UnknownTopicError, UnknownPartitionError):
            return None

    def _current(self, tp: Partition, f: _Fetching) -> bool:
        """Still following ``tp`` at the same epoch (roles may move while a request runs)."""
        with self._lock:
            return self.parts.get(tp) is f

    def _delay(self, tp: Partition, f: _Fetching, why: str) -> None:
        log.info("%s-%d: replica fetch from broker %d: %s; trying again", tp[0], tp[1],
                 self.leader, why)
        f.retry_at = time.monotonic() + BACKOFF_S

    # -- truncation by leader epoch ------------------------------------------------------
    def _truncate(self, info: BrokerInfo, parts: dict[Partition, _Fetching]) -> None:
        queries, logs = [], {}
        for tp, f in parts.items():
            plog = self._log(tp)
            if plog is None:
                continue
            latest = plog.leader_epochs.latest_epoch
            if latest == UNDEFINED:
                # No epochs (a new or emptied replica, or a log from before replication):
                # what is below the high watermark is on every in-sync replica.
                self._cut(tp, plog, plog.high_watermark, "it has no leader epochs")
                f.truncated = True
                continue
            logs[tp] = (plog, latest)
            queries.append(EpochQuery(tp[0], tp[1], f.leader_epoch, latest))
        if not queries:
            return
        answer = self._channel.epoch_end(
            info, encode(EpochRequest(self.broker.broker_id, queries)))
        for ans in decode_epoch_answer(answer).partitions:
            tp = (ans.topic, ans.partition)
            f = parts[tp]
            plog, asked = logs[tp]
            if ans.error is not None:
                self._delay(tp, f, ans.message)
                continue
            with self._lock:  # as in _fetch: never between a role change and its effect
                if self.parts.get(tp) is not f:
                    continue
                if ans.leader_epoch == UNDEFINED:
                    cut = plog.high_watermark
                else:
                    own = plog.leader_epochs.end_offset_for(ans.leader_epoch,
                                                            plog.log_end_offset)
                    cut = min(ans.end_offset, own.end_offset)
                self._cut(tp, plog, cut, f"leader epoch {asked} ends at {ans.end_offset} on "
                                         f"broker {self.leader} (its epoch {ans.leader_epoch})")
            # The leader did not know our epoch: ask again with the one we have now.
            f.truncated = ans.leader_epoch in (asked, UNDEFINED)

    @staticmethod
    def _cut(tp: Partition, plog: PartitionLog, offset: int, why: str) -> None:
        end = plog.log_end_offset
        offset = max(plog.log_start_offset, min(offset, end))
        if offset < end:
            log.warning("%s-%d: truncating the replica from %d to %d (%s)", tp[0], tp[1], end,
                        offset, why)
            plog.truncate_to(offset)
            step("truncated")
        else:  # no records to cut, but epochs that began at the end (led, never written)
            plog.leader_epochs.truncate_from_end(offset)

    # -- fetch ---------------------------------------------------------------------------
    def _fetch(self, info: BrokerInfo, parts: dict[Partition, _Fetching]) -> None:
        wanted, logs = [], {}
        for tp, f in parts.items():
            plog = self._log(tp)
            if plog is not None:
                logs[tp] = plog
                wanted.append(FetchPartition(tp[0], tp[1], plog.log_end_offset, f.leader_epoch))
        if not wanted:
            return
        req = FetchRequest(self.broker.broker_id, wanted, max_wait_ms=self.owner.max_wait_ms)
        answer, chunks = split_fetch_answer(self._channel.fetch(info, encode(req)))
        for ans, data in zip(answer.partitions, chunks, strict=True):
            tp = (ans.topic, ans.partition)
            fetching, plog = parts.get(tp), logs.get(tp)
            if fetching is None or plog is None or not self._current(tp, fetching):
                continue
            f = fetching
            if ans.error == "offset_out_of_range":
                self._out_of_range(tp, f, plog, ans.log_start_offset, ans.log_end_offset)
                continue
            if ans.error is not None:
                self._delay(tp, f, ans.message)
                continue
            with self._lock:  # a role change (remove) waits for this append, never between
                if self.parts.get(tp) is not f:
                    continue
                try:
                    self._apply(tp, plog, ans.first_offset, data, ans.epochs,
                                ans.log_start_offset)
                except LakelogError as exc:
                    self._delay(tp, f, exc.message)
                    continue
                if plog.advance_high_watermark(min(ans.high_watermark, plog.log_end_offset)):
                    self._moved.add(plog)
            self.lag[tp] = max(0, ans.log_end_offset - plog.log_end_offset)

    def _apply(self, tp: Partition, plog: PartitionLog, first: int, data: memoryview,
               epochs: list[tuple[int, int]], leader_start: int) -> None:
        if data.nbytes:
            end = plog.log_end_offset
            if first < end and plog.log_start_offset == end:
                # Started over at the leader's log start, which falls inside a batch.
                plog.truncate_fully(first, end)
            plog.append_replica(data, epochs)
        if plog.log_start_offset < leader_start <= plog.log_end_offset:
            plog.delete_records(leader_start)

    def _out_of_range(self, tp: Partition, f: _Fetching, plog: PartitionLog, leader_start: int,
                      leader_end: int) -> None:
        end = plog.log_end_offset
        if 0 <= leader_end < end:
            f.truncated = False  # longer than the leader's: truncate by epoch again
        elif end < leader_start:
            log.warning("%s-%d: the replica ends at %d, below broker %d's log start %d: "
                        "starting over there", tp[0], tp[1], end, self.leader, leader_start)
            plog.truncate_fully(leader_start)
        else:
            self._delay(tp, f, f"offset {end} out of range {leader_start}..{leader_end}")

    def _checkpoint(self) -> None:
        now = time.monotonic()
        if not self._moved or now - self._checkpointed < CHECKPOINT_S:
            return
        moved, self._moved = self._moved, set()
        self._checkpointed = now
        for plog in moved:
            try:
                plog.checkpoint_high_watermark()
            except LakelogError:
                log.exception("%s: publishing the high watermark failed", plog.name)
            if self.owner.on_high_watermark is not None:
                self.owner.on_high_watermark(plog)
