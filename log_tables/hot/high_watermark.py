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
