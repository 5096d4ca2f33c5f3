"""``<data_dir>/group_subscriptions.json``: the topics each live group subscribes to.

Members live in the server's memory, but readers in other processes (the SQL
views of ``lakelog sql``, a notebook's Spark session) list lag for every topic a
group reads, and a live member may read a topic the group has committed nothing
for yet. So the server writes this file whenever membership changes (at most
every 100 ms, from its session-check loop), and writes it empty when it starts
and when it stops: no member outlives its server. After a SIGKILL the file
keeps the last subscriptions until the server starts again.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from log_tables.errors import StorageError
from log_tables.files import atomic_write

SUBSCRIPTIONS_FILE = "group_subscriptions.json"


def subscriptions_path(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / SUBSCRIPTIONS_FILE


def write_subscriptions(data_dir: str | os.PathLike[str],
                        groups: Mapping[str, Sequence[str]]) -> None:
    """Replace the file (atomically) with ``{group: [topic, ...]}``."""
    body = {"written_ms": int(time.time() * 1000),
            "groups": {g: sorted(topics) for g, topics in sorted(groups.items())}}
    atomic_write(subscriptions_path(data_dir), json.dumps(body).encode())


class SubscriptionWriter:
    """The server's writer: one write at a time (they run in worker threads), and none
    after ``close``, which leaves the file empty."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.data_dir = data_dir
        self._lock = threading.Lock()
        self._closed = False

    def write(self, groups: Mapping[str, Sequence[str]]) -> None:
        with self._lock:
            if not self._closed:
                write_subscriptions(self.data_dir, groups)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            write_subscriptions(self.data_dir, {})


def read_subscriptions(data_dir: str | os.PathLike[str]) -> dict[str, list[str]]:
    """``{group: [topic, ...]}`` as the server last wrote it; empty when there is no file."""
    path = subscriptions_path(data_dir)
    try:
        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise StorageError(f"{path} is unreadable ({exc}): delete it; the server writes it "
                           "again when it starts") from None
    groups = raw.get("groups") if isinstance(raw, dict) else None
    if not isinstance(groups, dict) or not all(
            isinstance(t, list) and all(isinstance(x, str) for x in t) for t in groups.values()):
        raise StorageError(f"{path} is not a map of group to topics: delete it; the server "
                           "writes it again when it starts")
    return {str(g): list(t) for g, t in groups.items()}
