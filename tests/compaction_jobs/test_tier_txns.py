"""Tiering with transactions, on real Spark and Delta: a table holds committed records
only (no marker, no aborted record, nothing at or past a transaction still open), and a
committed transaction's records of one topic reach the table in one commit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compaction_jobs.tier import TierJob
from compaction_jobs.tier_txns import whole_transactions
from log_tables.hot.log_manager import LogManager
from log_tables.hot.partition_log import PartitionLog
from log_tables.layout import Layout
from log_tables.spark.read import read_topic
from tests.log_tables.helpers import batch_for

pytestmark = pytest.mark.slow


@pytest.fixture
def data(tmp_path: Path) -> Iterator[LogManager]:
    manager = LogManager(tmp_path / "data")
    yield manager
    manager.close()


def _txn(plog: PartitionLog, pid: int, epoch: int, n: int, seq: int = 0) -> None:
    plog.append(batch_for(plog.log_end_offset, n), producer_id=pid, producer_epoch=epoch,
                base_sequence=seq, transactional=True)


def _offsets(spark: SparkSession, topic: str, **options: object) -> dict[int, list[int]]:
    rows = read_topic(spark, topic, **options).select("partition", "offset").collect()  # type: ignore[arg-type]
    out: dict[int, list[int]] = {}
    for r in sorted(rows, key=lambda r: (r["partition"], r["offset"])):
        out.setdefault(r["partition"], []).append(r["offset"])
    return out


def test_a_table_holds_committed_records_only(spark: SparkSession, data: LogManager) -> None:
    data.create_topic("t", 2)
    p0, p1 = data.log("t", 0), data.log("t", 1)
    p0.append(batch_for(0, 2))                  # 0-1 plain
    _txn(p0, 1, 0, 2)                           # 2-3 committed at 6
    _txn(p0, 2, 0, 1)                           # 4 aborted at 5
    p0.append_marker(2, 1, commit=False, coordinator_epoch=0)   # 5
    p0.append_marker(1, 1, commit=True, coordinator_epoch=0)    # 6
    p0.append(batch_for(7, 1))                  # 7 plain
    p0.roll()
    p1.append(batch_for(0, 1))                  # 0 plain
    _txn(p1, 3, 0, 2)                           # 1-2 still open
    p1.append(batch_for(3, 1))                  # 3 plain, past the open transaction
    p1.roll()
    report = TierJob(Layout.of(data.data_dir)).run(spark)
    assert {(r.partition, r.end) for r in report.tiered} == {(0, 8)}  # p1 waits at offset 1
    assert _offsets(spark, "t", include_hot=False) == {0: [0, 1, 2, 3, 7]}
    # With the hot tail: read_committed, as every table read (Kafka's option name for the other).
    assert _offsets(spark, "t") == {0: [0, 1, 2, 3, 7], 1: [0]}
    # read_uncommitted reads the hot tail's open transaction too; the table part has no
    # aborted record at any level.
    assert _offsets(spark, "t", isolation_level="read_uncommitted") == {
        0: [0, 1, 2, 3, 7], 1: [0, 1, 2, 3]}

    p1.append_marker(3, 1, commit=True, coordinator_epoch=0)    # 4
    p1.roll()
    TierJob(Layout.of(data.data_dir)).run(spark)
    assert _offsets(spark, "t", include_hot=False) == {0: [0, 1, 2, 3, 7], 1: [0, 1, 2, 3]}


def test_a_transaction_over_two_partitions_is_tiered_in_one_commit(
        spark: SparkSession, data: LogManager) -> None:
    data.create_topic("t", 2)
    p0, p1 = data.log("t", 0), data.log("t", 1)
    p0.append(batch_for(0, 1))
    p0.roll()                                   # [0]: no transaction: tiered at once
    _txn(p0, 5, 0, 2)                           # 1-2
    _txn(p1, 5, 0, 2)                           # 0-1
    p0.append_marker(5, 1, commit=True, coordinator_epoch=0)    # p0: 3
    p1.append_marker(5, 1, commit=True, coordinator_epoch=0)    # p1: 2
    p0.roll()                                   # p0's part is sealed, p1's is not yet
    layout = Layout.of(data.data_dir)
    TierJob(layout).run(spark)
    assert _offsets(spark, "t", include_hot=False) == {0: [0]}
    p1.roll()
    TierJob(layout).run(spark)
    assert _offsets(spark, "t", include_hot=False) == {0: [0, 1, 2], 1: [0, 1]}


def test_a_commit_whose_markers_are_being_written_waits_for_all_of_them(
        spark: SparkSession, data: LogManager) -> None:
    """The coordinator wrote p0's COMMIT marker, not yet p1's (it is on its way, or the
    coordinator died between them and its successor will): p0's part waits."""
    data.create_topic("t", 2)
    p0, p1 = data.log("t", 0), data.log("t", 1)
    _txn(p0, 8, 0, 1)                           # p0: 0
    _txn(p1, 8, 0, 1)                           # p1: 0
    p0.append_marker(8, 1, commit=True, coordinator_epoch=0)    # p0: 1
    p0.append(batch_for(2, 1))                  # p0: 2
    p0.roll()
    p1.roll()
    layout = Layout.of(data.data_dir)
    TierJob(layout).run(spark)
    assert _offsets(spark, "t", include_hot=False) == {}
    p1.append_marker(8, 1, commit=True, coordinator_epoch=0)    # p1: 1
    p1.roll()
    TierJob(layout).run(spark)
    assert _offsets(spark, "t", include_hot=False) == {0: [0, 2], 1: [0]}


def test_a_marker_younger_than_settle_ms_holds_its_transaction_back(
        spark: SparkSession, data: LogManager) -> None:
    """A cluster's tierer reads followers' replicas, which may not yet hold records of a
    transaction whose marker it already has in another partition (here: p1 holds nothing
    of it yet). Until the marker is ``settle_ms`` old the transaction is held back like an
    open one; once it is, every in-sync replica holds it (``cluster.tierers``)."""
    data.create_topic("t", 2)
    p0 = data.log("t", 0)  # p1 (data.log("t", 1)) holds nothing of it yet
    _txn(p0, 9, 0, 2)                           # p0: 0-1
    p0.append_marker(9, 1, commit=True, coordinator_epoch=0)    # p0: 2
    p0.append(batch_for(3, 1))                  # p0: 3
    p0.roll()
    layout = Layout.of(data.data_dir)
    TierJob(layout, settle_ms=3_600_000).run(spark)
    assert _offsets(spark, "t", include_hot=False) == {}
    TierJob(layout, settle_ms=0).run(spark)     # old enough (here: no wait at all)
    assert _offsets(spark, "t", include_hot=False) == {0: [0, 1, 3]}


def test_ends_are_lowered_until_no_transaction_is_cut() -> None:
    # t1 (p0 [10, 12], p1 [5, 30]) straddles p1's end 20: p0 goes back to 10, p1 to 0;
    # then t2 (p0 [8, 9], p1 [18, 19]) is below p0's end and not p1's: p0 goes to 0.
    ends = whole_transactions(
        {0: 15, 1: 20}, {0: [0, 10, 15], 1: [0, 20]},
        {0: {(1, 0): (10, 12), (2, 0): (8, 9)}, 1: {(1, 0): (5, 30), (2, 0): (18, 19)}})
    assert ends == {0: 0, 1: 0}
    assert whole_transactions({0: 15, 1: 40}, {0: [0, 15], 1: [0, 40]},
                              {0: {(1, 0): (10, 12)}, 1: {(1, 0): (5, 30)}}) == {0: 15, 1: 40}
