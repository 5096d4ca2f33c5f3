"""Produce, fetch, list offsets, and producer ids."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from itertools import repeat
from operator import attrgetter
from typing import Annotated, Any, Literal, NamedTuple

import msgspec
import numpy as np
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response
from msgspec import StructMeta
from starlette.requests import ClientDisconnect

from ingest_api.body import (
    ObjectStream,
    chunks,
    content_length,
    decode,
    read_body,
    require_json,
)
from ingest_api.errors import ApiError, error_body
from ingest_api.fetch import record_time
from ingest_api.models import (
    BatchEntry,
    BatchRequest,
    BinaryData,
    JsonData,
    ProduceRecord,
    ProducerInit,
    StringData,
)
from ingest_api.produce import Acks, ProduceResult, envelope_bytes
from ingest_api.routers.cluster import check_cluster
from ingest_api.state import CLUSTER_ID, AppState, json_body, json_response, state
from log_tables.registry import TopicMetadata

router = APIRouter(tags=["records"])
BASE = "/v3/clusters/{cluster_id}/topics/{topic_name}"
TopicName = Annotated[str, Path(min_length=1, max_length=249)]
PartitionId = Annotated[int, Path(ge=0, le=2**31 - 1)]
AcksQuery = Annotated[Acks, Query(description="all: after fsync (default); 1: after the "
                                              "append; 0: once accepted")]
_record = msgspec.json.Decoder(ProduceRecord)
_batch = msgspec.json.Decoder(BatchRequest)
_producer = msgspec.json.Decoder(ProducerInit)
_encoder = msgspec.json.Encoder()
_entry_id = attrgetter("id")


class Success(msgspec.Struct, gc=False):
    """A batch entry's delivery report: Confluent's ``ProduceResponse`` with the entry's id."""

    id: str
    error_code: int
    cluster_id: str
    topic_name: str
    partition_id: int
    offset: int
    timestamp: msgspec.Raw
    """The record's time as an RFC 3339 JSON string."""
    key: msgspec.Raw | None
    value: msgspec.Raw | None
    """``{"type", "size"}``: the envelope's type and the bytes stored (null for a null)."""


class _EntryId(msgspec.Struct):
    """Only the id of an entry that is otherwise invalid (to report it by)."""

    id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class _RawBatch(msgspec.Struct, forbid_unknown_fields=True):
    entries: list[msgspec.Raw]


_raw_batch = msgspec.json.Decoder(_RawBatch)
_entry = msgspec.json.Decoder(BatchEntry)
_entry_id_only = msgspec.json.Decoder(_EntryId)


def _tag(env: Any) -> str | None:
    """The envelope's type, or None when it stores a null."""
    return None if env is None or env.data is None else env.__struct_config__.tag


def _size(env: Any) -> dict[str, Any] | None:
    stored = envelope_bytes(env)
    return None if stored is None else {"type": _tag(env), "size": len(stored)}


def _report(topic: str, rec: ProduceRecord, result: ProduceResult, i: int) -> dict[str, Any]:
    error = result.errors.get(i)
    if error is not None:
        return error_body(error)[1]
    return {"error_code": 200, "cluster_id": CLUSTER_ID, "topic_name": topic,
            "partition_id": int(result.partitions[i]), "offset": int(result.offsets[i]),
            "timestamp": record_time(int(result.timestamps[i])),
            "key": _size(rec.key), "value": _size(rec.value)}


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
    meta = st.manager.require_topic(topic_name)
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
                return _ndjson(_produce_all(st, meta, objects, acks))
            result = await st.produce.produce(meta, [record], acks)
            _count_in(st, topic_name, result)
            if 0 in result.errors:
                raise result.errors[0]
            return json_response(_report(topic_name, record, result, 0))
    return _ndjson(_produce_stream(st, meta, request, acks))


