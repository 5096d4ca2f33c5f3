"""A broker's picture of the cluster: live brokers, topics and partition states, kept
current by ZooKeeper watches (Kafka's metadata cache).

Watch callbacks only queue events; one thread applies them in order, reading ZooKeeper
where a watch says only "changed". Each partition state is held with its znode's
version (a leader changes its ISR by a write conditional on it: cluster.isr). A state
older than the one held is ignored (a stale read or a late event), so the broker never
steps back to an older leadership or ISR: older is a lower (leader epoch, znode version)
of the same znode, since an ISR change keeps the leader epoch but not the version; a
state znode made again (its topic deleted and created anew) is newer whatever it holds.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.protocol.states import ZnodeStat
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from cluster.model import (
    BROKERS,
    CONTROLLER,
    TOPICS,
    BrokerInfo,
    PartitionState,
    TopicAssignment,
    broker_path,
    decode,
    state_path,
    topic_path,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a partition lives: its leader (-1: none), leader epoch, replicas, ISR."""

    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    @property
    def under_replicated(self) -> bool:
        """Fewer replicas in sync than assigned (Kafka's UnderReplicatedPartitions)."""
        return len(self.isr) < len(self.replicas)


class ClusterView:
    """Thread-safe snapshot of the metadata; ``listeners`` hear every applied change as
    ``(kind, name)``: ("brokers", ""), ("topic", t), ("topic-deleted", t), ("state", t)."""

    def __init__(self, client: KazooClient) -> None:
        self.client = client
        self._lock = threading.Lock()
        self.brokers: dict[int, BrokerInfo] = {}
        self.broker_epochs: dict[int, int] = {}  # czxid of the registration: a new one per start
        self.topics: dict[str, TopicAssignment] = {}
        self.states: dict[tuple[str, int], PartitionState] = {}
        self._stamps: dict[tuple[str, int], tuple[int, int, int]] = {}
        """Each held state's (czxid, leader epoch, version) of its znode: what is newer."""
        self.controller_id: int | None = None
        self.listeners: list[Callable[[str, str], None]] = []
        self._watched_topics: set[str] = set()
        self._watched_states: set[tuple[str, int]] = set()
        self._events: queue.Queue[tuple[str, tuple[object, ...]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="cluster-metadata", daemon=True)
        self._applied = threading.Condition(self._lock)
        self._generation = 0

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()
        ChildrenWatch(self.client, BROKERS, lambda _: self._events.put(("brokers", ())))
        ChildrenWatch(self.client, TOPICS, self._topics_changed)
        DataWatch(self.client, CONTROLLER, self._controller_changed)

    def stop(self) -> None:
        self._events.put(None)

    def wait_applied(self, timeout_s: float) -> bool:
        """Wait until every event queued before this call has been applied."""
        done = threading.Event()
        self._events.put(("barrier", (done,)))
        return done.wait(timeout_s)

    # -- queries ---------------------------------------------------------------------
    def placement(self, topic: str, partition: int) -> Placement | None:
        with self._lock:
            assignment = self.topics.get(topic)
            state = self.states.get((topic, partition))
        if assignment is None or partition >= assignment.partitions:
            return None
        replicas = tuple(assignment.replicas[partition])
        if state is None:
            return Placement(-1, -1, replicas, ())
        return Placement(state.leader, state.leader_epoch, replicas, tuple(state.isr))

    def leader(self, topic: str, partition: int) -> int:
        with self._lock:
            state = self.states.get((topic, partition))
        return state.leader if state is not None else -1

    def leader_epoch(self, topic: str, partition: int) -> int:
        with self._lock:
            state = self.states.get((topic, partition))
        return state.leader_epoch if state is not None else -1

    def state_with_version(self, topic: str, partition: int
                           ) -> tuple[PartitionState, int] | None:
        """The partition's state and its znode version (what ``cluster.isr.alter_isr``
        writes on); None before a state is known."""
        with self._lock:
            state = self.states.get((topic, partition))
            stamp = self._stamps.get((topic, partition))
        if state is None or stamp is None:
            return None
        return state, stamp[2]

    def all_states(self) -> dict[tuple[str, int], PartitionState]:
        with self._lock:
            return dict(self.states)

    def broker(self, broker_id: int) -> BrokerInfo | None:
        with self._lock:
            return self.brokers.get(broker_id)

    def live_brokers(self) -> list[BrokerInfo]:
        with self._lock:
            return [self.brokers[b] for b in sorted(self.brokers)]

    def topic(self, name: str) -> TopicAssignment | None:
        with self._lock:
            return self.topics.get(name)

    def all_topics(self) -> dict[str, TopicAssignment]:
        with self._lock:
            return dict(self.topics)

    # -- reads on demand -------------------------------------------------------------
    def sync_topic(self, name: str) -> TopicAssignment | None:
        """Read a topic and its partition states from ZooKeeper now (after a sync, so
        that a topic created through another broker a moment ago is seen)."""
        try:
            self.client.sync(topic_path(name))
            data, _ = self.client.get(topic_path(name))
        except NoNodeError:
            return None
        assignment = decode(data, TopicAssignment)
        self._apply_topic(name, assignment)
        for p in range(assignment.partitions):
            try:
                raw, stat = self.client.get(state_path(name, p))
            except NoNodeError:
                continue
            self._apply_state(name, p, decode(raw, PartitionState), stat)
        self._watch_topic(name)
        return assignment

    # -- watches -> events -----------------------------------------------------------
    def _topics_changed(self, children: list[str]) -> None:
        self._events.put(("topics", (tuple(children),)))

    def _controller_changed(self, data: bytes | None, _stat: object) -> None:
        self._events.put(("controller", (data,)))

    def _watch_topic(self, name: str) -> None:
        with self._lock:
            if name in self._watched_topics:
                return
            self._watched_topics.add(name)

        def changed(data: bytes | None, _stat: object) -> bool:
            with self._lock:
                if name not in self._watched_topics:
                    return False
            self._events.put(("topic", (name, data)))
            return True

        DataWatch(self.client, topic_path(name), changed)

    def _watch_state(self, name: str, partition: int) -> None:
        key = (name, partition)
        with self._lock:
            if key in self._watched_states:
                return
            self._watched_states.add(key)

        def changed(data: bytes | None, stat: ZnodeStat | None) -> bool:
            with self._lock:
                if key not in self._watched_states:
                    return False
            if data is not None and stat is not None:
                self._events.put(("state", (name, partition, data, stat)))
            return True

        DataWatch(self.client, state_path(name, partition), changed)

    # -- applying events -------------------------------------------------------------
    def _run(self) -> None:
        while (event := self._events.get()) is not None:
            kind, args = event
            try:
                if kind == "barrier":
                    args[0].set()  # type: ignore[attr-defined]
                elif kind == "brokers":
                    self._refresh_brokers()
                elif kind == "topics":
                    self._refresh_topics(args[0])  # type: ignore[arg-type]
                elif kind == "topic":
                    name, data = args
                    if data is None:
                        self._drop_topic(name)  # type: ignore[arg-type]
                    else:
                        self._apply_topic(name, decode(data, TopicAssignment))  # type: ignore[arg-type]
                elif kind == "state":
                    name, partition, data, stat = args
                    self._apply_state(name, partition,  # type: ignore[arg-type]
                                      decode(data, PartitionState),  # type: ignore[arg-type]
                                      stat)
                elif kind == "controller":
                    data = args[0]
                    with self._lock:
                        self.controller_id = None if data is None else int(
                            decode(data, dict)["broker_id"])  # type: ignore[arg-type]
                    self._notify("controller", "")
            except Exception:
                log.exception("applying cluster metadata event %s failed", kind)

    def _refresh_brokers(self) -> None:
        brokers: dict[int, BrokerInfo] = {}
        epochs: dict[int, int] = {}
        for child in self.client.get_children(BROKERS):
            try:
                data, stat = self.client.get(broker_path(int(child)))
            except NoNodeError:
                continue
            brokers[int(child)] = decode(data, BrokerInfo)
            epochs[int(child)] = stat.czxid
        with self._lock:
            self.brokers, self.broker_epochs = brokers, epochs
        self._notify("brokers", "")

    def _refresh_topics(self, children: tuple[str, ...]) -> None:
        for name in children:
            self._watch_topic(name)
        with self._lock:
            gone = [t for t in self._watched_topics if t not in children]
        for name in gone:
            # The list may be older than a topic synced since (``sync_topic`` runs outside
            # this queue): drop only what ZooKeeper no longer holds.
            if self.client.exists(topic_path(name)) is None:
                self._drop_topic(name)

    def _apply_topic(self, name: str, assignment: TopicAssignment) -> None:
        with self._lock:
            before = self.topics.get(name)
            anew = before is not None and before.topic_id != assignment.topic_id
            missing = [p for p in range(assignment.partitions)
                       if anew or (name, p) not in self.states]
        # A new partition's state is read before the topic shows the partition, so that
        # no reader finds a partition without one (its watch's event comes later).
        read: dict[int, tuple[PartitionState, ZnodeStat]] = {}
        for p in missing:
            try:
                raw, stat = self.client.get(state_path(name, p))
            except NoNodeError:
                continue
            except KazooException as exc:  # unreachable now: the watches bring them later
                log.info("%s: partition states not read with the topic (%s)", name, exc)
                break
            read[p] = decode(raw, PartitionState), stat
        with self._lock:
            if anew:
                self.states = {k: v for k, v in self.states.items() if k[0] != name}
                self._stamps = {k: v for k, v in self._stamps.items() if k[0] != name}
            held = [self._hold(name, p, state, stat) for p, (state, stat) in read.items()]
            self.topics[name] = assignment
        for p in range(assignment.partitions):
            self._watch_state(name, p)
        if before != assignment:
            self._notify("topic", name)
        elif any(held):  # states new to the view of a topic it knew: heard as states
            self._notify("state", name)

    def drop_topic(self, name: str) -> None:
        self._drop_topic(name)

    def _drop_topic(self, name: str) -> None:
        with self._lock:
            known = self.topics.pop(name, None) is not None
            self._watched_topics.discard(name)
            self._watched_states = {k for k in self._watched_states if k[0] != name}
            self.states = {k: v for k, v in self.states.items() if k[0] != name}
            self._stamps = {k: v for k, v in self._stamps.items() if k[0] != name}
        if known:
            self._notify("topic-deleted", name)

    def _apply_state(self, name: str, partition: int, state: PartitionState,
                     stat: ZnodeStat) -> None:
        with self._lock:
            if not self._hold(name, partition, state, stat):
                return
        self._notify("state", name)

    def _hold(self, name: str, partition: int, state: PartitionState, stat: ZnodeStat
              ) -> bool:
        """Hold the state unless an older one (under the lock): whether it changed."""
        key = (name, partition)
        stamp = (int(stat.czxid), state.leader_epoch, int(stat.version))
        held, held_stamp = self.states.get(key), self._stamps.get(key)
        if held_stamp is not None and stamp <= held_stamp:
            if stamp < held_stamp:
                log.info("%s-%d: ignoring a state of (leader epoch, version) %s below "
                         "the held %s", name, partition, stamp[1:], held_stamp[1:])
            return False
        self.states[key], self._stamps[key] = state, stamp
        return held != state  # else rewritten as it was: the version is all that changed

    def _notify(self, kind: str, name: str) -> None:
        for listener in list(self.listeners):
            try:
                listener(kind, name)
            except Exception:
                log.exception("a cluster metadata listener failed on %s %s", kind, name)


def under_replicated(view: ClusterView) -> list[tuple[str, int]]:
    """Every partition of the view whose ISR is smaller than its replicas, in order."""
    out: list[tuple[str, int]] = []
    for topic, assignment in sorted(view.all_topics().items()):
        for p in range(assignment.partitions):
            placement = view.placement(topic, p)
            if placement is not None and placement.under_replicated:
                out.append((topic, p))
    return out
