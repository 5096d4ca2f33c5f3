"""The FastAPI app factory."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar

import msgspec
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from cluster.broker import ClusterBroker
from cluster.model import BrokerInfo
from cluster.replica_manager import ReplicaManager
from cluster.session import ZkSession
from cluster.znode import VersionedZnode
from consumer_groups.coordinator import GroupCoordinator
from consumer_groups.offsets import OffsetStore
from consumer_groups.subscriptions import SubscriptionWriter
from ingest_api.broker.cluster_link import ClusterLink
from ingest_api.broker.fetch import FetchService
from ingest_api.broker.group_poll import GroupPoll
from ingest_api.broker.group_slots import GroupSlots
from ingest_api.broker.leader_bounds import LeaderBounds
from ingest_api.broker.metadata import METADATA
from ingest_api.broker.metrics import LatencyMiddleware, Metrics, Sources
from ingest_api.broker.notifier import AppendNotifier
from ingest_api.broker.produce.service import ProduceService
from ingest_api.broker.replica_fetcher import Fetchers
from ingest_api.broker.security import ZNODE_PATH, SecurityStore, forward_headers
from ingest_api.http import errors
from ingest_api.http.access_log import AccessLog, AccessLogMiddleware
from ingest_api.http.auth import AuthMiddleware
from ingest_api.http.body import InFlightBytes
from ingest_api.http.dashboard import routes as dashboard_routes
from ingest_api.http.dashboard.health import Services
from ingest_api.http.dashboard.overview import Dashboard
from ingest_api.http.models import REQUEST_MODELS
from ingest_api.http.routers import (
    admin,
    cluster,
    group_views,
    partitions,
    records,
    replication,
    security,
    topics,
)
from ingest_api.http.routers import groups as groups_router
from ingest_api.http.state import AppState
from ingest_api.settings import ApiSettings
from log_tables.cold.tiered_storage import TieredStorage
from log_tables.errors import UnknownTopicError
from log_tables.hot.log_manager import LogManager
from log_tables.hot.partition_log import PartitionLog
from log_tables.registry import TopicMetadata

log = logging.getLogger(__name__)
SESSION_CHECK_S = 0.1


class BackgroundService(Protocol):
    """Work the server runs beside the API (the job scheduler): started after the logs
    are open, stopped before they close."""

    def start(self, manager: LogManager) -> None: ...

    def stop(self) -> None: ...


def create_app(settings: ApiSettings | None = None,
               services: Sequence[BackgroundService] = ()) -> FastAPI:
    """An app serving ``settings.data_dir``; the logs are opened (recovered) at startup."""
    settings = settings or ApiSettings()
    session = _zookeeper(settings)
    znode = VersionedZnode(session.client, ZNODE_PATH) if session is not None else None
    store = SecurityStore(settings.data_dir, znode) if settings.auth == "api-key" else None
    credentials = store.broker_credentials(settings.broker_id) \
        if store is not None and settings.broker_id is not None and session is not None else None
    if store is not None and (admin_key := store.bootstrap()) is not None:
        log.warning("no API key existed: made one for principal 'admin' (cluster admin) in "
                    "%s, readable only by this user; the CLI uses it from there, curl with "
                    "-u \"$(cat %s)\"", admin_key, admin_key)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        manager = LogManager(settings.data_dir)
        notifier = AppendNotifier(settings.max_long_polls)
        tiered = TieredStorage(manager, settings.layout)
        fetch = FetchService(manager, notifier, metrics, tiered)
        offsets = OffsetStore(settings.layout.warehouse, max_wait_ms=settings.offsets_commit_wait_ms,
                            vacuum_retention_hours=settings.vacuum_retention_hours)
        await asyncio.to_thread(offsets.load)
        offsets.start()
        groups = GroupCoordinator(offsets, _partitions_of(manager),
                                  # created_ms 0: made before topics kept it
                                  created_ms_of=_of_topic(manager, lambda t: t.created_ms or None),
                                  topic_id_of=_of_topic(manager, lambda t: t.topic_id),
                                  max_groups=settings.max_consumer_groups,
                                  max_members=settings.max_group_members,
                                  offsets_retention_ms=settings.offsets_retention_minutes * 60_000)
        link = await asyncio.to_thread(_join_cluster, settings, manager, session, credentials,
                                       metrics) \
            if session is not None else None
        produce = ProduceService(manager, notifier, settings.max_queued_records,
                                 acks_all_fsync=settings.acks_all_fsync,
                                 timeout_s=settings.produce_timeout_ms / 1000)
        group_slots: GroupSlots | None = None
        if link is not None:
            loop = asyncio.get_running_loop()

            def readable(plog: PartitionLog) -> None:  # a high watermark moved: wake fetches
                loop.call_soon_threadsafe(notifier.notify, plog.name)

            link.replicas = produce.replicas = await asyncio.to_thread(
                _start_replication, settings, link, credentials, readable)
            metrics.attach_replicas(link.replicas)
            # The groups this broker coordinates follow its coordinator slots.
            group_slots = GroupSlots(link, groups)
            groups.epoch_of = link.coordinator_epoch = group_slots.epoch
            group_slots.start()
        app.state.lakelog = AppState(
            settings, manager, produce,
            fetch, metrics, InFlightBytes(settings.max_in_flight_bytes), tiered, groups,
            GroupPoll(groups, fetch, manager, link), link)
        # Group lag counts to each partition's leader's bounds (in a cluster: its leader's).
        app.state.leader_bounds = bounds = LeaderBounds(manager, tiered, link)
        metrics.attach(Sources(manager, tiered, groups, bounds.latest))
        app.state.dashboard = dashboard = Dashboard(app.state.lakelog, app.version, ui_services,
                                                    bounds)
        metrics.attach_job_runs(dashboard.job_runs)
        sampler = asyncio.create_task(dashboard.sampler.run())
        upkeep = asyncio.create_task(_upkeep(manager, tiered, settings))
        subscriptions = SubscriptionWriter(settings.layout.data_dir)
        # No member outlives a server: what an earlier one wrote is gone.
        await asyncio.to_thread(_write_subscriptions, subscriptions, {})
        sessions = asyncio.create_task(_expire_sessions(groups, subscriptions))
        for service in services:
            service.start(manager)
        # Everything allocated so far lives as long as the server: move it out of
        # the collector's generations so that collections during requests stay cheap.
        gc.collect()
        gc.freeze()
        log.info("lakelog serving %s (%d partitions)", settings.data_dir, len(manager.all_logs()))
        try:
            yield
        finally:
            for service in services:
                service.stop()
            for task in (upkeep, sessions, sampler):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await asyncio.to_thread(offsets.close)
            await asyncio.to_thread(_close_subscriptions, subscriptions)
            metrics.attach(None)
            metrics.attach_job_runs(None)
            if access_log is not None:
                access_log.close()
            if link is not None:
                if group_slots is not None:
                    await group_slots.stop()
                if link.replicas is not None:
                    await asyncio.to_thread(link.replicas.stop)
                await link.close()
                await asyncio.to_thread(link.broker.stop)
                METADATA.attach(None)
            manager.close()
            log.info("lakelog stopped cleanly")

    app = FastAPI(title="lakelog", version="0.1.0", lifespan=lifespan,
                  description="Kafka-style event log over HTTP (Confluent REST v3 shapes), "
                              "stored in Delta Lake.")
    metrics = Metrics()
    errors.install(app)
    # Produce and fetch first: routes are matched in order, and these carry the traffic.
    app.include_router(records.router)
    app.include_router(cluster.router)
    app.include_router(topics.router)
    app.include_router(partitions.router)
    app.include_router(admin.router)
    app.include_router(groups_router.router)
    app.include_router(group_views.router)
    app.include_router(security.router)
    app.include_router(replication.router)
    app.include_router(dashboard_routes.router)
    app.state.security = store
    # The dashboard's service rows (ingest_api.http.dashboard.health): one line adds one.
    app.state.services = ui_services = Services()
    app.add_middleware(AuthMiddleware, store=store)
    app.add_middleware(LatencyMiddleware, metrics=metrics)
    app.add_middleware(errors.KeepConnectionOnError)  # around all of ours but the log:
    access_log = AccessLog(settings.access_log) if settings.access_log else None
    if access_log is not None:  # which then sees the 500 that one answers
        app.add_middleware(AccessLogMiddleware, log=access_log)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            _, components = msgspec.json.schema_components(
                REQUEST_MODELS, ref_template="#/components/schemas/{name}")
            schema.setdefault("components", {}).setdefault("schemas", {}).update(components)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


async def _upkeep(manager: LogManager, tiered: TieredStorage, settings: ApiSettings) -> None:
    """Roll segments older than segment.ms even when nothing is produced (they become
    tierable) and those whose records wait for Delta longer than half their topic's
    delta.target.lag.ms, and drop hot segments that are tiered and past local retention."""
    while True:
        await asyncio.sleep(settings.roll_check_interval_ms / 1000)
        try:
            await asyncio.to_thread(manager.roll_due_segments)
        except Exception:
            log.exception("rolling quiet segments failed")
        try:
            await asyncio.to_thread(tiered.roll_for_target_lag)
        except Exception:
            log.exception("rolling segments for delta.target.lag.ms failed")
        try:
            await asyncio.to_thread(tiered.retire, manager.clock.now_ms())
        except Exception:
            log.exception("removing tiered hot segments failed")


def _zookeeper(settings: ApiSettings) -> ZkSession | None:
    """A broker's ZooKeeper session (None for the cluster of one), opened before anything
    else: the security store lives there."""
    if settings.zookeeper is None:
        return None
    session = ZkSession(settings.zookeeper, settings.zookeeper_session_timeout_ms)
    session.start()
    return session


def _join_cluster(settings: ApiSettings, manager: LogManager, session: ZkSession,
                  credentials: str | None, metrics: Metrics) -> ClusterLink:
    """Register this broker with the cluster's ZooKeeper and load its metadata."""
    assert settings.broker_id is not None and settings.zookeeper is not None
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
        tls_ca=str(settings.tls_ca.absolute()) if settings.tls_ca is not None else None)
    broker.start()
    METADATA.attach(broker.view)
    log.info("broker %d joined cluster %s at %s (controller: broker %s)", settings.broker_id,
             broker.cluster_id, settings.zookeeper, broker.view.controller_id)
    return ClusterLink(
        broker, timeout_s=settings.max_fetch_wait_ms / 1000 + 30,
        offsets_slots=settings.offsets_topic_num_partitions,
        credentials=None if credentials is None else partial(forward_headers, credentials),
        verify=_tls_verify(settings),
        on_send=lambda broker_id, kind: metrics.forwarded.labels(str(broker_id), kind).inc())


