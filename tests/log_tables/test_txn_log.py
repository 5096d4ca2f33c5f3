"""Transactions in one partition's log: open transactions hold the last stable offset,
markers end them and are never read, aborted records are stepped over by committed
readers, in the broker and in other processes, through restarts, followers and
truncation."""

from __future__ import annotations

from pathlib import Path

import pytest

from log_tables.errors import InvalidProducerEpochError, InvalidRecordError
from log_tables.hot.hot_reader import PartitionReader
from log_tables.hot.isolation import READ_COMMITTED, READ_UNCOMMITTED, Isolation
from log_tables.hot.partition_log import PartitionLog
from log_tables.hot.txn_index import TXN_FILE, AbortedTxn
from tests.conftest import OpenLog
from tests.log_tables.helpers import batch_for

A, B = 7, 9  # producer ids


def _txn(plog: PartitionLog, pid: int, n: int, seq: int, epoch: int = 0) -> int:
    """Append ``n`` records of producer ``pid``'s transaction; their base offset."""
    first = plog.log_end_offset
    info = plog.append(batch_for(first, n), producer_id=pid, producer_epoch=epoch,
                       base_sequence=seq, transactional=True)
    return info.base_offset


def _offsets(plog: PartitionLog, isolation: Isolation, start: int = 0) -> list[int]:
    """Every offset a reader at ``isolation`` sees from ``start``, reading in small steps
    (so that a read can end on a hidden batch), and where it ends up."""
    out: list[int] = []
    offset = start
    for _ in range(1000):
        result = plog.read(offset, max_bytes=1, isolation=isolation)
        out += [r.offset for r in result.records()]
        nxt = result.next_offset
        if nxt is None or nxt == offset:
            return out
        offset = nxt
    raise AssertionError("no end to the reads")


def _reader_offsets(directory: Path, isolation: Isolation) -> list[int]:
    return [b.base_offset + i for b in PartitionReader(directory).batches(0, isolation=isolation)
            for i in range(b.records.num_rows)]


def test_an_open_transaction_holds_the_last_stable_offset_and_a_commit_releases_it(
        open_log: OpenLog) -> None:
    plog = open_log()
    plog.append(batch_for(0, 2))                       # 0-1 plain
    assert _txn(plog, A, 3, 0) == 2                    # 2-4 A's, open
    plog.append(batch_for(5, 1))                       # 5 plain
    assert plog.readable_end(READ_COMMITTED) == 2
    assert plog.readable_end(READ_UNCOMMITTED) == 6
    assert _offsets(plog, READ_COMMITTED) == [0, 1]
    assert _offsets(plog, READ_UNCOMMITTED) == [0, 1, 2, 3, 4, 5]

    marker = plog.append_marker(A, 1, commit=True, coordinator_epoch=3)
    assert marker == 6
    assert plog.readable_end(READ_COMMITTED) == 7
    # The marker takes an offset; no reader is handed it.
    assert _offsets(plog, READ_COMMITTED) == [0, 1, 2, 3, 4, 5]
    assert _offsets(plog, READ_UNCOMMITTED) == [0, 1, 2, 3, 4, 5]
    # A read that ends on the marker goes past it.
    assert plog.read(6, isolation=READ_COMMITTED).next_offset == 7


def test_aborted_records_are_stepped_over_by_committed_readers_only(open_log: OpenLog) -> None:
    plog = open_log()
    _txn(plog, A, 2, 0)                                # 0-1 A (to abort)
    _txn(plog, B, 2, 0)                                # 2-3 B (to commit)
    plog.append(batch_for(4, 1))                       # 4 plain
    _txn(plog, A, 1, 2)                                # 5 A
    assert plog.readable_end(READ_COMMITTED) == 0
    assert plog.append_marker(A, 1, commit=False, coordinator_epoch=0) == 6
    assert plog.readable_end(READ_COMMITTED) == 2      # B is still open
    assert plog.append_marker(B, 1, commit=True, coordinator_epoch=0) == 7
    assert plog.readable_end(READ_COMMITTED) == 8
    assert plog.producers.txns.aborted == [AbortedTxn(A, 0, 6)]
    assert _offsets(plog, READ_COMMITTED) == [2, 3, 4]
    assert _offsets(plog, READ_UNCOMMITTED) == [0, 1, 2, 3, 4, 5]
    # From the middle too: the aborted index covers a read that starts inside it.
    assert _offsets(plog, READ_COMMITTED, start=1) == [2, 3, 4]


def test_a_marker_is_written_once_and_fences_the_epoch_it_ended(open_log: OpenLog) -> None:
    plog = open_log()
    _txn(plog, A, 2, 0, epoch=4)
    assert plog.append_marker(A, 5, commit=True, coordinator_epoch=0) == 2
    # Again (a coordinator finishing the commit once more): nothing is open, no marker.
    assert plog.append_marker(A, 5, commit=True, coordinator_epoch=1) is None
    assert plog.log_end_offset == 3
    # A late write of the ended transaction, at its old epoch, is fenced (KIP-890).
    with pytest.raises(InvalidProducerEpochError):
        _txn(plog, A, 1, 2, epoch=4)
    # The next transaction starts at sequence 0 of the new epoch.
    assert _txn(plog, A, 1, 0, epoch=5) == 3
    # A marker of an older coordinator's epoch is refused.
    with pytest.raises(InvalidProducerEpochError):
        plog.append_marker(A, 4, commit=False, coordinator_epoch=0)
    with pytest.raises(InvalidRecordError, match="producer id"):
        plog.append(batch_for(9, 1), transactional=True)


