"""The on-disk record batch: a fixed 56-byte header, then an Arrow IPC body.

Header (little-endian)::

    0  base_offset      i64   offset of the first record
    8  batch_length     i32   bytes after this field (header rest + body)
    12 magic            u32   0x4C4B4C31 ("LKL1")
    16 crc              u32   CRC32C of bytes 20..end, then of bytes 0..12
    20 attributes       i16   bit 0: LogAppendTime; bit 4: transactional, bit 5: a
                              control batch (a transaction marker), as Kafka's bits;
                              bit 6: the marker commits (else it aborts)
    22 record_count     i32
    26 first_timestamp  i64
    34 max_timestamp    i64
    42 producer_id      i64   -1 without an idempotent producer
    50 producer_epoch   i16
    52 base_sequence    i32
    56 body             Arrow IPC record-batch message of RECORD_SCHEMA (8-byte aligned)

Arrow bodies make tiering and Spark reads nearly a copy; the CRC makes every
reader, in this process or another, stop at the last complete valid batch.
The CRC covers the base offset and length last, so a batch is prepared (body
serialized and checksummed) outside the partition lock and only those 12
bytes are added once the offset is known.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import Any, NamedTuple

import google_crc32c
import pyarrow as pa

from log_tables.errors import CorruptRecordError
from log_tables.records import RECORD_SCHEMA

MAGIC = 0x4C4B4C31
HEADER = struct.Struct("<qiIIhiqqqhi")
HEADER_SIZE = HEADER.size
_HEAD = struct.Struct("<qi")
_LENGTH_END = 12  # bytes covered by batch_length start here
_CRC_START, _CRC_END = 16, 20
ATTR_LOG_APPEND_TIME = 0x1
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
ATTR_COMMIT = 0x40
NO_PRODUCER_ID = -1
assert HEADER_SIZE == 56
# Any batch is bounded by segment.bytes when written; scans accept up to i32 so
# that lowering segment.bytes later never makes old batches look corrupt.
MAX_BATCH_BYTES = 2**31 - 1


class BatchHeader(NamedTuple):
    """The decoded fixed header of one batch."""

    base_offset: int
    batch_length: int
    magic: int
    crc: int
    attributes: int
    record_count: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int

    @property
    def size(self) -> int:
        """Bytes the whole batch takes on disk."""
        return _LENGTH_END + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.record_count - 1

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & ATTR_LOG_APPEND_TIME)

    @property
    def transactional(self) -> bool:
        """Records of a transaction, or its marker."""
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def control(self) -> bool:
        """A transaction marker: no reader hands its record to an application."""
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def commits(self) -> bool:
        """A marker that commits its producer's transaction (else it aborts it)."""
        return bool(self.attributes & ATTR_COMMIT)


class EncodedBatch(NamedTuple):
    """A batch ready to write: ``header`` bytes then ``body``."""

    header: BatchHeader
    header_bytes: bytes
    body: pa.Buffer

    @property
    def size(self) -> int:
        return self.header.size


def _pad8(body: pa.Buffer) -> pa.Buffer:
    rem = body.size % 8
    if rem == 0:
        return body
    return pa.py_buffer(body.to_pybytes() + b"\0" * (8 - rem))


class PreparedBatch(NamedTuple):
    """A serialized body and the header fields known before an offset is assigned."""

    body: pa.Buffer
    record_count: int
    attributes: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    partial_crc: int
    min_timestamp: int = 0
    """The records' earliest time (not in the header: the append checks it)."""

    @property
    def size(self) -> int:
        return HEADER_SIZE + int(self.body.size)


def prepare(
    records: pa.RecordBatch,
    *,
    log_append_time: bool = False,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    flags: int = 0,
) -> PreparedBatch:
    """Serialize ``records`` (RECORD_SCHEMA) and checksum everything but offset and length;
    ``flags``: the transactional, control and commit bits."""
    count = records.num_rows
    ts = records.column(0).to_numpy(zero_copy_only=True)
    first_ts = int(ts[0])
    min_ts, max_ts = (first_ts, first_ts) if count == 1 else (int(ts.min()), int(ts.max()))
    body = _pad8(records.serialize())
    attributes = (ATTR_LOG_APPEND_TIME if log_append_time else 0) | flags
    tail = HEADER.pack(
        0, 0, MAGIC, 0, attributes, count, first_ts, max_ts, producer_id, producer_epoch,
        base_sequence,
    )[_CRC_END:]
    crc = google_crc32c.extend(google_crc32c.value(tail), body)
    return PreparedBatch(
        body, count, attributes, first_ts, max_ts, producer_id, producer_epoch, base_sequence, crc,
        min_ts,
    )


def assign(prepared: PreparedBatch, base_offset: int) -> EncodedBatch:
    """Give a prepared batch its base offset and finish its header."""
    batch_length = HEADER_SIZE - _LENGTH_END + prepared.body.size
    head = _HEAD.pack(base_offset, batch_length)
    crc = int(google_crc32c.extend(prepared.partial_crc, head))
    header = BatchHeader(
        base_offset, batch_length, MAGIC, crc, prepared.attributes, prepared.record_count,
        prepared.first_timestamp, prepared.max_timestamp, prepared.producer_id,
        prepared.producer_epoch, prepared.base_sequence,
    )
    return EncodedBatch(header, HEADER.pack(*header), prepared.body)


