"""Kafka's log-layer scenarios against real segment files."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from log_tables.clock import ManualClock
from log_tables.errors import (
    InvalidRecordError,
    LogClosedError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    StorageError,
)
from log_tables.hot.group_commit import GroupCommit
from log_tables.hot.hot_reader import recovery_point
from log_tables.hot.log_manager import LogManager
from log_tables.hot.partition_log import AppendInfo, PartitionLog
from log_tables.hot.producer_state import MAX_SEQUENCE
from log_tables.records import MAX_TIMESTAMP_MS, build_batch
from tests.conftest import OpenLog
from tests.log_tables.helpers import append_n, assert_records_match_offsets, batch_for, read_all


def test_append_returns_dense_offsets_and_reads_back(open_log: OpenLog) -> None:
    plog = open_log()
    first = plog.append(batch_for(0, 3))
    second = plog.append(batch_for(3, 2))
    assert (first.base_offset, first.last_offset) == (0, 2)
    assert (second.base_offset, second.last_offset) == (3, 4)
    assert plog.high_watermark == 5 and plog.log_start_offset == 0
    records = read_all(plog)
    assert_records_match_offsets(records)
    assert [r.timestamp for r in records] == [1000, 1001, 1002, 1003, 1004]


def test_timestamps_outside_1970_to_9999_are_refused(open_log: OpenLog) -> None:
    plog = open_log()
    for bad in ([5, -1], [MAX_TIMESTAMP_MS + 1], [2**63 - 1]):
        with pytest.raises(InvalidRecordError, match=str(bad[-1])):
            plog.append(build_batch([b"v"] * len(bad), timestamps=bad))
    assert plog.high_watermark == 0  # nothing of a refused batch is written
    info = plog.append(build_batch([b"a", b"b"], timestamps=[0, MAX_TIMESTAMP_MS]))
    assert [r.timestamp for r in read_all(plog)] == [0, MAX_TIMESTAMP_MS]
    assert info.max_timestamp == MAX_TIMESTAMP_MS


@pytest.mark.parametrize("reopen", ["clean", "crash"])
def test_producer_sequences_wrap_to_zero_after_int32_max(open_log: OpenLog, reopen: str) -> None:
    """As in Kafka, a producer's sequence goes on at 0 after 2**31 - 1, and a batch may
    straddle the wrap. Sending 2**31 records takes hours, so the producer's state is set
    to where it would stand after 2**31 - 5 records (two of them still remembered)."""
    plog = open_log()
    pid = 42

    def append(values: list[bytes], seq: int) -> AppendInfo:
        return plog.append(build_batch(values, timestamps=1000), producer_id=pid, producer_epoch=0,
                           base_sequence=seq)

    plog.producers.update(pid, 0, MAX_SEQUENCE - 6, 2, -2)
    assert append([b"1", b"2", b"3"], MAX_SEQUENCE - 4).base_offset == 0
    straddling = append([b"4", b"5", b"6", b"7"], MAX_SEQUENCE - 1)  # MAX-1, MAX, 0, 1
    assert (straddling.base_offset, straddling.last_offset) == (3, 6)
    assert append([b"8"], 2).base_offset == 7
    retry = append([b"4", b"5", b"6", b"7"], MAX_SEQUENCE - 1)
    assert retry.duplicate_offsets == (3, 4, 5, 6) and plog.high_watermark == 8
    for gap in (4, MAX_SEQUENCE - 20):  # ahead of the next sequence, and long before the window
        with pytest.raises(OutOfOrderSequenceError, match="expected 3"):
            append([b"x"], gap)
    if reopen == "clean":
        plog.close()
    else:
        plog.abandon()  # no clean-shutdown marker: recovery replays the batch headers
    plog = open_log()
    overlap = append([b"8", b"9"], 2)  # a retry that overlaps the end: only its tail is new
    assert overlap.duplicate_offsets == (7,) and overlap.offset_of(1) == 8
    assert append([b"4", b"5", b"6", b"7"], MAX_SEQUENCE - 1).duplicate_offsets == (3, 4, 5, 6)
    assert [r.value for r in read_all(plog)] == [b"%d" % i for i in range(1, 10)]


def test_headers_nulls_and_tombstones_round_trip(open_log: OpenLog) -> None:
    plog = open_log()
    plog.append(build_batch([b"v", None], keys=[None, b"k"], timestamps=[5, 6],
                            headers=[[("h1", b"x"), ("h2", None)], None]))
    got = plog.read(0).records()
    assert got[0].key is None and got[0].headers == [("h1", b"x"), ("h2", None)]
    assert got[1].value is None and got[1].key == b"k" and got[1].headers == []


def test_read_in_middle_of_batch_and_record_limits(open_log: OpenLog) -> None:
    plog = open_log()
    append_n(plog, 100, per_batch=10)
    got = plog.read(37, max_records=5).records()
    assert [r.offset for r in got] == [37, 38, 39, 40, 41]
    assert_records_match_offsets(got, 37)


def test_max_bytes_returns_at_least_one_batch(open_log: OpenLog) -> None:
    plog = open_log()
    append_n(plog, 20, per_batch=10, size=500)
    result = plog.read(0, max_bytes=10)
    assert [b.base_offset for b in result.batches] == [0]
    assert result.next_offset == 10


def test_read_at_and_beyond_the_ends(open_log: OpenLog) -> None:
    plog = open_log(segment_bytes=2_000)
    append_n(plog, 30)
    plog.delete_records(10)
    assert plog.read(30).batches == []  # at the high watermark: nothing yet, no error
    for bad in (9, 31, -1):
        with pytest.raises(OffsetOutOfRangeError) as err:
            plog.read(bad)
        assert (err.value.log_start_offset, err.value.high_watermark) == (10, 30)
    assert_records_match_offsets(plog.read(10, max_bytes=1 << 20).records(), 10)


def test_size_based_roll(open_log: OpenLog) -> None:
    plog = open_log(segment_bytes=3_000)
    append_n(plog, 40)
    sizes = [s.size for s in plog.segments]
    assert len(sizes) > 5
    assert all(0 < size <= 3_000 for size in sizes)
    bases = [s.base_offset for s in plog.segments]
    assert bases == sorted(bases) and bases[0] == 0
    for prev, nxt in zip(plog.segments, plog.segments[1:], strict=False):
        assert prev.next_offset == nxt.base_offset and prev.sealed
    assert_records_match_offsets(read_all(plog))


def test_time_based_roll(open_log: OpenLog, clock: ManualClock) -> None:
    plog = open_log(segment_ms=1_000)
    append_n(plog, 3)
    clock.advance(999)
    append_n(plog, 1)
    assert len(plog.segments) == 1
    clock.advance(1)
    append_n(plog, 1)  # the segment is now 1,000 ms old: roll before appending
    assert [s.base_offset for s in plog.segments] == [0, 4]
    clock.advance(5_000)
    assert plog.roll_if_due() is not None  # a quiet partition is rolled without an append
    assert [s.base_offset for s in plog.segments] == [0, 4, 5]
    assert plog.roll_if_due() is None  # the new active segment is empty


def test_batch_over_segment_bytes_or_max_message_bytes_is_rejected(open_log: OpenLog) -> None:
    plog = open_log(segment_bytes=2_000, max_message_bytes=1_000_000)
    with pytest.raises(RecordTooLargeError, match=r"segment\.bytes"):
        plog.append(batch_for(0, 1, size=3_000))
    small = open_log(directory=plog.directory.parent / "b", max_message_bytes=1_000)
    with pytest.raises(RecordTooLargeError, match=r"max\.message\.bytes"):
        small.append(batch_for(0, 1, size=2_000))
    assert plog.high_watermark == 0 and small.high_watermark == 0
    assert plog.active_segment.size == 0


def test_wrong_schema_is_rejected(open_log: OpenLog) -> None:
    import pyarrow as pa

    plog = open_log()
    with pytest.raises(InvalidRecordError):
        plog.append(pa.record_batch({"value": pa.array([b"x"])}))


def test_log_append_time_stamps_broker_time(open_log: OpenLog, clock: ManualClock) -> None:
    plog = open_log(message_timestamp_type="LogAppendTime")
    info = plog.append(batch_for(0, 3, ts=5))
    assert info.log_append_time_ms == clock.now_ms()
    batch = plog.read(0).batches[0]
    assert batch.log_append_time
    assert {r.timestamp for r in batch.to_records()} == {clock.now_ms()}


def test_timestamp_lookup(open_log: OpenLog) -> None:
    plog = open_log(segment_bytes=4_000, index_interval_bytes=1)
    # Timestamps 1000, 1010, ... with one out-of-order record at offset 20.
    for o in range(60):
        ts = 1000 + 10 * o if o != 20 else 900
        plog.append(batch_for(o, 1, ts=ts))
    assert len(plog.segments) > 3
    assert plog.offset_for_timestamp(1000 + 10 * 33) == 33  # exact
    assert plog.offset_for_timestamp(1000 + 10 * 33 + 5) == 34  # between
    assert plog.offset_for_timestamp(0) == 0  # before the first
    assert plog.offset_for_timestamp(850) == 0
    assert plog.offset_for_timestamp(1000 + 10 * 59) == 59  # the last
    assert plog.offset_for_timestamp(1000 + 10 * 59 + 1) is None  # after the last
    assert plog.offset_for_timestamp(1000 + 10 * 20) == 21  # offset 20 is older than its place
    plog.delete_records(40)
    assert plog.offset_for_timestamp(0) == 40  # never below the log start


def test_truncate_then_reopen(open_log: OpenLog, tmp_path: Path) -> None:
    plog = open_log(segment_bytes=3_000)
    append_n(plog, 50, per_batch=5)
    plog.truncate_to(23)  # inside a batch of 5 and inside a segment
    assert plog.high_watermark == 23
    assert_records_match_offsets(read_all(plog))
    append_n(plog, 7)
    assert plog.high_watermark == 30
    plog.close()
    reopened = open_log()
    assert reopened.high_watermark == 30
    assert_records_match_offsets(read_all(reopened))


def test_truncate_to_segment_boundary_and_start(open_log: OpenLog) -> None:
    plog = open_log(segment_bytes=3_000)
    append_n(plog, 30)
    boundary = plog.segments[2].base_offset
    plog.truncate_to(boundary)
    assert plog.high_watermark == boundary and len(plog.segments) == 2
    plog.truncate_to(0)
    assert plog.high_watermark == 0 and plog.read(0).batches == []
    append_n(plog, 3)
    assert_records_match_offsets(read_all(plog))


def test_delete_segments_below_moves_log_start(open_log: OpenLog) -> None:
    plog = open_log(segment_bytes=3_000)
    append_n(plog, 40)
    cutoff = plog.segments[3].base_offset + 1
    deleted = plog.delete_segments_below(cutoff)
    assert [s.next_offset <= cutoff for s in deleted] == [True] * len(deleted) and len(deleted) == 3
    assert plog.log_start_offset == plog.segments[0].base_offset == deleted[-1].next_offset
    assert not any(p.exists() for s in deleted for p in (s.path, s.offset_index.path))
    assert plog.high_watermark == 40
    plog.close()
    reopened = open_log()
    assert reopened.log_start_offset == deleted[-1].next_offset and reopened.high_watermark == 40


def test_delete_records_to_the_end_keeps_offsets(open_log: OpenLog) -> None:
    plog = open_log()
    append_n(plog, 10)
    plog.delete_records(10)
    assert (plog.log_start_offset, plog.high_watermark) == (10, 10)
    assert plog.append(batch_for(10, 1)).base_offset == 10
    plog.close()
    reopened = open_log()
    assert (reopened.log_start_offset, reopened.high_watermark) == (10, 11)


def test_concurrent_reader_threads_never_see_partial_batches(open_log: OpenLog) -> None:
    plog = open_log(segment_bytes=20_000)
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                assert_records_match_offsets(read_all(plog))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    append_n(plog, 2_000, per_batch=7)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_group_commit_shares_syncs(open_log: OpenLog) -> None:
    plog = open_log()
    commit = GroupCommit()
    futures = []
    lock = threading.Lock()

    def producer() -> None:
        for _ in range(50):
            info = plog.append(batch_for(0, 1))
            with lock:
                futures.append(commit.request(plog, info.last_offset + 1))

    threads = [threading.Thread(target=producer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flushed = [f.result(timeout=30) for f in futures]
    commit.close()
    assert plog.flushed_offset == plog.high_watermark == 400
    assert min(flushed) >= 1
    assert commit.syncs < len(futures)  # shared: fewer syncs than requests


def test_group_commit_of_several_logs_reports_each(open_log: OpenLog, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    good, bad, idle = (open_log(tmp_path / name) for name in ("good", "bad", "idle"))
    for plog in (good, bad):
        append_n(plog, 3)
    broken_fd = bad.active_segment._fd
    real_sync = os.fdatasync

    def fdatasync(fd: int) -> None:  # an I/O error cannot be had for real: injected
        if fd == broken_fd:
            raise OSError(errno.EIO, "Input/output error")
        real_sync(fd)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    commit = GroupCommit()
    try:
        outcomes = commit.request_many([(good, 3), (bad, 3), (idle, 0)]).result(timeout=30)
        assert outcomes[0] is None and outcomes[2] is None
        assert isinstance(outcomes[1], StorageError) and "fsync failed" in str(outcomes[1])
        assert good.flushed_offset == 3 and bad.flushed_offset == 0
        assert commit.request_many([(good, 3), (idle, 0)]).result(timeout=1) == [None, None]
    finally:
        commit.close()


def test_flush_is_skipped_when_already_durable(open_log: OpenLog) -> None:
    plog = open_log()
    append_n(plog, 3)
    assert plog.flush() == 3
    assert plog.flush(up_to=2) == 3


class HeldFlushes:
    """A flush scheduler that only records what it is asked (the test runs the flush)."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def __call__(self, plog: PartitionLog, offset: int) -> None:
        self.asked.append(offset)


