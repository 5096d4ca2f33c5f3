"""The leader's end of the replica protocol (``cluster.replica_protocol``): followers
fetch stored batches and ask where leader epochs end. Only brokers may call it (their
own keys, acting for nobody): a user's key is refused with 403."""

from __future__ import annotations

import time
from collections.abc import Callable, Sized
from typing import Protocol, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response

from cluster.replica_protocol import (
    CONTENT_TYPE,
    EPOCH_END_PATH,
    FETCH_PATH,
    MAX_FETCH_BYTES,
    MAX_PARTITIONS,
    MAX_WAIT_MS,
    EpochAnswer,
    EpochEnd,
    FetchAnswer,
    FetchedPartition,
    FetchPartition,
    decode_epoch_request,
    decode_fetch_request,
    encode,
    epochs_touching,
    fetch_answer_bytes,
)
from cluster.replicas import LeaderPartition
from ingest_api.broker.security import is_broker_principal
from ingest_api.http.state import AppState, state
from log_tables.errors import (
    MALFORMED,
    AuthorizationFailedError,
    FencedLeaderEpochError,
    InvalidRequestError,
    LakelogError,
    NotAClusterError,
    NotLeaderError,
    OffsetOutOfRangeError,
    UnknownLeaderEpochError,
)

router = APIRouter(include_in_schema=False)


def _broker_only(request: Request) -> AppState:
    st = state(request)
    if st.cluster is None or st.cluster.replicas is None:
        raise NotAClusterError("this server is not a broker of a cluster: nothing to "
                               "replicate")
    if request.app.state.security is not None and (
            request.state.forwarded_by is not None
            or not is_broker_principal(request.state.principal)):
        raise AuthorizationFailedError("only brokers (with their own keys) fetch replicas")
    return st


def _leader(st: AppState, topic: str, partition: int, epoch: int) -> LeaderPartition:
    """The partition's leader state here at exactly ``epoch``, or the error that says why
    not (Kafka's fencing of replica fetches by leader epoch)."""
    assert st.cluster is not None and st.cluster.replicas is not None
    lp = st.cluster.replicas.leader(topic, partition)
    if lp is None or not st.cluster.broker.session.has_lease:
        raise NotLeaderError(f"broker {st.cluster.broker_id} does not lead {topic}-{partition}")
    if epoch < lp.leader_epoch:
        raise FencedLeaderEpochError(f"{topic}-{partition}: leader epoch {epoch} is older "
                                     f"than the leader's, {lp.leader_epoch}")
    if epoch > lp.leader_epoch:
        raise UnknownLeaderEpochError(f"{topic}-{partition}: leader epoch {epoch} is newer "
                                      f"than this broker knows, {lp.leader_epoch}")
    return lp


def _failed(part: FetchPartition, exc: LakelogError, lp: LeaderPartition | None
            ) -> FetchedPartition:
    """A partition's error; an offset out of range says where the leader's log is."""
    start = end = -1
    if isinstance(exc, OffsetOutOfRangeError) and lp is not None:
        start, end = lp.plog.log_start_offset, lp.plog.log_end_offset
    return FetchedPartition(part.topic, part.partition, exc.code, exc.message, -1, start, end,
                            [], -1, 0)


def _serve(st: AppState, replica: int, parts: list[FetchPartition], budget: int,
           per_partition: int) -> tuple[list[FetchedPartition], list[bytes], int, bool]:
    """One pass over the partitions: (answers, their bytes, bytes, whether any failed)."""
    assert st.cluster is not None and st.cluster.replicas is not None
    answers: list[FetchedPartition] = []
    data: list[bytes] = []
    total = 0
    failed = False
    for part in parts:
        lp = None
        try:
            lp = _leader(st, part.topic, part.partition, part.leader_epoch)
            plog = lp.plog
            if lp.on_fetch(replica, part.fetch_offset):
                st.cluster.replicas.published(plog)
            got = plog.read_raw(part.fetch_offset, max(1, min(per_partition, budget - total)))\
                if total < budget else None
        except LakelogError as exc:
            answers.append(_failed(part, exc, lp))
            failed = True
            continue
        chunk = got.data if got is not None else b""
        first = got.first_offset if got is not None else part.fetch_offset
        end = got.next_offset if got is not None else part.fetch_offset
        answers.append(FetchedPartition(
            part.topic, part.partition, None, "", plog.high_watermark, plog.log_start_offset,
            plog.log_end_offset,
            epochs_touching(plog.leader_epochs.entries, first, max(end, first + 1)),
            first, len(chunk)))
        data.append(chunk)
        total += len(chunk)
    return answers, data, total, failed


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
    st = _broker_only(request)
    req = await _read(request, decode_fetch_request, "replica fetch")
    budget = max(1, min(req.max_bytes, MAX_FETCH_BYTES))
    per_partition = max(1, min(req.partition_max_bytes, budget))
    deadline = time.monotonic() + max(0, min(req.max_wait_ms, MAX_WAIT_MS)) / 1000
    names = [f"{p.topic}-{p.partition}" for p in req.partitions]
    while True:
        answers, data, total, failed = _serve(st, req.replica_id, req.partitions, budget,
                                              per_partition)
        left = deadline - time.monotonic()
        if total >= req.min_bytes or failed or left <= 0:
            break
        await st.fetch.notifier.wait_any(names, left)
    return Response(fetch_answer_bytes(FetchAnswer(answers), data), media_type=CONTENT_TYPE)


@router.post(EPOCH_END_PATH)
async def epoch_end(request: Request) -> Response:
    st = _broker_only(request)
    req = await _read(request, decode_epoch_request, "epoch query")
    out = []
    for q in req.partitions:
        try:
            lp = _leader(st, q.topic, q.partition, q.current_leader_epoch)
        except LakelogError as exc:
            out.append(EpochEnd(q.topic, q.partition, exc.code, exc.message, -1, -1))
            continue
        found = lp.plog.leader_epochs.end_offset_for(q.leader_epoch, lp.plog.log_end_offset)
        out.append(EpochEnd(q.topic, q.partition, None, "", found.epoch, found.end_offset))
    return Response(encode(EpochAnswer(out)), media_type=CONTENT_TYPE)
