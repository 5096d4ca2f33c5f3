"""What the jobs did, for the dashboard and ``/metrics``: ``<warehouse>/_job_runs`` read
with delta-rs (the server never starts Spark), at most once every ``CACHE_S``.

A refresh is cheap and bounded: the held table handle catches up on new commits
only, the file list with its per-file stats (``max.end``) picks the files of the
runs that ended in the last ``RECENT_MS`` (and always the newest few, so that the
last runs show however old they are), at most ``MAX_FILES``; a file is read once and
kept while it is picked (the jobs only append files, one per run).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from log_tables.cold import job_runs
from log_tables.layout import delta_path
from log_tables.storage import filesystem, storage_options

log = logging.getLogger(__name__)

CACHE_S = 5.0
RECENT_MS = 3_600_000
"""Runs counted by ``lakelog_job_runs``: those that ended within this."""
NEWEST_FILES = 20
MAX_FILES = 500
SHOWN_ROWS = 25


class JobRunsSnapshot(NamedTuple):
    rows: list[dict[str, Any]]
    """The newest rows (one per run and partition), newest first."""
    last: dict[str, dict[str, Any]]
    """Each job's newest run: end, duration, status, error."""
    recent: dict[tuple[str, str], int]
    """(job, status) -> runs that ended within ``RECENT_MS`` (a run failed if any of its
    rows did)."""
    error: str | None = None
    """Why the table could not be read (the rest is the last good read)."""


EMPTY = JobRunsSnapshot([], {}, {})


class JobRunsView:
    """A cached view of ``_job_runs`` (thread-safe: the page and ``/metrics`` share it)."""

    def __init__(self, warehouse: str, clock: Callable[[], float] = time.time) -> None:
        self.warehouse = warehouse
        self.uri = job_runs.job_runs_uri(warehouse)
        self.clock = clock
        self._lock = threading.Lock()
        self._table: DeltaTable | None = None
        self._files: dict[str, pa.Table] = {}
        self._snapshot = EMPTY
        self._read_at = -CACHE_S

    def snapshot(self) -> JobRunsSnapshot:
        """The runs as of at most ``CACHE_S`` ago (blocks on a refresh: call it off the
        event loop)."""
        with self._lock:
            if time.monotonic() - self._read_at >= CACHE_S:
                self._read_at = time.monotonic()
                try:
                    self._snapshot = self._refresh()
                except Exception as exc:
                    log.exception("reading %s failed", self.uri)
                    self._snapshot = self._snapshot._replace(error=f"{type(exc).__name__}: {exc}")
            return self._snapshot

    def _open(self) -> DeltaTable | None:
        if self._table is None:
            try:
                self._table = DeltaTable(self.uri, storage_options=storage_options(self.uri))
            except TableNotFoundError:  # no job has recorded a run yet
                return None
        else:
            self._table.update_incremental()
        return self._table

    def _refresh(self) -> JobRunsSnapshot:
        dt = self._open()
        if dt is None:
            return EMPTY
        now_ms = int(self.clock() * 1000)
        actions = pa.table(dt.get_add_actions(flatten=True)).select(["path", "max.end"])
        ends = pc.fill_null(actions.column("max.end").cast(pa.int64()), 0)
        order = pc.array_sort_indices(ends, order="descending")
        picked: list[str] = []
        for i in order.to_pylist()[:MAX_FILES]:
            if len(picked) >= NEWEST_FILES and ends[i].as_py() < (now_ms - RECENT_MS) * 1000:
                break
            picked.append(actions.column("path")[i].as_py())
        uris = {u.rsplit("/", 1)[-1]: u for u in dt.file_uris()}
        fs, _ = filesystem(self.warehouse)
        self._files = {path: self._files.get(path) or ds.dataset(
            filesystem(delta_path(uris[path.rsplit("/", 1)[-1]]))[1], schema=job_runs.SCHEMA,
            format="parquet", filesystem=fs).to_table() for path in picked}
        if not self._files:
            return EMPTY
        return _summary(pa.concat_tables(self._files.values()), now_ms)


def _ms(when: Any) -> int:
    return int(when.timestamp() * 1000) if when is not None else 0


def _summary(table: pa.Table, now_ms: int) -> JobRunsSnapshot:
    """The newest rows, each job's last run and the runs per job and status (grouped in
    Arrow: the files of an hour of runs on many partitions are many rows)."""
    newest = table.sort_by([("start", "descending")])
    flagged = table.append_column("failed", pc.equal(table["status"], job_runs.FAILED)) \
        .append_column("dry", pc.equal(table["status"], job_runs.DRY_RUN))
    grouped = flagged.group_by(["job", "job_id"]).aggregate(
        [("start", "min"), ("end", "max"), ("failed", "any"), ("dry", "all")])
    last: dict[str, dict[str, Any]] = {}
    recent: dict[tuple[str, str], int] = {}
    for run in grouped.to_pylist():
        status = job_runs.FAILED if run["failed_any"] else \
            job_runs.DRY_RUN if run["dry_all"] else job_runs.SUCCEEDED
        start_ms, end_ms = _ms(run["start_min"]), _ms(run["end_max"])
        if end_ms >= now_ms - RECENT_MS:
            recent[(run["job"], status)] = recent.get((run["job"], status), 0) + 1
        if end_ms > last.get(run["job"], {}).get("end_ms", -1):
            last[run["job"]] = {"job": run["job"], "job_id": run["job_id"], "status": status,
                                "start_ms": start_ms, "end_ms": end_ms,
                                "duration_ms": end_ms - start_ms, "error": None}
    for run in last.values():
        if run["status"] == job_runs.FAILED:
            errors = newest.filter(pc.equal(newest["job_id"], run.pop("job_id"))) \
                .column("error").drop_null()
            run["error"] = errors[0].as_py() if len(errors) else None
        else:
            run.pop("job_id")
    shown = [{"job": r["job"], "topic": r["topic"], "partition": r["partition"],
              "start_ms": _ms(r["start"]), "duration_ms": _ms(r["end"]) - _ms(r["start"]),
              "status": r["status"], "records": r["records_in"], "detail": r["detail"],
              "error": r["error"]} for r in newest.slice(0, SHOWN_ROWS).to_pylist()]
    return JobRunsSnapshot(shown, last, recent)
