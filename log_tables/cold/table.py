"""The cold tier: one Delta table per topic, in the schema of Spark's Kafka source.

Layout: ``<warehouse>/topics/<topic>/partition=<p>/<file>.parquet`` plus
``_delta_log/``. The Parquet files hold every column but ``partition`` (a
Delta partition column, Hive-style in the path) and are sorted by offset. Each
file's add action carries real stats (``numRecords``, min/max of ``offset`` and
``timestamp``), so readers pick files by offset or time without opening them.

Per partition, three Delta app transactions carry the log's bookkeeping, each
checked and advanced in the same commit as the files it describes:

- ``lakelog-tier-<p>``: the tiered offset (the next offset to tier);
- ``lakelog-start-<p>``: the log start offset: offsets below it were deleted
  (retention, DeleteRecords) even where a file that straddles it still holds them;
- ``lakelog-cleaned-<p>``: the compaction checkpoint: ``[start, cleaned)`` is compacted;
- ``lakelog-files-<p>``: a counter that every commit removing files of the
  partition (retention, compaction, optimize) advances, so two such jobs planned
  on the same files can never both commit.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import NamedTuple
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from deltalake import DeltaTable, Schema
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.transaction import create_table_with_add_actions

from log_tables.errors import StorageError
from log_tables.records import HEADERS_TYPE, RECORD_SCHEMA

log = logging.getLogger(__name__)

TOPICS_DIR = "topics"
STAGE_DIR = "_stage"
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
CREATE_TIME, LOG_APPEND_TIME = 0, 1
ROW_GROUP_ROWS = 65_536
"""Rows per Parquet row group: small enough that a fetch of one offset reads a few MB."""

# Spark's Kafka source schema; ``topic`` is added at read time, not stored.
TABLE_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp", TIMESTAMP_TYPE, nullable=False),
    pa.field("timestampType", pa.int32(), nullable=False),
    pa.field("headers", HEADERS_TYPE),
])
FILE_SCHEMA = pa.schema([f for f in TABLE_SCHEMA if f.name != "partition"])
PARTITION_COLUMNS = ["partition"]


def table_uri(warehouse: str, topic: str) -> str:
    """Where a topic's Delta table lives."""
    return f"{warehouse.rstrip('/')}/{TOPICS_DIR}/{topic}"


def tier_app_id(partition: int) -> str:
    """The Delta app transaction id whose version is the partition's tiered offset."""
    return f"lakelog-tier-{partition}"


def start_app_id(partition: int) -> str:
    """The app transaction whose version is the partition's log start offset."""
    return f"lakelog-start-{partition}"


def cleaned_app_id(partition: int) -> str:
    """The app transaction whose version is the end of the compacted range."""
    return f"lakelog-cleaned-{partition}"


def files_app_id(partition: int) -> str:
    """The app transaction every file-removing commit of the partition advances."""
    return f"lakelog-files-{partition}"


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def local_path(uri: str) -> str:
    return uri.removeprefix("file://")


def delta_path(uri: str) -> str:
    """A file or table URI as delta-rs returns it (percent-encoded: ``jobs%20running``) as
    a path to open: local ones decoded."""
    return unquote(local_path(uri)) if is_local(uri) else uri


# -- converting between the hot and the cold form ------------------------------------
def to_table_rows(base_offset: int, records: pa.RecordBatch, log_append_time: bool
                  ) -> pa.RecordBatch:
    """A hot batch body (RECORD_SCHEMA) as cold rows (FILE_SCHEMA), offsets made explicit."""
    n = records.num_rows
    millis = records.column(0).cast(pa.timestamp("ms", tz="UTC"))
    return pa.RecordBatch.from_arrays([
        records.column(1),
        records.column(2),
        pa.array(np.arange(base_offset, base_offset + n, dtype=np.int64)),
        millis.cast(TIMESTAMP_TYPE),
        pa.array(np.full(n, LOG_APPEND_TIME if log_append_time else CREATE_TIME, np.int32)),
        records.column(3),
    ], schema=FILE_SCHEMA)


class ColdBatch(NamedTuple):
    """Rows of the cold tier back in the hot form: offsets ``base_offset ..`` dense."""

    base_offset: int
    records: pa.RecordBatch
    log_append_time: bool