def test_a_marker_where_the_transaction_wrote_nothing_fences_a_late_write(
        open_log: OpenLog) -> None:
    """KIP-890: the transaction added the partition, its write was checked, then the
    transaction ended before the write was appended. The marker (written although nothing
    of it is here) carries the new epoch, so the late write is refused instead of opening
    a transaction that no marker would ever end."""
    plog = open_log()
    assert plog.append_marker(B, 3, commit=True, coordinator_epoch=0) == 0
    with pytest.raises(InvalidProducerEpochError):
        _txn(plog, B, 1, 0, epoch=2)
    assert plog.producers.txns.open == {}
    assert plog.readable_end(READ_COMMITTED) == 1


@pytest.mark.parametrize("how", ["clean", "killed"])
def test_transactions_survive_a_restart(open_log: OpenLog, how: str) -> None:
    plog = open_log()
    _txn(plog, A, 2, 0)
    plog.append(batch_for(2, 1))
    assert plog.append_marker(A, 1, commit=False, coordinator_epoch=0) == 3
    plog.roll()                                         # a snapshot holds the state so far
    _txn(plog, B, 2, 0)                                 # 4-5, open over the restart
    if how == "clean":
        plog.close()
    else:
        plog.abandon()
    again = open_log()
    assert again.readable_end(READ_COMMITTED) == 4
    assert again.producers.txns.aborted == [AbortedTxn(A, 0, 3)]
    assert again.append_marker(B, 1, commit=True, coordinator_epoch=0) == 6
    assert _offsets(again, READ_COMMITTED) == [2, 4, 5]


def test_a_follower_and_a_truncation_keep_the_same_state(open_log: OpenLog,
                                                         tmp_path: Path) -> None:
    leader = open_log()
    _txn(leader, A, 2, 0)
    leader.append_marker(A, 1, commit=False, coordinator_epoch=0)
    _txn(leader, B, 1, 0)
    follower = open_log(tmp_path / "follower")
    follower.append_replica(leader.read_raw(0, 1 << 20).data)
    assert follower.producers.txns.open == {B: 3}
    assert follower.producers.txns.aborted == [AbortedTxn(A, 0, 2)]
    assert (tmp_path / "follower" / TXN_FILE).exists()
    assert _offsets(follower, READ_COMMITTED) == []
    # Truncated below the abort marker: A's transaction is open again.
    follower.truncate_to(2)
    assert follower.producers.txns.open == {A: 0}
    assert follower.producers.txns.aborted == []
    assert follower.readable_end(READ_COMMITTED) == 0


def test_readers_in_other_processes_see_what_the_broker_sees(open_log: OpenLog,
                                                             tmp_path: Path) -> None:
    plog = open_log()
    plog.append(batch_for(0, 1))                        # 0
    _txn(plog, A, 2, 0)                                 # 1-2 A, aborted at 5
    _txn(plog, B, 1, 0)                                 # 3 B, committed at 6
    plog.append(batch_for(4, 1))                        # 4
    plog.append_marker(A, 1, commit=False, coordinator_epoch=0)
    plog.append_marker(B, 1, commit=True, coordinator_epoch=0)
    _txn(plog, A, 1, 0, epoch=1)                        # 7, open
    plog.append(batch_for(8, 1))                        # 8
    directory = tmp_path / "log"
    assert _reader_offsets(directory, READ_COMMITTED) == _offsets(plog, READ_COMMITTED) \
        == [0, 3, 4]
    assert _reader_offsets(directory, READ_UNCOMMITTED) == _offsets(plog, READ_UNCOMMITTED) \
        == [0, 1, 2, 3, 4, 7, 8]
    end, found = PartitionReader(directory).committed(0)
    assert (end, found.last_stable) == (9, 7)


def test_a_partition_without_transactions_is_read_without_a_scan(open_log: OpenLog,
                                                                 tmp_path: Path) -> None:
    plog = open_log()
    plog.append(batch_for(0, 3), producer_id=1, producer_epoch=0, base_sequence=0)
    assert not (tmp_path / "log" / TXN_FILE).exists()
    assert _reader_offsets(tmp_path / "log", READ_COMMITTED) == [0, 1, 2]


def test_a_hot_range_read_steps_over_markers_without_duplicates(tmp_path: Path) -> None:
    """``read_range`` (what Spark's readers and the views read the hot tail with) goes on
    past markers and aborted records, in the middle of a range and at its end."""
    from log_tables.cold.topic_reader import hot_end_offset, read_range
    from log_tables.hot.log_manager import LogManager
    from log_tables.layout import Layout

    manager = LogManager(tmp_path / "data")
    try:
        manager.create_topic("t", 1)
        plog = manager.log("t", 0)
        plog.append(batch_for(0, 2))                    # 0-1
        _txn(plog, A, 1, 0)                             # 2, committed at 3
        plog.append_marker(A, 1, commit=True, coordinator_epoch=0)
        _txn(plog, B, 1, 0)                             # 4, aborted at 5
        plog.append_marker(B, 1, commit=False, coordinator_epoch=0)
        plog.append(batch_for(6, 3))                    # 6-8
        _txn(plog, A, 1, 0, epoch=1)                    # 9, committed at 10: the log ends
        plog.append_marker(A, 2, commit=True, coordinator_epoch=0)
        layout = Layout.of(manager.data_dir)
        end = hot_end_offset(layout, "t", 0)
        assert end == 11
        rows = [o for rb in read_range(layout, "t", 0, 0, end) for o in rb.column("offset").to_pylist()]
        assert rows == [0, 1, 2, 6, 7, 8, 9]
        tail = [o for rb in read_range(layout, "t", 0, 9, end) for o in rb.column("offset").to_pylist()]
        assert tail == [9]
    finally:
        manager.close()
