"""Transactions over HTTP: lakelog's own resource (Confluent's REST v3 has none), one per
transactional id, with the calls of Kafka's transactional producer. Each decodes, calls
one method of the transaction coordinator, encodes.

- ``POST .../transactions/{id}:init``: InitProducerId (fences older instances)
- ``POST .../transactions/{id}/partitions``: AddPartitionsToTxn
- ``POST .../transactions/{id}/offsets``: AddOffsetsToTxn + TxnOffsetCommit
- ``POST .../transactions/{id}:commit`` and ``:abort``: EndTxn (answers the new epoch)
- ``GET .../transactions/{id}`` and ``GET .../transactions``: DescribeTransactions,
  ListTransactions

A transactional write is a produce with ``?transactional_id=`` (``routers.records``).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from ingest_api.broker.transactions.coordinator import TransactionCoordinator
from ingest_api.broker.transactions.state import TxnMeta
from ingest_api.http.auth import require
from ingest_api.http.body import decode, read_body
from ingest_api.http.forwarding import forwarded
from ingest_api.http.resources import CLUSTER, collection, resource
from ingest_api.http.routers.cluster import check_cluster, forward
from ingest_api.http.state import json_body, json_response, state
from ingest_api.http.txn_models import TxnEnd, TxnInit, TxnOffsets, TxnPartitions
from log_tables.errors import NotCoordinatorError

router = APIRouter(tags=["transactions"])
BASE = "/v3/clusters/{cluster_id}/transactions"
TransactionalId = Annotated[str, Path(min_length=1, max_length=249)]
MAX_BODY = 4 << 20
_init = msgspec.json.Decoder(TxnInit)
_partitions = msgspec.json.Decoder(TxnPartitions)
_offsets = msgspec.json.Decoder(TxnOffsets)
_end = msgspec.json.Decoder(TxnEnd)


def _coordinator(request: Request) -> TransactionCoordinator:
    txns = state(request).broker.transactions
    assert txns is not None  # made with the broker
    return txns


async def to_coordinator(request: Request, tid: str) -> Response | None:
    """In a cluster, a transactional id's calls are its coordinator's (the leader of its
    ``__transaction_state`` partition): its answer, unless this broker is it (None)."""
    link = state(request).cluster
    if link is None:
        return None
    where = await link.txn_coordinator_of(tid)
    if where is None:
        return None
    if forwarded(request):
        raise NotCoordinatorError(f"broker {link.broker_id} does not coordinate transactional "
                                  f"id {tid!r} (the metadata moved); ask again")
    return await forward(request, where)


def txn_body(meta: TxnMeta) -> dict[str, Any]:
    url = f"{CLUSTER}/transactions/{meta.transactional_id}"
    return {**resource("LakelogTransaction", url, f"transactional-id={meta.transactional_id}"),
            "transactional_id": meta.transactional_id, "producer_id": meta.producer_id,
            "producer_epoch": meta.producer_epoch, "state": meta.state,
            "transaction_timeout_ms": meta.timeout_ms,
            "start_time_ms": meta.started_ms if meta.started_ms >= 0 else None,
            "partitions": [{"topic_name": t, "partition_id": p} for t, p in meta.partitions],
            "groups": list(meta.groups)}


@router.post(BASE + "/{transactional_id}:init", openapi_extra=json_body(TxnInit))
async def init(cluster_id: str, transactional_id: TransactionalId,
               request: Request) -> Response:
    """The transactional id's producer id and a new epoch; older instances are fenced and
    what they left open is aborted."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, transactional_id)) is not None:
        return answer
    raw = await read_body(request, MAX_BODY)
    body = decode(raw, _init) if raw.strip() else TxnInit()
    pid, epoch = await _coordinator(request).init_producer(transactional_id,
                                                           body.transaction_timeout_ms)
    return json_response({"transactional_id": transactional_id, "producer_id": pid,
                          "producer_epoch": epoch})


@router.post(BASE + "/{transactional_id}/partitions", openapi_extra=json_body(TxnPartitions))
async def add_partitions(cluster_id: str, transactional_id: TransactionalId,
                         request: Request) -> Response:
    """Add partitions to the transaction (it begins with the first)."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, transactional_id)) is not None:
        return answer
    body = decode(await read_body(request, MAX_BODY), _partitions)
    for p in body.partitions:
        require(request, "topic", p.topic_name, "produce")
    await _coordinator(request).add_partitions(
        transactional_id, body.producer_id, body.producer_epoch,
        [(p.topic_name, p.partition_id) for p in body.partitions])
    return Response(status_code=204)


@router.post(BASE + "/{transactional_id}/offsets", openapi_extra=json_body(TxnOffsets))
async def add_offsets(cluster_id: str, transactional_id: TransactionalId,
                      request: Request) -> Response:
    """A group's offsets, committed when the transaction commits."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, transactional_id)) is not None:
        return answer
    body = decode(await read_body(request, MAX_BODY), _offsets)
    require(request, "group", body.group_id, "commit")
    await _coordinator(request).add_offsets(
        transactional_id, body.producer_id, body.producer_epoch, body.group_id,
        body.member_id, body.member_epoch,
        [(o.topic_name, o.partition_id, o.offset, o.metadata) for o in body.offsets])
    return Response(status_code=204)


@router.post(BASE + "/{transactional_id}:commit", openapi_extra=json_body(TxnEnd))
async def commit(cluster_id: str, transactional_id: TransactionalId,
                 request: Request) -> Response:
    """Commit: markers in every partition, the offsets to their groups; the new epoch."""
    return await _finish(cluster_id, transactional_id, request, True)


@router.post(BASE + "/{transactional_id}:abort", openapi_extra=json_body(TxnEnd))
async def abort(cluster_id: str, transactional_id: TransactionalId,
                request: Request) -> Response:
    """Abort: committed readers never see the transaction's records; the new epoch."""
    return await _finish(cluster_id, transactional_id, request, False)


async def _finish(cluster_id: str, tid: str, request: Request, commit: bool) -> Response:
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, tid)) is not None:
        return answer
    body = decode(await read_body(request, MAX_BODY), _end)
    pid, epoch = await _coordinator(request).end(tid, body.producer_id, body.producer_epoch,
                                                 commit)
    return json_response({"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch})


@router.get(BASE + "/{transactional_id}")
async def describe(cluster_id: str, transactional_id: TransactionalId,
                   request: Request) -> Response:
    """The transactional id's producer, state, and the transaction's partitions."""
    check_cluster(cluster_id)
    if (answer := await to_coordinator(request, transactional_id)) is not None:
        return answer
    return json_response(txn_body(_coordinator(request).describe(transactional_id)))


@router.get(BASE)
async def list_transactions(cluster_id: str, request: Request) -> Response:
    """Every transactional id this broker coordinates (as Kafka's ListTransactions, a
    broker of a cluster answers for its own)."""
    check_cluster(cluster_id)
    metas = _coordinator(request).list()
    return json_response(collection("LakelogTransactionList", f"{CLUSTER}/transactions",
                                    [txn_body(m) for m in metas]))
