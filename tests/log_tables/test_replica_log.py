"""The log side of replication on real segment files: verbatim copies of the leader's
batches, the high watermark readers stop at, the leader-epoch cache and truncation by
epoch (KIP-101's two scenarios), and a follower that starts over at the leader's log start."""

from __future__ import annotations

from pathlib import Path

import pytest

from log_tables.cold.topic_reader import hot_end_offset
from log_tables.errors import CorruptRecordError, OffsetOutOfRangeError
from log_tables.hot.high_watermark import HW_FILE, read_high_watermark, write_high_watermark
from log_tables.hot.hot_reader import PartitionReader
from log_tables.hot.leader_epochs import UNDEFINED, EpochEnd, LeaderEpochCache
from log_tables.hot.partition_log import PartitionLog
from log_tables.layout import Layout
from tests.conftest import OpenLog
from tests.log_tables.helpers import assert_records_match_offsets, batch_for, read_all


def _append(plog: PartitionLog, count: int, per_batch: int = 3,
            producer_id: int | None = None) -> None:
    """``count`` records at the log end (from one idempotent producer, sequence = offset)."""
    done = 0
    while done < count:
        n = min(per_batch, count - done)
        end = plog.log_end_offset
        idempotent = {} if producer_id is None else {
            "producer_id": producer_id, "producer_epoch": 0, "base_sequence": end}
        plog.append(batch_for(end, n), **idempotent)
        done += n


def _copy(leader: PartitionLog, follower: PartitionLog, max_bytes: int = 700,
          upto: int | None = None) -> int:
    """Fetch from the leader until the follower's log end reaches ``upto`` (the leader's
    log end by default); returns how many fetches it took."""
    fetches = 0
    target = leader.log_end_offset if upto is None else upto
    while follower.log_end_offset < target:
        got = leader.read_raw(follower.log_end_offset, max_bytes)
        if got.first_offset < follower.log_end_offset:
            # The follower started over at the leader's log start, inside a batch: its log
            # starts at that batch (readers still start at the log start).
            assert follower.log_start_offset == follower.log_end_offset
            follower.truncate_fully(got.first_offset, follower.log_start_offset)
        assert got.first_offset == follower.log_end_offset
        follower.append_replica(got.data, leader.leader_epochs.entries)
        fetches += 1
    return fetches


def _stored(plog: PartitionLog) -> bytes:
    """Every stored batch's bytes, in order."""
    out, offset = [], plog.log_start_offset
    while offset < plog.log_end_offset:
        got = plog.read_raw(offset, 1 << 20)
        out.append(got.data)
        offset = got.next_offset
    return b"".join(out)


