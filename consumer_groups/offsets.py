"""``<warehouse>/_consumer_offsets``: committed offsets of consumer groups, in Delta.

Every commit is a row (group, topic, partition, offset, metadata, commit time,
member id and epoch, and ``seq``, which orders the rows of a key across commits,
restarts and coordinators); the latest row of a key wins, and a row with a null
offset is a tombstone (group deleted or expired). ``seq`` is the coordinator epoch
(the leader epoch of the group's coordinator slot in a cluster, 0 for a cluster of
one) in its high bits above ``SEQ_BITS`` and a counter below: a group's commits are
made by one coordinator at a time, a new one has a higher epoch, so its rows order
after the old one's even when the old one writes late. Commits from many requests
are batched by one writer thread into one Delta append: it takes what is queued,
waits up to ``max_wait_ms`` for more, appends, and only then answers every waiter.
Every ``compact_every`` appends it rewrites the table to the latest row per key as
the table holds them (every broker's commits), keeping their ``seq``, dropping
tombstones and expired groups (``expired`` says which: in a cluster, only groups
this broker coordinates), then checkpoints it and vacuums files older than the
grace period, so the table and its log stay small.

In a cluster every broker's store writes the one table: each coordinator commits its
groups' offsets; a broker that becomes a group's coordinator reads them first
(``reload_groups``). Readers (the SQL views, ``lakelog sql``) read any snapshot.
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
from deltalake.exceptions import CommitFailedError, TableNotFoundError

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
SEQ_BITS = 40
"""``seq`` = coordinator epoch << SEQ_BITS | a counter of the store that wrote it."""
_COUNTER = (1 << SEQ_BITS) - 1
MAX_APPEND_ATTEMPTS = 5
"""An append that lost to another broker's rewrite is made again on a fresh snapshot."""


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
    epoch: int
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

    def _latest_rows(self, dt: DeltaTable | None = None) -> tuple[pa.Table, int] | None:
        """The table's latest row of each key (tombstones included), in ``seq`` order, and
        the Delta version read (of ``dt``, else of the table as it is now); None when
        there is no table yet."""
        if dt is None:
            try:
                dt = load_table(self.uri)
            except TableNotFoundError:
                return None
        table = dt.to_pyarrow_table().sort_by("seq")
        keys = zip(table.column("group").to_pylist(), table.column("topic").to_pylist(),
                   table.column("partition").to_pylist(), strict=True)
        last = {key: i for i, key in enumerate(keys)}
        return table.take(sorted(last.values())), dt.version()

    def _committed(self, rows: pa.Table, wanted: Callable[[str], bool] | None = None
                   ) -> dict[OffsetKey, Committed]:
        """The committed offsets of ``rows`` (of the groups ``wanted``), tombstones left
        out; the counter moves past every ``seq`` seen."""
        latest: dict[OffsetKey, Committed] = {}
        cols = {name: rows.column(name).to_pylist() for name in SCHEMA.names}
        for i in range(rows.num_rows):
            self._seq = max(self._seq, (cols["seq"][i] & _COUNTER) + 1)
            offset = cols["offset"][i]
            if offset is None or (wanted is not None and not wanted(cols["group"][i])):
                continue
            ts: datetime = cols["commit_timestamp"][i]
            key = OffsetKey(cols["group"][i], cols["topic"][i], cols["partition"][i])
            latest[key] = Committed(offset, cols["metadata"][i], int(ts.timestamp() * 1000),
                                    cols["member_id"][i], cols["member_epoch"][i])
        return latest

    def load(self) -> None:
        """Read the table (if any): the latest row per key wins; tombstones remove."""
        found = self._latest_rows()
        if found is None:
            return
        rows, version = found
        self.latest = self._committed(rows)
        log.info("loaded %d committed offsets of %d groups from %s (Delta version %d)",
                 len(self.latest), len({k.group for k in self.latest}), self.uri, version)

    def reload_groups(self, wanted: Callable[[str], bool]) -> int:
        """Read the latest committed offsets of the groups ``wanted`` from the table as it
        is now (every broker's commits), in place of what this store held of them: a
        broker that becomes their coordinator. Returns how many were read."""
        found = self._latest_rows()
        fresh = self._committed(found[0], wanted) if found is not None else {}
        for key in [k for k in list(self.latest) if wanted(k.group)]:
            self.latest.pop(key, None)
        self.latest.update(fresh)
        return len(fresh)

    def forget_groups(self, wanted: Callable[[str], bool]) -> None:
        """Drop what this store holds of the groups ``wanted`` (another broker coordinates
        them now: what is here would go stale)."""
        for key in [k for k in list(self.latest) if wanted(k.group)]:
            self.latest.pop(key, None)

    def group_offsets(self, group: str) -> dict[tuple[str, int], Committed]:
        return {(k.topic, k.partition): c for k, c in list(self.latest.items()) if k.group == group}

    def groups(self) -> set[str]:
        return {k.group for k in list(self.latest)}

    # -- writing -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lakelog-offsets", daemon=True)
        self._thread.start()

    def submit(self, changes: list[Change], epoch: int = 0) -> concurrent.futures.Future[None]:
        """Queue changes for the next Delta append, made by the coordinator at ``epoch``;
        the future completes after it."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._cond:
            if self._closing:
                raise StorageError(f"{self.uri}: the offset store is closed")
            if self._queued_rows + len(changes) > self.max_queued_rows:
                raise QueueFullError(f"{self._queued_rows} offset commits are already waiting "
                                     f"for {self.uri}; retry shortly")
            self._queue.append(_Pending(changes, epoch, future))
            self._queued_rows += len(changes)
            self._cond.notify()
        return future

    async def commit(self, changes: list[Change], epoch: int = 0) -> None:
        """Append ``changes`` (batched with other callers'); returns once they are in Delta."""
        await asyncio.wrap_future(self.submit(changes, epoch))

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
                self._append([(c, p.epoch) for p in batch for c in p.changes])
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

    def _rows(self, changes: Iterable[tuple[Change, int]]) -> pa.Table:
        cols: dict[str, list[object]] = {name: [] for name in SCHEMA.names}
        for (key, c), epoch in changes:
            cols["group"].append(key.group)
            cols["topic"].append(key.topic)
            cols["partition"].append(key.partition)
            cols["offset"].append(c.offset if c else None)
            cols["metadata"].append(c.metadata if c else None)
            ms = c.commit_ms if c else int(time.time() * 1000)
            cols["commit_timestamp"].append(datetime.fromtimestamp(ms / 1000, UTC))
            cols["member_id"].append(c.member_id if c else None)
            cols["member_epoch"].append(c.member_epoch if c else -1)
            cols["seq"].append(epoch << SEQ_BITS | self._seq)
            self._seq += 1
        return pa.table(cols, schema=SCHEMA)

    def _table(self) -> DeltaTable | None:
        if self._dt is None:
            try:
                self._dt = load_table(self.uri)
            except TableNotFoundError:
                return None
        return self._dt

    def _append(self, changes: list[tuple[Change, int]]) -> None:
        rows = self._rows(changes)
        for attempt in range(MAX_APPEND_ATTEMPTS):
            # Through a kept handle: delta-rs then reads only the new log entries, not the log.
            dt = self._table()
            try:
                write_deltalake(dt if dt is not None else self.uri, rows, mode="append",
                                storage_options=None if dt is not None
                                else storage_options(self.uri))
                break
            except CommitFailedError:
                # Another broker's compaction rewrote the table after this handle's
                # snapshot: a blind append is safe to make again on the new one.
                if attempt == MAX_APPEND_ATTEMPTS - 1:
                    raise
                self._dt = None
        self.appends += 1
        self._since_compaction += 1
        for (key, c), _ in changes:
            if c is None:
                self.latest.pop(key, None)
            else:
                self.latest[key] = c

    def compact(self) -> None:
        """Rewrite the table as its latest row per key (every broker's, their ``seq``
        kept), without tombstones and expired groups; then checkpoint and vacuum. Runs in
        the writer thread (none of this store's appends interleaves; another broker's
        append that lands meanwhile stays, after or beside the rewrite, in ``seq``
        order)."""
        self._dt = None  # the snapshot read is the one rewritten
        dt = self._table()
        found = self._latest_rows(dt) if dt is not None else None
        if dt is None or found is None:
            return
        rows = found[0]
        newest: dict[str, int] = {}
        groups = rows.column("group").to_pylist()
        offsets = rows.column("offset").to_pylist()
        stamps = rows.column("commit_timestamp").to_pylist()
        for group, offset, ts in zip(groups, offsets, stamps, strict=True):
            if offset is not None:
                newest[group] = max(newest.get(group, 0), int(ts.timestamp() * 1000))
        gone = {g for g, ms in newest.items() if self.expired(g, ms)}
        keep = [i for i, (g, o) in enumerate(zip(groups, offsets, strict=True))
                if o is not None and g not in gone]
        write_deltalake(dt, rows.take(keep), mode="overwrite")
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
