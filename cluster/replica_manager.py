"""Which partitions this broker leads and follows, and the thread that keeps their ISR.

``sync_roles`` reads the view of ZooKeeper (called on every change it reports, and
every ``TICK_S``): a partition with more than one replica whose state names this broker
as leader gets a ``LeaderPartition`` (its leader epoch starts at the log end); one that
names another broker is fetched from it (``Followers``, the fetcher threads); a new
leader epoch always starts over (a follower truncates by leader epoch first).

The ISR thread, every ``TICK_S``: shrinks the ISR of followers that stopped catching
up, expands it for those that caught up, each by a conditional write
(``cluster.isr.alter_isr``), and publishes the high watermarks that moved
(``high-watermark`` files, for readers in other processes).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from cluster.isr import IsrConflictError, alter_isr
from cluster.model import OFFSETS_TOPIC
from cluster.replicas import LeaderPartition, not_leader, step
from log_tables.errors import (
    LakelogError,
    LeaderNotAvailableError,
    UnknownPartitionError,
    UnknownTopicError,
)
from log_tables.hot.partition_log import PartitionLog

if TYPE_CHECKING:
    from cluster.broker import ClusterBroker

log = logging.getLogger(__name__)
TICK_S = 0.1
Partition = tuple[str, int]


class Followers(Protocol):
    """The fetcher threads (``ingest_api.broker.replica_fetcher``)."""

    def follow(self, tp: Partition, leader: int, leader_epoch: int) -> None: ...

    def unfollow(self, tp: Partition) -> None: ...

    def stop(self) -> None: ...


class ReplicaManager:
    def __init__(self, broker: ClusterBroker, *, lag_time_max_ms: int = 30_000,
                 followers: Followers | None = None,
                 on_high_watermark: Callable[[PartitionLog], None] | None = None) -> None:
        self.broker = broker
        self.broker_id = broker.broker_id
        self.lag_time_max_ms = lag_time_max_ms
        self.followers = followers
        self.on_high_watermark = on_high_watermark
        self.leaders: dict[Partition, LeaderPartition] = {}
        self.following: dict[Partition, tuple[int, int]] = {}
        self.isr_shrinks = 0
        self.isr_expands = 0
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replica-manager", daemon=True)

    def start(self) -> None:
        self.broker.view.listeners.append(lambda _kind, _name: self._wake.set())
        self.sync_roles()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(5)
        with self._lock:
            for lp in self.leaders.values():
                lp.close(not_leader(lp.name, self.broker_id))
                lp.plog.checkpoint_high_watermark()
        if self.followers is not None:
            self.followers.stop()

    # -- roles ---------------------------------------------------------------------------
    def leader(self, topic: str, partition: int) -> LeaderPartition | None:
        """The partition's replication state when this broker leads it and it has more
        than one replica; None otherwise (not led here, or one replica)."""
        return self.leaders.get((topic, partition))

    def for_append(self, topic: str, partition: int, epoch: int | None
                   ) -> LeaderPartition | None:
        """The leader state an append to the partition is acknowledged under: None for a
        partition of one replica (its acks=all is the leader's fsync). For one with more,
        ``LeaderNotAvailableError`` (retriable) unless this broker's leader state of it is
        made, at ``epoch`` (the leader epoch the request was routed at; None: any): in the
        moment between the metadata naming this broker and its leader state being made
        (a new leader, a lease lost and held again), followers cannot fetch, so an append
        then would be acknowledged on this broker's copy alone (the nemesis lost records
        that way)."""
        lp = self.leaders.get((topic, partition))
        if lp is not None and (epoch is None or lp.leader_epoch == epoch):
            return lp
        assignment = self.broker.view.topic(topic)
        if assignment is None or partition >= assignment.partitions or \
                len(assignment.replicas[partition]) < 2:
            return None
        raise LeaderNotAvailableError(
            f"{topic}-{partition}: broker {self.broker_id} is becoming its leader (leader "
            f"epoch {epoch}) and does not replicate it yet; try again")

    def sync_roles(self) -> None:
        view = self.broker.view
        has_lease = self.broker.session.has_lease
        seen: set[Partition] = set()
        with self._lock:
            for (topic, p), state in view.all_states().items():
                if topic == OFFSETS_TOPIC:
                    continue
                assignment = view.topic(topic)
                if assignment is None or p >= assignment.partitions:
                    continue
                replicas = assignment.replicas[p]
                if len(replicas) < 2 or self.broker_id not in replicas:
                    continue
                try:
                    plog = self.broker.manager.log(topic, p)
                except (UnknownTopicError, UnknownPartitionError):
                    continue  # not mirrored here yet: the next change brings it
                tp = (topic, p)
                seen.add(tp)
                if state.leader == self.broker_id and has_lease:
                    self._lead(tp, plog, state.leader_epoch, replicas, state.isr,
                               self._version(tp))
                elif state.leader >= 0 and state.leader != self.broker_id:
                    self._follow(tp, plog, state.leader, state.leader_epoch)
                else:
                    self._resign(tp)
                    self._unfollow(tp)
            for tp in set(self.leaders) - seen:
                self._resign(tp)
            for tp in set(self.following) - seen:
                self._unfollow(tp)

    def _version(self, tp: Partition) -> int:
        found = self.broker.view.state_with_version(*tp)
        return found[1] if found is not None else -1

    def _lead(self, tp: Partition, plog: PartitionLog, epoch: int, replicas: list[int],
              isr: list[int], version: int) -> None:
        current = self.leaders.get(tp)
        if current is not None and current.leader_epoch == epoch:
            if set(isr) | {self.broker_id} != current.isr or version > current.version:
                current.set_isr(isr, version)
            return
        step("becoming-leader")
        self._resign(tp)
        self._unfollow(tp)
        plog.start_replication()
        plog.become_leader(epoch)
        lp = LeaderPartition(plog, tp[0], tp[1], self.broker_id, epoch, replicas, isr, version)
        self.leaders[tp] = lp
        log.info("%s: leading at epoch %d from offset %d (ISR %s, high watermark %d)",
                 lp.name, epoch, plog.log_end_offset, sorted(lp.isr), plog.high_watermark)
        if lp.maybe_advance():
            self.published(plog)

    def _follow(self, tp: Partition, plog: PartitionLog, leader: int, epoch: int) -> None:
        self._resign(tp)
        if self.following.get(tp) == (leader, epoch):
            return
        plog.start_replication()
        self.following[tp] = (leader, epoch)
        if self.followers is not None:
            self.followers.follow(tp, leader, epoch)

    def _resign(self, tp: Partition) -> None:
        lp = self.leaders.pop(tp, None)
        if lp is not None:
            lp.close(not_leader(lp.name, self.broker_id))
            log.info("%s: no longer leading (epoch %d)", lp.name, lp.leader_epoch)

    def _unfollow(self, tp: Partition) -> None:
        if self.following.pop(tp, None) is not None and self.followers is not None:
            self.followers.unfollow(tp)

    # -- the ISR thread ------------------------------------------------------------------
    def poke(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(TICK_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.sync_roles()
                self._maintain_isr()
            except Exception:
                log.exception("replica manager step failed; trying again")
            for lp in list(self.leaders.values()):
                try:
                    lp.plog.checkpoint_high_watermark()
                except LakelogError:
                    log.exception("%s: publishing the high watermark failed", lp.name)

    def _maintain_isr(self) -> None:
        for tp, lp in list(self.leaders.items()):
            if not self.broker.session.has_lease:
                return
            out = lp.out_of_sync(self.lag_time_max_ms)
            joining = lp.caught_up(self.lag_time_max_ms,
                                   (b.broker_id for b in self.broker.view.live_brokers()))
            if not out and not joining:
                continue
            new_isr = sorted((lp.isr - out) | joining)
            lp.expanding(joining)  # counted before the write; dropped only after it
            try:
                state, version = alter_isr(self.broker.client, tp[0], tp[1], self.broker_id,
                                           lp.leader_epoch, new_isr, lp.version)
            except IsrConflictError as exc:
                lp.expanding(())
                log.info("%s: ISR change refused (%s); reading the state again", lp.name, exc)
                self.broker.view.sync_topic(tp[0])
                continue
            except Exception:
                lp.expanding(())
                raise
            step("leader-isr-written")
            if out:
                self.isr_shrinks += 1
                log.warning("%s: ISR shrinks from %s to %s (behind for more than "
                            "replica.lag.time.max.ms=%d)", lp.name, sorted(lp.isr),
                            state.isr, self.lag_time_max_ms)
            if joining:
                self.isr_expands += 1
                log.info("%s: ISR expands from %s to %s", lp.name, sorted(lp.isr), state.isr)
            moved_before = lp.plog.high_watermark
            lp.set_isr(state.isr, version)
            if lp.plog.high_watermark != moved_before:
                self.published(lp.plog)

    def published(self, plog: PartitionLog) -> None:
        if self.on_high_watermark is not None:
            self.on_high_watermark(plog)

    def check_min_isr(self, lp: LeaderPartition) -> None:
        """Before an acks=all append: NOT_ENOUGH_REPLICAS when the ISR is smaller than the
        topic's min.insync.replicas, as this leader holds it or as ZooKeeper already says
        (a shrink the view has and this leader's thread is about to apply)."""
        placement = self.broker.view.placement(lp.topic, lp.partition)
        held = (frozenset(placement.isr) | {self.broker_id}) if placement is not None \
            and placement.leader_epoch == lp.leader_epoch else lp.isr
        lp.check_min_isr(self.broker.min_insync_replicas(lp.topic),
                         lp.isr if len(lp.isr) <= len(held) else held)

    # -- what /metrics and the API show ----------------------------------------------------
    def under_replicated(self) -> list[Partition]:
        return sorted(tp for tp, lp in self.leaders.items() if len(lp.isr) < len(lp.replicas))