def encode(base_offset: int, records: pa.RecordBatch, **kwargs: Any) -> EncodedBatch:
    """Prepare and assign in one step."""
    return assign(prepare(records, **kwargs), base_offset)


def _crc(raw: pa.Buffer, size: int) -> int:
    crc = google_crc32c.value(raw.slice(_CRC_END, size - _CRC_END))
    return int(google_crc32c.extend(crc, raw.slice(0, _LENGTH_END)))


def decode_header(view: memoryview | bytes, pos: int = 0) -> BatchHeader:
    """Unpack a header (no validation beyond its length)."""
    return BatchHeader._make(HEADER.unpack_from(view, pos))


def check_header(header: BatchHeader, path: str, position: int, max_batch_bytes: int) -> str | None:
    """Why this header cannot start a valid batch, or None if it may."""
    if header.magic != MAGIC:
        return f"bad magic {header.magic:#x}"
    if not HEADER_SIZE - _LENGTH_END <= header.batch_length <= max_batch_bytes:
        return f"batch length {header.batch_length} out of bounds"
    if header.record_count <= 0:
        return f"record count {header.record_count}"
    return None


def verify(header: BatchHeader, raw: pa.Buffer) -> bool:
    """True when the CRC over ``raw`` (the whole batch) matches the header."""
    return _crc(raw, header.size) == header.crc


def decode_body(header: BatchHeader, body: pa.Buffer, path: str, position: int) -> pa.RecordBatch:
    """Decode a CRC-checked body into a RecordBatch of RECORD_SCHEMA."""
    try:
        batch = pa.ipc.read_record_batch(body, RECORD_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise CorruptRecordError(path, position, f"undecodable body: {exc}") from None
    if batch.num_rows != header.record_count:
        raise CorruptRecordError(
            path, position, f"body has {batch.num_rows} records, header says {header.record_count}"
        )
    return batch


class ScannedBatch(NamedTuple):
    """A batch found by a scan: its header, file position and raw bytes."""

    header: BatchHeader
    position: int
    raw: pa.Buffer

    def records(self, path: str) -> pa.RecordBatch:
        return decode_body(self.header, self.raw.slice(HEADER_SIZE), path, self.position)


class ScanStop(NamedTuple):
    """Why a scan stopped before ``end``: where, and the reason."""

    position: int
    reason: str
    torn: bool = False
    """The batch runs past ``end``: a tail being written (or cut short), not damage."""


class BatchScanner:
    """Reads consecutive batches of a file between two positions, validating each.

    Stops (without raising) at the first torn, corrupt or out-of-sequence batch
    and records where and why in ``stop``. Reads ahead in chunks so that many
    small batches cost one ``pread``.
    """

    def __init__(
        self,
        fd: int,
        path: str,
        start: int,
        end: int,
        *,
        expected_offset: int | None = None,
        max_batch_bytes: int = 2**31 - 1,
        verify_crc: bool = True,
        read_ahead: int = 1 << 20,
    ) -> None:
        self.fd = fd
        self.path = path
        self.position = start
        self.end = end
        self.expected_offset = expected_offset
        self.max_batch_bytes = max_batch_bytes
        self.verify_crc = verify_crc
        self.read_ahead = read_ahead
        self.stop: ScanStop | None = None
        self._chunk = pa.py_buffer(b"")
        self._chunk_start = start

    def _bytes(self, position: int, length: int) -> pa.Buffer | None:
        rel = position - self._chunk_start
        if rel < 0 or rel + length > self._chunk.size:
            want = min(max(length, self.read_ahead), self.end - position)
            if want < length:
                return None
            data = os.pread(self.fd, want, position)
            if len(data) < length:
                return None
            self._chunk = pa.py_buffer(data)
            self._chunk_start = position
            rel = 0
        return self._chunk.slice(rel, length)

    def __iter__(self) -> Iterator[ScannedBatch]:
        while self.position < self.end:
            pos = self.position
            head = self._bytes(pos, HEADER_SIZE)
            if head is None:
                self.stop = ScanStop(pos, "torn header at end of file", torn=True)
                return
            header = decode_header(memoryview(head))
            problem = check_header(header, self.path, pos, self.max_batch_bytes)
            if problem is None and self.expected_offset is not None and (
                header.base_offset != self.expected_offset
            ):
                problem = f"base offset {header.base_offset}, expected {self.expected_offset}"
            if problem is not None:
                self.stop = ScanStop(pos, problem)
                return
            raw = self._bytes(pos, header.size)
            if raw is None:
                self.stop = ScanStop(pos, "torn batch at end of file", torn=True)
                return
            if self.verify_crc and not verify(header, raw):
                self.stop = ScanStop(pos, "CRC mismatch")
                return
            self.position = pos + header.size
            if self.expected_offset is not None:
                self.expected_offset = header.next_offset
            yield ScannedBatch(header, pos, raw)
