"""The ``high-watermark`` file of a replicated partition: how far readers in other
processes (the tiering job, Spark's ``read_topic``) may read.

Kafka keeps the high watermark in a checkpoint file too
(``replication-offset-checkpoint``, written every few seconds). Here the leader's
replica manager writes it when it moved, at most every ``replica.high.watermark.checkpoint.interval.ms``,
without fsync: it only ever lags the true high watermark, so a reader that trusts it
sees less, never a record an in-sync replica lacks. No file: the partition has one
replica and readers read to the log end.
"""

from __future__ import annotations

import json
from pathlib import Path

from log_tables.errors import StorageError
from log_tables.files import atomic_write

HW_FILE = "high-watermark"


def read_high_watermark(directory: Path) -> int | None:
    """The published high watermark; None when the partition is not replicated."""
    try:
        return int(json.loads((directory / HW_FILE).read_bytes())["high_watermark"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return 0  # unreadable: show nothing rather than too much


def write_high_watermark(directory: Path, name: str, offset: int) -> None:
    try:
        atomic_write(directory / HW_FILE, json.dumps({"high_watermark": offset}).encode(),
                     sync=False)
    except OSError as exc:
        raise StorageError(f"{name}: cannot write {directory / HW_FILE}: {exc.strerror}",
                           exc.errno) from None


class HighWatermark:
    """A partition's high watermark in memory, and as published to other processes
    (``checkpoint``). The log holds its lock for every change."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.name = name
        self.value: int | None = read_high_watermark(directory)
        """None: not replicated (readers see up to the log end)."""
        self._written = self.value

    def start(self, log_start: int) -> bool:
        """Replicated from now on, from ``log_start``; False if it was already."""
        if self.value is not None:
            return False
        self.value = log_start
        return True

    def advance(self, offset: int, log_end: int) -> bool:
        """Raise it to ``offset`` (at most ``log_end``); True if it moved."""
        if self.value is None:
            return False
        new = min(offset, log_end)
        if new <= self.value:
            return False
        self.value = new
        return True

    def lower(self, offset: int, *, to: bool = False) -> None:
        """A truncation to ``offset``: at most it (``to``: exactly it)."""
        if self.value is not None:
            self.value = offset if to else min(self.value, offset)

    def checkpoint(self, readable: int) -> None:
        """Write ``readable`` (the bounded high watermark) when the value moved since the
        last write (``high-watermark``, without fsync: a stale or missing one only shows
        readers less)."""
        hw = self.value
        if hw is not None and hw != self._written:
            write_high_watermark(self.directory, self.name, readable)
            self._written = hw