def test_a_follower_holds_the_leaders_batches_byte_for_byte(open_log: OpenLog,
                                                              tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader", segment_bytes=2048)
    follower = open_log(tmp_path / "follower", segment_bytes=1500)
    leader.become_leader(3)
    _append(leader, 40, producer_id=7)
    fetches = _copy(leader, follower)
    assert fetches > 3  # several fetches, each of whole batches
    assert len(leader.segments) > 1 and len(follower.segments) > 1
    assert _stored(follower) == _stored(leader)  # same offsets, bytes and CRCs
    assert follower.leader_epochs.entries == [(3, 0)]
    assert_records_match_offsets(read_all(follower))
    # The producer's state came with the headers: a retry of the last batch, sent to the
    # follower once it leads, is answered with the first offsets, not appended again.
    follower.become_leader(4)
    retry = follower.append(batch_for(37, 3), producer_id=7, producer_epoch=0, base_sequence=37)
    assert retry.duplicate_offsets == (37, 38, 39) and follower.log_end_offset == 40
    assert follower.leader_epochs.entries == [(3, 0), (4, 40)]


def test_a_damaged_or_misplaced_fetch_is_refused_and_nothing_after_it_appended(
        open_log: OpenLog, tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    _append(leader, 9)
    data = bytearray(leader.read_raw(0, 1 << 20).data)
    first_batch = int.from_bytes(data[8:12], "little") + 12
    data[first_batch + 100] ^= 0xFF  # a bit flips in transit in the second batch
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        follower.append_replica(bytes(data))
    assert follower.log_end_offset == 3  # the first batch, and only it
    with pytest.raises(CorruptRecordError, match="log ends at 3"):
        follower.append_replica(leader.read_raw(6, 1 << 20).data)
    assert follower.log_end_offset == 3


def test_readers_see_only_below_the_high_watermark(open_log: OpenLog, tmp_path: Path) -> None:
    layout = Layout.of(tmp_path)
    plog = open_log(layout.partition_dir("t", 0))
    _append(plog, 6)
    plog.start_replication()
    assert plog.high_watermark == 0 and plog.log_end_offset == 6
    assert plog.read(0).batches == [] and plog.read(4).high_watermark == 0
    with pytest.raises(OffsetOutOfRangeError):
        plog.read(7)  # past the log end: out of range; below it: just nothing yet
    assert plog.advance_high_watermark(4) and not plog.advance_high_watermark(2)
    assert [r.offset for r in read_all(plog)] == [0, 1, 2, 3]
    assert plog.advance_high_watermark(100) and plog.high_watermark == 6  # never past the end
    plog.advance_high_watermark(0)
    assert plog.high_watermark == 6
    # Readers in other processes read the published high watermark.
    _append(plog, 3)
    plog.checkpoint_high_watermark()
    assert read_high_watermark(plog.directory) == 6
    assert PartitionReader(plog.directory).end_offset() == 9  # the scan sees the log end...
    assert hot_end_offset(layout, "t", 0) == 6  # ...readers of a topic (Spark, jobs) the mark
    write_high_watermark(layout.partition_dir("t", 0), "t-0", 8)
    assert hot_end_offset(layout, "t", 0) == 8
    (layout.partition_dir("t", 0) / HW_FILE).unlink()
    assert hot_end_offset(layout, "t", 0) == 9  # no mark: one replica, the log end
    write_high_watermark(layout.partition_dir("t", 0), "t-0", 6)
    plog.close()
    again = open_log(layout.partition_dir("t", 0))
    assert again.high_watermark == 6 and again.log_end_offset == 9  # ...and a reopen the mark


def test_epoch_cache_answers_where_each_epoch_ends(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path, "t-0")
    assert cache.end_offset_for(0, 10) == EpochEnd(UNDEFINED, UNDEFINED)
    for epoch, start in [(1, 0), (2, 10), (5, 30)]:
        assert cache.assign(epoch, start)
    assert not cache.assign(2, 12)  # an older epoch changes nothing
    assert cache.end_offset_for(1, 50) == (1, 10)
    assert cache.end_offset_for(2, 50) == (2, 30)
    assert cache.end_offset_for(4, 50) == (2, 30)  # unknown: the largest below (KIP-279)
    assert cache.end_offset_for(5, 50) == (5, 50)  # the latest ends at the log end
    assert cache.end_offset_for(0, 50) == (UNDEFINED, UNDEFINED)
    cache.truncate_from_end(30)
    assert LeaderEpochCache(tmp_path, "t-0").entries == [(1, 0), (2, 10)]  # persisted
    cache.truncate_from_start(12)
    assert cache.entries == [(2, 12)]
    cache.assign(6, 11)  # a new leader whose log ends below the latest start
    assert cache.entries == [(6, 11)]


def _truncate_by_epoch(follower: PartitionLog, leader: PartitionLog) -> int:
    """What a follower does on a new leader (KIP-101/279): ask where its latest epoch
    ends on the leader and cut its log there (or where its own copy of the leader's
    answer ends, if that is lower)."""
    mine = follower.leader_epochs.latest_epoch
    theirs = leader.leader_epochs.end_offset_for(mine, leader.log_end_offset)
    if theirs.epoch == UNDEFINED:
        cut = follower.high_watermark
    else:
        own = follower.leader_epochs.end_offset_for(theirs.epoch, follower.log_end_offset)
        cut = min(theirs.end_offset, own.end_offset)
    follower.truncate_to(min(cut, follower.log_end_offset))
    return cut


def test_kip_101_scenario_1_a_restarted_replica_keeps_records_the_leader_has(
        open_log: OpenLog, tmp_path: Path) -> None:
    """Truncating to the high watermark would cut a record every in-sync replica has."""
    a, b = open_log(tmp_path / "a"), open_log(tmp_path / "b")
    for plog in (a, b):
        plog.start_replication()
    a.become_leader(0)
    _append(a, 2, per_batch=1)
    _copy(a, b)
    a.advance_high_watermark(2)  # acknowledged by both...
    b.advance_high_watermark(1)  # ...but b learnt the new high watermark only up to 1
    b.close()
    b = open_log(tmp_path / "b")  # b restarts; a fails; b leads at epoch 1
    b.become_leader(1)
    assert b.high_watermark == 1
    a.close()
    a = open_log(tmp_path / "a")
    assert _truncate_by_epoch(a, b) == 2  # not 1, its high watermark
    assert a.log_end_offset == 2 and b.log_end_offset == 2


def test_kip_101_scenario_2_diverged_replicas_converge_on_the_new_leaders_log(
        open_log: OpenLog, tmp_path: Path) -> None:
    """Both crash, each with a record the other lacks at the same offset: truncating by
    high watermark would keep both and the replicas would differ forever."""
    a, b = open_log(tmp_path / "a"), open_log(tmp_path / "b")
    a.become_leader(0)
    _append(a, 1, per_batch=1)
    _copy(a, b)
    _append(a, 1, per_batch=1)  # offset 1 on a, never copied to b
    b.become_leader(1)  # b leads after a fails; it writes its own offset 1
    _append(b, 2, per_batch=1)
    a.close()
    a = open_log(tmp_path / "a")
    assert _truncate_by_epoch(a, b) == 1  # epoch 0 ends at 1 on b: a's offset 1 goes
    _copy(b, a)
    assert _stored(a) == _stored(b)
    assert a.leader_epochs.entries == b.leader_epochs.entries == [(0, 0), (1, 1)]


def test_a_follower_behind_the_leaders_log_start_starts_over_there(
        open_log: OpenLog, tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader", segment_bytes=1024)
    follower = open_log(tmp_path / "follower")
    leader.become_leader(2)
    _append(leader, 30)
    _append(follower, 4)
    leader.delete_records(20)
    with pytest.raises(OffsetOutOfRangeError):
        leader.read_raw(follower.log_end_offset, 1 << 20)
    follower.truncate_fully(leader.log_start_offset)
    assert (follower.log_start_offset, follower.log_end_offset) == (20, 20)
    _copy(leader, follower)
    assert _stored(follower) == _stored(leader) and follower.log_end_offset == 30
    follower.close()
    again = open_log(tmp_path / "follower")
    assert (again.log_start_offset, again.log_end_offset) == (20, 30)
