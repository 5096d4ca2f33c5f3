"""Cached table handles and partition states of one warehouse, refreshed on a new commit."""

from __future__ import annotations

import os
import threading
import time
from typing import NamedTuple

from deltalake import DeltaTable

from log_tables.cold.table import PartitionState, open_table, snapshot, table_topic_id
from log_tables.layout import is_local, local_path, table_uri


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
