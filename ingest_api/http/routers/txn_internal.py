"""The transaction calls brokers make of each other (``Peers.txn``): a marker for a
partition this broker leads, a transactional write checked by the coordinator this
broker is, a group's offsets checked or committed by the group's coordinator here. Only
brokers may call them (their own keys, acting for nobody); each answers 204, or the
error as this broker would answer it (NOT_LEADER, NOT_COORDINATOR: the caller asks
again)."""

from __future__ import annotations

from typing import Any

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response

from ingest_api.broker.security import is_broker_principal
from ingest_api.broker.transactions.groups import offsets_of
from ingest_api.http.peers import TXN_PATH
from ingest_api.http.state import AppState, state
from log_tables.errors import (
    MALFORMED,
    AuthorizationFailedError,
    InvalidRequestError,
    NotCoordinatorError,
)

router = APIRouter(include_in_schema=False)
_body = msgspec.json.Decoder(dict[str, Any])


async def _broker_call(request: Request) -> tuple[AppState, dict[str, Any]]:
    st = state(request)
    if st.cluster is None:
        raise InvalidRequestError("this broker is not in a cluster")
    if request.app.state.security is not None and (
            request.state.forwarded_by is not None
            or not is_broker_principal(request.state.principal)):
        raise AuthorizationFailedError("only brokers (with their own keys) make these calls")
    try:
        return st, _body.decode(await request.body())
    except msgspec.DecodeError as exc:
        raise InvalidRequestError.saying(f"malformed call: {exc}", detail=MALFORMED) from None


@router.post(TXN_PATH + "/marker")
async def marker(request: Request) -> Response:
    st, b = await _broker_call(request)
    assert st.cluster is not None
    topic, partition = str(b["topic_name"]), int(b["partition_id"])
    epoch = st.cluster.route(topic, partition, True)  # NOT_LEADER unless it leads here
    assert isinstance(epoch, int)
    await st.broker.txn_markers.write_here(
        topic, partition, int(b["producer_id"]), int(b["producer_epoch"]), bool(b["commit"]),
        int(b["coordinator_epoch"]), epoch)
    return Response(status_code=204)


@router.post(TXN_PATH + "/verify")
async def verify(request: Request) -> Response:
    st, b = await _broker_call(request)
    assert st.broker.transactions is not None
    st.broker.transactions.verify(str(b["transactional_id"]), int(b["producer_id"]),
                                  int(b["producer_epoch"]), str(b["topic_name"]),
                                  int(b["partition_id"]))
    return Response(status_code=204)


@router.post(TXN_PATH + "/offsets-check")
async def offsets_check(request: Request) -> Response:
    st, b = await _broker_call(request)
    group = _coordinated_here(st, str(b["group_id"]))
    member = b.get("member_id")
    offsets = offsets_of(b["offsets"])
    st.groups.check_commit(group, None if member is None else str(member),
                           int(b["member_epoch"]), offsets)
    if "transactional_id" in b:  # (a peer of before holds nothing)
        st.broker.held_offsets.hold(group, str(b["transactional_id"]),
                                    {(t, p) for t, p, _, _ in offsets}, int(b["timeout_ms"]))
    return Response(status_code=204)


@router.post(TXN_PATH + "/offsets-commit")
async def offsets_commit(request: Request) -> Response:
    st, b = await _broker_call(request)
    group = _coordinated_here(st, str(b["group_id"]))
    await st.groups.commit_ended(group, offsets_of(b["offsets"]))
    if "transactional_id" in b:
        st.broker.held_offsets.release(group, str(b["transactional_id"]))
    return Response(status_code=204)


@router.post(TXN_PATH + "/offsets-release")
async def offsets_release(request: Request) -> Response:
    """An aborted transaction's offsets: no longer held."""
    st, b = await _broker_call(request)
    st.broker.held_offsets.release(str(b["group_id"]), str(b["transactional_id"]))
    return Response(status_code=204)


def _coordinated_here(st: AppState, group: str) -> str:
    assert st.cluster is not None
    if st.cluster.coordinator(group) is not None:
        raise NotCoordinatorError(f"this broker does not coordinate group {group!r} (any "
                                  "more); ask for its coordinator again")
    return group