class _NdjsonStream(Response):
    """Streams report lines while the request body is still being read.

    Starlette's StreamingResponse listens for a disconnect by calling receive()
    concurrently, which would steal the body chunks this response reads, so the
    lines are sent with plain ASGI messages instead.
    """

    media_type = "application/x-ndjson"

    def __init__(self, lines: AsyncIterator[bytes]) -> None:
        super().__init__(status_code=200, media_type=self.media_type)
        self.lines = lines

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # No content-length: uvicorn sends the lines with chunked transfer encoding.
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": [(b"content-type", self.media_type.encode())]})
        async for line in self.lines:
            await send({"type": "http.response.body", "body": line, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _ndjson(reports: AsyncIterator[bytes]) -> Response:
    return _NdjsonStream(reports)


async def _produce_all(st: AppState, meta: TopicMetadata, objects: list[bytes], acks: Acks
                       ) -> AsyncIterator[bytes]:
    async for line in _produce_objects(st, meta, objects, acks):
        yield line


async def _produce_stream(st: AppState, meta: TopicMetadata, request: Request, acks: Acks
                          ) -> AsyncIterator[bytes]:
    """Produce each chunk's records as they arrive; report them once acknowledged."""
    stream = ObjectStream(st.settings.max_request_bytes)
    try:
        async for chunk in chunks(request, st.settings.max_request_bytes):
            with st.in_flight.reserve(len(chunk)):
                objects = stream.feed(chunk)
                async for line in _produce_objects(st, meta, objects, acks):
                    yield line
            if stream.error:  # the records before it are answered for; the stream ends
                raise stream.error
        async for line in _produce_objects(st, meta, stream.feed(b"", final=True), acks):
            yield line
        if stream.error:
            raise stream.error
    except ApiError as exc:  # the stream cannot go on (malformed JSON, too large)
        _, body = error_body(exc)
        yield msgspec.json.encode(body) + b"\n"
    except ClientDisconnect:  # gone (or timed out) mid-stream: reported records stay
        return


async def _produce_objects(st: AppState, meta: TopicMetadata, objects: list[bytes], acks: Acks
                           ) -> AsyncIterator[bytes]:
    records: list[ProduceRecord] = []
    slots: list[dict[str, Any] | None] = []
    for raw in objects:
        try:
            records.append(decode(raw, _record))
            slots.append(None)
        except ApiError as exc:
            slots.append(error_body(exc)[1])
    result = await st.produce.produce(meta, records, acks) if records else None
    if result is not None:
        _count_in(st, meta.name, result)
    j = 0
    for slot in slots:
        if slot is None:
            assert result is not None
            slot = _report(meta.name, records[j], result, j)
            j += 1
        yield msgspec.json.encode(slot) + b"\n"


@router.post(BASE + "/records:batch", status_code=207, openapi_extra=json_body(BatchRequest))
async def produce_batch(cluster_id: str, topic_name: TopicName, request: Request,
                        acks: AcksQuery = "all") -> Response:
    """Produce 1 to ``max_batch_entries`` records: 207 with ``successes`` and ``failures`` by
    id. An entry that is not a valid record (bad base64, a wrong field) fails alone."""
    check_cluster(cluster_id)
    st = state(request)
    meta = st.manager.require_topic(topic_name)
    limit = st.settings.max_request_bytes
    with st.in_flight.reserve(content_length(request, limit) or 0):
        entries, rejected = _decode_batch(await read_body(request, limit),
                                          st.settings.max_batch_entries)
        count = len(entries) + len(rejected)
        ids = list(map(_entry_id, entries))
        every_id = ids + [entry_id for entry_id, _ in rejected]
        if len(set(every_id)) != count:
            dup = next(i for i in every_id if every_id.count(i) > 1)
            raise ApiError(422, f"entry id {dup!r} is used more than once", name="invalid_request")
        envelopes = _envelopes(entries)
        acked = st.produce.start(meta, entries, acks)
        del entries  # the decoded request is not needed while waiting for the append
        result = await acked
    _count_in(st, topic_name, result)
    return Response(_batch_body(topic_name, ids, result, envelopes, rejected), status_code=207,
                    media_type="application/json")


def _decode_batch(body: bytes, max_entries: int
                  ) -> tuple[list[BatchEntry], list[tuple[str, ApiError]]]:
    """The valid entries, and (id, error) of those that are not records; 1 to
    ``max_entries`` in all.

    The whole body is decoded at once; only when that finds a wrong shape is it decoded
    again entry by entry, so that each invalid entry fails alone (as in Confluent). Bad
    JSON, a wrong envelope, or an invalid entry without a usable id fail the request.
    """
    try:
        entries = decode(body, _batch).entries
        _check_count(len(entries), max_entries)
        return entries, []
    except ApiError as exc:
        if exc.status != 422 or exc.error_code == 42208:
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
                err.message += " (the entry has no valid id to report it by: the batch is refused)"
                raise err from None
            rejected.append((entry_id, err))
    return entries, rejected


def _check_count(count: int, max_entries: int) -> None:
    if not count:
        raise ApiError(422, "entries is empty: a batch needs at least one entry",
                       error_code=42208, name="empty_batch")
    if count > max_entries:
        raise ApiError(413, f"{count} entries is over the limit of {max_entries} per request",
                       name="too_many_entries")


class Envelopes(NamedTuple):
    """Per entry, what its delivery report says of its key and value beyond their sizes."""

    key_types: str | list[str | None]  # one type for all, or each one's (None: a null)
    key_sizes: list[int]
    value_types: str | list[str | None]


_TAGS = {BinaryData: "BINARY", StringData: "STRING", JsonData: "JSON"}
_key_of = attrgetter("key")
_value_of = attrgetter("value")
_data_of = attrgetter("data")


def _one_class(envelopes: list[Any]) -> StructMeta | None:
    """The envelopes' class when they all have one and none stores a null (the usual
    batch): found without a Python step per record."""
    classes = set(map(type, envelopes))
    if len(classes) == 1 and (cls := classes.pop()) in _TAGS and (
            None not in map(_data_of, envelopes)):
        return cls
    return None


def _types(envelopes: list[Any], cls: StructMeta | None) -> str | list[str | None]:
    """The one type of all the envelopes, or each one's (None for a null)."""
    if cls is not None:
        return _TAGS[cls]
    return [None if e is None or e.data is None else _TAGS[e.__class__] for e in envelopes]


_STORED_SIZE: dict[StructMeta, Any] = {
    BinaryData: lambda data: map(len, data),
    StringData: lambda data: map(len, map(str.encode, data)),
    JsonData: lambda data: map(len, map(_encoder.encode, data)),
}


def _envelopes(entries: list[BatchEntry]) -> Envelopes:
    # The value's size is the record's stored bytes less the key's (the produce result
    # has them), so only keys, which are short, are measured here.
    keys = list(map(_key_of, entries))
    values = list(map(_value_of, entries))
    key_class, value_class = _one_class(keys), _one_class(values)
    if key_class is not None:
        sizes = list(_STORED_SIZE[key_class](list(map(_data_of, keys))))
    else:
        sizes = [0 if b is None else len(b) for b in map(envelope_bytes, keys)]
    return Envelopes(_types(keys, key_class), sizes, _types(values, value_class))


def _size_raws(types: str | list[str | None], sizes: list[int]) -> list[msgspec.Raw | None]:
    """Each record's ``{"type", "size"}`` as raw JSON (None for a null); each distinct one
    is encoded once."""
    if isinstance(types, str):
        by_size = {n: msgspec.Raw(_encoder.encode({"type": types, "size": n}))
                   for n in set(sizes)}
        return list(map(by_size.__getitem__, sizes))
    pairs = list(zip(types, sizes, strict=True))
    raws = {p: None if p[0] is None else msgspec.Raw(_encoder.encode({"type": p[0], "size": p[1]}))
            for p in set(pairs)}
    return list(map(raws.__getitem__, pairs))


def _batch_body(topic: str, ids: list[str], result: ProduceResult, envelopes: Envelopes,
                rejected: list[tuple[str, ApiError]]) -> bytes:
    """``successes`` and ``failures`` by entry id, encoded.

    This is the hot path of a large request: the success objects are made by
    ``map`` (no Python frame per record) and each distinct timestamp and each
    distinct ``{"type", "size"}`` is encoded once and embedded as raw JSON.
    """
    ts = result.timestamps
    errors = result.errors
    failures: list[dict[str, Any]] = [{"id": i, **error_body(e)[1]} for i, e in rejected]
    if not len(ts):
        return _encoder.encode({"successes": [], "failures": failures})
    if (ts == ts[0]).all():
        times: Iterable[msgspec.Raw] = repeat(_raw_time(int(ts[0])), len(ts))
    else:
        cache: dict[int, msgspec.Raw] = {}
        times = [cache.get(t) or cache.setdefault(t, _raw_time(t)) for t in ts.tolist()]
    keys = _size_raws(envelopes.key_types, envelopes.key_sizes)
    values = _size_raws(envelopes.value_types,
                        (result.record_bytes - np.array(envelopes.key_sizes, np.int64)).tolist())
    count = len(ids)
    successes = list(map(Success, ids, repeat(200, count), repeat(CLUSTER_ID, count),
                         repeat(topic, count), result.partitions.tolist(),
                         result.offsets.tolist(), times, keys, values))
    if errors:
        failures += [{"id": ids[i], **error_body(errors[i])[1]} for i in sorted(errors)]
        successes = [s for i, s in enumerate(successes) if i not in errors]
    return _encoder.encode({"successes": successes, "failures": failures})


def _raw_time(ms: int) -> msgspec.Raw:
    return msgspec.Raw(_encoder.encode(record_time(ms)))


@router.get(BASE + "/partitions/{partition_id}/records")
async def fetch(
    cluster_id: str, topic_name: TopicName, partition_id: PartitionId, request: Request,
    offset: Annotated[int, Query(ge=0, le=2**63 - 1)],
    max_records: Annotated[int | None, Query(ge=1)] = None,
    max_bytes: Annotated[int | None, Query(ge=1)] = None,
    timeout_ms: Annotated[int, Query(ge=0)] = 0,
    format: Annotated[Literal["BINARY", "STRING", "JSON"], Query()] = "BINARY",
) -> Response:
    """Records from ``offset``; with nothing there yet, waits up to ``timeout_ms`` for some."""
    check_cluster(cluster_id)
    st = state(request)
    s = st.settings
    max_records = min(max_records or 500, s.max_fetch_records)
    max_bytes = min(max_bytes or s.default_fetch_bytes, s.max_fetch_bytes)
    timeout_ms = min(timeout_ms, s.max_fetch_wait_ms)
    body = await st.fetch.fetch(topic_name, partition_id, offset, max_records, max_bytes,
                                timeout_ms, format)
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
    plog = st.manager.log(topic_name, partition_id)
    log_start = st.tiered.log_start_offset(plog, topic_name, partition_id)
    if spec == "earliest":
        offset: int | None = log_start
    elif spec == "latest":
        offset = plog.high_watermark
    else:
        if timestamp is None:
            raise ApiError(422, "spec=timestamp needs a timestamp query parameter (epoch ms)",
                           name="invalid_request")
        offset = await asyncio.to_thread(st.tiered.offset_for_timestamp, plog, topic_name,
                                         partition_id, timestamp)
    return json_response({"topic_name": topic_name, "partition_id": partition_id, "spec": spec,
                          "timestamp": timestamp, "offset": offset,
                          "log_start_offset": log_start,
                          "high_watermark": plog.high_watermark})


@router.post("/v3/clusters/{cluster_id}/producers", openapi_extra=json_body(ProducerInit))
async def init_producer(cluster_id: str, request: Request) -> Response:
    """A producer id and epoch for idempotent produce; send an existing id to bump its epoch."""
    check_cluster(cluster_id)
    st = state(request)
    raw = await read_body(request, 4096)
    body = decode(raw, _producer) if raw.strip() else ProducerInit()
    pid, epoch = st.manager.producer_ids.init_producer(body.producer_id)
    return json_response({"producer_id": pid, "producer_epoch": epoch})