def _rolled_log(open_log: OpenLog, **config: object
                ) -> tuple[PartitionLog, HeldFlushes, list[int]]:
    plog = open_log(segment_bytes=3_000, **config)
    held = HeldFlushes()
    plog.flush_scheduler = held
    notified: list[int] = []
    plog.roll_listeners.append(lambda _, seg: notified.append(seg.base_offset))
    append_n(plog, 40)
    assert len(plog.segments) > 3
    return plog, held, notified


def test_roll_during_an_append_leaves_the_sync_to_the_flush_scheduler(open_log: OpenLog) -> None:
    plog, held, notified = _rolled_log(open_log)
    bases = [s.base_offset for s in plog.segments]
    # Each roll asked for a flush below the new segment's base and synced nothing itself:
    # the recovery point, the checkpoint and the listeners wait for that flush.
    assert held.asked == bases[1:]
    assert plog.recovery_point == 0 and recovery_point(plog.directory) == 0
    assert plog.flushed_offset == 0 and notified == []
    assert all(s.sealed for s in plog.segments[:-1])
    assert plog.flush(held.asked[0]) == plog.high_watermark  # one flush syncs every sealed one
    assert plog.recovery_point == bases[-1] == recovery_point(plog.directory)
    assert notified == bases[:-1]
    assert plog.flush(held.asked[-1]) == plog.high_watermark and notified == bases[:-1]
    assert_records_match_offsets(read_all(plog))


