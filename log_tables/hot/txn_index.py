"""Transactions as one partition sees them: which producers have one open here (from
which offset), which ended in an abort (the offsets it spans), and the marker records
that end them.

A transactional producer's first batch in a partition opens its transaction there; the
coordinator's marker (a control batch: Kafka's COMMIT or ABORT control record) ends it.
The last stable offset is the first offset of the oldest transaction still open (the
log end when none is): ``read_committed`` readers stop there. An aborted transaction is
remembered as ``(producer, first offset, marker offset)``: a batch of that producer
between the two is aborted, and committed readers step over it, as over every marker.

The index is rebuilt from batch headers alone (``apply``: the marker's type is in its
attributes), so recovery, a follower's fetched batches and a truncation keep it
without reading a body. It is saved with the producers' snapshot.

Readers in other processes (the tiering job, Spark) have no broker's memory: ``scan``
works out the same from the headers between where they read and where the log ends.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa

from log_tables.errors import InvalidRecordError, StorageError
from log_tables.files import atomic_write
from log_tables.hot.batch import BatchHeader
from log_tables.records import RECORD_SCHEMA

TXN_FILE = "transactional"
"""In a partition directory: a transactional batch was (or is being) written here, so
readers in other processes must read the markers (``scan``); without it none was."""

CONTROL_KEY = struct.Struct(">hh")
"""Kafka's control record key: version 0, type (0 abort, 1 commit)."""
CONTROL_VALUE = struct.Struct(">hi")
"""Kafka's end-transaction marker value: version 0, coordinator epoch."""


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    """The abort marker's offset."""


