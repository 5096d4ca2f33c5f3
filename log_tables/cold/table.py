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

import json
import logging
import os
import time
from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable, Schema
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.transaction import create_table_with_add_actions

from log_tables.cold.rows import FILE_SCHEMA, TABLE_SCHEMA
from log_tables.errors import StorageError
from log_tables.layout import delta_path, is_local, local_path
from log_tables.storage import filesystem, storage_options

log = logging.getLogger(__name__)

STAGE_DIR = "_stage"
PARTITION_COLUMNS = ["partition"]


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
                                      description=f"lakelog topic_id={topic_id}",
                                      storage_options=storage_options(uri))
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
        return DeltaTable(uri, version=version, storage_options=storage_options(uri))
    except TableNotFoundError:
        raise
    except DeltaError:
        if set_aside_torn_commit(uri) is None:
            raise
    return DeltaTable(uri, version=version, storage_options=storage_options(uri))


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
    if not description.startswith("lakelog topic_id="):
        return None
    words = description.removeprefix("lakelog topic_id=").split()  # (a typed table's says more)
    return words[0] if words else ""


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
               columns: Sequence[str] | None = None, limit: int | None = None,
               env: tuple[tuple[str, str], ...] | None = None) -> pa.Table:
    """Rows with ``start <= offset < end`` of the given files, sorted by offset
    (the first ``limit`` of them: row groups past those are not read); ``env``: an
    object store's settings to use instead of this process's (in a Spark task)."""
    chosen = sorted((f for f in files if f.max_offset >= start and f.min_offset < end),
                    key=lambda f: f.min_offset)
    if not chosen:
        return FILE_SCHEMA.empty_table()
    where = (ds.field("offset") >= start) & (ds.field("offset") < end)
    fs, _ = filesystem(chosen[0].path, env or None)
    cols = list(columns) if columns else None
    if limit is None:
        dataset = ds.dataset([_path(f) for f in chosen], schema=FILE_SCHEMA, format="parquet",
                             filesystem=fs)
        return dataset.to_table(columns=cols, filter=where).sort_by("offset")
    parts: list[pa.Table] = []
    wanted = limit
    for f in chosen:  # files do not overlap and are sorted: stop once enough rows are read
        dataset = ds.dataset([_path(f)], schema=FILE_SCHEMA, format="parquet", filesystem=fs)
        part = dataset.scanner(columns=cols, filter=where).head(wanted)
        parts.append(part)
        wanted -= part.num_rows
        if wanted <= 0:
            break
    return pa.concat_tables(parts).sort_by("offset")


def _path(f: ColdFile) -> str:
    return local_path(f.path) if is_local(f.path) else filesystem(f.path)[1]
