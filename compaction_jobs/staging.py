"""Where a job writes the files it adds to a table, before its commit takes them.

A local table (a file system with rename and flock): a job writes under
``<table>/_stage/<job_id>/`` (vacuum never looks there), holding an flock on
``.lock`` while it runs. Before it moves files into the table it writes
``manifest.json`` listing where they go, so that if it dies between the move and
the commit, the next job finds the directory (its lock is free), deletes the moved
files no commit references, and removes it.

An object store (no rename, no lock): a job's tasks write each file straight to a
final name under the table that holds the job id, so no two jobs ever write one
name. Nothing reads a file no commit references; a job that loses its commit
deletes its files (best effort), and a job that dies leaves them to the vacuum job,
which deletes files in no commit once they are older than its grace period.
``Outputs`` is the one interface the jobs use for both.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Mapping

from deltalake import DeltaTable

from log_tables.cold.commit import relative_path
from log_tables.cold.table import STAGE_DIR
from log_tables.layout import is_local, local_path
from log_tables.storage import delete_files, object_store_env

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"


def new_job_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


class StageDir:
    """One job's stage directory in one table, locked while the job runs."""

    def __init__(self, table_uri: str, job_id: str) -> None:
        self.root = local_path(table_uri)
        self.path = os.path.join(self.root, STAGE_DIR, job_id)
        os.makedirs(self.path, exist_ok=True)
        self._fd: int | None = os.open(os.path.join(self.path, ".lock"), os.O_RDWR | os.O_CREAT,
                                       0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def move_in(self, finals: Mapping[str, str]) -> None:
        """Record then move staged files (absolute path → path relative to the table)."""
        with open(os.path.join(self.path, MANIFEST), "w") as fh:
            json.dump(sorted(finals.values()), fh)
        for src, rel in finals.items():
            os.makedirs(os.path.join(self.root, os.path.dirname(rel)), exist_ok=True)
            os.replace(src, os.path.join(self.root, rel))

    def discard(self, rels: list[str]) -> None:
        """Delete moved files that will never be committed."""
        for rel in rels:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.root, rel))

    def close(self, *, remove: bool = True) -> None:
        if remove:
            shutil.rmtree(self.path, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Outputs:
    """One job run's new files in one table: staged and renamed in (a local table), or
    written straight to their final names (an object store: ``direct``)."""

    def __init__(self, table_uri: str, job_id: str) -> None:
        self.uri = table_uri.rstrip("/")
        self.job_id = job_id
        self.direct = not is_local(table_uri)
        self.env = object_store_env(table_uri)
        """The store's settings, for the Spark tasks that write (never logged)."""
        self._stage = None if self.direct else StageDir(table_uri, job_id)

    def path(self, staged_name: str, final: str) -> str:
        """Where a task writes a file: ``staged_name`` in the stage directory, or (direct)
        ``final`` (relative to the table, holding the job id) itself."""
        if self._stage is None:
            return f"{self.uri}/{final}"
        return os.path.join(self._stage.path, staged_name)

    def move_in(self, finals: Mapping[str, str]) -> None:
        """Put written files (path → path relative to the table) at their final names:
        a rename each, or nothing when they were written there."""
        if self._stage is not None:
            self._stage.move_in(finals)

    def discard(self, rels: list[str]) -> None:
        """Delete files (relative to the table) that will never be committed."""
        if self._stage is not None:
            self._stage.discard(rels)
        else:
            delete_files([f"{self.uri}/{rel}" for rel in rels])

    def close(self) -> None:
        if self._stage is not None:
            self._stage.close()


def clean_orphans(uri: str, dt: DeltaTable, min_age_s: float = 60.0) -> int:
    """Remove stage directories of jobs that are gone, and files they moved in but never
    committed; returns how many files were deleted.

    A running job holds the lock in its directory; ``min_age_s`` keeps a job that
    has just made its directory (and not yet taken the lock) safe. An object-store
    table has no stage directories: its orphans are the vacuum job's."""
    if not is_local(uri):
        return 0
    stage = os.path.join(local_path(uri), STAGE_DIR)
    try:
        entries = os.listdir(stage)
    except FileNotFoundError:
        return 0
    removed = 0
    referenced: set[str] | None = None
    for name in entries:
        directory = os.path.join(stage, name)
        try:
            if time.time() - os.stat(directory).st_mtime < min_age_s:
                continue
            fd = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its job is still running
            try:
                with open(os.path.join(directory, MANIFEST)) as fh:
                    moved = json.load(fh)
            except FileNotFoundError:
                moved = []
            if moved and referenced is None:
                dt.update_incremental()
                referenced = {relative_path(uri, f) for f in dt.file_uris()}
            for rel in moved:
                if rel not in (referenced or set()):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(local_path(uri), rel))
                        removed += 1
            shutil.rmtree(directory, ignore_errors=True)
            log.info("removed the stage directory of dead job %s (%d uncommitted files)",
                     name, removed)
        finally:
            os.close(fd)
    return removed
