"""The values a produce request becomes: stored bytes, runs of records, per-record results.

A ``Run`` is what one append gets (one partition, one producer identity, consecutive
sequences); a ``Piece`` is what an append gave a stretch of a run; a ``ProduceResult``
is the answer for every record of the request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from log_tables.errors import LakelogError
from log_tables.hot.partition_log import AppendInfo
from log_tables.records import HEADERS_TYPE, RECORD_SCHEMA, null_headers

# Bytes a record adds to a batch beyond its key, value and headers (Arrow offsets,
# timestamp), with margin (a batch's own overhead is the planner's BATCH_OVERHEAD).
RECORD_OVERHEAD = 32
Row = tuple[bytes | None, bytes | None, int, list[dict[str, Any]] | None]  # key, value, ts, headers


@dataclass(slots=True)
class Run:
    """Records for one append: one partition, one producer identity, consecutive sequences.

    Large requests carry an Arrow ``batch``; small ones carry Python ``rows``, which
    the appender turns into one Arrow batch for all the small runs it drains at once.
    """

    partition: int
    batch: pa.RecordBatch | None
    indices: np.ndarray  # positions of these records in the request
    size: int  # estimated stored bytes
    producer: tuple[int, int, int] | None = None  # (id, epoch, first sequence)
    rows: list[Row] | None = None
    transactional: bool = False

    def to_batch(self) -> pa.RecordBatch:
        if self.batch is not None:
            return self.batch
        return rows_batch(self.rows or [])


def rows_batch(rows: list[Row]) -> pa.RecordBatch:
    first_ts = rows[0][2]
    any_headers = any(r[3] for r in rows)
    return pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(first_ts, pa.int64()), len(rows))
        if all(r[2] == first_ts for r in rows) else pa.array([r[2] for r in rows], pa.int64()),
        pa.array([r[0] for r in rows], pa.binary()),
        pa.array([r[1] for r in rows], pa.binary()),
        pa.array([r[3] for r in rows], HEADERS_TYPE) if any_headers
        else null_headers(len(rows)),
    ], schema=RECORD_SCHEMA)

# What an append gave each stretch of a run: (first record in the run, record count,
# the append's info or the error that refused them, index of the first in the append).
Piece = tuple[int, int, "AppendInfo | Exception", int]


@dataclass(slots=True)
class ProduceResult:
    """Per record of a request: its partition, offset (-1 if unknown) and timestamp, or an error."""

    partitions: np.ndarray
    offsets: np.ndarray
    timestamps: np.ndarray
    errors: dict[int, LakelogError]
    record_bytes: np.ndarray  # key + value bytes of each record

    def __len__(self) -> int:
        return len(self.partitions)

    def accepted_bytes(self) -> int:
        """Key + value bytes of the records without an error (what the metrics count)."""
        total = int(self.record_bytes.sum())
        return total - sum(int(self.record_bytes[i]) for i in self.errors)


def binary_lengths(arr: pa.Array) -> np.ndarray:
    """Byte length of each value of a binary array (0 for a null), read from its offsets."""
    offsets = np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4)
    return np.diff(offsets).astype(np.int64)
