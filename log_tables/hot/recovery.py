"""Opening a partition directory after a stop, clean or not: the files of recovery.

Files it reads and writes::

    partition.json       checkpoint: log_start_offset and recovery_point
    .clean-shutdown      written by close(); lists segment sizes; removed on open
    <offset>.snapshot    producer state as of that offset (the newest two kept)

``recovery_point`` is the base offset of the first segment that may hold bytes
not yet fsynced; every segment before it is sealed and synced. After an
unclean stop, ``recover`` validates every batch from the recovery point on and
truncates at the first torn or corrupt one (dropping later segments too).
Segments below it (and every segment after a clean stop) are durable and are
never truncated: if their indexes do not check out, they are rebuilt, and a
damaged batch found on the way is kept and reported to the readers that reach it
(``LogSegment.intact``), so it hides neither the batches before nor after it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from log_tables.clock import Clock
from log_tables.config import TopicConfig
from log_tables.errors import StorageError
from log_tables.files import atomic_write, fsync_dir
from log_tables.hot.batch import MAX_BATCH_BYTES, ScannedBatch
from log_tables.hot.producer_state import ProducerStateManager
from log_tables.hot.segment import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIMEINDEX_SUFFIX,
    LogSegment,
    parse_stem,
)

CHECKPOINT_FILE = "partition.json"
SNAPSHOT_SUFFIX = ".snapshot"
CLEAN_SHUTDOWN_FILE = ".clean-shutdown"

Note = Callable[[str], None]
"""Records what recovery found and did (logged, and kept in ``recovered_from``)."""


class Recovered(NamedTuple):
    """The segments a directory holds after recovery, and what the checkpoint said."""

    segments: list[LogSegment]
    """Contiguous, oldest first, never empty."""
    log_start_offset: int
    """As checkpointed (the log clamps it to its segments)."""
    clean: bool
    """The last stop was clean: every segment is synced."""


def recover(d: Path, config: TopicConfig, clock: Clock, note: Note) -> Recovered:
    """Steps: 1. remove leftovers of an interrupted write or delete; 2. read the checkpoint
    and the clean-shutdown marker (removing it); 3. load each segment, trusting the
    durable ones and truncating the first one that is not at its first bad batch."""
    remove_leftovers(d, note)
    log_start, recovery_point = read_checkpoint(d, note)
    clean, clean_end = read_clean_marker(d)
    now = clock.now_ms()
    bases = sorted(b for p in d.iterdir() if p.name.endswith(LOG_SUFFIX)
                   and (b := parse_stem(p.name)) is not None)
    interval = config.index_interval_bytes
    segments: list[LogSegment] = []
    expected: int | None = None
    for i, base in enumerate(bases):
        seg = LogSegment.open_existing(d, base, interval, now)
        if expected is not None and base != expected:
            note(f"{seg.path}: gap or overlap (expected base offset {expected})")
            seg.close()
            drop_files_from(d, bases[i:], note)
            break
        last = i == len(bases) - 1
        trusted = (clean.get(base) == seg.size) if clean else (
            not last and bases[i + 1] <= recovery_point)
        if trusted and seg.load(MAX_BATCH_BYTES):
            segments.append(seg)
            expected = seg.next_offset
            continue
        # A durable segment (synced, its end known) is never cut: a damaged batch in
        # it is a fault of the disk, not a torn write, and the batches after it were
        # acknowledged. Its indexes are rebuilt; reads report the damage.
        known_end = (bases[i + 1] if not last else clean_end) if trusted else None
        if known_end is not None and known_end > base:
            for damage in seg.rebuild(known_end, MAX_BATCH_BYTES):
                note(f"{seg.path}: offsets {damage.first_offset}.."
                     f"{damage.last_offset} at byte {damage.position} are damaged "
                     f"({damage.reason}); kept, and reported to readers")
            seg.flush()
            segments.append(seg)
            expected = seg.next_offset
            continue
        stop = seg.recover(MAX_BATCH_BYTES)
        seg.flush()
        if stop is not None:
            note(f"{seg.path}: truncated at byte {stop.position} ({stop.reason})")
        if seg.size == 0 and segments:
            seg.close()
            seg.delete()
        else:
            segments.append(seg)
            expected = seg.next_offset
        if stop is not None:
            drop_files_from(d, bases[i + 1:], note)
            break
    if not segments:
        start = max(log_start, 0)
        segments.append(LogSegment.create(d, start, interval, now))
    return Recovered(segments, log_start, bool(clean))


def remove_leftovers(d: Path, note: Note) -> None:
    logs = {p.name[: -len(LOG_SUFFIX)] for p in d.iterdir() if p.name.endswith(LOG_SUFFIX)}
    for p in d.iterdir():
        if p.name.endswith((DELETED_SUFFIX, ".tmp")):
            p.unlink(missing_ok=True)
        elif p.name.endswith((INDEX_SUFFIX, TIMEINDEX_SUFFIX)) and (
            p.name.rsplit(".", 1)[0] not in logs
        ):
            note(f"{p}: orphan index removed")
            p.unlink(missing_ok=True)


def drop_files_from(d: Path, bases: list[int], note: Note) -> None:
    for base in bases:
        seg = LogSegment(d, base, 0, 0)
        note(f"{seg.path}: removed (follows a truncation point)")
        seg.delete()


# -- the checkpoint and the clean-shutdown marker ------------------------------------
def read_checkpoint(d: Path, note: Note) -> tuple[int, int]:
    """(log start offset, recovery point); (0, 0) when there is none or it is unreadable."""
    try:
        data = json.loads((d / CHECKPOINT_FILE).read_bytes())
        return int(data["log_start_offset"]), int(data["recovery_point"])
    except FileNotFoundError:
        return 0, 0
    except (ValueError, KeyError, TypeError):
        note("checkpoint unreadable; recovering every segment")
        return 0, 0


def write_checkpoint(d: Path, name: str, log_start_offset: int, recovery_point: int) -> None:
    body = {"log_start_offset": log_start_offset, "recovery_point": recovery_point}
    try:
        atomic_write(d / CHECKPOINT_FILE, json.dumps(body).encode())
    except OSError as exc:
        raise StorageError(f"{name}: cannot write checkpoint {d / CHECKPOINT_FILE}: "
                           f"{exc.strerror}", exc.errno) from None


def read_clean_marker(d: Path) -> tuple[dict[int, int], int | None]:
    """(segment sizes, log end offset) of a clean stop; ({}, None) after an unclean one."""
    marker = d / CLEAN_SHUTDOWN_FILE
    end: int | None = None
    try:
        data = json.loads(marker.read_bytes())
        sizes = {int(k): int(v) for k, v in data["segments"].items()}
        if data.get("log_end_offset") is not None:
            end = int(data["log_end_offset"])
    except FileNotFoundError:
        return {}, None
    except (ValueError, KeyError, TypeError, AttributeError):
        sizes = {}
    # Removed before any append: a crash from here on is an unclean stop.
    marker.unlink()
    fsync_dir(d)
    return sizes, end


def write_clean_marker(d: Path, log_end_offset: int, segments: Sequence[LogSegment]) -> None:
    sizes = {str(s.base_offset): s.size for s in segments}
    atomic_write(d / CLEAN_SHUTDOWN_FILE,
                 json.dumps({"log_end_offset": log_end_offset, "segments": sizes}).encode())


# -- producer state snapshots ---------------------------------------------------------
def _snapshots(d: Path) -> list[int]:
    return sorted(int(p.name[:-len(SNAPSHOT_SUFFIX)]) for p in d.iterdir()
                  if p.name.endswith(SNAPSHOT_SUFFIX) and p.name[:20].isdigit())


def _snapshot_path(d: Path, offset: int) -> Path:
    return d / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def write_producer_snapshot(d: Path, name: str, producers: ProducerStateManager,
                            offset: int) -> None:
    """Persist producer state as of ``offset`` (the log end); keep the newest two snapshots."""
    path = _snapshot_path(d, offset)
    try:
        atomic_write(path, json.dumps(producers.to_json()).encode())
    except OSError as exc:
        raise StorageError(f"{name}: cannot write producer snapshot {path}: {exc.strerror}",
                           exc.errno) from None
    for old in _snapshots(d)[:-2]:
        _snapshot_path(d, old).unlink(missing_ok=True)


def rebuild_producer_state(d: Path, name: str, segments: Sequence[LogSegment],
                           log_end_offset: int, note: Note) -> ProducerStateManager:
    """Load the newest snapshot at or below the log end and replay the headers after it."""
    producers = ProducerStateManager(name)
    start = segments[0].base_offset
    for offset in reversed(_snapshots(d)):
        if offset > log_end_offset:
            _snapshot_path(d, offset).unlink(missing_ok=True)
            continue
        try:
            producers.load_json(json.loads(_snapshot_path(d, offset).read_bytes()))
            start = max(offset, start)
            break
        except (ValueError, KeyError, TypeError, OSError):
            note(f"producer snapshot {offset} unreadable; replaying the log")
    for seg in segments:
        if seg.next_offset <= start:
            continue
        for batch in seg.intact(start, MAX_BATCH_BYTES):
            if isinstance(batch, ScannedBatch) and batch.header.base_offset >= start:
                producers.apply(batch.header)
    return producers
