"""The SQL endpoint's state file, ``<data_dir>/sql-endpoint.json``: written by the
endpoint's process (``starting``, ``ready`` with its addresses, ``failed`` with the
error), read by ``lakelog sql`` and the server's health (light: no Spark, no jobs)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

STATE_FILE = "sql-endpoint.json"


def state_path(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / STATE_FILE


def read_state(data_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The endpoint's state as it last wrote it, or None (none runs, or it is gone). A
    ``failed`` state outlives its process (it says why the endpoint is gone) until the
    next endpoint starts; another one is kept only while its process lives."""
    try:
        state: dict[str, Any] = json.loads(state_path(data_dir).read_text())
    except (FileNotFoundError, ValueError):
        return None
    if state.get("state") == "failed":
        return state
    pid = state.get("pid")
    return state if isinstance(pid, int) and _alive(pid) else None


def _alive(pid: int) -> bool:
    """Running (a zombie its parent has not reaped yet counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def write_state(data_dir: str, **state: Any) -> None:
    """Replace the state file atomically with this process's ``state``."""
    path = state_path(data_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "since_ms": int(time.time() * 1000),
                               **state}))
    tmp.replace(path)
