"""A file of fixed-size index entries, mirrored in memory, appended in order."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from log_tables.errors import CorruptIndexError
from log_tables.files import atomic_write


class IndexFile:
    """Base of the offset and time indexes: entries of ``ENTRY`` packed back to back.

    Each subclass keeps two parallel columns in memory (``_a`` and ``_b``) and
    asserts its own ordering invariants on load and on append.
    """

    ENTRY: struct.Struct

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._a: list[int] = []
        self._b: list[int] = []
        self._fd = -1

    # -- file handling -------------------------------------------------------
    def open(self) -> None:
        """Open for appending (creating an empty file if missing)."""
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)

    def load(self) -> None:
        """Read every entry from disk and check the invariants; CorruptIndexError if broken."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            raise CorruptIndexError(f"{self.path} is missing") from None
        size = self.ENTRY.size
        if len(data) % size:
            raise CorruptIndexError(f"{self.path} has {len(data)} bytes, not a multiple of {size}")
        a: list[int] = []
        b: list[int] = []
        for first, second in self.ENTRY.iter_unpack(data):
            a.append(first)
            b.append(second)
        self._a, self._b = a, b
        problem = self.check()
        if problem:
            raise CorruptIndexError(f"{self.path}: {problem}")

    def check(self) -> str | None:
        """Describe a broken invariant of the in-memory entries, or None."""
        raise NotImplementedError

    def _write_entry(self, first: int, second: int) -> None:
        os.write(self._fd, self.ENTRY.pack(first, second))

    def reset(self, a: list[int], b: list[int]) -> None:
        """Replace every entry (index rebuild), crash-safely."""
        self.close()
        atomic_write(self.path, b"".join(self.ENTRY.pack(x, y) for x, y in zip(a, b, strict=True)))
        self._a, self._b = list(a), list(b)
        self.open()

    def _truncate_entries(self, keep: int) -> None:
        del self._a[keep:]
        del self._b[keep:]
        os.ftruncate(self._fd, keep * self.ENTRY.size)

    def flush(self) -> None:
        if self._fd >= 0:
            os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __len__(self) -> int:
        return len(self._a)