def from_table_rows(rows: pa.Table) -> Iterator[ColdBatch]:
    """Cold rows sorted by offset as hot-form batches: one per run of consecutive offsets
    (compaction leaves holes) with one timestamp type."""
    if rows.num_rows == 0:
        return
    ts_type = rows.column("timestampType").to_numpy()
    offsets = rows.column("offset").to_numpy()
    breaks = (np.diff(ts_type) != 0) | (np.diff(offsets) != 1)
    cuts = [0, *(np.flatnonzero(breaks) + 1).tolist(), rows.num_rows]
    millis = pc.divide(rows.column("timestamp").cast(pa.int64()), 1000)
    body = pa.Table.from_arrays(
        [millis, rows.column("key"), rows.column("value"), rows.column("headers")],
        schema=RECORD_SCHEMA).combine_chunks()
    for lo, hi in itertools.pairwise(cuts):
        first = int(offsets[lo])
        for rb in body.slice(lo, hi - lo).to_batches():
            yield ColdBatch(first, rb, bool(ts_type[lo] == LOG_APPEND_TIME))
            first += rb.num_rows


def _iso_ms(micros: int) -> str:
    return datetime.fromtimestamp(micros / 1_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def file_stats(rows: pa.RecordBatch | pa.Table, key_nulls: int | None = None,
               value_nulls: int | None = None) -> str:
    """Delta stats JSON of a file's rows (sorted by offset; ``key``/``value`` columns may be
    left out when their null counts are given)."""
    n = rows.num_rows
    ts = pc.min_max(rows.column("timestamp").cast(pa.int64()))
    tt = pc.min_max(rows.column("timestampType"))
    offsets = rows.column("offset")
    return json.dumps({
        "numRecords": n,
        "minValues": {"offset": offsets[0].as_py(), "timestamp": _iso_ms(ts["min"].as_py()),
                      "timestampType": tt["min"].as_py()},
        "maxValues": {"offset": offsets[n - 1].as_py(), "timestamp": _iso_ms(ts["max"].as_py()),
                      "timestampType": tt["max"].as_py()},
        "nullCount": {"key": rows.column("key").null_count if key_nulls is None else key_nulls,
                      "value": rows.column("value").null_count if value_nulls is None
                      else value_nulls,
                      "offset": 0, "timestamp": 0, "timestampType": 0},
    })


def parquet_file_stats(path: str) -> tuple[int, int, int, str]:
    """(rows, min offset, max offset, Delta stats JSON) of a Parquet file written by anyone
    (Spark included), sorted by offset: three small columns read, null counts from the footer."""
    pf = pq.ParquetFile(path)
    meta = pf.metadata
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    nulls = dict.fromkeys(("key", "value"), 0)
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for name in nulls:
            stats = group.column(names.index(name)).statistics
            nulls[name] += stats.null_count if stats is not None and stats.has_null_count else 0
    rows = pf.read(columns=["offset", "timestamp", "timestampType"])
    if rows.schema.field("timestamp").type != TIMESTAMP_TYPE:
        raise StorageError(f"{path}: timestamps stored as {rows.schema.field('timestamp').type}, "
                           f"expected {TIMESTAMP_TYPE} (spark.sql.parquet.outputTimestampType)")
    offsets = rows.column("offset")
    return (rows.num_rows, offsets[0].as_py(), offsets[-1].as_py(),
            file_stats(rows, nulls["key"], nulls["value"]))


def write_rows(path: str, batches: Sequence[pa.RecordBatch]) -> int:
    """Write cold rows to one Parquet file; returns its size in bytes."""
    table = pa.Table.from_batches(batches, FILE_SCHEMA)
    pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS, compression="snappy",
                   write_statistics=["offset", "timestamp", "timestampType"])
    return os.path.getsize(path)


# -- the table ----------------------------------------------------------------------------
class ColdFile(NamedTuple):
    """One data file of the table, as its add action describes it."""

    path: str
    """Absolute path or URI."""
    partition: int
    min_offset: int
    max_offset: int
    min_timestamp_ms: int
    max_timestamp_ms: int
    num_records: int
    size_bytes: int


class PartitionState(NamedTuple):
    """What the cold tier holds of one partition at one table version."""

    tiered_offset: int
    """The next offset to tier (0 when nothing is tiered)."""
    start_offset: int
    """The log start offset (0 until retention or DeleteRecords moves it)."""
    size_bytes: int
    files: tuple[ColdFile, ...]
    """Sorted by offset; a compacted file has holes, a file may start below ``start_offset``."""
    cleaned_offset: int = 0
    """Offsets below this were compacted (the cleaner checkpoint)."""
    files_version: int = 0
    """How many commits have removed files of this partition."""

    @property
    def log_start_offset(self) -> int | None:
        """The lowest offset the cold tier answers for, or None when it covers nothing."""
        return self.start_offset if self.tiered_offset > self.start_offset else None


