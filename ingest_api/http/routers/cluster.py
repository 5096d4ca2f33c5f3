"""Clusters (there is one, ``lakelog``), its brokers, health and metrics."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cluster.model import BrokerInfo
from ingest_api.broker.metadata import METADATA, Broker
from ingest_api.http.auth import may
from ingest_api.http.resources import (
    CLUSTER,
    broker_url,
    collection,
    related,
    replica_body,
    resource,
)
from ingest_api.http.state import CLUSTER_ID, json_response, leader_bounds, state
from log_tables.errors import (
    UnknownBrokerError,
    UnknownClusterError,
)

router = APIRouter()
BrokerId = Annotated[int, Path(ge=0, le=2**31 - 1)]


def check_cluster(cluster_id: str) -> None:
    if cluster_id != CLUSTER_ID:
        raise UnknownClusterError(f"cluster {cluster_id!r} does not exist; the only cluster "
                                  f"is {CLUSTER_ID!r}")


async def forward(request: Request, broker: BrokerInfo) -> Response:
    """The request, sent on to the broker whose it is (a service named it); its answer."""
    link = state(request).cluster
    assert link is not None, "only a broker of a cluster names another broker"
    return await link.proxy(request, broker)


def cluster_body() -> dict[str, object]:
    """Confluent's ``ClusterData``: the cluster and the links it requires."""
    return {**resource("KafkaCluster", CLUSTER, ""), "cluster_id": CLUSTER_ID,
            "controller": related(broker_url(METADATA.controller_id)),
            "acls": related(f"{CLUSTER}/acls"), "brokers": related(f"{CLUSTER}/brokers"),
            "broker_configs": related(f"{CLUSTER}/broker-configs"),
            "consumer_groups": related(f"{CLUSTER}/consumer-groups"),
            "topics": related(f"{CLUSTER}/topics"),
            "partition_reassignments": related(f"{CLUSTER}/topics/-/partitions/-/reassignment")}


@router.get("/v3/clusters", tags=["cluster"])
async def list_clusters() -> Response:
    """The clusters this server serves (always just ``lakelog``)."""
    return json_response(collection("KafkaClusterList", "/v3/clusters", [cluster_body()]))


@router.get("/v3/clusters/{cluster_id}", tags=["cluster"])
async def get_cluster(cluster_id: str) -> Response:
    check_cluster(cluster_id)
    return json_response(cluster_body())


def _broker_body(broker: Broker) -> dict[str, object]:
    url = broker_url(broker.broker_id)
    return {**resource("KafkaBroker", url, f"broker={broker.broker_id}"),
            "cluster_id": CLUSTER_ID, "broker_id": broker.broker_id, "host": broker.host,
            "port": broker.port, "rack": broker.rack, "configs": related(f"{url}/configs"),
            "partition_replicas": related(f"{url}/partition-replicas")}


def _broker(request: Request, broker_id: int) -> Broker:
    for broker in METADATA.brokers(request.url.hostname, request.url.port):
        if broker.broker_id == broker_id:
            return broker
    raise UnknownBrokerError(f"broker {broker_id} does not exist; the brokers are "
                             f"{[b.broker_id for b in METADATA.brokers(None, None)]}")


@router.get("/v3/clusters/{cluster_id}/brokers", tags=["cluster"])
async def list_brokers(cluster_id: str, request: Request) -> Response:
    """The live brokers of the cluster (a cluster of one: this server, broker 1)."""
    check_cluster(cluster_id)
    brokers = METADATA.brokers(request.url.hostname, request.url.port)
    return json_response(collection("KafkaBrokerList", f"{CLUSTER}/brokers",
                                    [_broker_body(b) for b in brokers]))


@router.get("/v3/clusters/{cluster_id}/brokers/{broker_id}", tags=["cluster"])
async def get_broker(cluster_id: str, broker_id: BrokerId, request: Request) -> Response:
    check_cluster(cluster_id)
    return json_response(_broker_body(_broker(request, broker_id)))


@router.get("/v3/clusters/{cluster_id}/brokers/{broker_id}/configs", tags=["cluster"])
async def list_broker_configs(cluster_id: str, broker_id: BrokerId, request: Request) -> Response:
    """Dynamic broker configs: none (the server's settings come from its environment)."""
    check_cluster(cluster_id)
    _broker(request, broker_id)
    return json_response(collection("KafkaBrokerConfigList",
                                    f"{broker_url(broker_id)}/configs", []))


@router.get("/v3/clusters/{cluster_id}/broker-configs", tags=["cluster"])
async def list_cluster_configs(cluster_id: str) -> Response:
    """Dynamic cluster-wide broker configs: none (see ``list_broker_configs``)."""
    check_cluster(cluster_id)
    return json_response(collection("KafkaClusterConfigList", f"{CLUSTER}/broker-configs", []))


@router.get("/v3/clusters/{cluster_id}/brokers/{broker_id}/partition-replicas", tags=["cluster"])
async def list_broker_replicas(cluster_id: str, broker_id: BrokerId,
                               request: Request) -> Response:
    """Every partition replica the broker holds."""
    check_cluster(cluster_id)
    _broker(request, broker_id)
    info = state(request).cluster_info
    visible = [t.name for t in info.topics.topics() if may(request, "topic", t.name, "describe")]
    replicas = [replica_body(t, p, broker_id) for t, p in info.replicas_on(broker_id, visible)]
    return json_response(collection("KafkaReplicaList",
                                    f"{broker_url(broker_id)}/partition-replicas", replicas))


@router.get("/healthz", tags=["ops"])
async def healthz(request: Request) -> Response:
    """Liveness and a summary: topics and partitions served; a broker of a cluster adds
    its id and its cluster's (readers beside it check they reach their own). It
    answers 503 (``"status": "starting"``) until it is first ready: registered, with a
    controller elected and its metadata loaded, so that a topic or a group asked for the
    moment every broker answers 200 is placed over all of them."""
    health = state(request).cluster_info.health()
    body: dict[str, object] = {"status": "ok", "topics": health.topics,
                               "partitions": health.partitions}
    if (broker := health.broker) is not None:  # its id and its ZooKeeper lease
        body.update(broker_id=broker.broker_id, cluster_id=broker.cluster_id,
                    controller=broker.controller, zookeeper_lease=broker.zookeeper_lease,
                    ready=broker.ready, leads=broker.leads)
        if not broker.ready:
            body["status"] = "starting"
            return json_response(body, status=503)
    return json_response(body)


@router.get("/metrics", tags=["ops"])
async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    # Group lag counts to the leaders' bounds: asked first (shared with the dashboard's
    # sampler when it asked within the last second).
    await leader_bounds(request).refresh_groups(state(request).groups, max_age_s=1.0)
    # Off the event loop: with many groups the lag gauges take tens of milliseconds to
    # collect and render (the collectors read snapshots, see ingest_api.broker.metrics).
    body = await asyncio.to_thread(generate_latest, state(request).metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
