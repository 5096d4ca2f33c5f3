"""Kafka record batches (v2, the format of every client since Kafka 0.11) to and from
lakelog's records, with aiokafka's record codec (its C build where there is one; gzip,
snappy, lz4 and zstd through it).

A batch that does not decode (sizes, CRC, records) fails its partition with
INVALID_RECORD. A produce request's batches become a ``ProduceRequest`` of one partition: keys, values,
timestamps, headers, and the producer id, epoch and per-record sequence an idempotent
producer sent. A fetch's ``LogBatch`` becomes one v2 batch at its base offset.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator

import google_crc32c
import numpy as np
import pyarrow as pa
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from ingest_api.broker.produce.request import Headers, ProducerColumns, ProduceRequest
from log_tables.errors import InvalidRecordError
from log_tables.records import LogBatch
from log_tables.varint import zigzag

BATCH_HEADER = 61
"""Bytes of a v2 batch before its records."""
_LENGTH = struct.Struct(">qiib")
"""Base offset, batch length, partition leader epoch, magic."""


class Decoded:
    """A partition's records as produced, and what the batches said about them."""

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.timestamps: list[int] = []
        self.headers: list[Headers | None] = []
        self.producers: list[tuple[int, int, int] | None] = []
        self.transactional = False

    def request(self, partition: int) -> ProduceRequest:
        n = len(self.keys)
        any_headers = any(h is not None for h in self.headers)
        any_producer = any(p is not None for p in self.producers)
        return ProduceRequest(
            keys=self.keys, values=self.values,
            timestamps=np.asarray(self.timestamps, np.int64),
            headers=self.headers if any_headers else None,
            partitions=np.full(n, partition, np.int64),
            producers=ProducerColumns.of(self.producers) if any_producer else None)


def split(records: bytes) -> Iterator[memoryview]:
    """The batches of a produce request's ``records`` field, each whole."""
    view = memoryview(records)
    at = 0
    while at < len(view):
        if len(view) - at < _LENGTH.size:
            raise InvalidRecordError(f"{len(view) - at} bytes after the last whole batch")
        _, length, _, magic = _LENGTH.unpack_from(view, at)
        end = at + 12 + length
        if length < BATCH_HEADER - 12 or end > len(view):
            raise InvalidRecordError(f"a batch of {length} bytes in {len(view) - at} left")
        if magic != 2:
            raise InvalidRecordError(f"record batches of magic {magic} are not accepted: "
                                     "use a client of Kafka 0.11 or later (magic 2)")
        yield view[at:end]
        at = end


def decode(records: bytes) -> Decoded:
    """A produce request's batches of one partition, checked (CRC, sizes)."""
    out = Decoded()
    for raw in split(records):
        batch = DefaultRecordBatch(bytes(raw))
        if not batch.validate_crc():
            raise InvalidRecordError("a record batch's CRC does not match its bytes")
        if batch.is_control_batch:
            raise InvalidRecordError("clients do not write control batches")
        out.transactional |= bool(batch.is_transactional)
        pid, epoch, seq = batch.producer_id, batch.producer_epoch, batch.base_sequence
        try:
            for i, record in enumerate(batch):
                out.keys.append(record.key)
                out.values.append(record.value)
                out.timestamps.append(record.timestamp if record.timestamp is not None else -1)
                out.headers.append([{"key": k, "value": v} for k, v in record.headers]
                                   if record.headers else None)
                out.producers.append((pid, epoch, seq + i) if pid >= 0 else None)
        except CorruptRecordException as exc:
            raise InvalidRecordError(f"a record batch does not decode: {exc}") from None
    return out


def encode(batch: LogBatch) -> bytes:
    """A stored batch as one v2 record batch at its base offset (uncompressed; a batch
    whose times the log stamped goes out with them as create times)."""
    rows: pa.RecordBatch = batch.records
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=0, producer_id=batch.producer_id,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 31)
    stamps = rows.column("timestamp").to_pylist()
    keys = rows.column("key").to_pylist()
    values = rows.column("value").to_pylist()
    headers = rows.column("headers")
    lists = headers.to_pylist() if headers.null_count < len(headers) else None
    for i in range(rows.num_rows):
        hs = [] if lists is None or not lists[i] else [(h["key"], h["value"])
                                                        for h in lists[i]]
        builder.append(i, timestamp=stamps[i], key=keys[i], value=values[i], headers=hs)
    out = builder.build()
    struct.pack_into(">q", out, 0, batch.base_offset)  # (outside the CRC)
    return bytes(out)


_CONTROL = 0x30
"""Attributes of a control batch: transactional (0x10) and control (0x20)."""


def gap(first: int, end: int) -> bytes:
    """A control batch (a commit marker of no producer) covering offsets ``first`` to
    ``end - 1``: what a fetch returns where the log holds no record to give there
    (markers, aborted records stepped over, records gone), so that a Kafka client moves
    on to ``end`` (clients skip control batches and go past their last offset)."""
    delta = end - 1 - first
    key = struct.pack(">hh", 0, 1)  # version 0, COMMIT
    value = struct.pack(">hi", 0, 0)  # version 0, coordinator epoch 0
    body = b"\0" + zigzag(0) + zigzag(delta) + zigzag(len(key)) + key + \
        zigzag(len(value)) + value + zigzag(0)
    record = zigzag(len(body)) + body
    now = int(time.time() * 1000)
    after_crc = struct.pack(">hiqqqhii", _CONTROL, delta, now, now, -1, -1, -1, 1) + record
    crc = google_crc32c.value(after_crc)
    head = struct.pack(">qiibI", first, 4 + 1 + 4 + len(after_crc), -1, 2, crc)
    return head + after_crc
