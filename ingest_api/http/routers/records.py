"""Produce, fetch, list offsets, and producer ids."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from operator import attrgetter
from typing import Annotated, Any, Literal

import msgspec
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from cluster.model import BrokerInfo
from ingest_api.broker.produce.runs import ProduceResult
from ingest_api.broker.produce.service import Acks
from ingest_api.broker.transactions.gate import check_remote
from ingest_api.http.arrow_headers import ARROW_RESPONSE, arrow_response, wants_arrow
from ingest_api.http.auth import require
from ingest_api.http.body import (
    ObjectStream,
    chunks,
    content_length,
    decode,
    read_body,
    require_json,
)
from ingest_api.http.errors import ApiError, error_body
from ingest_api.http.forwarding import ProduceRoute, forwarded, principal_of
from ingest_api.http.models import (
    AnyEntry,
    BatchEntry,
    BatchRequest,
    EntryId,
    PlainBatch,
    ProducerBatch,
    ProduceRecord,
    ProducerInit,
    RawBatch,
)
from ingest_api.http.ndjson import ndjson
from ingest_api.http.produce_columns import produce_request, typed_request
from ingest_api.http.reports import Envelopes, batch_body, report
from ingest_api.http.routers.cluster import check_cluster, forward
from ingest_api.http.schema_envelopes import (
    has_schema_envelopes,
    schema_checks,
    without_failed,
)
from ingest_api.http.state import AppState, json_body, json_response, state
from log_tables.errors import (
    EmptyBatchError,
    InvalidBatchError,
    InvalidRequestError,
    TooManyEntriesError,
)
from log_tables.hot.isolation import Isolation
from log_tables.registry import TopicMetadata

router = APIRouter(tags=["records"])
BASE = "/v3/clusters/{cluster_id}/topics/{topic_name}"
TopicName = Annotated[str, Path(min_length=1, max_length=249)]
PartitionId = Annotated[int, Path(ge=0, le=2**31 - 1)]
TransactionalIdQuery = Annotated[str | None, Query(
    min_length=1, max_length=249, description="Writes of this transactional id's open "
                                             "transaction (lakelog's extension)")]
IsolationQuery = Annotated[Literal["read_uncommitted", "read_committed"], Query(
    description="Kafka's isolation.level: read_committed stops at the last stable offset")]
AcksQuery = Annotated[Acks, Query(description="all: after fsync (default); 1: after the "
                                              "append; 0: once accepted")]
_record = msgspec.json.Decoder(ProduceRecord)
_batch = msgspec.json.Decoder(BatchRequest)
_shapes = (msgspec.json.Decoder(PlainBatch), msgspec.json.Decoder(ProducerBatch))
_producer = msgspec.json.Decoder(ProducerInit)
_entry_id = attrgetter("id")


_raw_batch = msgspec.json.Decoder(RawBatch)
_entry = msgspec.json.Decoder(BatchEntry)
_entry_id_only = msgspec.json.Decoder(EntryId)


def _route(st: AppState, request: Request) -> ProduceRoute | None:
    """In a cluster: where this request's partitions go (ingest_api.broker.cluster_link)."""
    if st.cluster is None:
        return None
    return ProduceRoute(st.cluster, forwarded(request), principal_of(request))


async def _to_leader(st: AppState, request: Request, topic: str, partition: int
                     ) -> Response | None:
    """In a cluster, the leader's answer when another broker leads the partition."""
    leader = st.cluster_info.read_leader(topic, partition, forwarded(request))
    return None if leader is None else await forward(request, leader)


def _count_in(st: AppState, topic: str, result: ProduceResult) -> None:
    ok = len(result) - len(result.errors)
    if ok:
        st.metrics.records_in.labels(topic).inc(ok)
        st.metrics.bytes_in.labels(topic).inc(result.accepted_bytes())