class TxnIndex:
    """Open and aborted transactions of one partition (the caller holds the log's lock
    for changes)."""

    def __init__(self) -> None:
        self.open: dict[int, int] = {}
        """Producer id -> first offset of its transaction open here."""
        self.aborted: list[AbortedTxn] = []
        """In marker order (so by ``last_offset``)."""

    def apply(self, header: BatchHeader) -> None:
        """Follow one appended batch (a producer's, a follower's, or a replayed one)."""
        if not header.transactional:
            return
        pid = header.producer_id
        if not header.control:
            self.open.setdefault(pid, header.base_offset)
            return
        first = self.open.pop(pid, None)
        if first is not None and not header.commits:
            self.aborted.append(AbortedTxn(pid, first, header.base_offset))

    def first_unstable(self) -> int | None:
        """The last stable offset when a transaction is open here; else None."""
        return min(self.open.values()) if self.open else None

    def aborted_in(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions with records in ``[start, end)``."""
        i = bisect_left([a.last_offset for a in self.aborted], start)
        return [a for a in self.aborted[i:] if a.first_offset < end]

    def prune(self, log_start: int) -> None:
        """Forget aborted transactions wholly below the log start."""
        i = bisect_left([a.last_offset for a in self.aborted], log_start)
        if i:
            del self.aborted[:i]

    def to_json(self) -> dict[str, Any]:
        return {"open": {str(p): o for p, o in self.open.items()},
                "aborted": [list(a) for a in self.aborted]}

    def load_json(self, data: dict[str, Any]) -> None:
        self.open = {int(p): int(o) for p, o in data.get("open", {}).items()}
        self.aborted = [AbortedTxn(int(a[0]), int(a[1]), int(a[2]))
                        for a in data.get("aborted", [])]


class TxnMark:
    """The ``transactional`` file of a partition, written (durably) before its first
    transactional batch: a reader that finds no file after it found the log's end knows
    no batch below that end is transactional, and skips the scan."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / TXN_FILE
        self.marked = self.path.exists()

    def ensure(self, name: str, producer_id: int) -> None:
        if producer_id < 0:
            raise InvalidRecordError(f"{name}: a transactional batch needs a producer id")
        if self.marked:
            return
        try:
            atomic_write(self.path, b"")
        except OSError as exc:
            raise StorageError(f"{name}: cannot write {self.path}: {exc.strerror}",
                               exc.errno) from None
        self.marked = True


def has_transactions(directory: Path) -> bool:
    """Whether a transactional batch was ever written to the partition in ``directory``."""
    return (directory / TXN_FILE).exists()


class Hidden:
    """Which batches a reader steps over: every marker, and for a committed reader the
    batches of aborted transactions (``aborted``: those that overlap the read)."""

    __slots__ = ("aborted",)

    def __init__(self, aborted: Iterable[AbortedTxn] = ()) -> None:
        self.aborted: dict[int, list[tuple[int, int]]] = {}
        for a in aborted:
            self.aborted.setdefault(a.producer_id, []).append((a.first_offset, a.last_offset))

    def spans(self) -> tuple[AbortedTxn, ...]:
        return tuple(AbortedTxn(p, lo, hi) for p, spans in self.aborted.items()
                     for lo, hi in spans)

    def __call__(self, header: BatchHeader) -> bool:
        if not header.transactional:
            return False
        if header.control:
            return True
        spans = self.aborted.get(header.producer_id)
        return spans is not None and any(lo <= header.base_offset <= hi for lo, hi in spans)


TxnId = tuple[int, int]
"""A transaction: its producer id and the epoch of its records (KIP-890: each
transaction of a producer ends with a new epoch, so no two share one)."""


class TxnScan(NamedTuple):
    """What a reader without the broker's index found in the headers it scanned."""

    last_stable: int | None
    """The first offset of a transaction with no marker yet (None: all ended)."""
    hidden: Hidden
    committed: dict[TxnId, tuple[int, int]]
    """Committed transactions with records in the scan: their first and last offsets."""
    open: dict[TxnId, int] = {}  # noqa: RUF012 (a NamedTuple's default, never changed)
    """Transactions with no marker here yet: their first offsets (one may be committed in
    another partition already: its coordinator is writing the markers)."""
    ended_ms: dict[TxnId, int] = {}  # noqa: RUF012 (a NamedTuple's default, never changed)
    """When each committed transaction's marker here was written (its leader's clock)."""


def scan(headers: Iterable[BatchHeader]) -> TxnScan:
    """Work out, from consecutive headers up to the readable end, where the first
    transaction still open starts, which of the scanned batches were aborted, and where
    each committed one's records are."""
    pending: dict[int, tuple[int, int, int]] = {}  # pid -> (epoch, first, last offset)
    aborted: list[AbortedTxn] = []
    committed: dict[TxnId, tuple[int, int]] = {}
    ended_ms: dict[TxnId, int] = {}
    for h in headers:
        if not h.transactional:
            continue
        pid = h.producer_id
        if not h.control:
            epoch, first, _ = pending.get(pid, (h.producer_epoch, h.base_offset, 0))
            pending[pid] = (epoch, first, h.last_offset)
            continue
        ended = pending.pop(pid, None)
        if ended is None:
            continue
        if h.commits:
            committed[(pid, ended[0])] = ended[1:]
            ended_ms[(pid, ended[0])] = h.max_timestamp
        else:
            aborted.append(AbortedTxn(pid, ended[1], h.base_offset))
    return TxnScan(min(first for _, first, _ in pending.values()) if pending else None,
                   Hidden(aborted), committed,
                   {(pid, epoch): first for pid, (epoch, first, _) in pending.items()}, ended_ms)


def marker_records(commit: bool, coordinator_epoch: int, timestamp_ms: int) -> pa.RecordBatch:
    """The one record of a marker, as Kafka writes it: key (version, type), value
    (version, coordinator epoch)."""
    key = CONTROL_KEY.pack(0, 1 if commit else 0)
    value = CONTROL_VALUE.pack(0, coordinator_epoch)
    return pa.record_batch([pa.array([timestamp_ms], pa.int64()), pa.array([key], pa.binary()),
                            pa.array([value], pa.binary()),
                            pa.array([None], RECORD_SCHEMA.field(3).type)], schema=RECORD_SCHEMA)
