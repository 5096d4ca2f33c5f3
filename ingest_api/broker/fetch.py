"""Fetch: records of one partition from an offset, with long polling."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import msgspec

from ingest_api.broker.arrow_answer import (
    ArrowAnswer,
    Paging,
    binary_bytes,
    data_bytes,
    kafka_rows,
    stream,
)
from ingest_api.broker.metrics import Metrics
from ingest_api.broker.notifier import AppendNotifier
from log_tables.cold.tiered_storage import TieredStorage
from log_tables.errors import CorruptRecordError, OffsetOutOfRangeError
from log_tables.hot.isolation import READ_UNCOMMITTED, Isolation
from log_tables.hot.log_manager import LogManager
from log_tables.records import FetchResult, LogBatch

Format = Literal["BINARY", "STRING", "JSON"]


class Data(msgspec.Struct, gc=False):
    """A fetched key or value: ``{"type": "BINARY"|"STRING"|"JSON", "data": ...}``."""

    type: str
    data: Any


class Header(msgspec.Struct, gc=False):
    name: str
    value: bytes | None


class FetchedRecord(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """A record as fetch and a group member's poll answer it. A poll names each record's
    topic and partition; a fetch (of one partition) leaves them out of the body."""

    topic_name: str | None = None
    partition_id: int | None = None
    offset: int
    timestamp: datetime
    timestamp_type: str
    key: Data | None
    value: Data | None
    headers: list[Header]


class RemoteFetch(msgspec.Struct, gc=False):
    """The part of a fetch answer a coordinator reads from another broker's partition."""

    records: list[FetchedRecord]
    next_offset: int
    high_watermark: int
    log_start_offset: int


_encoder = msgspec.json.Encoder()
_json_check = msgspec.json.Decoder()


def _envelope(data: bytes | None, fmt: Format) -> Data | None:
    """Bytes as the caller asked; bytes that are not valid in that form come back as BINARY."""
    if data is None:
        return None
    if fmt == "STRING":
        try:
            return Data("STRING", data.decode())
        except UnicodeDecodeError:
            pass
    elif fmt == "JSON":
        try:
            _json_check.decode(data)
            return Data("JSON", msgspec.Raw(data))
        except (msgspec.DecodeError, RecursionError):  # not JSON, or nested too deep
            pass
    return Data("BINARY", data)


def record_time(ms: int) -> datetime:
    """A record's epoch-ms time as a datetime. Appends take 0 to year 9999 only; a time
    outside what datetime holds (in a log written by other means) is shown at the
    nearest end of that range, so that the record stays readable."""
    try:
        return _EPOCH + timedelta(milliseconds=ms)  # exact, where ms / 1000 as a float is not
    except OverflowError:
        return _LATEST if ms > 0 else _EARLIEST


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EARLIEST = datetime.min.replace(tzinfo=UTC)
_LATEST = datetime.max.replace(tzinfo=UTC)


def _column(values: list[bytes | None], fmt: Format) -> list[Data | None]:
    if fmt == "BINARY":
        return [None if v is None else Data("BINARY", v) for v in values]
    return [_envelope(v, fmt) for v in values]


def records_of(batch: LogBatch, fmt: Format, topic: str | None = None,
               partition: int | None = None) -> list[FetchedRecord]:
    """A batch's records as answered; named by ``topic`` and ``partition`` when given."""
    rb = batch.records
    n = len(rb)
    ts_col = rb.column(0)
    first = ts_col[0].as_py()
    timestamps = ts_col.to_pylist()
    when: dict[int, datetime] = {first: record_time(first)}
    times = [when[t] if t in when else when.setdefault(t, record_time(t)) for t in timestamps]
    keys = _column(rb.column(1).to_pylist(), fmt)
    values = _column(rb.column(2).to_pylist(), fmt)
    header_col = rb.column(3)
    no_headers: list[Header] = []
    if header_col.null_count == n:
        headers: list[list[Header]] = [no_headers] * n
    else:
        headers = [[Header(x["key"], x["value"]) for x in h] if h else no_headers
                   for h in header_col.to_pylist()]
    ts_type = "LOG_APPEND_TIME" if batch.log_append_time else "CREATE_TIME"
    base = batch.base_offset
    if topic is None:
        return [FetchedRecord(offset=base + i, timestamp=times[i], timestamp_type=ts_type,
                              key=keys[i], value=values[i], headers=headers[i])
                for i in range(n)]
    return [FetchedRecord(topic_name=topic, partition_id=partition, offset=base + i,
                          timestamp=times[i], timestamp_type=ts_type, key=keys[i],
                          value=values[i], headers=headers[i])
            for i in range(n)]


