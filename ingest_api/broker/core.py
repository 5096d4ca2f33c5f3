"""The broker: a plain Python object that owns the logs and every service over them,
started and stopped by whichever front drives it (``ingest_api.http.app`` serves it over
HTTP; a test or another listener may drive it directly).

``start`` (in order): 1. open (recover) the logs; 2. load the committed offsets and
start their writer; 3. in a cluster, join it (ZooKeeper registration, metadata, the
peers the front connects); 4. the produce service; 5. in a cluster, replication and the
coordinator slots of the groups; alone, the transaction coordinator (its state loaded,
what was under way finished); 6. the background tasks (upkeep of segments, expiry of
group sessions) and services (the job scheduler). ``stop`` undoes them in reverse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from cluster.broker import ClusterBroker
from cluster.coordinators import CoordinatorSlots
from cluster.model import BrokerInfo
from cluster.producer_ids import ClusterProducerIds
from cluster.replica_manager import ReplicaManager
from cluster.session import ZkSession
from cluster.znode import VersionedZnode
from consumer_groups.coordinator import GroupCoordinator
from consumer_groups.held import HeldOffsets
from consumer_groups.offsets import OffsetStore
from consumer_groups.subscriptions import SubscriptionWriter
from ingest_api.broker.cluster_info import ClusterInfo
from ingest_api.broker.cluster_link import ClusterLink
from ingest_api.broker.fetch import FetchService
from ingest_api.broker.group_admin import GroupAdmin
from ingest_api.broker.group_poll import GroupPoll
from ingest_api.broker.group_slots import GroupSlots
from ingest_api.broker.leader_bounds import LeaderBounds
from ingest_api.broker.metadata import METADATA
from ingest_api.broker.metrics import Metrics, Sources
from ingest_api.broker.notifier import AppendNotifier
from ingest_api.broker.peers import Connect, PeerSetup
from ingest_api.broker.produce.service import ProduceService
from ingest_api.broker.records_admin import RecordsAdmin
from ingest_api.broker.replica_fetcher import Fetchers
from ingest_api.broker.replica_server import ReplicaServer
from ingest_api.broker.schemas.registry import SchemaRegistry
from ingest_api.broker.schemas.serde import Writers
from ingest_api.broker.schemas.source import RegistrySource
from ingest_api.broker.schemas.store import ClusterSchemaLog, LocalSchemaLog
from ingest_api.broker.schemas.validation import SchemaValidation
from ingest_api.broker.security import ZNODE_PATH, SecurityStore
from ingest_api.broker.topics import TopicAdmin
from ingest_api.broker.transactions.coordinator import TransactionCoordinator
from ingest_api.broker.transactions.groups import group_offsets
from ingest_api.broker.transactions.markers import BrokerMarkers
from ingest_api.broker.transactions.slots import TxnSlots
from ingest_api.broker.transactions.state_log import ClusterStateLog, LocalStateLog, StateLog
from ingest_api.broker.upkeep import expire_sessions, upkeep, write_subscriptions
from ingest_api.settings import ApiSettings
from log_tables.cold.tiered_storage import TieredStorage
from log_tables.errors import InvalidTopicError, UnknownPartitionError, UnknownTopicError
from log_tables.hot.log_manager import LogManager
from log_tables.hot.partition_log import PartitionLog
from log_tables.registry import INTERNAL_TOPICS, TXN_STATE_TOPIC, TopicMetadata

log = logging.getLogger(__name__)


class BackgroundService(Protocol):
    """Work the server runs beside the broker (the job scheduler): started after the logs
    are open, stopped before they close."""

    def start(self, manager: LogManager) -> None: ...

    def stop(self) -> None: ...


class Broker:
    """One broker: made from its settings (and, in a cluster, the front's ``connect`` to
    its peers and the ``ClusterLink`` type the front routes with); its services exist
    between ``start`` and ``stop``.

    The ZooKeeper session opens here, before ``start``: the security store lives there
    and the front's authentication needs it from the first request."""

    def __init__(self, settings: ApiSettings | None = None, *, connect: Connect | None = None,
                 link_type: type[ClusterLink] = ClusterLink,
                 services: Sequence[BackgroundService] = (),
                 metrics: Metrics | None = None) -> None:
        self.settings = settings = settings or ApiSettings()
        if settings.zookeeper is not None and connect is None:
            raise ValueError("a broker of a cluster needs its front's connect to its peers")
        self.metrics = metrics or Metrics()
        self._connect = connect
        self._link_type = link_type
        self.services = tuple(services)
        self.session = _zookeeper(settings)
        znode = VersionedZnode(self.session.client, ZNODE_PATH) \
            if self.session is not None else None
        self.security = store = SecurityStore(settings.data_dir, znode) \
            if settings.auth == "api-key" else None
        self.credentials = store.broker_credentials(settings.broker_id) \
            if store is not None and settings.broker_id is not None \
            and self.session is not None else None
        if store is not None and (admin_key := store.bootstrap()) is not None:
            log.warning("no API key existed: made one for principal 'admin' (cluster admin) "
                        "in %s, readable only by this user; the CLI uses it from there, curl "
                        "with -u \"$(cat %s)\"", admin_key, admin_key)
        self.link: ClusterLink | None = None
        self.group_slots: GroupSlots | None = None
        self.transactions: TransactionCoordinator | None = None
        self.txn_slots: TxnSlots | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        settings, metrics = self.settings, self.metrics
        self.manager = manager = LogManager(settings.data_dir, producer_ids=None if (
            self.session is None or settings.broker_id is None)
            else ClusterProducerIds(self.session.client, settings.broker_id))
        self.notifier = notifier = AppendNotifier(settings.max_long_polls)
        self.tiered = tiered = TieredStorage(manager, settings.layout)
        self.fetch = fetch = FetchService(manager, notifier, metrics, tiered)
        self.offsets = offsets = OffsetStore(
            settings.layout.warehouse, max_wait_ms=settings.offsets_commit_wait_ms,
            vacuum_retention_hours=settings.vacuum_retention_hours)
        await asyncio.to_thread(offsets.load)
        offsets.start()
        self.groups = groups = GroupCoordinator(
            offsets, _of_topic(manager, lambda t: t.partitions),
            # created_ms 0: made before topics kept it
            created_ms_of=_of_topic(manager, lambda t: t.created_ms or None),
            topic_id_of=_of_topic(manager, lambda t: t.topic_id),
            max_groups=settings.max_consumer_groups, max_members=settings.max_group_members,
            offsets_retention_ms=settings.offsets_retention_minutes * 60_000)
        if self.session is not None:
            self.link = await asyncio.to_thread(self._join_cluster, manager, self.session)
        link = self.link
        self.produce = produce = ProduceService(
            manager, notifier, settings.max_queued_records,
            acks_all_fsync=settings.acks_all_fsync, timeout_s=settings.produce_timeout_ms / 1000)
        if link is not None:
            loop = asyncio.get_running_loop()

            def readable(plog: PartitionLog) -> None:  # a high watermark moved: wake fetches
                loop.call_soon_threadsafe(notifier.notify, plog.name)

            link.replicas = produce.replicas = await asyncio.to_thread(
                self._start_replication, link, readable)
            metrics.attach_replicas(link.replicas)
            # The groups this broker coordinates follow its coordinator slots.
            self.group_slots = GroupSlots(link, groups)
            groups.epoch_of = link.coordinator_epoch = self.group_slots.epoch
            self.group_slots.start()
        self.txn_markers = BrokerMarkers(manager, notifier, produce, link)
        self.transactions = txns = self._transactions(manager, produce, groups, link)
        if link is not None:
            self.txn_slots = TxnSlots(link, txns)
            link.txn_epoch = self.txn_slots.slots.epoch
            self.txn_slots.start()
        await txns.start()
        produce.transactions = txns
        self.held_offsets = held = HeldOffsets()
        groups.pending = lambda group: txns.pending_partitions(group) | held.partitions(group)
        self.poll = GroupPoll(groups, fetch, manager, link)
        # Group lag counts to each partition's leader's bounds (in a cluster: its leader's).
        self.bounds = bounds = LeaderBounds(manager, tiered, link)
        metrics.attach(Sources(manager, tiered, groups, bounds.latest))
        # The services the fronts call: topic and group administration, views, replicas.
        self.topic_admin = topics = TopicAdmin(
            manager, tiered, groups, settings.default_replication_factor, link,
            broker_defaults=settings.topic_defaults)
        self.group_admin = GroupAdmin(groups, manager, tiered, topics, bounds, link)
        self.cluster_info = ClusterInfo(manager, tiered, topics, link)
        self.records_admin = RecordsAdmin(tiered, topics, link)
        self.schemas = SchemaRegistry(LocalSchemaLog(manager) if link is None else
                                      ClusterSchemaLog(manager, produce, link))
        source = RegistrySource(self.schemas, link)
        self.schema_writers = Writers(source)
        self.schema_validation = SchemaValidation(source)
        self.replica_server = ReplicaServer(link, notifier)
        self.subscriptions = SubscriptionWriter(settings.layout.data_dir)
        # No member outlives a server: what an earlier one wrote is gone.
        await asyncio.to_thread(write_subscriptions, self.subscriptions, {})
        self._tasks = [asyncio.create_task(upkeep(manager, tiered, settings)),
                       asyncio.create_task(expire_sessions(groups, self.subscriptions))]
        for service in self.services:
            service.start(manager)
        log.info("lakelog broker started on %s (%d partitions)", settings.data_dir,
                 len(manager.all_logs()))

    def _transactions(self, manager: LogManager, produce: ProduceService,
                      groups: GroupCoordinator, link: ClusterLink | None
                      ) -> TransactionCoordinator:
        """The transaction coordinator: of every slot alone; in a cluster, of the slots of
        ``__transaction_state`` this broker leads (``TxnSlots`` loads them)."""
        settings = self.settings
        slots = settings.transaction_state_log_num_partitions
        state_log: StateLog = LocalStateLog(manager, slots) if link is None else \
            ClusterStateLog(manager, produce, link, slots)
        return TransactionCoordinator(
            state_log, manager.producer_ids, self.txn_markers,
            max_timeout_ms=settings.transaction_max_timeout_ms,
            abort_interval_ms=settings.transaction_abort_interval_ms,
            expiration_ms=settings.transactional_id_expiration_ms,
            require_partition=manager.log if link is None else _known_partition(link),
            groups=group_offsets(groups, link),
            serving=None if link is None else CoordinatorSlots(
                link.broker, TXN_STATE_TOPIC, slots))

    async def stop(self) -> None:
        for service in self.services:
            service.stop()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self.txn_slots is not None:
            await self.txn_slots.stop()
        if self.transactions is not None:
            await self.transactions.stop()
        await asyncio.to_thread(self.offsets.close)
        await asyncio.to_thread(_close_subscriptions, self.subscriptions)
        self.metrics.attach(None)
        if (link := self.link) is not None:
            if self.group_slots is not None:
                await self.group_slots.stop()
            if link.replicas is not None:
                await asyncio.to_thread(link.replicas.stop)
            await link.close()
            await asyncio.to_thread(link.broker.stop)
            METADATA.attach(None)
        self.manager.close()
        log.info("lakelog broker stopped cleanly")

    def require_topic(self, name: str) -> TopicMetadata:
        """The topic a user writes to; in a cluster, one made through another broker a
        moment ago is read from ZooKeeper before it is called unknown. lakelog's own
        (``__transaction_state``) is refused, as Kafka refuses appends to its internal
        topics: only its coordinators write it."""
        if name in INTERNAL_TOPICS:
            raise InvalidTopicError(f"topic {name!r} is lakelog's own "
                                    f"({INTERNAL_TOPICS[name]}): only lakelog writes to it")
        if self.link is not None and name not in self.manager.registry:
            self.link.ensure_topic(name)
        return self.manager.require_topic(name)

    # -- a cluster -------------------------------------------------------------------
    def _join_cluster(self, manager: LogManager, session: ZkSession) -> ClusterLink:
        """Register this broker with the cluster's ZooKeeper and load its metadata."""
        settings = self.settings
        assert settings.broker_id is not None and settings.zookeeper is not None
        assert self._connect is not None
        host = settings.advertised_host or (
            "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host)
        info = BrokerInfo(settings.broker_id, host, settings.port, settings.broker_rack,
                          "https" if settings.tls_cert else "http")
        broker = ClusterBroker(
            settings.broker_id, session, info, manager, topic_defaults=settings.topic_defaults,
            balance={"auto_leader_rebalance_enable": settings.auto_leader_rebalance_enable,
                     "leader_imbalance_check_interval_seconds":
                         settings.leader_imbalance_check_interval_seconds,
                     "leader_imbalance_per_broker_percentage":
                         settings.leader_imbalance_per_broker_percentage},
            offsets_topic_replication_factor=settings.offsets_topic_replication_factor,
            tls_ca=str(settings.tls_ca.absolute()) if settings.tls_ca is not None else None,
            replica_lag_time_max_ms=settings.replica_lag_time_max_ms)
        broker.start()
        METADATA.attach(broker.view)
        log.info("broker %d joined cluster %s at %s (controller: broker %s)",
                 settings.broker_id, broker.cluster_id, settings.zookeeper,
                 broker.view.controller_id)
        forwarded = self.metrics.forwarded
        peers = self._connect(PeerSetup(
            settings.broker_id, settings, self.credentials,
            on_send=lambda broker_id, kind: forwarded.labels(str(broker_id), kind).inc()))
        return self._link_type(broker, peers,
                               offsets_slots=settings.offsets_topic_num_partitions,
                               txn_slots=settings.transaction_state_log_num_partitions)

    def _start_replication(self, link: ClusterLink,
                           on_high_watermark: Callable[[PartitionLog], None]
                           ) -> ReplicaManager:
        """The leader's replica state and the follower's fetcher threads of this broker."""
        settings = self.settings
        fetchers = Fetchers(link.broker, channel=link.peers.replica_channel,
                            max_wait_ms=settings.replica_fetch_wait_max_ms,
                            on_high_watermark=on_high_watermark)
        replicas = ReplicaManager(link.broker, lag_time_max_ms=settings.replica_lag_time_max_ms,
                                  followers=fetchers, on_high_watermark=on_high_watermark)
        replicas.start()
        return replicas


def _known_partition(link: ClusterLink) -> Callable[[str, int], None]:
    """A partition a transaction adds must exist in the cluster."""
    def check(topic: str, partition: int) -> None:
        link.ensure_topic(topic)
        assignment = link.broker.view.topic(topic)
        count = assignment.partitions if assignment is not None else 0
        if partition >= count:
            raise UnknownPartitionError(topic, partition, count)
    return check


def _zookeeper(settings: ApiSettings) -> ZkSession | None:
    """A broker's ZooKeeper session (None for the cluster of one), opened before anything
    else: the security store lives there."""
    if settings.zookeeper is None:
        return None
    session = ZkSession(settings.zookeeper, settings.zookeeper_session_timeout_ms)
    session.start()
    return session


_T = TypeVar("_T")


def _of_topic(manager: LogManager, field: Callable[[TopicMetadata], _T | None]
              ) -> Callable[[str], _T | None]:
    """``field`` of a topic, looked up once (a topic deleted meanwhile, by another
    thread, is None, not an error)."""
    def of(topic: str) -> _T | None:
        try:
            return field(manager.topic(topic))
        except UnknownTopicError:
            return None
    return of


def _close_subscriptions(writer: SubscriptionWriter) -> None:
    try:
        writer.close()
    except OSError:
        log.exception("clearing the consumer groups' subscriptions in %s failed",
                      writer.data_dir)
