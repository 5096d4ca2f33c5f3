"""Human-readable dumps of hot segment files (like kafka-dump-log)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from log_tables.errors import LakelogError
from log_tables.hot.damage import Damage
from log_tables.hot.hot_reader import SegmentFile, list_segments, scan_segment
from log_tables.hot.segment import LOG_SUFFIX, parse_stem
from log_tables.records import batch_records


def dump(path: Path, with_records: bool = False) -> Iterator[str]:
    """Lines describing every batch of a segment file or of a partition directory."""
    if path.is_dir():
        segments = list_segments(path)
    elif path.name.endswith(LOG_SUFFIX) and (base := parse_stem(path.name)) is not None:
        segments = [SegmentFile(base, path)]
    else:
        raise LakelogError(f"{path} is neither a partition directory nor a .log segment file")
    for i, segment in enumerate(segments):
        yield f"segment {segment.path}"
        nxt = segments[i + 1].base_offset if i + 1 < len(segments) else None
        items, stop = scan_segment(segment, None, nxt)
        for b in items:
            if isinstance(b, Damage):
                yield (f"  DAMAGED: offsets {b.first_offset}..{b.last_offset} positions "
                       f"{b.position}..{b.resume_position - 1}: {b.reason} (never served; "
                       f"readers seek to {b.next_offset} to skip it)")
                continue
            h = b.header
            yield (f"  baseOffset: {h.base_offset} lastOffset: {h.last_offset} "
                   f"count: {h.record_count} position: {b.position} size: {h.size} "
                   f"maxTimestamp: {h.max_timestamp} logAppendTime: {h.log_append_time} "
                   f"producerId: {h.producer_id} producerEpoch: {h.producer_epoch} "
                   f"baseSequence: {h.base_sequence} crc: {h.crc:#010x} valid: true")
            if with_records:
                for r in batch_records(h.base_offset, b.records(str(segment.path))):
                    yield (f"    | offset: {r.offset} timestamp: {r.timestamp} key: {r.key!r} "
                           f"value: {r.value!r} headers: {r.headers}")
        if stop is not None:
            size = _size(segment.path)
            yield (f"  stop at position {stop.position}: {stop.reason} "
                   f"({size - stop.position} bytes not readable)")


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
