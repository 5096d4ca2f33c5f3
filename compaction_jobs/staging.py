"""Stage directories: where a job writes new files before they enter a table.

A job writes under ``<table>/_stage/<job_id>/`` (vacuum never looks there),
holding an flock on ``.lock`` while it runs. Before it moves files into the
table it writes ``manifest.json`` listing where they go, so that if it dies
between the move and the commit, the next job finds the directory (its lock is
free), deletes the moved files no commit references, and removes it.
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
from log_tables.layout import local_path

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


def clean_orphans(uri: str, dt: DeltaTable, min_age_s: float = 60.0) -> int:
    """Remove stage directories of jobs that are gone, and files they moved in but never
    committed; returns how many files were deleted.

    A running job holds the lock in its directory; ``min_age_s`` keeps a job that
    has just made its directory (and not yet taken the lock) safe."""
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
