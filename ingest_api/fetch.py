"""Fetch: records of one partition from an offset, with long polling."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

from ingest_api.metrics import Metrics
from ingest_api.notifier import AppendNotifier
from log_tables.log_manager import LogManager
from log_tables.partition_log import FetchResult, LogBatch

Format = Literal["BINARY", "STRING", "JSON"]
_encoder = msgspec.json.Encoder()
_json_check = msgspec.json.Decoder()


def _envelope(data: bytes | None, fmt: Format) -> dict[str, Any] | None:
    """Bytes as the caller asked; bytes that are not valid in that form come back as BINARY."""
    if data is None:
        return None
    if fmt == "STRING":
        try:
            return {"type": "STRING", "data": data.decode()}
        except UnicodeDecodeError:
            pass
    elif fmt == "JSON":
        try:
            _json_check.decode(data)
            return {"type": "JSON", "data": msgspec.Raw(data)}
        except msgspec.DecodeError:
            pass
    return {"type": "BINARY", "data": data}


def _records(batch: LogBatch, fmt: Format) -> list[dict[str, Any]]:
    rb = batch.records
    timestamps = rb.column(0).to_pylist()
    keys = rb.column(1).to_pylist()
    values = rb.column(2).to_pylist()
    header_col = rb.column(3)
    headers = (header_col.to_pylist() if header_col.null_count != len(header_col)
               else [None] * len(rb))
    ts_type = "LOG_APPEND_TIME" if batch.log_append_time else "CREATE_TIME"
    when: dict[int, datetime] = {}
    out = []
    for i in range(len(rb)):
        ts = timestamps[i]
        dt = when.get(ts)
        if dt is None:
            dt = when[ts] = datetime.fromtimestamp(ts / 1000, UTC)
        h = headers[i]
        out.append({
            "offset": batch.base_offset + i,
            "timestamp": dt,
            "timestamp_type": ts_type,
            "key": _envelope(keys[i], fmt),
            "value": _envelope(values[i], fmt),
            "headers": [{"name": x["key"], "value": x["value"]} for x in h] if h else [],
        })
    return out


class FetchService:
    def __init__(self, manager: LogManager, notifier: AppendNotifier, metrics: Metrics) -> None:
        self.manager = manager
        self.notifier = notifier
        self.metrics = metrics

    async def fetch(self, topic: str, partition: int, offset: int, max_records: int,
                    max_bytes: int, timeout_ms: int, fmt: Format) -> bytes:
        """The response body of a fetch; waits up to ``timeout_ms`` for data at the log end."""
        plog = self.manager.log(topic, partition)
        result = plog.read(offset, max_bytes, max_records)
        deadline = time.monotonic() + timeout_ms / 1000
        while not result.batches and timeout_ms > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await self.notifier.wait(plog.name, remaining)
            result = plog.read(offset, max_bytes, max_records)
        return self._encode(topic, partition, offset, result, fmt)

    def _encode(self, topic: str, partition: int, offset: int, result: FetchResult,
                fmt: Format) -> bytes:
        records: list[dict[str, Any]] = []
        nbytes = 0
        for batch in result.batches:
            records.extend(_records(batch, fmt))
            nbytes += batch.records.nbytes
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


