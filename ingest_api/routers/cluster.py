"""Clusters (there is one, ``lakelog``), health and metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ingest_api.errors import ApiError
from ingest_api.state import CLUSTER_ID, json_response, state

router = APIRouter()


def check_cluster(cluster_id: str) -> None:
    if cluster_id != CLUSTER_ID:
        raise ApiError(404, f"cluster {cluster_id!r} does not exist; the only cluster is "
                            f"{CLUSTER_ID!r}", error_code=40410, name="unknown_cluster")


def cluster_body() -> dict[str, object]:
    return {"kind": "KafkaCluster", "metadata": {"self": f"/v3/clusters/{CLUSTER_ID}"},
            "cluster_id": CLUSTER_ID,
            "topics": {"related": f"/v3/clusters/{CLUSTER_ID}/topics"}}


@router.get("/v3/clusters", tags=["cluster"])
async def list_clusters() -> Response:
    """The clusters this server serves (always just ``lakelog``)."""
    return json_response({"kind": "KafkaClusterList", "metadata": {"self": "/v3/clusters"},
                          "data": [cluster_body()]})


@router.get("/v3/clusters/{cluster_id}", tags=["cluster"])
async def get_cluster(cluster_id: str) -> Response:
    check_cluster(cluster_id)
    return json_response(cluster_body())


@router.get("/healthz", tags=["ops"])
async def healthz(request: Request) -> Response:
    """Liveness and a summary: topics and partitions served."""
    st = state(request)
    return json_response({"status": "ok", "topics": len(st.manager.registry.list()),
                          "partitions": len(st.manager.all_logs())})


@router.get("/metrics", tags=["ops"])
async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    # Off the event loop: with many groups the lag gauges take tens of milliseconds to
    # collect and render (the collectors read snapshots, see ingest_api.metrics).
    body = await asyncio.to_thread(generate_latest, state(request).metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
