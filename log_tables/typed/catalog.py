"""The schema registry as a job or a Spark task sees it: read from this data directory's
replica of ``__schemas``-0, without a broker.

A schema id never changes its schema, so what a replica holds is right as far as it
goes; it may lag the registry's leader by the records written a moment ago. A record
whose id is at or past the replica's next id is therefore *not known yet* for up to
``wait_s`` from the first time it is asked for (the job waits for it), then unknown: a
broker alone (``wait_s`` None) holds the registry itself, so such an id is unknown at
once, as are bytes that only look like the wire format. An id below the next id that has
no schema was deleted for good. Either way the record cannot be decoded
(``delta.errors.mode`` decides).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from log_tables.errors import CorruptRecordError, OffsetOutOfRangeError
from log_tables.hot.hot_reader import PartitionReader, list_segments
from log_tables.hot.isolation import READ_UNCOMMITTED, published_readable_end
from log_tables.layout import Layout
from log_tables.registry import SCHEMAS_TOPIC
from log_tables.typed.registry_state import Reference, RegistryState, Schema

log = logging.getLogger(__name__)


class NotYetKnown(LookupError):
    """A schema id past what this replica holds: written a moment ago elsewhere."""


class DeletedSchema(LookupError):
    """A schema id the registry gave once and no longer has (deleted for good)."""


class UnknownSchema(LookupError):
    """A schema id the registry never gave (as far as this replica can tell)."""


REFRESH_MIN_S = 0.5
"""An id past the replica re-reads it at most this often."""
MAX_MISSING = 10_000
CLUSTER_WAIT_S = 60.0
"""How long a cluster's broker waits for its replica of ``__schemas`` to bring an id."""


class Catalog:
    """Schemas by id from ``<data_dir>/hot/__schemas/0``, read on first use and again
    whenever an id past the last read is asked for."""

    def __init__(self, layout: Layout, wait_s: float | None = None) -> None:
        self.directory = Path(layout.data_dir) / "hot" / SCHEMAS_TOPIC / "0"
        self.wait_s = wait_s
        """How long an id past this replica is waited for (None: not at all)."""
        self._missing: dict[int, float] = {}
        self._refreshed_at = -REFRESH_MIN_S
        self._state = RegistryState()
        self._by_id: dict[int, Schema] = {}
        self._read_to = 0
        self._lock = threading.Lock()

    def schema(self, schema_id: int) -> Schema:
        """The schema of an id; ``NotYetKnown`` or ``DeletedSchema`` otherwise."""
        found = self._by_id.get(schema_id)
        if found is not None:
            return found
        if schema_id >= self._state.next_id and \
                time.monotonic() - self._refreshed_at >= REFRESH_MIN_S:
            self.refresh()  # (at most so often: bytes that only look framed give many ids)
        found = self._by_id.get(schema_id)
        if found is not None:
            return found
        if schema_id >= self._state.next_id:
            if len(self._missing) >= MAX_MISSING:
                self._missing.clear()
            first = self._missing.setdefault(schema_id, time.monotonic())
            if self.wait_s is not None and time.monotonic() - first <= self.wait_s:
                raise NotYetKnown(f"schema id {schema_id} is not in this broker's copy of "
                                  f"the registry yet (it holds ids below "
                                  f"{self._state.next_id})")
            raise UnknownSchema(f"schema id {schema_id} is not in the registry (it has given "
                                f"ids below {self._state.next_id})")
        raise DeletedSchema(f"schema id {schema_id} is not in the registry (deleted for good)")

    def reference(self, ref: Reference) -> Schema:
        """A referenced schema (``subject`` at ``version``)."""
        version = self._state.subjects.get(ref.subject, {}).get(ref.version)
        if version is None:
            self.refresh()
            version = self._state.subjects.get(ref.subject, {}).get(ref.version)
        if version is None:
            raise DeletedSchema(f"the schema reference {ref.name!r} ({ref.subject} version "
                                f"{ref.version}) is not in the registry")
        return version.schema

    def latest(self, subject: str) -> tuple[int, Schema] | None:
        """The newest live version's id and schema of a subject, as of the last read."""
        self.refresh()
        live = self._state.live(subject)
        return (live[-1].id, live[-1].schema) if live else None

    def refresh(self) -> None:
        """Read the records written since the last read (all of them after a compaction
        moved the log start past it)."""
        with self._lock:
            self._refreshed_at = time.monotonic()
            if not self.directory.exists():
                return
            segments = list_segments(self.directory)
            if segments and self._read_to < segments[0].base_offset:
                self._state, self._read_to = RegistryState(), segments[0].base_offset
            reader = PartitionReader(self.directory)
            # Below the published high watermark only: a record not on every in-sync
            # replica may be lost in a failover, and its id given to another schema.
            end = published_readable_end(self.directory, reader.end_offset(), READ_UNCOMMITTED)
            try:
                for batch in reader.batches(self._read_to, end, skip_damage=True,
                                            isolation=READ_UNCOMMITTED):
                    for k, v in zip(batch.records.column(1).to_pylist(),
                                    batch.records.column(2).to_pylist(), strict=True):
                        if k is not None:
                            self._state.apply(k, v)
            except (OffsetOutOfRangeError, CorruptRecordError, OSError) as exc:
                log.warning("reading the schema registry's records in %s: %s",
                            self.directory, exc)
            self._read_to = max(self._read_to, reader.read_to)
            self._by_id = {v.id: v.schema for versions in self._state.subjects.values()
                           for v in versions.values()}
