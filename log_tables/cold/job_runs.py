"""``<warehouse>/_job_runs``: one row per job run and partition, so an operator can see
what ran, what it did and what failed (SQL view ``job_runs``, HTTP ``/v3/.../jobs/runs``).

Every run appends its rows in one Delta commit (blind appends from several
processes rebase cleanly); the upkeep job checkpoints the table and drops rows
older than ``RETENTION_MS``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError

from log_tables.layout import delta_path
from log_tables.storage import filesystem, storage_options

log = logging.getLogger(__name__)

JOB_RUNS_DIR = "_job_runs"
RETENTION_MS = 7 * 24 * 3600 * 1000
"""Rows older than this are deleted by the upkeep job: the table stays small."""
MAX_ROWS_READ = 10_000
SUCCEEDED, FAILED, DRY_RUN = "succeeded", "failed", "dry_run"

SCHEMA = pa.schema([
    ("job", pa.string()),
    ("job_id", pa.string()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("start", pa.timestamp("us", tz="UTC")),
    ("end", pa.timestamp("us", tz="UTC")),
    ("status", pa.string()),
    ("records_in", pa.int64()),
    ("records_out", pa.int64()),
    ("bytes_in", pa.int64()),
    ("bytes_out", pa.int64()),
    ("detail", pa.string()),
    ("error", pa.string()),
])
SPARK_DDL = ("job STRING, job_id STRING, topic STRING, partition INT, start TIMESTAMP, "
             "`end` TIMESTAMP, status STRING, records_in BIGINT, records_out BIGINT, "
             "bytes_in BIGINT, bytes_out BIGINT, detail STRING, error STRING")


class JobRun(NamedTuple):
    """One row: what a job did to one partition (or to a whole topic: partition None)."""

    job: str
    job_id: str
    topic: str | None
    partition: int | None
    start_ms: int
    end_ms: int
    status: str
    records_in: int = 0
    records_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    detail: str | None = None
    """What was done, in words (offsets, files)."""
    error: str | None = None


def job_runs_uri(warehouse: str) -> str:
    return f"{warehouse.rstrip('/')}/{JOB_RUNS_DIR}"


def now_ms() -> int:
    return int(time.time() * 1000)


def _rows(runs: Sequence[JobRun]) -> pa.Table:
    cols = {name: [getattr(r, name) for r in runs] for name in JobRun._fields}
    ts = pa.timestamp("us", tz="UTC")
    return pa.table({
        "job": cols["job"], "job_id": cols["job_id"], "topic": cols["topic"],
        "partition": pa.array(cols["partition"], pa.int32()),
        "start": pa.array([ms * 1000 for ms in cols["start_ms"]], pa.int64()).cast(ts),
        "end": pa.array([ms * 1000 for ms in cols["end_ms"]], pa.int64()).cast(ts),
        "status": cols["status"],
        "records_in": pa.array(cols["records_in"], pa.int64()),
        "records_out": pa.array(cols["records_out"], pa.int64()),
        "bytes_in": pa.array(cols["bytes_in"], pa.int64()),
        "bytes_out": pa.array(cols["bytes_out"], pa.int64()),
        "detail": pa.array(cols["detail"], pa.string()),
        "error": pa.array(cols["error"], pa.string()),
    }, schema=SCHEMA)


def record(warehouse: str, runs: Sequence[JobRun]) -> None:
    """Append rows in one commit. A failure is logged, never raised: a job's outcome
    must not depend on its bookkeeping."""
    if not runs:
        return
    try:
        uri = job_runs_uri(warehouse)
        write_deltalake(uri, _rows(runs), mode="append", storage_options=storage_options(uri))
    except Exception:
        log.exception("could not record %d job run row(s) in %s", len(runs),
                      job_runs_uri(warehouse))


def read(warehouse: str, *, job: str | None = None, topic: str | None = None,
         status: str | None = None, limit: int = 100) -> list[dict[str, object]]:
    """The newest rows first, filtered; at most ``min(limit, MAX_ROWS_READ)``."""
    try:
        dt = DeltaTable(job_runs_uri(warehouse), storage_options=storage_options(warehouse))
    except TableNotFoundError:
        return []
    fs, _ = filesystem(warehouse)
    files = [filesystem(delta_path(u))[1] for u in dt.file_uris()]
    if not files:
        return []
    where = None
    for name, value in (("job", job), ("topic", topic), ("status", status)):
        if value is not None:
            cond = ds.field(name) == value
            where = cond if where is None else where & cond
    table = ds.dataset(files, schema=SCHEMA, format="parquet", filesystem=fs).to_table(filter=where)
    table = table.sort_by([("start", "descending")]).slice(0, min(limit, MAX_ROWS_READ))
    out: list[dict[str, object]] = table.to_pylist()
    for row in out:
        for key in ("start", "end"):
            when = row[key]
            if isinstance(when, datetime):
                row[key] = when.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return out


def trim(warehouse: str, retention_ms: int = RETENTION_MS) -> int:
    """Delete rows older than ``retention_ms`` and checkpoint; returns rows deleted."""
    try:
        dt = DeltaTable(job_runs_uri(warehouse), storage_options=storage_options(warehouse))
    except TableNotFoundError:
        return 0
    cutoff = datetime.fromtimestamp((now_ms() - retention_ms) / 1000, UTC)
    fs, _ = filesystem(warehouse)
    files = [filesystem(delta_path(u))[1] for u in dt.file_uris()]
    old = 0
    if files:
        starts = ds.dataset(files, schema=SCHEMA, format="parquet", filesystem=fs).to_table(columns=["start"])
        old = int(pc.sum(pc.less(starts.column("start"), pa.scalar(cutoff, SCHEMA.field("start").type))).as_py() or 0)
    if old:
        dt.delete(f"start < '{cutoff.strftime('%Y-%m-%dT%H:%M:%S')}Z'")
        dt.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
    if dt.version() % 10 == 0:
        dt.create_checkpoint()
    return old
