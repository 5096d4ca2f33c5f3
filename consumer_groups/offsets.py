"""``<warehouse>/_consumer_offsets``: committed offsets of consumer groups, in Delta.

Every commit is a row (group, topic, partition, offset, metadata, commit time,
member id and epoch, and ``seq``, a sequence number that orders rows across
commits and restarts); the latest row of a key wins, and a row with a null
offset is a tombstone (group deleted or expired). Commits from many requests are
batched by one writer thread into one Delta append: it takes what is queued,
waits up to ``max_wait_ms`` for more, appends, and only then answers every
waiter. Every ``compact_every`` appends it rewrites the table to the latest row
per key (dropping tombstones and expired groups), checkpoints it and vacuums
files older than the grace period, so the table and its log stay small.

The server is the only writer; readers (the SQL views, ``lakelog sql``) read
any snapshot.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import NamedTuple

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError

from log_tables.cold.table import load_table
from log_tables.errors import QueueFullError, StorageError
from log_tables.layout import is_local, local_path
from log_tables.storage import storage_options

log = logging.getLogger(__name__)

OFFSETS_DIR = "_consumer_offsets"
SCHEMA = pa.schema([
    ("group", pa.string()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("metadata", pa.string()),
    ("commit_timestamp", pa.timestamp("us", tz="UTC")),
    ("member_id", pa.string()),
    ("member_epoch", pa.int32()),
    ("seq", pa.int64()),
])
SPARK_DDL = ("`group` STRING, topic STRING, partition INT, offset BIGINT, metadata STRING, "
             "commit_timestamp TIMESTAMP, member_id STRING, member_epoch INT, seq BIGINT")


class OffsetKey(NamedTuple):
    group: str
    topic: str
    partition: int


class Committed(NamedTuple):
    offset: int
    metadata: str | None
    commit_ms: int
    member_id: str | None
    member_epoch: int


Change = tuple[OffsetKey, Committed | None]
"""One row to write: a committed offset, or None (a tombstone)."""


def offsets_uri(warehouse: str) -> str:
    return f"{warehouse.rstrip('/')}/{OFFSETS_DIR}"


class _Pending(NamedTuple):
    changes: list[Change]
    future: concurrent.futures.Future[None]


class OffsetStore:
    """The latest committed offsets in memory, every change in Delta before it is answered."""

    def __init__(self, warehouse: str, *, max_wait_ms: float = 5.0, max_batch_rows: int = 50_000,
                 max_queued_rows: int = 200_000, compact_every: int = 500,
                 vacuum_retention_hours: float = 24.0,
                 expired: Callable[[str, int], bool] | None = None) -> None:
        self.uri = offsets_uri(warehouse)
        self.max_wait_s = max_wait_ms / 1000
        self.max_batch_rows = max_batch_rows
        self.max_queued_rows = max_queued_rows
        self.compact_every = compact_every
        self.vacuum_retention_hours = vacuum_retention_hours
        self.expired = expired or (lambda group, newest_ms: False)
        self.latest: dict[OffsetKey, Committed] = {}
        self.appends = 0
        """Delta commits made by this store (appends and rewrites)."""
        self._seq = 0
        self._since_compaction = 0
        self._queue: list[_Pending] = []
        self._queued_rows = 0
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._dt: DeltaTable | None = None

    # -- reading -------------------------------------------------------------------------

    def load(self) -> None:
        """Read the table (if any): the latest row per key wins; tombstones remove."""
        try:
            dt = load_table(self.uri)
        except TableNotFoundError:
            return
        table = dt.to_pyarrow_table().sort_by("seq")
        latest: dict[OffsetKey, Committed] = {}
        cols = {name: table.column(name).to_pylist() for name in SCHEMA.names}
        for i in range(table.num_rows):
            key = OffsetKey(cols["group"][i], cols["topic"][i], cols["partition"][i])
            offset = cols["offset"][i]
            if offset is None:
                latest.pop(key, None)
                continue
            ts: datetime = cols["commit_timestamp"][i]
            latest[key] = Committed(offset, cols["metadata"][i], int(ts.timestamp() * 1000),
                                    cols["member_id"][i], cols["member_epoch"][i])
        self.latest = latest
        self._seq = (max(cols["seq"]) + 1) if cols["seq"] else 0
        log.info("loaded %d committed offsets of %d groups from %s (Delta version %d)",
                 len(latest), len({k.group for k in latest}), self.uri, dt.version())

    def group_offsets(self, group: str) -> dict[tuple[str, int], Committed]:
        return {(k.topic, k.partition): c for k, c in list(self.latest.items()) if k.group == group}

    def groups(self) -> set[str]:
        return {k.group for k in list(self.latest)}

    # -- writing -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lakelog-offsets", daemon=True)
        self._thread.start()

    def submit(self, changes: list[Change]) -> concurrent.futures.Future[None]:
        """Queue changes for the next Delta append; the future completes after it."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._cond:
            if self._closing:
                raise StorageError(f"{self.uri}: the offset store is closed")
            if self._queued_rows + len(changes) > self.max_queued_rows:
                raise QueueFullError(f"{self._queued_rows} offset commits are already waiting "
                                     f"for {self.uri}; retry shortly")
            self._queue.append(_Pending(changes, future))
            self._queued_rows += len(changes)
            self._cond.notify()
        return future

    async def commit(self, changes: list[Change]) -> None:
        """Append ``changes`` (batched with other callers'); returns once they are in Delta."""
        await asyncio.wrap_future(self.submit(changes))

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue and self._closing:
                    return
                # Wait a little for more commits to share this append (bounded by time and rows).
                deadline = time.monotonic() + self.max_wait_s
                while self._queued_rows < self.max_batch_rows and not self._closing:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                batch, self._queue = self._queue, []
                self._queued_rows = 0
            try:
                self._append([c for p in batch for c in p.changes])
            except Exception as exc:
                log.exception("appending %d offset commits to %s failed", len(batch), self.uri)
                err = exc if isinstance(exc, StorageError) else StorageError(
                    f"{self.uri}: committing offsets failed: {type(exc).__name__}: {exc}",
                    getattr(exc, "errno", None))
                for p in batch:
                    p.future.set_exception(err)
                continue
            for p in batch:
                p.future.set_result(None)
            if self._since_compaction >= self.compact_every:
                try:
                    self.compact()
                except Exception:
                    log.exception("compacting %s failed (retried after the next appends)",
                                  self.uri)

    def _rows(self, changes: Iterable[Change]) -> pa.Table:
        cols: dict[str, list[object]] = {name: [] for name in SCHEMA.names}
        for key, c in changes:
            cols["group"].append(key.group)
            cols["topic"].append(key.topic)
            cols["partition"].append(key.partition)
            cols["offset"].append(c.offset if c else None)
            cols["metadata"].append(c.metadata if c else None)
            ms = c.commit_ms if c else int(time.time() * 1000)
            cols["commit_timestamp"].append(datetime.fromtimestamp(ms / 1000, UTC))
            cols["member_id"].append(c.member_id if c else None)
            cols["member_epoch"].append(c.member_epoch if c else -1)
            cols["seq"].append(self._seq)
            self._seq += 1
        return pa.table(cols, schema=SCHEMA)

    def _table(self) -> DeltaTable | None:
        if self._dt is None:
            try:
                self._dt = load_table(self.uri)
            except TableNotFoundError:
                return None
        return self._dt

    def _append(self, changes: list[Change]) -> None:
        # Through a kept handle: delta-rs then reads only the new log entries, not the log.
        dt = self._table()
        write_deltalake(dt if dt is not None else self.uri, self._rows(changes), mode="append",
                        storage_options=None if dt is not None else storage_options(self.uri))
        self.appends += 1
        self._since_compaction += 1
        for key, c in changes:
            if c is None:
                self.latest.pop(key, None)
            else:
                self.latest[key] = c

    def compact(self) -> None:
        """Rewrite the table as the latest offset per key, without expired groups; then
        checkpoint and vacuum. Runs in the writer thread (no append interleaves)."""
        newest: dict[str, int] = {}
        for key, c in list(self.latest.items()):
            newest[key.group] = max(newest.get(key.group, 0), c.commit_ms)
        gone = {g for g, ms in newest.items() if self.expired(g, ms)}
        keep = [(k, c) for k, c in sorted(self.latest.items()) if k.group not in gone]
        dt = self._table()
        write_deltalake(dt if dt is not None else self.uri, self._rows(keep), mode="overwrite",
                        storage_options=None if dt is not None else storage_options(self.uri))
        self.appends += 1
        self._since_compaction = 0
        for key in [k for k in self.latest if k.group in gone]:
            self.latest.pop(key, None)
        dt = self._dt = DeltaTable(self.uri, storage_options=storage_options(self.uri))
        dt.create_checkpoint()
        dt.cleanup_metadata()
        if is_local(self.uri) and os.path.isdir(local_path(self.uri)):
            dt.vacuum(retention_hours=int(self.vacuum_retention_hours),
                      enforce_retention_duration=False, dry_run=False)
        if gone:
            log.info("offsets of %d group(s) expired: %s", len(gone), ", ".join(sorted(gone)))

    def close(self) -> None:
        """Write what is queued, then stop the writer."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(30)
