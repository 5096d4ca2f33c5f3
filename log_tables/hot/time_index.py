"""The time index: entries (timestamp, offset) meaning "no record at or before
this offset in the segment has a timestamp above this timestamp".

An entry is added when a batch raises the segment's maximum timestamp (and, as
with the offset index, about once per ``index.interval.bytes``). Timestamps and
offsets both increase. To find the first offset with timestamp >= T, start after
the last entry whose timestamp is below T: every record up to it is below T.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from pathlib import Path

from log_tables.errors import IndexOrderError
from log_tables.hot.index_file import IndexFile


class TimeIndex(IndexFile):
    """Entries (timestamp i64, relative_offset u32)."""

    ENTRY = struct.Struct("<qI")

    def __init__(self, path: Path, base_offset: int) -> None:
        super().__init__(path, base_offset)

    def check(self) -> str | None:
        ts, offsets = self._a, self._b
        for i in range(1, len(ts)):
            if ts[i] <= ts[i - 1] or offsets[i] <= offsets[i - 1]:
                return f"entry {i} ({ts[i]}, {offsets[i]}) is not after entry {i - 1}"
        return None

    @property
    def last(self) -> tuple[int, int] | None:
        """The last entry as (timestamp, absolute offset)."""
        if not self._a:
            return None
        return self._a[-1], self.base_offset + self._b[-1]

    def maybe_append(self, timestamp: int, offset: int) -> bool:
        """Add (timestamp, offset) if it raises the indexed maximum timestamp."""
        if self._a and timestamp <= self._a[-1]:
            return False
        rel = offset - self.base_offset
        if self._b and rel <= self._b[-1]:
            raise IndexOrderError(
                f"{self.path}: offset {offset} is not after the last entry's offset "
                f"{self.base_offset + self._b[-1]}"
            )
        self._write_entry(timestamp, rel)
        self._a.append(timestamp)
        self._b.append(rel)
        return True

    def scan_start(self, timestamp: int) -> int:
        """The offset to start scanning from to find the first record >= ``timestamp``."""
        i = bisect_left(self._a, timestamp)
        if i == 0:
            return self.base_offset
        return self.base_offset + self._b[i - 1] + 1

    def truncate_to(self, offset: int) -> None:
        """Drop every entry whose offset is at or after ``offset``."""
        rel = offset - self.base_offset
        keep = len(self._b)
        while keep and self._b[keep - 1] >= rel:
            keep -= 1
        self._truncate_entries(keep)

    def entries(self) -> list[tuple[int, int]]:
        return [(a, self.base_offset + b) for a, b in zip(self._a, self._b, strict=True)]