@router.post(BASE + "/records", openapi_extra=json_body(ProduceRecord))
async def produce(cluster_id: str, topic_name: TopicName, request: Request,
                  acks: AcksQuery = "all") -> Response:
    """Produce one record, or a stream of concatenated records (one report per record,
    in order, streamed back as each is acknowledged)."""
    check_cluster(cluster_id)
    st = state(request)
    meta = st.require_topic(topic_name)
    require_json(request)
    limit = st.settings.max_request_bytes
    length = content_length(request, limit)
    if length is not None:  # the whole body is here: one record, or several at once
        with st.in_flight.reserve(length):
            body = await read_body(request, limit)
            try:
                record = _record.decode(body)
            except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc:
                if "trailing characters" not in str(exc):
                    decode(body, _record)  # raises the 400/422 naming what is wrong
                    raise
                stream = ObjectStream(limit)
                objects = stream.feed(body, final=True)
                if stream.error:  # the whole body is here: refuse it whole
                    raise stream.error from None
                return ndjson(_produce_all(st, meta, objects, acks, _route(st, request)))
            if failed := await schema_checks(st, meta, [record],
                                             has_schema_envelopes([record])):
                raise failed[0]
            result = await st.produce.produce(meta, produce_request([record]), acks,
                                              _route(st, request))
            _count_in(st, topic_name, result)
            if 0 in result.errors:
                raise result.errors[0]
            return json_response(report(topic_name, record, result, 0))
    return ndjson(_produce_stream(st, meta, request, acks, _route(st, request)))


async def _produce_all(st: AppState, meta: TopicMetadata, objects: list[bytes], acks: Acks,
                       route: ProduceRoute | None) -> AsyncIterator[bytes]:
    async for line in _produce_objects(st, meta, objects, acks, route):
        yield line


async def _produce_stream(st: AppState, meta: TopicMetadata, request: Request, acks: Acks,
                          route: ProduceRoute | None) -> AsyncIterator[bytes]:
    """Produce each chunk's records as they arrive; report them once acknowledged."""
    stream = ObjectStream(st.settings.max_request_bytes)
    try:
        async for chunk in chunks(request, st.settings.max_request_bytes):
            with st.in_flight.reserve(len(chunk)):
                objects = stream.feed(chunk)
                async for line in _produce_objects(st, meta, objects, acks, route):
                    yield line
            if stream.error:  # the records before it are answered for; the stream ends
                raise stream.error
        async for line in _produce_objects(st, meta, stream.feed(b"", final=True), acks,
                                           route):
            yield line
        if stream.error:
            raise stream.error
    except ApiError as exc:  # the stream cannot go on (malformed JSON, too large)
        _, body = error_body(exc)
        yield msgspec.json.encode(body) + b"\n"
    except ClientDisconnect:  # gone (or timed out) mid-stream: reported records stay
        return


async def _produce_objects(st: AppState, meta: TopicMetadata, objects: list[bytes], acks: Acks,
                           route: ProduceRoute | None) -> AsyncIterator[bytes]:
    records: list[ProduceRecord] = []
    slots: list[dict[str, Any] | None] = []
    for raw in objects:
        try:
            records.append(decode(raw, _record))
            slots.append(None)
        except ApiError as exc:
            slots.append(error_body(exc)[1])
    if records:
        records = without_failed(records, slots, await schema_checks(
            st, meta, records, has_schema_envelopes(records)))
    result = (await st.produce.produce(meta, produce_request(records), acks, route)
              if records else None)
    if result is not None:
        _count_in(st, meta.name, result)
    j = 0
    for slot in slots:
        if slot is None:
            assert result is not None
            slot = report(meta.name, records[j], result, j)
            j += 1
        yield msgspec.json.encode(slot) + b"\n"


