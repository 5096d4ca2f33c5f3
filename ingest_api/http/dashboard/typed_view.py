"""Typed and upsert topics for the dashboard and ``/metrics``: each partition's typed
offset and dead letters (``log_tables.typed.status``), read at most once every
``CACHE_S`` (delta-rs, the tables' logs only)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from log_tables.layout import Layout
from log_tables.registry import TopicMetadata
from log_tables.typed.status import TypedPartition, typed_status

log = logging.getLogger(__name__)
CACHE_S = 5.0


class TypedTablesView:
    """A cached view of every typed topic's tables (thread-safe)."""

    def __init__(self, layout: Layout, topics: Callable[[], list[TopicMetadata]]) -> None:
        self.layout = layout
        self.topics = topics
        self._lock = threading.Lock()
        self._read_at = -CACHE_S
        self._status: dict[str, list[TypedPartition]] = {}

    def snapshot(self) -> dict[str, list[TypedPartition]]:
        """Topic → its partitions, as of at most ``CACHE_S`` ago (blocks on a refresh:
        call it off the event loop)."""
        with self._lock:
            if time.monotonic() - self._read_at >= CACHE_S:
                self._read_at = time.monotonic()
                status = {}
                for meta in self.topics():
                    try:
                        found = typed_status(self.layout, meta)
                    except Exception:
                        log.exception("reading the typed tables of %s failed", meta.name)
                        found = self._status.get(meta.name, [])
                    if found:
                        status[meta.name] = found
                self._status = status
            return self._status