class FetchService:
    def __init__(self, manager: LogManager, notifier: AppendNotifier, metrics: Metrics,
                 tiered: TieredStorage) -> None:
        self.manager = manager
        self.tiered = tiered
        self.notifier = notifier
        self.metrics = metrics

    async def read(self, topic: str, partition: int, offset: int, max_records: int,
                   max_bytes: int, isolation: Isolation = READ_UNCOMMITTED
                   ) -> tuple[int, FetchResult]:
        """What is there from ``offset`` now, from either tier, without waiting: the offset
        actually read from (the next existing one when ``offset`` fell in a hole the
        Delta tier no longer has) and the result, whose ``log_start_offset`` spans both
        tiers. Raises OffsetOutOfRangeError below the log start or past the end, and
        CorruptRecordError (naming topic, partition and offsets) when the first batch to
        return is damaged and the Delta tier has no copy of it; the records before a
        damaged batch are returned without it. ``read_committed`` stops at the last
        stable offset and steps over aborted records; no read returns a marker."""
        try:
            return await self._read(topic, partition, offset, max_records, max_bytes, isolation)
        except CorruptRecordError as exc:
            raise exc.located(topic, partition) from None

    async def _read(self, topic: str, partition: int, offset: int, max_records: int,
                    max_bytes: int, isolation: Isolation) -> tuple[int, FetchResult]:
        plog = self.manager.log(topic, partition)
        start = self.tiered.log_start_offset(plog, topic, partition)
        if offset < start:  # deleted by retention or DeleteRecords (maybe not yet from hot)
            raise OffsetOutOfRangeError(plog.name, offset, start, plog.readable_end(READ_UNCOMMITTED))
        try:
            result = plog.read(offset, max_bytes, max_records, isolation)
        except CorruptRecordError as exc:
            # Tiered before the damage? The Delta tier has those records intact.
            assert exc.next_offset is not None
            copy = await asyncio.to_thread(self.tiered.read_copy, topic, partition, offset,
                                           exc.next_offset, max_records, max_bytes)
            if copy is None:
                raise
            if not copy:  # compacted away in Delta: go on after the damaged batch
                return exc.next_offset, FetchResult([], plog.readable_end(READ_UNCOMMITTED), start)
            return offset, FetchResult(copy, plog.readable_end(READ_UNCOMMITTED), start)
        except OffsetOutOfRangeError:
            if offset >= plog.log_start_offset:
                raise
            # Below the hot tier: the Delta tier may still hold it (tiered storage).
            batches = await asyncio.to_thread(self.tiered.read, plog, topic, partition, offset,
                                              max_records, max_bytes)
            if batches:
                return offset, FetchResult(batches, plog.readable_end(READ_UNCOMMITTED), start)
            # Nothing left between here and the hot tier (records deleted before they were
            # tiered): answer from the next offset that exists, as Kafka does.
            offset = plog.log_start_offset
            result = plog.read(offset, max_bytes, max_records, isolation)
        return offset, result._replace(log_start_offset=start)

    async def fetch(self, topic: str, partition: int, offset: int, max_records: int,
                    max_bytes: int, timeout_ms: int, fmt: Format,
                    isolation: Isolation = READ_UNCOMMITTED) -> bytes:
        """The response body of a fetch; waits up to ``timeout_ms`` for data at the log end."""
        offset, result = await self._wait_read(topic, partition, offset, max_records,
                                               max_bytes, timeout_ms, isolation)
        return self._encode(topic, partition, offset, result, fmt)

    async def fetch_arrow(self, topic: str, partition: int, offset: int, max_records: int,
                          max_bytes: int, timeout_ms: int,
                          isolation: Isolation = READ_UNCOMMITTED) -> ArrowAnswer:
        """``fetch`` as an Arrow stream (SPARK_SCHEMA) and its paging."""
        offset, result = await self._wait_read(topic, partition, offset, max_records,
                                               max_bytes, timeout_ms, isolation)
        rows = [kafka_rows(b, topic, partition) for b in result.batches]
        count = sum(r.num_rows for r in rows)
        if count:
            self.metrics.records_out.labels(topic).inc(count)
            self.metrics.bytes_out.labels(topic).inc(sum(map(data_bytes, rows)))
        nxt = result.next_offset if result.next_offset is not None else offset
        return ArrowAnswer(stream(rows), Paging(count, nxt, result.high_watermark,
                                                result.log_start_offset))

    async def _wait_read(self, topic: str, partition: int, offset: int, max_records: int,
                         max_bytes: int, timeout_ms: int, isolation: Isolation
                         ) -> tuple[int, FetchResult]:
        """``read``, waiting up to ``timeout_ms`` for data when there is none yet (from
        past what the reads stepped over: markers, aborted records)."""
        plog = self.manager.log(topic, partition)
        offset, result = await self.read(topic, partition, offset, max_records, max_bytes,
                                         isolation)
        start = result.log_start_offset
        deadline = time.monotonic() + timeout_ms / 1000
        while not result.batches and timeout_ms > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if result.read_to is not None and result.read_to > offset:
                offset = result.read_to  # stepped over markers or aborted records: on at once
            else:
                await self.notifier.wait(plog.name, remaining)
            try:
                result = plog.read(offset, max_bytes, max_records, isolation)
            except CorruptRecordError as exc:
                raise exc.located(topic, partition) from None
        return offset, result._replace(log_start_offset=start)

    def _encode(self, topic: str, partition: int, offset: int, result: FetchResult,
                fmt: Format) -> bytes:
        records: list[FetchedRecord] = []
        nbytes = 0
        for batch in result.batches:
            records.extend(records_of(batch, fmt))
            nbytes += binary_bytes(batch.records.column(1)) + binary_bytes(batch.records.column(2))
        if records:
            self.metrics.records_out.labels(topic).inc(len(records))
            self.metrics.bytes_out.labels(topic).inc(nbytes)
        body = {
            "topic_name": topic,
            "partition_id": partition,
            "records": records,
            "next_offset": result.next_offset if result.next_offset is not None else offset,
            "high_watermark": result.high_watermark,
            "log_start_offset": result.log_start_offset,
        }
        return _encoder.encode(body)


