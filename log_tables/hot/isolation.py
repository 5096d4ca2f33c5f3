"""How far a reader may read: Kafka's isolation levels, and the one bound they give.

``read_uncommitted`` reads up to the high watermark (what every in-sync replica holds;
a Kafka consumer's default); ``read_committed`` up to the last stable offset, below
which no transaction is still open (``log_tables.hot.txn_index``). Every reader asks for
its bound here (``PartitionLog.readable_end`` in the broker, ``published_readable_end``
in other processes) and says which level it reads at. A process without the broker's
index learns the last stable offset from the headers it reads (``txn_index.scan``), so
``published_readable_end`` bounds by the high watermark alone and its readers by both.
"""

from __future__ import annotations

import enum
from pathlib import Path

from log_tables.hot.high_watermark import read_high_watermark


class Isolation(enum.Enum):
    """Kafka's ``isolation.level`` of a read."""

    READ_UNCOMMITTED = "read_uncommitted"
    """Up to the high watermark: consumers' fetches and group polls."""
    READ_COMMITTED = "read_committed"
    """Up to the last stable offset: what becomes a table (tiering, Spark, compaction)."""


READ_UNCOMMITTED = Isolation.READ_UNCOMMITTED
READ_COMMITTED = Isolation.READ_COMMITTED


def bounded_end(log_end: int, log_start: int, high_watermark: int | None,
                isolation: Isolation, first_unstable: int | None = None) -> int:
    """The readable end of a log: ``log_end`` for a partition of one replica (no high
    watermark), else the high watermark within ``[log_start, log_end]``; for
    ``read_committed``, the first offset of a transaction still open if that is lower."""
    end = log_end if high_watermark is None else max(log_start, min(high_watermark, log_end))
    if isolation is Isolation.READ_COMMITTED and first_unstable is not None:
        end = max(log_start, min(end, first_unstable))
    return end


def published_readable_end(directory: Path, log_end: int, isolation: Isolation) -> int:
    """The readable end of the partition in ``directory`` as another process sees it
    (the tiering job, Spark's readers): ``log_end`` (what the reader found on disk), or
    the published high watermark if that is lower (records not yet on every in-sync
    replica are not read)."""
    published = read_high_watermark(directory)
    return bounded_end(log_end, 0, published, isolation)
