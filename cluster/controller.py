"""The controller: one broker, elected through ZooKeeper, that assigns replicas and
elects partition leaders (Kafka's ZooKeeper-mode controller).

Its steps, each numbered in docs/architecture.md with the test that kills a broker there:

1. elect: create ``/controller`` (one this session made in an interrupted try counts as
   made); bump ``/controller_epoch``, which fences every later write
   (cluster.controller_epoch);
2. reconcile: read the live brokers (and the czxid of each registration, its broker
   epoch: a broker that restarted has a new one) and every partition state; a broker
   gone or restarted leaves the ISR of every partition it is in (never the last member),
   and a partition whose leader is gone or restarted gets a new leader from its ISR,
   the unclean election if its topic allows it, or none (-1, offline) until an ISR
   member returns: the rules are cluster.election's. Only a change of leader raises the
   leader epoch. Each change is one conditional write of the state (on its znode
   version, since the partition's leader changes the ISR too: cluster.isr);
3. topics: create (assign replicas over the live brokers, rack-aware; write the topic and
   its partition states in one transaction), add partitions, alter configs, delete
   (cluster.topic_changes);
4. preferred leaders: every ``leader_imbalance_check_interval_seconds`` (with
   ``auto_leader_rebalance_enable``), per broker whose preferred partitions (it is their
   first replica) are led elsewhere beyond ``leader_imbalance_per_broker_percentage``,
   each of them moves back to it where it is live and in the ISR; ``elect_preferred``
   does it at once for every partition (or a topic's).

Brokers learn every change from their watches (cluster.view).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypedDict

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError

from cluster.assign import grow
from cluster.election import (
    after_brokers_changed,
    after_brokers_changed_recordless,
    imbalanced,
    to_preferred,
)
from cluster.model import (
    RECORDLESS_TOPICS,
    BrokerInfo,
    PartitionState,
    TopicAssignment,
    decode,
    encode,
    state_path,
    topic_path,
)
from cluster.topic_changes import TopicChanges
from log_tables.config import config_value
from log_tables.errors import InvalidConfigError, NotControllerError, UnknownTopicError

log = logging.getLogger(__name__)

step_hook: Callable[[str], None] | None = None
"""Called with each controller step's name as the controller completes it (tests kill the
broker there): elected, epoch, leader-written, isr-written, topic-written,
preferred-written."""

MAX_WRITE_ATTEMPTS = 16
"""Tries of one partition's conditional write that lose to its leader's ISR changes;
then the partition waits for the next reconcile."""
UNCLEAN = "unclean.leader.election.enable"
RECONCILE_EVERY_S = 5.0
"""Also a periodic check, in case a watch was missed."""


class BalanceOptions(TypedDict, total=False):
    """Kafka's preferred leader rebalancing settings, by their Kafka names (``_`` for
    ``.``); the Controller's keyword arguments, with Kafka's defaults there."""

    auto_leader_rebalance_enable: bool
    leader_imbalance_check_interval_seconds: float
    leader_imbalance_per_broker_percentage: int


def step(name: str) -> None:
    if step_hook is not None:
        step_hook(name)


class Controller(TopicChanges):
    """Runs on every broker; acts only while elected. Step 1 is ``ControllerEpoch``'s,
    step 3 ``TopicChanges``'s."""

    def __init__(self, client: KazooClient, broker_id: int, *,
                 topic_defaults: Mapping[str, str] | None = None,
                 auto_leader_rebalance_enable: bool = True,
                 leader_imbalance_check_interval_seconds: float = 300,
                 leader_imbalance_per_broker_percentage: int = 10,
                 offsets_topic_replication_factor: int = 3) -> None:
        """``topic_defaults``: the broker's defaults of topic configs by Kafka name (the
        controller reads ``unclean.leader.election.enable`` there for a topic that does
        not set its own). ``offsets_topic_replication_factor``: the replicas each
        coordinator slot gets, as brokers live to hold them."""
        super().__init__(client, broker_id)
        self.offsets_topic_replication_factor = offsets_topic_replication_factor
        self.topic_defaults = dict(topic_defaults or {})
        self.auto_leader_rebalance_enable = auto_leader_rebalance_enable
        self.leader_imbalance_check_interval_s = float(leader_imbalance_check_interval_seconds)
        self.leader_imbalance_per_broker_percentage = leader_imbalance_per_broker_percentage
        self._next_balance_check = float("inf")
        self._seen_epochs: dict[int, int] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="controller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.active = False

    def poke(self) -> None:
        """Something changed (brokers, the controller node, a new session): look again."""
        self._wake.set()

    def _on_elected(self) -> None:
        self._seen_epochs = {}
        self._next_balance_check = time.monotonic() + self.leader_imbalance_check_interval_s

    def _step(self, name: str) -> None:
        step(name)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._idle_s())
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.run_once()
            except Exception:
                log.exception("controller step failed; trying again")
                time.sleep(0.5)
                self._wake.set()

    def run_once(self) -> None:
        """One turn of the controller's thread, now: be elected if nobody is; while
        elected, reconcile, and check the preferred leaders when that is due."""
        with self._lock:
            if not self._still_controller():
                self._elect()
            if self.active:
                self.reconcile()
                if self.auto_leader_rebalance_enable and \
                        time.monotonic() >= self._next_balance_check:
                    self._next_balance_check = \
                        time.monotonic() + self.leader_imbalance_check_interval_s
                    self.check_leader_imbalance()

    def _idle_s(self) -> float:
        if not (self.active and self.auto_leader_rebalance_enable):
            return RECONCILE_EVERY_S
        return min(RECONCILE_EVERY_S, max(0.05, self._next_balance_check - time.monotonic()))

    # -- 2. leaders ------------------------------------------------------------------
    def reconcile(self) -> int:
        """Step 2 over every partition; returns how many states changed. Two passes, as
        Kafka's controller does on a broker's failure: first the partitions whose leader
        is gone get a new one (they take no produce until then), then the ISRs shrink
        (their partitions still take produce meanwhile)."""
        with self._lock:
            if not self.active:
                raise NotControllerError(f"broker {self.broker_id} is not the controller")
            live = self.live_brokers()
            epochs = {b: czxid for b, (_, czxid) in live.items()}
            bounced = {b for b, e in epochs.items()
                       if b in self._seen_epochs and self._seen_epochs[b] != e}
            topics = []
            for topic, assignment in self._assignments():
                if topic in RECORDLESS_TOPICS:
                    assignment = self._grow_replicas(topic, assignment, live)
                topics.append((topic, assignment, self._unclean(topic, assignment)))
            decided: set[tuple[str, int]] = set()  # a new leader's state has its ISR too
            for leaders_only in (True, False):
                for topic, assignment, unclean in topics:
                    for p, replicas in enumerate(assignment.replicas):
                        if (topic, p) not in decided and self._reconcile_partition(
                                topic, p, replicas, epochs, bounced, unclean,
                                topic in RECORDLESS_TOPICS, leaders_only):
                            decided.add((topic, p))
            self._seen_epochs = epochs
            return len(decided)

    def _unclean(self, topic: str, assignment: TopicAssignment) -> bool:
        """The topic's unclean.leader.election.enable, else this broker's default."""
        try:
            return bool(config_value(UNCLEAN, assignment.configs, self.topic_defaults))
        except InvalidConfigError:
            log.exception("topic %s: %s is invalid; electing clean only", topic, UNCLEAN)
            return False

    def _reconcile_partition(self, topic: str, partition: int, replicas: Sequence[int],
                             live: Mapping[int, int], bounced: set[int], unclean: bool,
                             recordless: bool = False, leaders_only: bool = False) -> int:
        """One partition's step 2: its state after the brokers' changes, written on the
        znode version it was read at (read again when its leader changed the ISR);
        ``leaders_only``: only a change of leader, not of the ISR alone."""
        def decide(state: PartitionState) -> tuple[PartitionState, str] | None:
            change = after_brokers_changed_recordless(
                state, replicas, live, bounced, self.epoch) if recordless else \
                after_brokers_changed(state, replicas, live, bounced, unclean, self.epoch)
            if change is None or (leaders_only and change.kind == "isr"):
                return None
            return change.state, change.kind

        written = self._rewrite_state(topic, partition, decide)
        if written is None:
            return 0
        state, new, kind = written
        if kind == "isr":
            log.info("%s-%d: ISR %s -> %s (leader %d, leader epoch %d)", topic, partition,
                     state.isr, new.isr, new.leader, new.leader_epoch)
            step("isr-written")
            return 1
        if kind == "unclean":
            log.warning("%s-%d: unclean leader election: no in-sync replica of %s is "
                        "alive, so out-of-sync broker %d leads (leader epoch %d); "
                        "acknowledged records it does not have are lost", topic,
                        partition, state.isr, new.leader, new.leader_epoch)
        else:
            log.info("%s-%d: leader %d -> %d (leader epoch %d, ISR %s)", topic, partition,
                     state.leader, new.leader, new.leader_epoch, new.isr)
        step("leader-written")
        return 1

    def _grow_replicas(self, topic: str, assignment: TopicAssignment,
                       live: Mapping[int, tuple[BrokerInfo, int]]) -> TopicAssignment:
        """A record-less topic (the coordinator slots) made while fewer brokers lived, or
        by a lakelog that gave it one replica: its partitions get live brokers as new
        replicas up to ``offsets_topic_replication_factor`` (``cluster.assign.grow``;
        nothing to copy: the reconcile puts them in sync at once). One conditional
        write of the topic."""
        target = min(self.offsets_topic_replication_factor, len(live))
        grown = grow(assignment.replicas, sorted(live), target)
        if grown is None:
            return assignment
        updated = TopicAssignment(grown, assignment.configs, assignment.topic_id,
                                  assignment.created_ms)
        try:
            current, version = self._topic(topic)
            if current != assignment:
                return current  # changed meanwhile: the next reconcile looks again
            self._commit([("set_data", (topic_path(topic), encode(updated)),
                           {"version": version})])
        except (BadVersionError, UnknownTopicError):
            return assignment
        log.info("%s: each coordinator slot now has %d replicas", topic, target)
        step("replicas-grown")
        return updated

    def _rewrite_state(self, topic: str, partition: int,
                       decide: Callable[[PartitionState], tuple[PartitionState, str] | None]
                       ) -> tuple[PartitionState, PartitionState, str] | None:
        """Read a partition's state, ``decide`` its new one, and write it on the znode
        version it was read at, fenced by the controller epoch; read and decide again
        when something (its leader's ISR change) wrote it meanwhile. Returns (old, new,
        what ``decide`` called the change); None when there is nothing to change (or every
        try lost its race: the next reconcile tries again)."""
        path = state_path(topic, partition)
        for _ in range(MAX_WRITE_ATTEMPTS):
            try:
                data, stat = self.client.get(path)
            except NoNodeError:
                return None
            state = decode(data, PartitionState)
            decided = decide(state)
            if decided is None:
                return None
            new, kind = decided
            try:
                self._commit([("set_data", (path, encode(new)), {"version": stat.version})])
            except BadVersionError:
                continue  # its leader changed the ISR meanwhile: decide again
            return state, new, kind
        self.poke()
        return None

    # -- 4. preferred leaders --------------------------------------------------------
    def elect_preferred(self, topic: str | None = None) -> int:
        """Kafka's preferred replica election, now: every partition (of ``topic``) whose
        first replica is live and in the ISR but does not lead gets it as leader (leader
        epoch + 1, ISR unchanged); returns how many moved."""
        with self._lock, self._reachable():
            self._require_active()
            live = set(self.live_brokers())
            moved = 0
            for name, assignment in self._assignments(topic):
                for p, replicas in enumerate(assignment.replicas):
                    moved += self._to_preferred(name, p, replicas, live)
            return moved

    def check_leader_imbalance(self) -> int:
        """Kafka's auto leader rebalance, once: for each broker whose preferred partitions
        are led elsewhere beyond ``leader_imbalance_per_broker_percentage``, move each of
        them back (where it can be); returns how many moved."""
        with self._lock, self._reachable():
            self._require_active()
            live = set(self.live_brokers())
            placements: dict[tuple[str, int], tuple[Sequence[int], PartitionState]] = {}
            replicas_of: dict[tuple[str, int], Sequence[int]] = {}
            for name, assignment in self._assignments():
                for p, replicas in enumerate(assignment.replicas):
                    try:
                        state = decode(self.client.get(state_path(name, p))[0], PartitionState)
                    except NoNodeError:
                        continue
                    placements[(name, p)] = (replicas, state)
                    replicas_of[(name, p)] = replicas
            moved = 0
            for name, p in imbalanced(placements, self.leader_imbalance_per_broker_percentage):
                moved += self._to_preferred(name, p, replicas_of[(name, p)], live)
            return moved

    def _to_preferred(self, topic: str, partition: int, replicas: Sequence[int],
                      live: set[int]) -> int:
        def decide(state: PartitionState) -> tuple[PartitionState, str] | None:
            new = to_preferred(state, replicas, live, self.epoch)
            return None if new is None else (new, "preferred")

        written = self._rewrite_state(topic, partition, decide)
        if written is None:
            return 0
        state, new, _ = written
        log.info("%s-%d: leader %d -> %d, its preferred replica (leader epoch %d)", topic,
                 partition, state.leader, new.leader, new.leader_epoch)
        step("preferred-written")
        return 1
