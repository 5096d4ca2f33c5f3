"""A damaged batch in a segment written by a real PartitionLog: it hides only its own records.

Every test flips real bytes of a real segment file on disk; nothing is mocked.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from log_tables.errors import CorruptRecordError
from log_tables.hot.batch import BatchScanner
from log_tables.hot.dump import dump
from log_tables.hot.hot_reader import PartitionReader, SegmentFile, segment_max_timestamp
from log_tables.hot.partition_log import PartitionLog
from log_tables.hot.segment import TIMEINDEX_SUFFIX
from log_tables.records import Record
from tests.conftest import OpenLog
from tests.log_tables.helpers import append_n, assert_records_match_offsets

PER_BATCH = 3


def batches_of(path: Path) -> list[tuple[int, int, int]]:
    """(position, size, base offset) of every batch of an intact segment file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return [(b.position, b.header.size, b.header.base_offset)
                for b in BatchScanner(fd, str(path), 0, os.fstat(fd).st_size)]
    finally:
        os.close(fd)


def flip(path: Path, position: int, mask: int = 0xFF) -> None:
    """Flip bits of one byte in place (the file keeps its size, as a bad sector would)."""
    with path.open("r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ mask]))


def read_from(plog: PartitionLog, offset: int) -> list[Record]:
    """Records from ``offset`` to the log end, reading batch by batch as a consumer does."""
    out: list[Record] = []
    while offset < plog.high_watermark:
        got = plog.read(offset, max_bytes=1 << 12).records()
        assert got, f"no progress at {offset}"
        out += got
        offset = got[-1].offset + 1
    return out


# Where in a batch the byte is flipped: its header fields (base offset, length, magic,
# CRC, record count) and its body. A damaged length or magic leaves the scan no way to
# find the next batch from the damaged one: it is found by the index or by the magic.
WHERE = {"base_offset": 3, "length": 9, "magic": 13, "crc": 17, "record_count": 24,
         "body": -5}


@pytest.mark.parametrize("index_interval_bytes", [1, 1 << 20], ids=["indexed", "unindexed"])
@pytest.mark.parametrize("where", list(WHERE))
def test_a_damaged_batch_hides_only_its_own_records(open_log: OpenLog, where: str,
                                                   index_interval_bytes: int) -> None:
    plog = open_log(segment_bytes=4_000, index_interval_bytes=index_interval_bytes)
    append_n(plog, 90, per_batch=PER_BATCH)
    seg = plog.segments[1]
    position, size, base = batches_of(seg.path)[2]
    flip(seg.path, position + WHERE[where] % size)
    damaged = range(base, base + PER_BATCH)

    # A read from before it answers the records up to it, and no further.
    got = plog.read(0, max_bytes=1 << 20).records()
    assert [r.offset for r in got] == list(range(base))
    assert_records_match_offsets(got)
    # A read that starts at (or inside) it names the offsets, the file and where to go on.
    for offset in damaged:
        with pytest.raises(CorruptRecordError) as err:
            plog.read(offset)
        e = err.value
        assert (e.first_offset, e.next_offset) == (base, base + PER_BATCH), where
        assert e.path == str(seg.path) and e.position == position
        assert f"offsets {base}..{base + PER_BATCH - 1}" in e.message
        assert str(seg.path) in e.message and f"seek to offset {base + PER_BATCH}" in e.message
    # Past it, every record is served, each the one written at its offset.
    after = read_from(plog, base + PER_BATCH)
    assert_records_match_offsets(after, start=base + PER_BATCH)
    assert after[-1].offset == 89
    # Looking up by time passes over it (its times cannot be read).
    assert plog.offset_for_timestamp(1_000 + base) == base + PER_BATCH


def test_a_damaged_first_batch_of_the_log_is_named_and_skippable(open_log: OpenLog) -> None:
    plog = open_log(segment_bytes=4_000)
    append_n(plog, 30, per_batch=PER_BATCH)
    flip(plog.segments[0].path, 100)
    with pytest.raises(CorruptRecordError) as err:
        plog.read(0)
    assert (err.value.first_offset, err.value.next_offset) == (0, PER_BATCH)
    assert_records_match_offsets(read_from(plog, PER_BATCH), start=PER_BATCH)


@pytest.mark.parametrize("clean", [True, False], ids=["clean-stop", "killed"])
def test_a_restart_never_cuts_a_durable_segment_at_a_damaged_batch(open_log: OpenLog,
                                                                   clean: bool) -> None:
    """The last batch of a sealed, synced segment is past its last index entry, so a
    restart validates it. It used to truncate the segment there and delete every later
    segment: one flipped byte lost all acknowledged records after it (60 -> 7 here)."""
    plog = open_log(segment_bytes=4_000)
    append_n(plog, 60, per_batch=PER_BATCH)
    seg = plog.segments[1]
    position, size, base = batches_of(seg.path)[-1]
    segments = len(plog.segments)
    if clean:
        plog.close()
    else:
        plog.abandon()
    flip(seg.path, position + size - 5)
    reopened = open_log(segment_bytes=4_000)
    assert reopened.high_watermark == 60 and len(reopened.segments) == segments
    assert any(f"offsets {base}..{base + PER_BATCH - 1}" in note
               for note in reopened.recovered_from), reopened.recovered_from
    assert [r.offset for r in reopened.read(0).records()] == list(range(base))
    with pytest.raises(CorruptRecordError):
        reopened.read(base)
    assert_records_match_offsets(read_from(reopened, base + PER_BATCH), start=base + PER_BATCH)
    append_n(reopened, 3)  # and the log goes on at its end
    assert reopened.high_watermark == 63


def test_a_clean_stop_keeps_the_records_after_damage_in_the_active_segment(
        open_log: OpenLog) -> None:
    plog = open_log(index_interval_bytes=1 << 20)
    append_n(plog, 30, per_batch=PER_BATCH)
    path = plog.active_segment.path
    position, _, base = batches_of(path)[4]
    plog.close()  # synced: a damaged batch now is the disk's doing, not a torn write
    flip(path, position + 60)
    reopened = open_log(index_interval_bytes=1 << 20)
    assert reopened.high_watermark == 30
    assert [r.offset for r in reopened.read(0).records()] == list(range(base))
    assert_records_match_offsets(read_from(reopened, base + PER_BATCH), start=base + PER_BATCH)


def test_readers_in_other_processes_see_damage_not_a_torn_tail(open_log: OpenLog) -> None:
    plog = open_log(segment_bytes=4_000)
    append_n(plog, 60, per_batch=PER_BATCH)
    seg = plog.segments[1]
    position, _, base = batches_of(seg.path)[1]
    flip(seg.path, position + 70)
    reader = PartitionReader(plog.directory)
    assert reader.end_offset() == 60
    got: list[int] = []
    with pytest.raises(CorruptRecordError) as err:
        for b in reader.batches(0):
            got += [r.offset for r in b.to_records()]
    assert got == list(range(base))  # the records before it first
    assert (err.value.first_offset, err.value.next_offset) == (base, base + PER_BATCH)
    after = [r for b in reader.batches(base + PER_BATCH) for r in b.to_records()]
    assert_records_match_offsets(after, start=base + PER_BATCH)
    skipped = [r.offset for b in reader.batches(0, skip_damage=True) for r in b.to_records()]
    assert skipped == [o for o in range(60) if not base <= o < base + PER_BATCH]
    # The active segment: damage with whole batches after it is damage...
    active = plog.active_segment
    a_pos, _, a_base = batches_of(active.path)[1]
    flip(active.path, a_pos + 70)
    with pytest.raises(CorruptRecordError) as err:
        list(reader.batches(a_base))
    assert err.value.first_offset == a_base
    assert reader.end_offset() == 60
    # ...while a torn tail (a batch being written) is the readable end, as before.
    with active.path.open("ab") as f:
        f.write(b"\x01" * 30)
    assert reader.end_offset() == 60
    assert [r.offset for b in reader.batches(a_base + PER_BATCH) for r in b.to_records()][-1] == 59
    # Without its time index, a segment's newest time counts the batches after the damage.
    seg.path.with_suffix(TIMEINDEX_SUFFIX).unlink()
    newest = seg.next_offset - 1  # record o was written with time 1000 + o
    assert segment_max_timestamp(SegmentFile(seg.base_offset, seg.path)) == 1_000 + newest
    # dump-log shows the damaged run and goes on listing the batches after it.
    lines = list(dump(plog.directory))
    assert any(line.startswith(f"  DAMAGED: offsets {base}..{base + PER_BATCH - 1}")
               for line in lines)
    assert sum("baseOffset:" in line for line in lines) == 60 // PER_BATCH - 2


@pytest.mark.parametrize("reopen", [False, True], ids=["live", "reopened"])
def test_two_damaged_batches_without_index_entries_each_hide_only_their_own_records(
        open_log: OpenLog, reopen: bool) -> None:
    """No index entry to resume from: the batches between the two damaged ones are found
    by their magic and chain, not taken for part of the damage."""
    config = {"segment_bytes": 1 << 20, "index_interval_bytes": 1 << 30}
    plog = open_log(**config)
    append_n(plog, 90, per_batch=PER_BATCH)
    path = plog.active_segment.path
    batches = batches_of(path)
    flip(path, batches[3][0] + WHERE["length"])  # offsets 9..11: its length is garbage
    flip(path, batches[20][0] + WHERE["body"] % batches[20][1])  # offsets 60..62
    if reopen:
        plog.close()
        plog = open_log(**config)
        assert plog.high_watermark == 90 and len(plog.recovered_from) == 2
    assert [r.offset for r in plog.read(0).records()] == list(range(9))
    for first in (9, 60):
        with pytest.raises(CorruptRecordError) as err:
            plog.read(first)
        assert (err.value.first_offset, err.value.next_offset) == (first, first + PER_BATCH)
    between = plog.read(12, max_bytes=1 << 20).records()
    assert [r.offset for r in between] == list(range(12, 60))
    assert_records_match_offsets(between, start=12)
    assert_records_match_offsets(read_from(plog, 63), start=63)
