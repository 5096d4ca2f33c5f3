"""The FastAPI app factory: the HTTP front of a ``Broker`` (``ingest_api.broker.core``).

``create_app`` makes the broker (its ZooKeeper session and security store open here: the
authentication middleware needs the store) and the app; the app's lifespan starts the
broker and attaches what only the front has: the dashboard and its sampler, the access
log, and the job-runs view of ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from ingest_api.broker.core import BackgroundService as BackgroundService
from ingest_api.broker.core import Broker
from ingest_api.http import errors
from ingest_api.http.access_log import AccessLog, AccessLogMiddleware
from ingest_api.http.auth import AuthMiddleware
from ingest_api.http.body import InFlightBytes
from ingest_api.http.dashboard import routes as dashboard_routes
from ingest_api.http.dashboard.health import Services
from ingest_api.http.dashboard.overview import Dashboard
from ingest_api.http.latency import LatencyMiddleware
from ingest_api.http.models import REQUEST_MODELS
from ingest_api.http.peers import HttpLink, connect
from ingest_api.http.routers import (
    admin,
    cluster,
    group_views,
    partitions,
    records,
    replication,
    schema_settings,
    schemas,
    security,
    topics,
    transactions,
    txn_internal,
)
from ingest_api.http.routers import groups as groups_router
from ingest_api.http.state import AppState
from ingest_api.http.txn_models import TXN_REQUEST_MODELS
from ingest_api.kafka.listener import KafkaListener
from ingest_api.settings import ApiSettings

log = logging.getLogger(__name__)


def create_app(settings: ApiSettings | None = None,
               services: Sequence[BackgroundService] = ()) -> FastAPI:
    """An app serving ``settings.data_dir``; the logs are opened (recovered) at startup."""
    broker = Broker(settings, connect=connect, link_type=HttpLink, services=services)
    settings = broker.settings
    store = broker.security

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await broker.start()
        app.state.broker = broker
        kafka = await _kafka_listener(broker)
        app.state.kafka = kafka
        app.state.lakelog = st = AppState(broker, InFlightBytes(settings.max_in_flight_bytes))
        app.state.leader_bounds = broker.bounds
        app.state.dashboard = dashboard = Dashboard(st, app.version, ui_services, broker.bounds)
        broker.metrics.attach_job_runs(dashboard.job_runs)
        broker.metrics.attach_typed(dashboard.typed)
        sampler = asyncio.create_task(dashboard.sampler.run())
        # Everything allocated so far lives as long as the server: move it out of
        # the collector's generations so that collections during requests stay cheap.
        gc.collect()
        gc.freeze()
        log.info("lakelog serving %s (%d partitions)", settings.data_dir,
                 len(broker.manager.all_logs()))
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            broker.metrics.attach_job_runs(None)
            broker.metrics.attach_typed(None)
            if kafka is not None:
                await kafka.stop()
            await broker.stop()
            if access_log is not None:
                access_log.close()
            log.info("lakelog stopped cleanly")

    app = FastAPI(title="lakelog", version="0.1.0", lifespan=lifespan,
                  description="Kafka-style event log over HTTP (Confluent REST v3 shapes), "
                              "stored in Delta Lake.")
    metrics = broker.metrics
    errors.install(app)
    # Produce and fetch first: routes are matched in order, and these carry the traffic.
    app.include_router(records.router)
    app.include_router(cluster.router)
    app.include_router(topics.router)
    app.include_router(partitions.router)
    app.include_router(admin.router)
    app.include_router(groups_router.router)
    app.include_router(transactions.router)
    app.include_router(schemas.router)
    app.include_router(schema_settings.router)
    app.include_router(txn_internal.router)
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
                (*REQUEST_MODELS, *TXN_REQUEST_MODELS), ref_template="#/components/schemas/{name}")
            schema.setdefault("components", {}).setdefault("schemas", {}).update(components)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


async def _kafka_listener(broker: Broker) -> KafkaListener | None:
    """The Kafka protocol front beside this one (``settings.kafka_port``), started."""
    settings = broker.settings
    if not settings.kafka_port:
        return None
    advertised = settings.kafka_advertised_host or (
        "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host)
    listener = KafkaListener(broker, settings.host, settings.kafka_port, advertised,
                             settings.max_request_bytes, settings.max_in_flight_bytes,
                             settings.limit_concurrency)
    await listener.start()
    return listener