def test_a_refused_flush_request_syncs_the_rolled_segment_inline(open_log: OpenLog) -> None:
    plog = open_log(segment_bytes=3_000)
    notified: list[int] = []
    plog.roll_listeners.append(lambda _, seg: notified.append(seg.base_offset))

    def closed(_: PartitionLog, offset: int) -> None:
        raise LogClosedError("group commit is closed")
    plog.flush_scheduler = closed
    append_n(plog, 40)
    bases = [s.base_offset for s in plog.segments]
    assert len(bases) > 3 and notified == bases[:-1]
    assert plog.recovery_point == bases[-1] == recovery_point(plog.directory)


def test_close_syncs_segments_still_waiting_for_their_flush(open_log: OpenLog) -> None:
    plog, _, _ = _rolled_log(open_log)
    end, last_base = plog.high_watermark, plog.active_segment.base_offset
    plog.close()
    assert recovery_point(plog.directory) == last_base
    reopened = open_log()
    assert reopened.recovered_from == [] and reopened.high_watermark == end
    assert_records_match_offsets(read_all(reopened))


def test_segments_deleted_before_their_flush_are_not_synced(open_log: OpenLog) -> None:
    plog, _, notified = _rolled_log(open_log)
    bases = [s.base_offset for s in plog.segments]
    gone = plog.delete_segments_below(bases[2])
    assert [s.base_offset for s in gone] == bases[:2]
    assert plog.recovery_point == bases[2]  # the first segment still to sync
    plog.flush()
    assert plog.recovery_point == bases[-1] and notified == bases[2:-1]
    plog.truncate_to(bases[2] + 1)  # drops the later segments, synced or not
    assert plog.high_watermark == bases[2] + 1 and plog.flush() == bases[2] + 1
    assert_records_match_offsets(read_all(plog), bases[2])