@router.post(BASE + "/records:batch", status_code=207, openapi_extra=json_body(BatchRequest))
async def produce_batch(cluster_id: str, topic_name: TopicName, request: Request,
                        acks: AcksQuery = "all",
                        transactional_id: TransactionalIdQuery = None) -> Response:
    """Produce 1 to ``max_batch_entries`` records: 207 with ``successes`` and ``failures`` by
    id. An entry that is not a valid record (bad base64, a wrong field) fails alone. With
    ``transactional_id``: writes of that id's open transaction (every entry with its
    producer's fields; the partitions added to the transaction first)."""
    check_cluster(cluster_id)
    st = state(request)
    if transactional_id is not None:
        require(request, "transactional_id", transactional_id, "write")
    meta = st.require_topic(topic_name)
    limit = st.settings.max_request_bytes
    with st.in_flight.reserve(content_length(request, limit) or 0):
        raw = await read_body(request, limit)
        entries, rejected = _decode_batch(raw, st.settings.max_batch_entries)
        leader = _one_other_leader(st, request, meta, entries, rejected)
        if leader is not None:  # the whole request is another broker's: passed on as it is
            assert st.cluster is not None
            return await st.cluster.proxy(request, leader, raw)
        count = len(entries) + len(rejected)
        ids = list(map(_entry_id, entries))
        every_id = ids + [entry_id for entry_id, _ in rejected]
        if len(set(every_id)) != count:
            dup = next(i for i in every_id if every_id.count(i) > 1)
            raise _batch_error(f"entry id {dup!r} is used more than once: ids must be distinct")
        failed = await schema_checks(st, meta, entries, has_schema_envelopes(entries))
        produce, key_types, value_types = typed_request(entries)
        produce.invalid.update(failed)
        if transactional_id is not None:
            produce.transactional_id = transactional_id
            if st.cluster is not None:
                await check_remote(st.cluster, st.manager, transactional_id, topic_name,
                                   produce)
        sizes = Envelopes(key_types, produce.key_sizes(), value_types)
        acked = st.produce.start(meta, produce, acks, _route(st, request))
        del entries, produce  # the request is not needed while waiting for the append
        result = await acked
    _count_in(st, topic_name, result)
    return Response(batch_body(topic_name, ids, result, sizes, rejected), status_code=207,
                    media_type="application/json")


def _one_other_leader(st: AppState, request: Request, meta: TopicMetadata,
                      entries: Sequence[AnyEntry], rejected: list[tuple[str, ApiError]]
                      ) -> BrokerInfo | None:
    """In a cluster, the leader's broker when every entry names a partition and one other
    broker leads them all (then the body goes there untouched: no planning here, no
    re-encoding); None otherwise."""
    if st.cluster is None or rejected or forwarded(request) or not entries:
        return None
    partitions = {e.partition_id for e in entries}
    if None in partitions or max(p or 0 for p in partitions) >= meta.partitions:
        return None  # keys to hash, or a partition to refuse: planned here
    leaders = set()
    for p in partitions:
        assert p is not None
        where = st.cluster.route(meta.name, p, False)
        if isinstance(where, int):
            return None
        leaders.add(where)
    return leaders.pop() if len(leaders) == 1 else None


def _decode_batch(body: bytes, max_entries: int
                  ) -> tuple[Sequence[AnyEntry], list[tuple[str, ApiError]]]:
    """The valid entries, and (id, error) of those that are not records; 1 to
    ``max_entries`` in all.

    The whole body is decoded at once; only when that finds a wrong shape is it decoded
    again entry by entry, so that each invalid entry fails alone (as in Confluent). Bad
    JSON, a wrong envelope, or an invalid entry without a usable id fail the request.
    """
    if not body.strip():
        raise _batch_error("the request body is empty: send {\"entries\": [...]}")
    for shape in _shapes:  # the usual entries first: fewer fields to decode and look at
        try:
            usual: Sequence[AnyEntry] = shape.decode(body).entries
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            continue  # decoded below, and refused as before when it is invalid
        _check_count(len(usual), max_entries)
        return usual, []
    try:
        entries = decode(body, _batch).entries
        _check_count(len(entries), max_entries)
        return entries, []
    except ApiError as exc:
        if exc.code not in ("invalid_request", "invalid_base64"):
            raise
        raws = decode(body, _raw_batch).entries
    _check_count(len(raws), max_entries)
    entries = []
    rejected: list[tuple[str, ApiError]] = []
    for i, raw in enumerate(raws):
        try:
            entries.append(decode(raw, _entry))
        except ApiError as err:
            err.message = err.message.replace("`$", f"`$.entries[{i}]", 1)
            try:
                entry_id = _entry_id_only.decode(raw).id
            except (msgspec.DecodeError, UnicodeDecodeError):
                raise _batch_error(f"{err.message} (the entry has no valid id to report it by: "
                                   "the batch is refused)") from None
            rejected.append((entry_id, err))
    return entries, rejected