def _start_replication(settings: ApiSettings, link: ClusterLink, credentials: str | None,
                       on_high_watermark: Callable[[PartitionLog], None]) -> ReplicaManager:
    """The leader's replica state and the follower's fetcher threads of this broker."""
    fetchers = Fetchers(link.broker,
                        headers={} if credentials is None else forward_headers(credentials, None),
                        verify=_tls_verify(settings),
                        max_wait_ms=settings.replica_fetch_wait_max_ms,
                        on_high_watermark=on_high_watermark)
    replicas = ReplicaManager(link.broker, lag_time_max_ms=settings.replica_lag_time_max_ms,
                              followers=fetchers, on_high_watermark=on_high_watermark)
    replicas.start()
    return replicas


def _tls_verify(settings: ApiSettings) -> bool | str:
    """Brokers reach each other over HTTPS when they serve it; their certificates are
    checked against the system's CAs, or ``tls_ca`` (a private CA's bundle)."""
    return str(settings.tls_ca) if settings.tls_ca is not None else True


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


def _partitions_of(manager: LogManager) -> Callable[[str], int | None]:
    return _of_topic(manager, lambda t: t.partitions)


def _write_subscriptions(writer: SubscriptionWriter, groups: dict[str, list[str]]) -> bool:
    try:
        writer.write(groups)
    except OSError:
        log.exception("writing the consumer groups' subscriptions to %s failed", writer.data_dir)
        return False
    return True


def _close_subscriptions(writer: SubscriptionWriter) -> None:
    try:
        writer.close()
    except OSError:
        log.exception("clearing the consumer groups' subscriptions in %s failed",
                      writer.data_dir)


async def _expire_sessions(groups: GroupCoordinator, subscriptions: SubscriptionWriter) -> None:
    """Remove group members whose session timed out (their partitions move), and write
    the groups' subscriptions for the SQL views when membership changed."""
    written = groups.membership_version
    while True:
        await asyncio.sleep(SESSION_CHECK_S)
        for group, member in groups.expire_sessions():
            log.info("consumer group %s: member %s missed its session timeout and was removed",
                     group, member)
        if groups.membership_version != written:
            version = groups.membership_version
            if await asyncio.to_thread(_write_subscriptions, subscriptions,
                                       groups.subscriptions()):
                written = version  # else: tried again at the next check