def test_a_managed_log_syncs_rolled_segments_in_the_group_commit(tmp_path: Path) -> None:
    manager = LogManager(tmp_path / "data")
    try:
        manager.create_topic("t", 1, {"segment.bytes": 3_000})
        plog = manager.log("t", 0)
        seen: list[tuple[int, str]] = []
        manager.roll_listeners.append(
            lambda _, seg: seen.append((seg.base_offset, threading.current_thread().name)))
        append_n(plog, 40)
        bases = [s.base_offset for s in plog.segments]
        assert len(bases) > 3
        deadline = time.monotonic() + 10
        # The checkpoint file is written just after the recovery point moves in memory, and
        # the roll listeners are called after both.
        while (plog.recovery_point < bases[-1] or recovery_point(plog.directory) < bases[-1]
               or len(seen) < len(bases) - 1) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert plog.recovery_point == bases[-1] == recovery_point(plog.directory)
        assert [base for base, _ in seen] == bases[:-1]
        assert all(name.startswith("lakelog-group-commit") for _, name in seen), seen
    finally:
        manager.close()


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 20)),
    st.tuples(st.just("read"), st.integers(0, 10_000), st.integers(1, 50)),
    st.tuples(st.just("truncate"), st.integers(0, 10_000)),
    st.tuples(st.just("reopen"), st.booleans()),
), max_size=40))
def test_log_matches_a_list_model(tmp_path_factory: pytest.TempPathFactory,
                                  ops: list[tuple]) -> None:  # type: ignore[type-arg]
    from log_tables.config import TopicConfig
    from log_tables.hot.partition_log import PartitionLog

    directory = tmp_path_factory.mktemp("model")
    config = TopicConfig(segment_bytes=2_500, index_interval_bytes=300)
    plog = PartitionLog.open(directory, config)
    model: list[bytes] = []
    for op in ops:
        if op[0] == "append":
            plog.append(batch_for(len(model), op[1]))
            model.extend(batch_for(len(model), op[1]).column(2).to_pylist())
        elif op[0] == "read" and model:
            offset = op[1] % (len(model) + 1)
            got = plog.read(offset, max_records=op[2]).records()
            assert [r.value for r in got] == model[offset:offset + op[2]][:len(got)]
            assert got or offset == len(model)
        elif op[0] == "truncate":
            target = op[1] % (len(model) + 1)
            plog.truncate_to(target)
            del model[target:]
        elif op[0] == "reopen":
            if op[1]:
                plog.close()
            else:
                plog.abandon()
            plog = PartitionLog.open(directory, config)
        assert plog.high_watermark == len(model)
    assert [r.value for r in read_all(plog)] == model
    plog.abandon()
