"""Recovery after unclean stops: torn tails, garbage, broken and missing indexes."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from log_tables.errors import CorruptRecordError
from log_tables.hot.batch import BatchScanner
from log_tables.hot.partition_log import PartitionLog
from log_tables.hot.recovery import CLEAN_SHUTDOWN_FILE
from tests.conftest import OpenLog
from tests.log_tables.helpers import append_n, assert_records_match_offsets, read_all


def batch_positions(path: Path) -> list[tuple[int, int]]:
    fd = os.open(path, os.O_RDONLY)
    try:
        return [(b.position, b.header.size)
                for b in BatchScanner(fd, str(path), 0, os.fstat(fd).st_size)]
    finally:
        os.close(fd)


@pytest.mark.parametrize("seed", range(10))
def test_garbage_from_a_random_byte_of_record_k(open_log: OpenLog, seed: int) -> None:
    rng = random.Random(seed)
    plog = open_log(index_interval_bytes=200)
    append_n(plog, 60)
    path = plog.active_segment.path
    plog.abandon()  # an unclean stop: no clean-shutdown marker
    k = rng.randrange(60)
    position, size = batch_positions(path)[k]
    start = position + rng.randrange(size)
    with path.open("r+b") as f:
        f.seek(start)
        f.write(rng.randbytes(rng.randrange(1, 3 * size)))
    recovered = open_log()
    assert recovered.high_watermark == k
    assert_records_match_offsets(read_all(recovered))
    assert recovered.recovered_from, "recovery should report what it truncated"
    append_n(recovered, 5)  # and the log goes on from k
    assert_records_match_offsets(read_all(recovered))


@pytest.mark.parametrize("clean", [True, False])
def test_random_bytes_appended_to_log_and_index(open_log: OpenLog, clean: bool) -> None:
    rng = random.Random(1)
    plog = open_log(index_interval_bytes=100, segment_bytes=5_000)
    append_n(plog, 80, per_batch=3)
    before = read_all(plog)
    active = plog.active_segment
    if clean:
        plog.close()
    else:
        plog.abandon()
    for path in (active.path, active.offset_index.path, plog.segments[0].offset_index.path):
        with path.open("ab") as f:
            f.write(rng.randbytes(37))
    reopened = open_log(index_interval_bytes=100, segment_bytes=5_000)
    assert reopened.high_watermark == 80
    assert read_all(reopened) == before


@pytest.mark.parametrize("damage", ["delete", "garbage", "truncate"])
def test_index_files_are_rebuilt(open_log: OpenLog, damage: str) -> None:
    plog = open_log(index_interval_bytes=50, segment_bytes=4_000)
    append_n(plog, 50)
    expected = [(s.offset_index.entries(), s.time_index.entries()) for s in plog.segments]
    paths = [p for s in plog.segments for p in (s.offset_index.path, s.time_index.path)]
    plog.close()
    for path in paths:
        if damage == "delete":
            path.unlink()
        elif damage == "garbage":
            path.write_bytes(random.Random(3).randbytes(path.stat().st_size or 24))
        else:
            with path.open("r+b") as f:
                f.truncate(max(0, path.stat().st_size - 5))
    reopened = open_log(index_interval_bytes=50, segment_bytes=4_000)
    got = [(s.offset_index.entries(), s.time_index.entries()) for s in reopened.segments]
    # Rebuilt indexes point at the same batches (sealed segments may gain their
    # final time-index entry back only on seal, so compare offset indexes exactly).
    assert [g[0] for g in got] == [e[0] for e in expected]
    assert all(p.exists() for p in paths)
    assert_records_match_offsets(read_all(reopened))
    assert reopened.offset_for_timestamp(1_025) == 25


def test_orphan_indexes_and_deleted_leftovers_are_removed(open_log: OpenLog) -> None:
    plog = open_log()
    append_n(plog, 5)
    directory = plog.directory
    plog.close()
    orphan = directory / ("00000000000000000999" + ".index")
    orphan.write_bytes(b"\0" * 8)
    leftover = directory / ("00000000000000000500.log.deleted")
    leftover.write_bytes(b"junk")
    reopened = open_log()
    assert not orphan.exists() and not leftover.exists()
    assert reopened.high_watermark == 5


def test_clean_shutdown_skips_the_scan_and_unclean_recovers(open_log: OpenLog) -> None:
    plog = open_log(index_interval_bytes=1)
    append_n(plog, 30)
    path = plog.active_segment.path
    position, _ = batch_positions(path)[10]
    plog.close()
    assert (plog.directory / CLEAN_SHUTDOWN_FILE).exists()
    with path.open("r+b") as f:  # flip a byte inside record 10's body, sizes unchanged
        f.seek(position + 70)
        byte = f.read(1)
        f.seek(position + 70)
        f.write(bytes([byte[0] ^ 0xFF]))
    trusted = open_log(index_interval_bytes=1)
    assert trusted.high_watermark == 30  # clean stop: no scan, files trusted
    assert not (plog.directory / CLEAN_SHUTDOWN_FILE).exists()  # removed on open
    with pytest.raises(CorruptRecordError) as err:  # ...but a read still checks the CRC
        trusted.read(10)
    assert str(path) in err.value.message
    trusted.abandon()
    recovered = open_log(index_interval_bytes=1)  # unclean now: scanned, truncated
    assert recovered.high_watermark == 10


def test_clean_marker_with_wrong_sizes_triggers_recovery(open_log: OpenLog) -> None:
    plog = open_log()
    append_n(plog, 10)
    path = plog.active_segment.path
    plog.close()
    with path.open("ab") as f:
        f.write(b"\x00" * 100)  # the marker's size no longer matches
    reopened = open_log()
    assert reopened.high_watermark == 10
    assert reopened.active_segment.size == path.stat().st_size


def test_missing_middle_segment_truncates_the_rest(open_log: OpenLog) -> None:
    plog = open_log(segment_bytes=3_000)
    append_n(plog, 30)
    doomed = plog.segments[2]
    plog.abandon()
    doomed.path.unlink()
    reopened = open_log(segment_bytes=3_000)
    assert reopened.high_watermark == doomed.base_offset
    assert_records_match_offsets(read_all(reopened))


def test_empty_directory_and_checkpoint_loss(open_log: OpenLog, tmp_path: Path) -> None:
    plog = open_log(segment_bytes=3_000)
    append_n(plog, 20)
    plog.abandon()
    (plog.directory / "partition.json").write_text("{not json")
    reopened = open_log(segment_bytes=3_000)
    assert reopened.high_watermark == 20
    assert_records_match_offsets(read_all(reopened))
    fresh = PartitionLog.open(tmp_path / "empty")
    assert (fresh.log_start_offset, fresh.high_watermark) == (0, 0)
    fresh.close()


def test_a_sealed_segment_whose_sync_never_came_is_recovered_like_the_active_one(
        open_log: OpenLog) -> None:
    """An OS crash can lose any unsynced page of a segment that rolled while its sync was
    still to come, a middle one too (writeback keeps no order; simulated by zeroing one
    batch): the recovery point stayed before the segment, so recovery validates every
    batch of it (a trusted segment's are checked only after its last index entry) and
    drops everything from the lost batch on."""
    plog = open_log(segment_bytes=3_000, index_interval_bytes=100)
    append_n(plog, 10)
    plog.roll()  # synced: the recovery point moves past it
    plog.flush_scheduler = lambda _, offset: None  # the flush of later rolls never runs
    append_n(plog, 30)
    bases = [s.base_offset for s in plog.segments]
    assert plog.recovery_point == 10 and bases.index(10) + 3 < len(bases)
    victim = plog.segments[bases.index(10) + 1]  # sealed, never synced
    positions = batch_positions(victim.path)
    assert len(positions) > 3
    plog.abandon()
    with open(victim.path, "r+b") as fh:
        fh.seek(positions[1][0])
        fh.write(bytes(positions[1][1]))
    reopened = open_log(segment_bytes=3_000, index_interval_bytes=100)
    assert reopened.high_watermark == victim.base_offset + 1  # one whole one-record batch
    assert [s.base_offset for s in reopened.segments] == bases[:bases.index(victim.base_offset) + 1]
    assert any(str(victim.path) in note for note in reopened.recovered_from)
    assert_records_match_offsets(read_all(reopened))
