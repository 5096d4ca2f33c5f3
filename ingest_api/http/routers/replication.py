"""The leader's end of the replica protocol (``cluster.replica_protocol``): followers
fetch stored batches and ask where leader epochs end. Only brokers may call it (their
own keys, acting for nobody): a user's key is refused with 403."""

from __future__ import annotations

from collections.abc import Callable, Sized
from typing import Protocol, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response

from cluster.replica_protocol import (
    CONTENT_TYPE,
    EPOCH_END_PATH,
    FETCH_PATH,
    MAX_PARTITIONS,
    decode_epoch_request,
    decode_fetch_request,
    encode,
    fetch_answer_bytes,
)
from ingest_api.broker.replica_server import ReplicaServer
from ingest_api.broker.security import is_broker_principal
from ingest_api.http.state import state
from log_tables.errors import (
    MALFORMED,
    AuthorizationFailedError,
    InvalidRequestError,
)

router = APIRouter(include_in_schema=False)


def _broker_only(request: Request) -> ReplicaServer:
    server = state(request).replica_server
    server.require_cluster()
    if request.app.state.security is not None and (
            request.state.forwarded_by is not None
            or not is_broker_principal(request.state.principal)):
        raise AuthorizationFailedError("only brokers (with their own keys) fetch replicas")
    return server


class _Request(Protocol):
    @property
    def partitions(self) -> Sized: ...


_R = TypeVar("_R", bound=_Request)


async def _read(request: Request, decode: Callable[[bytes], _R], what: str) -> _R:
    """The body, decoded; 400 when it is malformed or names too many partitions."""
    try:
        req = decode(await request.body())
    except Exception as exc:
        raise InvalidRequestError.saying(f"malformed {what}: {exc}", detail=MALFORMED) from None
    if len(req.partitions) > MAX_PARTITIONS:
        raise InvalidRequestError.saying(f"a {what} names at most {MAX_PARTITIONS} partitions",
                                         detail=MALFORMED)
    return req


@router.post(FETCH_PATH)
async def replica_fetch(request: Request) -> Response:
    server = _broker_only(request)
    answer, data = await server.fetch(await _read(request, decode_fetch_request,
                                                  "replica fetch"))
    return Response(fetch_answer_bytes(answer, data), media_type=CONTENT_TYPE)


@router.post(EPOCH_END_PATH)
async def epoch_end(request: Request) -> Response:
    server = _broker_only(request)
    answer = server.epoch_end(await _read(request, decode_epoch_request, "epoch query"))
    return Response(encode(answer), media_type=CONTENT_TYPE)
