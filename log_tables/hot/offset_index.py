"""The sparse offset index: relative offset -> file position of a batch start.

One entry per ``index.interval.bytes`` of log; a lookup finds the batch to start
scanning from, so a read never scans more than about one interval.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from pathlib import Path

from log_tables.errors import IndexOrderError
from log_tables.hot.index_file import IndexFile

_U32 = 2**32


class OffsetIndex(IndexFile):
    """Entries (relative_offset u32, position u32), both strictly increasing."""

    ENTRY = struct.Struct("<II")

    def __init__(self, path: Path, base_offset: int) -> None:
        super().__init__(path, base_offset)

    def check(self) -> str | None:
        offsets, positions = self._a, self._b
        for i in range(1, len(offsets)):
            if offsets[i] <= offsets[i - 1] or positions[i] <= positions[i - 1]:
                return f"entry {i} ({offsets[i]}, {positions[i]}) is not after entry {i - 1}"
        return None

    @property
    def last(self) -> tuple[int, int] | None:
        """The last entry as (absolute offset, position)."""
        if not self._a:
            return None
        return self.base_offset + self._a[-1], self._b[-1]

    def lookup(self, offset: int) -> tuple[int, int]:
        """The last entry at or before ``offset``, or (base_offset, 0)."""
        i = bisect_right(self._a, offset - self.base_offset)
        if i == 0:
            return self.base_offset, 0
        return self.base_offset + self._a[i - 1], self._b[i - 1]

    def append(self, offset: int, position: int) -> None:
        """Add an entry; it must come strictly after the last one."""
        rel = offset - self.base_offset
        if not 0 <= rel < _U32 or not 0 <= position < _U32:
            raise IndexOrderError(
                f"{self.path}: entry ({offset}, {position}) does not fit a u32 relative entry"
            )
        if self._a and (rel <= self._a[-1] or position <= self._b[-1]):
            raise IndexOrderError(
                f"{self.path}: entry ({offset}, {position}) is not after the last entry "
                f"({self.base_offset + self._a[-1]}, {self._b[-1]})"
            )
        self._write_entry(rel, position)
        self._a.append(rel)
        self._b.append(position)

    def truncate_to(self, offset: int) -> None:
        """Drop every entry at or after ``offset``."""
        self._truncate_entries(bisect_right(self._a, offset - self.base_offset - 1))

    def entries(self) -> list[tuple[int, int]]:
        # Not strict: a reader may look while the writer is between its two list appends.
        return [(self.base_offset + a, b) for a, b in zip(self._a, self._b)]  # noqa: B905
