"""A broker of a cluster: its ZooKeeper session and registration, its metadata view, the
controller it may become, and the local logs that mirror the cluster's topics.

Every broker keeps every topic in its registry (the topic list, configs and partition
counts mirror ZooKeeper), so that any broker can describe any topic; a partition's hot
log holds records only on the broker that leads it. ``leads`` is the one question the
produce path asks: this broker is the partition's leader in the newest state it holds,
and its ZooKeeper lease is live (cluster.session).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Mapping

from kazoo.exceptions import NodeExistsError, NoNodeError

from cluster.controller import BalanceOptions, Controller
from cluster.model import (
    OFFSETS_TOPIC,
    BrokerInfo,
    broker_path,
    decode,
    encode,
)
from cluster.session import ZkSession, unreachable_as
from cluster.tierers import SETTLE_FACTOR, tiered_by
from cluster.view import ClusterView
from log_tables.config import config_value
from log_tables.errors import (
    LeaderNotAvailableError,
    NotLeaderError,
    UnknownTopicError,
)
from log_tables.hot.log_manager import LogManager
from log_tables.leadership import (
    LEADERSHIP_FILE,
    clear_leadership,
    read_cluster_id,
    write_cluster_id,
    write_leadership,
)
from log_tables.registry import TopicMetadata

log = logging.getLogger(__name__)

CLUSTER_ID_PATH = "/cluster/id"


class ClusterBroker:
    def __init__(self, broker_id: int, session: ZkSession, info: BrokerInfo,
                 manager: LogManager, *, topic_defaults: Mapping[str, str] | None = None,
                 balance: BalanceOptions | None = None,
                 offsets_topic_replication_factor: int = 3, tls_ca: str | None = None,
                 replica_lag_time_max_ms: int = 30_000) -> None:
        """``session``: started already (the server reads its security from ZooKeeper
        before the logs are open). ``manager``: built with this cluster's producer ids
        (``cluster.producer_ids.ClusterProducerIds``). ``topic_defaults``: this broker's defaults of topic
        configs by Kafka name (``ApiSettings.topic_defaults``), for topics that do not
        set their own; ``balance``: the controller's preferred leader rebalancing;
        ``offsets_topic_replication_factor``: the replicas of each coordinator slot;
        ``tls_ca``: the CA bundle brokers' certificates are checked against (cluster.json
        tells the readers beside this broker)."""
        self.broker_id = broker_id
        self.tls_ca = tls_ca
        self.tier_settle_ms = SETTLE_FACTOR * replica_lag_time_max_ms
        self.topic_defaults = dict(topic_defaults or {})
        self.info = info
        self.manager = manager
        self.session = session
        session.on_new_session = self._new_session
        session.on_lease_change = lambda _held: self._write_leadership()
        self.client = self.session.client
        self.view = ClusterView(self.client)
        self.controller = Controller(
            self.client, broker_id, topic_defaults=self.topic_defaults,
            offsets_topic_replication_factor=offsets_topic_replication_factor,
            **(balance or {}))
        self.view.listeners.append(self._changed)
        self._leadership_written: tuple[dict[str, list[int]], dict[str, list[int]]] | None \
            = None
        self._ready = False
        self._leadership_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------
    def start(self, timeout_s: float = 60) -> None:
        self._join_cluster()
        self._register(timeout_s)
        self.view.start()
        self.controller.start()
        self.controller.poke()
        if not self.view.wait_applied(timeout_s):
            raise TimeoutError("the cluster metadata did not load")
        for name in list(self.view.topics):
            self._mirror(name)
        self._drop_unknown_local_topics()

    def stop(self) -> None:
        self.controller.stop()
        self.view.stop()
        with contextlib.suppress(Exception):
            self.client.delete(broker_path(self.broker_id))
        self.session.stop()

    def _join_cluster(self) -> None:
        """The cluster's id (made by its first broker); this data directory must belong to
        it, or be new to clusters and hold no topics."""
        self.client.ensure_path("/cluster")
        with contextlib.suppress(NodeExistsError):
            self.client.create(CLUSTER_ID_PATH, uuid.uuid4().hex.encode())
        cluster_id = self.client.get(CLUSTER_ID_PATH)[0].decode()
        data_dir = self.manager.data_dir
        mine = read_cluster_id(data_dir)
        if mine is None and self.manager.registry.list():
            raise RuntimeError(
                f"{data_dir} holds topics but was never part of a cluster; a broker starts on "
                f"an empty data directory (or its own from before)")
        if mine is not None and mine != cluster_id:
            raise RuntimeError(
                f"{data_dir} belongs to cluster {mine}, but ZooKeeper at "
                f"{self.session.connect} holds cluster {cluster_id}: a wrong chroot?")
        # Every start: where this broker answers now, for the readers beside it.
        write_cluster_id(data_dir, cluster_id, self.broker_id, self.info.url, self.tls_ca)
        clear_leadership(data_dir)  # nothing is led until the metadata says so
        self.cluster_id = cluster_id

    def _register(self, timeout_s: float) -> None:
        """Create this broker's ephemeral node. A node left by this broker's previous
        process (killed: its session lives on until it times out) is waited out, never
        taken over: that process might only be paused."""
        deadline = time.monotonic() + max(timeout_s, 2 * self.session.session_timeout_s)
        announced = False
        while True:
            try:
                self.client.create(broker_path(self.broker_id), encode(self.info),
                                   ephemeral=True)
                return
            except NodeExistsError:
                try:
                    data, stat = self.client.get(broker_path(self.broker_id))
                except NoNodeError:  # the earlier session ended between the two calls
                    continue
                if stat.ephemeralOwner == self.client.client_id[0]:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"broker id {self.broker_id} is registered by another live process "
                        f"({decode(data, BrokerInfo).url}); two brokers cannot share an id") \
                        from None
                if not announced:
                    log.warning("broker id %d is still registered by an earlier session; "
                                "waiting for ZooKeeper to end it (up to %.0fs)",
                                self.broker_id, self.session.session_timeout_s)
                    announced = True
                time.sleep(0.2)

    def _new_session(self) -> None:
        self._register(60)
        self.controller.poke()

    def ready(self) -> bool:
        """Whether this broker has been ready at least once since it started: registered
        (its view lists it), a controller elected, and its ZooKeeper lease held. After
        that, always (a broker cut off from ZooKeeper later says so in its lease, and
        keeps answering: liveness, not readiness)."""
        if self._ready:
            return True
        self._ready = (self.view.broker(self.broker_id) is not None
                       and self.view.controller_id is not None and self.session.has_lease)
        return self._ready

    # -- leadership ------------------------------------------------------------------
    def leads(self, topic: str, partition: int) -> bool:
        return self.view.leader(topic, partition) == self.broker_id and self.session.has_lease

    def check_leader(self, topic: str, partition: int) -> int:
        """The leader epoch this broker leads the partition at; else NotLeader (another
        broker leads) or LeaderNotAvailable (none does, or this broker lost its lease)."""
        placement = self.view.placement(topic, partition)
        if placement is None:
            if self.view.topic(topic) is None:
                raise UnknownTopicError(topic)
            raise LeaderNotAvailableError(f"{topic}-{partition} has no state yet")
        if placement.leader == self.broker_id:
            if not self.session.has_lease:
                raise LeaderNotAvailableError(
                    f"broker {self.broker_id} has lost touch with ZooKeeper and does not act "
                    f"as the leader of {topic}-{partition} until it is back; try again")
            return placement.leader_epoch
        if placement.leader_epoch < 0:
            raise LeaderNotAvailableError(f"{topic}-{partition}'s state is not known here "
                                          f"yet; try again")
        if placement.leader < 0:
            raise LeaderNotAvailableError(
                f"{topic}-{partition} has no leader: its broker(s) {list(placement.isr)} "
                f"are down; it comes back when one returns")
        raise NotLeaderError(f"broker {self.broker_id} does not lead {topic}-{partition}; "
                             f"broker {placement.leader} does")

    def min_insync_replicas(self, topic: str) -> int:
        """The topic's ``min.insync.replicas``: its own, else this broker's default (an
        acks=all produce needs an ISR at least this large)."""
        assignment = self.view.topic(topic)
        configs = assignment.configs if assignment is not None else {}
        return int(config_value("min.insync.replicas", configs, self.topic_defaults))

    def led_partitions(self) -> dict[str, list[int]]:
        led: dict[str, list[int]] = {}
        for (topic, p), state in sorted(self.view.all_states().items()):
            if state.leader == self.broker_id and topic != OFFSETS_TOPIC:
                led.setdefault(topic, []).append(p)
        return led

    def tiered_partitions(self) -> dict[str, list[int]]:
        """The partitions this broker's job process tiers (``cluster.tierers``)."""
        topics = {name: t for name, t in self.view.all_topics().items() if name != OFFSETS_TOPIC}
        return tiered_by(self.broker_id, topics, self.view.all_states())

    def _write_leadership(self) -> None:
        """``<data_dir>/leadership.json``: the partitions this broker leads and those it
        tiers, for its job process (which compacts and expires only the first, and tiers
        only the second)."""
        with self._leadership_lock:
            # Without the lease this broker leads nothing: its job process stops too.
            led, tiers = ((self.led_partitions(), self.tiered_partitions())
                          if self.session.has_lease else ({}, {}))
            if (led, tiers) == self._leadership_written:
                return
            write_leadership(self.manager.data_dir, self.broker_id, led, tiers,
                             self.tier_settle_ms)
            self._leadership_written = (led, tiers)

    # -- mirroring topics --------------------------------------------------------------
    def _changed(self, kind: str, name: str) -> None:
        if kind in ("brokers", "controller"):
            self.controller.poke()
        elif kind == "topic":
            self._mirror(name)
        elif kind == "topic-deleted":
            self._unmirror(name)
        if kind in ("state", "topic", "topic-deleted"):
            try:
                self._write_leadership()
            except OSError:
                log.exception("writing %s failed", LEADERSHIP_FILE)

    def _mirror(self, name: str) -> None:
        if name == OFFSETS_TOPIC:
            return
        assignment = self.view.topic(name)
        if assignment is None:
            return
        meta = TopicMetadata(name, assignment.topic_id, assignment.partitions,
                             dict(assignment.configs), assignment.created_ms)
        try:
            self.manager.mirror_topic(meta)
        except Exception:
            log.exception("mirroring topic %s from the cluster metadata failed", name)

    def _unmirror(self, name: str) -> None:
        try:
            self.manager.delete_topic(name)
        except UnknownTopicError:
            pass
        except Exception:
            log.exception("deleting topic %s (deleted in the cluster) failed", name)

    def _drop_unknown_local_topics(self) -> None:
        for meta in self.manager.registry.list():
            if self.view.topic(meta.name) is None and self.view.sync_topic(meta.name) is None:
                log.warning("topic %s is in %s but not in the cluster: deleting it here",
                            meta.name, self.manager.data_dir)
                self._unmirror(meta.name)

    def forget_topic(self, name: str) -> None:
        """A topic deleted through this broker: gone here at once (the others hear it
        from their watches)."""
        self.view.drop_topic(name)
        self._unmirror(name)

    def ensure_topic(self, name: str) -> bool:
        """Whether the topic exists in the cluster, and if so mirrored here as ZooKeeper
        holds it now: a topic made or changed a moment ago (through another broker, or by
        this one's controller) is read, not awaited from the watches.

        Called only off the hot path (an unknown topic, the answer to a topic change).
        The view alone is not enough: it holds a new topic before the watch's listener
        has mirrored it into the registry, and a changed topic only once the watch fires.
        """
        with unreachable_as(LeaderNotAvailableError,
                            f"broker {self.broker_id} looking up topic {name!r}"):
            if self.view.sync_topic(name) is None:
                return False
        self._mirror(name)
        return True