def _batch_error(message: str) -> InvalidBatchError:
    """A batch refused whole: Confluent's 422/42208 (an empty batch, a null body, ids used
    twice or missing)."""
    return InvalidBatchError(message)


def _check_count(count: int, max_entries: int) -> None:
    if not count:
        raise EmptyBatchError("entries is empty: a batch needs at least one entry")
    if count > max_entries:
        raise TooManyEntriesError(f"{count} entries is over the limit of {max_entries} per "
                                  "request")


@router.get(BASE + "/partitions/{partition_id}/records", responses=ARROW_RESPONSE)
async def fetch(
    cluster_id: str, topic_name: TopicName, partition_id: PartitionId, request: Request,
    offset: Annotated[int, Query(ge=0, le=2**63 - 1)],
    max_records: Annotated[int | None, Query(ge=1)] = None,
    max_bytes: Annotated[int | None, Query(ge=1)] = None,
    timeout_ms: Annotated[int, Query(ge=0)] = 0,
    format: Annotated[Literal["BINARY", "STRING", "JSON"], Query()] = "BINARY",
    isolation_level: IsolationQuery = "read_uncommitted",
) -> Response:
    """Records from ``offset``; with nothing there yet, waits up to ``timeout_ms`` for some.
    With ``Accept: application/vnd.apache.arrow.stream``: an Arrow stream (``format`` does
    not apply), the paging in ``Lakelog-*`` headers. ``read_committed`` stops at the last
    stable offset and steps over aborted transactions; no read returns a marker, and
    ``next_offset`` passes what a read stepped over."""
    check_cluster(cluster_id)
    st = state(request)
    if (answer := await _to_leader(st, request, topic_name, partition_id)) is not None:
        return answer
    s = st.settings
    max_records = min(max_records or 500, s.max_fetch_records)
    max_bytes = min(max_bytes or s.default_fetch_bytes, s.max_fetch_bytes)
    timeout_ms = min(timeout_ms, s.max_fetch_wait_ms)
    if wants_arrow(request.headers.get("accept")):
        arrow = await st.fetch.fetch_arrow(topic_name, partition_id, offset, max_records,
                                           max_bytes, timeout_ms, Isolation(isolation_level))
        return arrow_response(arrow)
    body = await st.fetch.fetch(topic_name, partition_id, offset, max_records, max_bytes,
                                timeout_ms, format, Isolation(isolation_level))
    return Response(body, media_type="application/json")


@router.get(BASE + "/partitions/{partition_id}/offsets")
async def list_offsets(
    cluster_id: str, topic_name: TopicName, partition_id: PartitionId, request: Request,
    spec: Annotated[Literal["earliest", "latest", "timestamp"], Query()] = "latest",
    timestamp: Annotated[int | None, Query(ge=0, le=2**63 - 1,
                                           description="epoch ms, with spec=timestamp")] = None,
) -> Response:
    """Kafka's ListOffsets: earliest, latest, or the first offset with timestamp >= T (null if none)."""
    check_cluster(cluster_id)
    st = state(request)
    if (answer := await _to_leader(st, request, topic_name, partition_id)) is not None:
        return answer
    info = st.cluster_info
    info.require_partition(topic_name, partition_id)
    if spec == "timestamp" and timestamp is None:
        raise InvalidRequestError("spec=timestamp needs a timestamp query parameter "
                                  "(epoch ms)")
    listed = await info.list_offset(topic_name, partition_id, spec, timestamp)
    return json_response({"topic_name": topic_name, "partition_id": partition_id, "spec": spec,
                          "timestamp": timestamp, "offset": listed.offset,
                          "log_start_offset": listed.log_start_offset,
                          "high_watermark": listed.high_watermark})


@router.post("/v3/clusters/{cluster_id}/producers", openapi_extra=json_body(ProducerInit))
async def init_producer(cluster_id: str, request: Request) -> Response:
    """A producer id and epoch for idempotent produce; send an existing id to bump its epoch."""
    check_cluster(cluster_id)
    st = state(request)
    raw = await read_body(request, 4096)
    body = decode(raw, _producer) if raw.strip() else ProducerInit()
    pid, epoch = st.manager.producer_ids.init_producer(body.producer_id)
    return json_response({"producer_id": pid, "producer_epoch": epoch})
