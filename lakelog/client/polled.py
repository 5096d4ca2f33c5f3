"""A poll's records, decoded from the Arrow answer only as the application reads them.

``PolledRecords`` is a sequence of ``Record``: its length is known at once, but the
Python objects of a record (bytes, datetime, headers) are made a chunk of
``CHUNK_ROWS`` rows at a time, when iteration or indexing reaches them (one
``to_pylist`` per column and chunk: C speed, never a loop per cell). The RecordBatches
themselves stay available as ``batches``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, overload

import pyarrow as pa
import pyarrow.compute as pc

from lakelog.client.structs import Record

Format = Literal["BINARY", "STRING", "JSON"]
CHUNK_ROWS = 256
KAFKA_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
    ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
])
"""The columns of an Arrow answer: those of Spark's Kafka source (the server's
``SPARK_SCHEMA``)."""


def decode(data: bytes | None, fmt: Format) -> Any:
    """Bytes as ``format`` asks, as the server's JSON answer gives them: STRING as str,
    JSON parsed; bytes not valid in that form stay bytes."""
    if data is None or fmt == "BINARY":
        return data
    try:
        return data.decode() if fmt == "STRING" else json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return data


def data_bytes(batch: pa.RecordBatch) -> int:
    """Bytes of keys and values (what ``max_bytes`` and Kafka's fetch sizes count)."""
    total = 0
    for name in ("key", "value"):
        n = pc.sum(pc.binary_length(batch.column(name))).as_py()
        total += n or 0
    return total


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _datetimes(column: pa.Array) -> list[datetime | None]:
    """A timestamp column as UTC datetimes. pyarrow's own ``to_pylist`` of a zoned column
    costs ~3.7 us a value; integers and one datetime per distinct value (a produced
    batch shares its timestamp) cost ~0.1."""
    made: dict[int, datetime] = {}
    out: list[datetime | None] = []
    for micros in column.cast(pa.int64()).to_pylist():
        if micros is None:
            out.append(None)
            continue
        value = made.get(micros)
        if value is None:
            value = made[micros] = _EPOCH + timedelta(microseconds=micros)
        out.append(value)
    return out


def _records(batch: pa.RecordBatch, fmt: Format) -> list[Record]:
    cols: dict[str, list[Any]] = {name: batch.column(name).to_pylist()
                                  for name in ("key", "value", "topic", "partition", "offset")}
    cols["timestamp"] = _datetimes(batch.column("timestamp"))
    raw_headers = batch.column("headers")
    headers: list[list[tuple[str, bytes | None]]]
    if raw_headers.null_count == len(raw_headers):
        headers = [[] for _ in range(len(raw_headers))]
    else:
        headers = [[(h["key"], h["value"]) for h in hs] if hs else []
                   for hs in raw_headers.to_pylist()]
    keys, values = cols["key"], cols["value"]
    if fmt != "BINARY":
        keys = [decode(k, fmt) for k in keys]
        values = [decode(v, fmt) for v in values]
    return [Record(*row) for row in zip(cols["topic"], cols["partition"], cols["offset"],
                                        cols["timestamp"], keys, values, headers,
                                        strict=True)]


class PolledRecords(Sequence[Record]):
    """The records of one poll, made as they are read (see the module docstring)."""

    def __init__(self, batches: list[pa.RecordBatch], fmt: Format = "BINARY") -> None:
        self.batches = batches
        """The poll's records as RecordBatches in ``KAFKA_SCHEMA`` (nothing decoded)."""
        self.format = fmt
        self._len = int(sum(b.num_rows for b in batches))
        self._made: list[Record] = []
        self._chunks = self._chunked()

    def _chunked(self) -> Iterator[pa.RecordBatch]:
        for b in self.batches:
            for start in range(0, b.num_rows, CHUNK_ROWS):
                yield b.slice(start, CHUNK_ROWS)

    def _make_until(self, n: int) -> None:
        """Decode chunks until at least ``n`` records are made (or all are)."""
        while len(self._made) < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                return
            self._made.extend(_records(chunk, self.format))

    @property
    def materialized(self) -> int:
        """How many records have been made into Python objects so far."""
        return len(self._made)

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, i: int) -> Record: ...

    @overload
    def __getitem__(self, i: slice) -> list[Record]: ...

    def __getitem__(self, i: int | slice) -> Record | list[Record]:
        if isinstance(i, slice):
            self._make_until(self._len)
            return self._made[i]
        index = i + self._len if i < 0 else i
        if not 0 <= index < self._len:
            raise IndexError("record index out of range")
        self._make_until(index + 1)
        return self._made[index]

    def __iter__(self) -> Iterator[Record]:
        i = 0
        while i < self._len:
            self._make_until(i + 1)
            yield from self._made[i:]
            i = len(self._made)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Sequence[Record]) -> list[Record]:
        """A list, as ``poll`` answered before it decoded lazily (``a.poll() + b.poll()``)."""
        return list(self) + list(other)

    def __radd__(self, other: Sequence[Record]) -> list[Record]:
        return list(other) + list(self)

    def __repr__(self) -> str:
        return f"PolledRecords({self._len} records, {self.materialized} made)"
