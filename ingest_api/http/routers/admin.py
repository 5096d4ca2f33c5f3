"""Operator endpoints: Kafka's DeleteRecords, sealing segments for a tiering run, and
what the jobs did (``_job_runs``)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import msgspec
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from ingest_api.http.body import decode, read_body
from ingest_api.http.forwarding import forwarded, principal_of
from ingest_api.http.models import DeleteRecordsRequest
from ingest_api.http.routers.cluster import check_cluster
from ingest_api.http.state import json_body, json_response, state
from log_tables.cold import job_runs

router = APIRouter(tags=["admin"])
_delete = msgspec.json.Decoder(DeleteRecordsRequest)
MAX_DELETE_BODY_BYTES = 1 << 20


@router.post("/v3/clusters/{cluster_id}/topics/{topic_name}/records:delete",
             openapi_extra=json_body(DeleteRecordsRequest))
async def delete_records(cluster_id: str, topic_name: Annotated[str, Path(max_length=249)],
                         request: Request) -> Response:
    """Delete every record below an offset in some partitions (Kafka's DeleteRecords):
    the log start moves there in both tiers; fetches below it answer offset_out_of_range."""
    check_cluster(cluster_id)
    body = decode(await read_body(request, MAX_DELETE_BODY_BYTES), _delete)
    starts = await state(request).records_admin.delete_records(
        topic_name, {e.partition_id: e.offset for e in body.partitions}, forwarded(request),
        principal_of(request))
    return json_response({"topic_name": topic_name, "partitions": [
        {"partition_id": p, "low_watermark": starts[p]} for p in sorted(starts)]})


@router.post("/v3/clusters/{cluster_id}/topics/{topic_name}/segments:roll")
async def roll_segments(cluster_id: str, topic_name: Annotated[str, Path(max_length=249)],
                        request: Request) -> Response:
    """Seal every partition's records so far for a tiering job run now (``lakelog jobs
    tier --roll``): each active segment that holds records is rolled, every sealed
    segment synced; ``end_offset``: every record below it is in a sealed, durable
    segment, which the tiering job takes. In a cluster every broker seals the partitions
    it leads."""
    check_cluster(cluster_id)
    sealed = await state(request).records_admin.seal(topic_name, forwarded(request),
                                                     principal_of(request))
    return json_response({"topic_name": topic_name, "partitions": [
        {"partition_id": s.partition, "rolled": s.rolled, "end_offset": s.end_offset}
        for s in sorted(sealed, key=lambda s: s.partition)]})


@router.get("/v3/clusters/{cluster_id}/jobs/runs")
async def list_job_runs(
    cluster_id: str, request: Request,
    job: Annotated[str | None, Query(max_length=64, description="tier, retention, compact, "
                                     "optimize, vacuum or delete-records")] = None,
    topic: Annotated[str | None, Query(max_length=249)] = None,
    status: Annotated[str | None, Query(max_length=32,
                                        description="succeeded, failed or dry_run")] = None,
    limit: Annotated[int, Query(ge=1, le=job_runs.MAX_ROWS_READ)] = 100,
) -> Response:
    """The newest job runs first: one row per job run and partition (``_job_runs``)."""
    check_cluster(cluster_id)
    st = state(request)
    rows = await asyncio.to_thread(job_runs.read, st.settings.layout.warehouse, job=job,
                                   topic=topic, status=status, limit=limit)
    return json_response({"runs": rows})
