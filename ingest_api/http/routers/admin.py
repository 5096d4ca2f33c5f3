"""Operator endpoints: Kafka's DeleteRecords, sealing segments for a tiering run, and
what the jobs did (``_job_runs``)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import msgspec
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from cluster.model import BrokerInfo
from ingest_api.http.body import decode, read_body
from ingest_api.http.errors import error_of
from ingest_api.http.forwarding import forwarded
from ingest_api.http.models import DeleteRecordsRequest
from ingest_api.http.routers.cluster import check_cluster, send
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
    admin = state(request).records_admin
    body = decode(await read_body(request, MAX_DELETE_BODY_BYTES), _delete)
    plan = admin.plan_delete(topic_name, {e.partition_id: e.offset for e in body.partitions},
                             forwarded(request))
    # each leader deletes in its partitions
    rows = await _from_leaders(request, [
        (broker, {"partitions": [{"partition_id": p, "offset": o} for p, o in parts.items()]})
        for broker, parts in plan.elsewhere])
    starts = await admin.delete_local(topic_name, plan.local)
    rows += [{"partition_id": p, "low_watermark": starts[p]} for p in starts]
    return json_response({"topic_name": topic_name,
                          "partitions": sorted(rows, key=lambda r: r["partition_id"])})


async def _from_leaders(request: Request,
                        parts: list[tuple[BrokerInfo, dict[str, object] | None]]
                        ) -> list[dict[str, int]]:
    """The same request to other brokers (with a body of their part, or none): the
    ``partitions`` rows of their answers; the first error fails the request."""
    answers = await asyncio.gather(*(send(request, broker, "POST", request.url.path, body)
                                     for broker, body in parts))
    rows: list[dict[str, int]] = []
    for answer in answers:
        if answer.status_code != 200:
            raise error_of(answer)
        rows += answer.json()["partitions"]
    return rows


@router.post("/v3/clusters/{cluster_id}/topics/{topic_name}/segments:roll")
async def roll_segments(cluster_id: str, topic_name: Annotated[str, Path(max_length=249)],
                        request: Request) -> Response:
    """Seal every partition's records so far for a tiering job run now (``lakelog jobs
    tier --roll``): each active segment that holds records is rolled, every sealed
    segment synced; ``end_offset``: every record below it is in a sealed, durable
    segment, which the tiering job takes. In a cluster every broker seals the partitions
    it leads."""
    check_cluster(cluster_id)
    sealed, others = await state(request).records_admin.seal(topic_name, forwarded(request))
    rows = [{"partition_id": s.partition, "rolled": s.rolled, "end_offset": s.end_offset}
            for s in sealed]
    rows += await _from_leaders(request, [(b, None) for b in others])
    return json_response({"topic_name": topic_name,
                          "partitions": sorted(rows, key=lambda r: r["partition_id"])})


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
