"""Step 2 of the tiering job (``tier.TierJob``), run in Spark tasks: each sealed segment
(or its untiered rest) read, CRC-checked, and written as one Parquet file, with the
stats its add action needs.

A damaged batch ends the segment's file: the records before it are written and the
partition's later segments wait, unless ``skip_damaged`` says to tier around it (its
offsets become a hole). The job spreads the segments over one task per core
(``balance``); the files go where ``staging.Outputs`` says, a stage directory or (on an
object store) their final names (``final_name``).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pyarrow as pa

from compaction_jobs.tier_typed import TypedStaged, TypedWork, type_segment
from log_tables.cold.rows import file_stats, to_table_rows, write_rows_at
from log_tables.errors import CorruptRecordError
from log_tables.hot.damage import Damage
from log_tables.hot.hot_reader import SegmentFile, scan_segment
from log_tables.hot.segment_reads import records_from
from log_tables.hot.txn_index import AbortedTxn, Hidden


class SegmentWork(NamedTuple):
    """One sealed segment (or its untiered rest) to write as one Parquet file."""

    topic: str
    partition: int
    segment_path: str
    base_offset: int
    start: int
    """First offset to tier (the partition's tiered offset, or the segment base)."""
    end: int
    """The next segment's base offset: the segment holds exactly ``start .. end-1``."""
    staged_path: str
    skip_damaged: bool = False
    """Tier around damaged batches (their offsets become a hole) instead of stopping."""
    store_env: tuple[tuple[str, str], ...] = ()
    """Object-store warehouse: ``staged_path`` is the file's final URI in the table, written
    straight there with these settings (no stage directory, no rename); (): a local one.
    They travel in the task (in memory, never logged) because an executor's environment
    need not hold them."""
    aborted: tuple[AbortedTxn, ...] = ()
    """Aborted transactions with records in the segment: their batches are left out, as
    every marker is (a table holds committed records only)."""
    typed: TypedWork | None = None
    """A typed topic's segment: also written as typed rows (``tier_typed``)."""


class StagedFile(NamedTuple):
    """A Parquet file a task wrote, with what its add action needs."""

    work: SegmentWork
    size_bytes: int
    """0: no record to tier (nothing was written)."""
    stats: str
    end: int
    """The offset after what it covers: ``work.end``, or where a damaged batch starts."""
    damage: tuple[Damage, ...] = ()
    """Damaged runs met: the one it stopped at, or (``skip_damaged``) those it skipped."""
    typed: TypedStaged | None = None
    """The typed file written beside it (None: none, the typed job types these records)."""


def write_segment(work: SegmentWork) -> StagedFile:
    """Stage step (runs in a Spark task): one sealed segment as one Parquet file."""
    segment = SegmentFile(work.base_offset, Path(work.segment_path))
    items, stop = scan_segment(segment, work.start, work.end)
    hidden = Hidden(work.aborted)
    rows = []
    damage: list[Damage] = []
    position = work.start
    for b in items:
        if isinstance(b, Damage):
            if b.next_offset <= position or b.first_offset >= work.end:
                continue
            damage.append(b)
            if not work.skip_damaged:
                break  # tier what is before it; the partition waits here
            position = min(b.next_offset, work.end)
            continue
        if b.header.next_offset <= position or position >= work.end:
            continue
        if hidden(b.header):
            position = min(b.header.next_offset, work.end)
            continue
        body = records_from(b, work.segment_path, position, work.end - 1)
        rows.append(to_table_rows(position, body, b.header.log_append_time))
        position += body.num_rows
    if position != work.end and not (damage and not work.skip_damaged):
        why = stop.reason if stop is not None else "the segment ends early"
        raise CorruptRecordError(
            work.segment_path, stop.position if stop is not None else -1,
            f"sealed segment readable only up to offset {position}, expected up to "
            f"{work.end} ({why}); not tiering {work.topic}-{work.partition}")
    typed = type_segment(rows, work.partition, position, work.typed, work.store_env) \
        if work.typed is not None and not damage else None
    if not rows:
        return StagedFile(work, 0, "", position, tuple(damage), typed)
    size = write_rows_at(work.staged_path, rows, work.store_env)
    return StagedFile(work, size, file_stats(pa.Table.from_batches(rows)), position,
                      tuple(damage), typed)


def final_name(partition: int, start: int, end: int, job_id: str) -> str:
    """A tiered file's path in its table: unique per job, so two jobs never write one name."""
    return f"partition={partition}/{start:020d}-{end:020d}-{job_id}.parquet"


def write_segments(works: list[SegmentWork]) -> list[StagedFile]:
    """One Spark task: several segments, one after the other."""
    return [write_segment(w) for w in works]


def balance(works: list[SegmentWork], slots: int) -> list[list[SegmentWork]]:
    """Spread segments over at most ``slots`` tasks with similar record counts (largest
    first onto the lightest task): a Spark task costs tens of milliseconds, so one per
    core beats one per segment."""
    groups: list[list[SegmentWork]] = [[] for _ in range(max(1, min(slots, len(works))))]
    loads = [0] * len(groups)
    for w in sorted(works, key=lambda w: w.end - w.start, reverse=True):
        i = loads.index(min(loads))
        groups[i].append(w)
        loads[i] += w.end - w.start
    return groups
