"""The leader-epoch cache of one partition (Kafka's ``LeaderEpochFileCache``, KIP-101).

Each entry ``(epoch, start_offset)`` says that the leader of ``epoch`` wrote its first
record at ``start_offset``. A leader adds its entry when it starts leading (at its log
end); a follower copies the leader's entries with the batches it fetches. After a
leader change a follower asks the new leader where its own latest epoch ends
(``end_offset_for``, Kafka's OffsetsForLeaderEpoch) and truncates there: records a
deposed leader wrote that nobody else has are cut, and records below the high
watermark never are. Truncating by the high watermark alone loses acknowledged
records or keeps divergent ones (KIP-101's two scenarios); the test of each is named
in docs/architecture.md.

File ``leader-epoch-checkpoint`` in the partition directory: a JSON list of
``[epoch, start_offset]``, replaced atomically (and synced) on every change, which
happens once per leader change, not per append.
"""

from __future__ import annotations

import json
import threading
from bisect import bisect_right
from pathlib import Path
from typing import NamedTuple

from log_tables.errors import StorageError
from log_tables.files import atomic_write

EPOCH_FILE = "leader-epoch-checkpoint"
UNDEFINED = -1


class EpochEnd(NamedTuple):
    """The answer to "where does my epoch end": the largest epoch at or below the one
    asked for that this log knows, and the offset after its last record."""

    epoch: int
    end_offset: int


class LeaderEpochCache:
    """Entries in increasing epoch and non-decreasing start offset."""

    def __init__(self, directory: Path, name: str) -> None:
        self.path = directory / EPOCH_FILE
        self.name = name
        self._lock = threading.Lock()
        self._entries: list[tuple[int, int]] = self._load()

    def _load(self) -> list[tuple[int, int]]:
        try:
            raw = json.loads(self.path.read_bytes())
            entries = [(int(e), int(s)) for e, s in raw]
        except FileNotFoundError:
            return []
        except (ValueError, TypeError) as exc:
            raise StorageError(f"{self.name}: leader-epoch checkpoint {self.path} is "
                               f"unreadable ({exc}); remove it to rebuild from the leader"
                               ) from None
        return entries

    def _save(self) -> None:
        try:
            atomic_write(self.path, json.dumps(self._entries).encode())
        except OSError as exc:
            raise StorageError(f"{self.name}: cannot write {self.path}: {exc.strerror}",
                               exc.errno) from None

    @property
    def entries(self) -> list[tuple[int, int]]:
        with self._lock:
            return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        with self._lock:
            return self._entries[-1][0] if self._entries else UNDEFINED

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Epoch ``epoch`` starts at ``start_offset``; returns whether that was news.

        An epoch older than the latest is ignored; entries starting past
        ``start_offset`` are dropped (they were never written to by a leader whose
        records this log kept)."""
        with self._lock:
            if self._entries and epoch <= self._entries[-1][0]:
                return False
            while self._entries and self._entries[-1][1] > start_offset:
                self._entries.pop()
            self._entries.append((epoch, start_offset))
            self._save()
            return True

    def end_offset_for(self, epoch: int, log_end_offset: int) -> EpochEnd:
        """Kafka's ``endOffsetFor``: for the latest epoch, the log end; for an older one,
        where the next larger epoch starts; for an epoch this log does not know, the
        largest one below it (KIP-279) and where that one ends; (-1, -1) when even the
        first entry is newer than ``epoch`` or there are none."""
        with self._lock:
            entries = self._entries
            if not entries or epoch < entries[0][0]:
                return EpochEnd(UNDEFINED, UNDEFINED)
            if epoch >= entries[-1][0]:
                return EpochEnd(entries[-1][0], log_end_offset)
            i = bisect_right([e for e, _ in entries], epoch) - 1
            return EpochEnd(entries[i][0], entries[i + 1][1])

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was cut at ``end_offset``: entries starting at or after it go."""
        with self._lock:
            keep = [(e, s) for e, s in self._entries if s < end_offset]
            if len(keep) != len(self._entries):
                self._entries = keep
                self._save()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at ``start_offset``: entries wholly below it go, and the one
        that holds it starts there."""
        with self._lock:
            later = [(e, s) for e, s in self._entries if s >= start_offset]
            below = [(e, s) for e, s in self._entries if s < start_offset]
            if not below:
                return
            keep = ([(below[-1][0], start_offset)] if not later or later[0][1] > start_offset
                    else []) + later
            if keep != self._entries:
                self._entries = keep
                self._save()

    def clear(self) -> None:
        with self._lock:
            if self._entries:
                self._entries = []
                self._save()