def log_start(hot_start: int, cold: PartitionState | None) -> int:
    """A partition's log start offset across both tiers.

    The Delta tier covers ``[start_offset, tiered_offset)`` (compaction only leaves
    holes, read as the next offset); above it, or with nothing tiered, the hot tier's
    start counts, but never below a log start another process has already moved."""
    if cold is None:
        return hot_start
    if cold.log_start_offset is not None:
        return cold.log_start_offset
    return max(cold.start_offset, hot_start)


def create_table(uri: str, topic_id: str) -> None:
    """Create an empty topic table (an existing one is left alone)."""
    try:
        create_table_with_add_actions(uri, Schema.from_arrow(TABLE_SCHEMA), [], mode="ignore",
                                      partition_by=PARTITION_COLUMNS,
                                      description=f"lakelog topic_id={topic_id}")
    except Exception as exc:  # delta-rs raises plain errors for a racing create
        if open_table(uri) is None:
            raise StorageError(f"cannot create Delta table {uri}: {exc}") from None


def set_aside_torn_commit(uri: str) -> str | None:
    """Move a newest ``_delta_log/<v>.json`` that is not whole JSON lines to
    ``<table>/_torn_commits/`` so the table opens at v-1; returns where it went.

    delta-rs writes a commit to a temporary file and renames it into place, so a torn
    newest entry was never committed (a crash on a file system without atomic
    renames, or damage): like a torn tail of a segment, it is set aside, and its data
    files are orphans that vacuum removes. Only the newest entry is touched; damage
    further back stays an error that names the file.
    """
    if not is_local(uri):
        return None
    log_dir = os.path.join(local_path(uri), "_delta_log")
    try:
        commits = sorted(n for n in os.listdir(log_dir)
                         if n.endswith(".json") and n[:-5].isdigit())
    except FileNotFoundError:
        return None
    if not commits:
        return None
    newest = os.path.join(log_dir, commits[-1])
    with open(newest, "rb") as f:
        data = f.read()
    try:
        for line in data.splitlines():
            if line.strip():
                json.loads(line)
        return None
    except ValueError:
        pass
    torn_dir = os.path.join(local_path(uri), "_torn_commits")
    os.makedirs(torn_dir, exist_ok=True)
    dest = os.path.join(torn_dir, f"{commits[-1]}.{int(time.time() * 1000)}")
    os.replace(newest, dest)
    log.error("%s: the newest Delta log entry is torn (%d bytes, not whole JSON); set aside "
              "as %s, the table goes on from the entry before it", newest, len(data), dest)
    return dest


def load_table(uri: str, version: int | None = None) -> DeltaTable:
    """``DeltaTable(uri)``, setting a torn newest log entry aside once if it fails."""
    try:
        return DeltaTable(uri, version=version)
    except TableNotFoundError:
        raise
    except DeltaError:
        if set_aside_torn_commit(uri) is None:
            raise
    return DeltaTable(uri, version=version)


def open_table(uri: str, version: int | str | datetime | None = None) -> DeltaTable | None:
    """The topic's Delta table, or None when it does not exist yet."""
    try:
        dt = load_table(uri, version=version if isinstance(version, int) else None)
    except TableNotFoundError:
        return None
    if version is not None and not isinstance(version, int):
        dt.load_as_version(version)
    return dt


def table_topic_id(dt: DeltaTable) -> str | None:
    description = dt.metadata().description or ""
    return description.removeprefix("lakelog topic_id=") if description.startswith("lakelog") else None


def snapshot(dt: DeltaTable, partitions: int) -> list[PartitionState]:
    """Per partition: tiered offset, first offset, bytes and files, from the log alone."""
    actions = pa.table(dt.get_add_actions(flatten=True))
    root = delta_path(dt.table_uri).rstrip("/")
    files: dict[int, list[ColdFile]] = {p: [] for p in range(partitions)}
    if actions.num_rows:
        cols = {name: actions.column(name).to_pylist() for name in (
            "path", "partition.partition", "min.offset", "max.offset", "min.timestamp",
            "max.timestamp", "num_records", "size_bytes")}
        for i, path in enumerate(cols["path"]):
            p = cols["partition.partition"][i]
            if p not in files:
                continue
            files[p].append(ColdFile(
                f"{root}/{path}", p, cols["min.offset"][i], cols["max.offset"][i],
                _ms(cols["min.timestamp"][i]), _ms(cols["max.timestamp"][i]),
                cols["num_records"][i], cols["size_bytes"][i]))
    out = []
    for p in range(partitions):
        fs = tuple(sorted(files[p], key=lambda f: f.min_offset))
        out.append(PartitionState(
            dt.transaction_version(tier_app_id(p)) or 0,
            dt.transaction_version(start_app_id(p)) or 0,
            sum(f.size_bytes for f in fs), fs,
            dt.transaction_version(cleaned_app_id(p)) or 0,
            dt.transaction_version(files_app_id(p)) or 0))
    return out


