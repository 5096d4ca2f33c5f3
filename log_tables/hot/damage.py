"""Damage inside a segment: the bytes a scan stopped at, and where intact batches resume.

A scan stops at the first batch that fails its checks (magic, length, base offset,
CRC). That is either the readable end of the log (a tail a writer left torn, or is
writing right now) or damage with intact batches after it (a flipped bit, a bad
sector). ``locate`` tells the two apart and finds where the intact batches resume,
so that a damaged batch hides only its own records: never the ones before it, nor
the ones after it.

Where the next intact batch starts is found, most trusted first, from

1. the next offset-index entry past the damage whose position holds a CRC-valid
   batch with the entry's base offset (the writer indexed it when it appended it);
2. the end of the segment, when its next offset is known (in the writer's process,
   or in another process for a segment that has a successor);
3. a search for the batch magic between the damage and that anchor: the first
   candidate (a batch start is always 8-byte aligned) whose chain of CRC-valid,
   offset-dense batches lands exactly on the anchor. That narrows the damage to
   the damaged batch itself even when its own header (its length) is what was hit.

With no anchor (the last segment, seen from another process, and no index entry
past the stop) only a chain that reaches the end of the file counts; without one
the stop is the readable end (``None``), as for a torn tail.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from typing import NamedTuple

from log_tables.hot.batch import (
    HEADER_SIZE,
    MAGIC,
    BatchScanner,
    ScanStop,
    check_header,
    decode_header,
)

_MAGIC_AT = 12  # the magic's position inside a header
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_CHUNK = 1 << 20
_MAX_DEPTH = 32
"""Damaged runs between two anchors that a search resolves one by one; past that many the
whole stretch counts as one damaged run."""


class Damage(NamedTuple):
    """A damaged run of a segment and the offsets it hides."""

    path: str
    position: int
    """Byte where the damaged run starts."""
    resume_position: int
    """Byte where the next intact batch starts (the segment's end when none follows)."""
    first_offset: int
    """The first offset the run hides (the one after the last intact batch before it)."""
    next_offset: int
    """The first offset after the run: seek here to skip it."""
    reason: str

    @property
    def last_offset(self) -> int:
        return self.next_offset - 1


def locate(fd: int, path: str, stop: ScanStop, first_offset: int, end: int,
           end_offset: int | None, index: Sequence[tuple[int, int]],
           max_batch_bytes: int) -> Damage | None:
    """The damage a scan stopped at (``stop``, at offset ``first_offset``), or None when
    the stop is the readable end: nothing valid follows and the segment's end offset
    is unknown, or the stop hides no offset.

    ``end``: the segment's size in bytes; ``end_offset``: its next offset if known;
    ``index``: its offset-index entries as (offset, position).
    """
    anchor: tuple[int, int | None] | None = None
    for offset, position in index:
        if position > stop.position and offset > first_offset and _valid_at(
                fd, path, position, offset, end, max_batch_bytes):
            anchor = (position, offset)
            break
    if anchor is None:
        if end_offset is not None and end_offset <= first_offset:
            return None  # bytes past the last offset (say, appended junk): nothing hidden
        anchor = (end, end_offset)
    # Damage, not a tail: a batch that "runs past the end" has a damaged length.
    reason = "batch length runs past the end of the file" if stop.torn else stop.reason
    found = _search(fd, path, stop.position, first_offset, anchor, max_batch_bytes)
    if found is not None:
        return Damage(path, stop.position, found[0], first_offset, found[1], reason)
    if anchor[1] is None:
        return None  # the readable end (a torn tail, maybe still being written)
    return Damage(path, stop.position, anchor[0], first_offset, anchor[1], reason)


def _valid_at(fd: int, path: str, position: int, offset: int, end: int,
              max_batch_bytes: int) -> bool:
    """A whole CRC-valid batch with base offset ``offset`` starts at ``position``."""
    scanner = BatchScanner(fd, path, position, end, expected_offset=offset,
                           max_batch_bytes=max_batch_bytes, read_ahead=HEADER_SIZE)
    return next(iter(scanner), None) is not None


def _search(fd: int, path: str, start: int, first_offset: int, anchor: tuple[int, int | None],
            max_batch_bytes: int, depth: int = 0) -> tuple[int, int] | None:
    """(position, base offset) of the first batch start in ``[start, anchor)`` whose chain
    of valid batches lands exactly on the anchor (across further damage, each resolved
    the same way), or None. Each byte is scanned a bounded number of times: a chain
    that fails at some damage rules out every batch start before that damage too."""
    limit = anchor[0]
    pos = start
    while pos < limit:
        chunk = os.pread(fd, min(_CHUNK, limit - pos) + HEADER_SIZE, pos)
        i = chunk.find(_MAGIC_BYTES)
        resume = pos + _CHUNK
        while i >= 0:
            q = pos + i - _MAGIC_AT
            if q >= start and q % 8 == 0 and q < limit:
                hit, dead_end = _chain(fd, path, q, first_offset, anchor, max_batch_bytes, depth)
                if hit is not None:
                    return hit
                if dead_end > pos + i:  # every start before it chains into the same end
                    resume = dead_end
                    break
            i = chunk.find(_MAGIC_BYTES, i + 1)
        pos = resume
    return None


def _chain(fd: int, path: str, q: int, first_offset: int, anchor: tuple[int, int | None],
           max_batch_bytes: int, depth: int) -> tuple[tuple[int, int] | None, int]:
    """((q, base offset) if the chain of valid batches from ``q`` reaches the anchor, else
    None; the position the chain ended at, when it holds at least one batch, else q)."""
    limit, anchor_offset = anchor
    head = os.pread(fd, HEADER_SIZE, q)
    if len(head) < HEADER_SIZE:
        return None, q
    header = decode_header(head)
    if check_header(header, path, q, max_batch_bytes) is not None or (
            header.base_offset < first_offset):
        return None, q
    scanner = BatchScanner(fd, path, q, limit, expected_offset=header.base_offset,
                           max_batch_bytes=max_batch_bytes)
    for _ in scanner:
        pass
    if scanner.position == q:
        return None, q  # not even its first batch is whole
    hit = (q, header.base_offset)
    stop, expected = scanner.stop, scanner.expected_offset
    assert expected is not None
    if stop is None or (anchor_offset is None and stop.torn):
        landed = anchor_offset is None or expected == anchor_offset
        return (hit if landed else None), scanner.position
    # More damage before the anchor: the chain counts if the batches after that damage
    # reach the anchor in turn (never a chain that ends nowhere: it could be a batch
    # someone stored inside a record's value).
    if depth < _MAX_DEPTH and _search(fd, path, stop.position, expected, anchor,
                                      max_batch_bytes, depth + 1) is not None:
        return hit, scanner.position
    return None, scanner.position