def _ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def read_files(files: Sequence[ColdFile], start: int, end: int,
               columns: Sequence[str] | None = None, limit: int | None = None) -> pa.Table:
    """Rows with ``start <= offset < end`` of the given files, sorted by offset
    (the first ``limit`` of them: row groups past those are not read)."""
    chosen = sorted((f for f in files if f.max_offset >= start and f.min_offset < end),
                    key=lambda f: f.min_offset)
    if not chosen:
        return FILE_SCHEMA.empty_table()
    where = (ds.field("offset") >= start) & (ds.field("offset") < end)
    cols = list(columns) if columns else None
    if limit is None:
        dataset = ds.dataset([_path(f) for f in chosen], schema=FILE_SCHEMA, format="parquet")
        return dataset.to_table(columns=cols, filter=where).sort_by("offset")
    parts: list[pa.Table] = []
    wanted = limit
    for f in chosen:  # files do not overlap and are sorted: stop once enough rows are read
        dataset = ds.dataset([_path(f)], schema=FILE_SCHEMA, format="parquet")
        part = dataset.scanner(columns=cols, filter=where).head(wanted)
        parts.append(part)
        wanted -= part.num_rows
        if wanted <= 0:
            break
    return pa.concat_tables(parts).sort_by("offset")


def _path(f: ColdFile) -> str:
    return local_path(f.path) if is_local(f.path) else f.path


class _Cached(NamedTuple):
    checked_at: float
    """``time.monotonic()`` of the last look at the table's log."""
    table: DeltaTable
    partitions: int
    version: int
    """The table version ``states`` were read at."""
    states: list[PartitionState]


def next_commit_path(uri: str, version: int) -> str:
    """Where the commit after ``version`` of a local table will appear (delta-rs renames
    a whole ``<version>.json`` into ``_delta_log/``)."""
    return os.path.join(local_path(uri), "_delta_log", f"{version + 1:020d}.json")


class ColdTables:
    """Cached table handles and partition states of one warehouse.

    A local table is read again as soon as a newer commit exists (one ``stat`` of
    the next commit's file per call), so every call sees every commit that finished
    before it, whichever process made it: a ``lakelog jobs tier`` that has just
    reported its records is seen by the next request. An object-store table is
    looked at again after ``max_age_s``. One lock per topic: a refresh (update the
    handle, read the states at the version it reached) is never interleaved with
    another, which could otherwise leave states of an older version cached as the
    newest."""

    def __init__(self, warehouse: str, max_age_s: float = 1.0) -> None:
        self.warehouse = warehouse
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._cache: dict[str, _Cached] = {}

    def _topic_lock(self, topic: str) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(topic, threading.Lock())

    def _current(self, topic: str, cached: _Cached) -> bool:
        uri = table_uri(self.warehouse, topic)
        if is_local(uri):
            return not os.path.exists(next_commit_path(uri, cached.version))
        return time.monotonic() - cached.checked_at < self.max_age_s

    def state(self, topic: str, partitions: int, topic_id: str, *, refresh: bool = False
              ) -> list[PartitionState] | None:
        """The cold state of every partition of ``topic`` (None: nothing tiered yet).

        A table left by an earlier topic of the same name (another topic id) counts as
        none: its tiered offsets say nothing about this topic's hot segments."""
        with self._topic_lock(topic):
            cached = self._cache.get(topic)
            if cached and not refresh and cached.partitions == partitions and \
                    self._current(topic, cached):
                return cached.states
            now = time.monotonic()
            if cached:
                dt = cached.table
                dt.update_incremental()
            else:
                opened = open_table(table_uri(self.warehouse, topic))
                if opened is None:
                    return None
                dt = opened
            if table_topic_id(dt) != topic_id:
                self._cache.pop(topic, None)
                return None
            version = dt.version()
            if cached and version == cached.version and cached.partitions == partitions:
                states = cached.states  # no new commit: the states still hold
            else:
                states = snapshot(dt, partitions)
            self._cache[topic] = _Cached(now, dt, partitions, version, states)
            return states

    def forget(self, topic: str) -> None:
        with self._topic_lock(topic):
            self._cache.pop(topic, None)
