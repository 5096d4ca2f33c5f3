"""Retention by time and size, and DeleteRecords, over both tiers (Kafka's scenarios)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compaction_jobs.retention import RetentionJob, Unit, plan_partition
from compaction_jobs.tier import TierJob
from log_tables.cold.commit import delete_records
from log_tables.cold.table import PartitionState, open_table, snapshot
from log_tables.cold.topic_reader import partition_bounds
from log_tables.config import TopicConfig
from log_tables.hot.hot_reader import list_segments
from log_tables.hot.log_manager import LogManager
from log_tables.layout import Layout
from log_tables.records import build_batch
from log_tables.spark.read import read_topic

T0 = 1_700_000_000_000
HOUR_MS = 3600 * 1000


@pytest.fixture
def data(tmp_path: Path) -> LogManager:
    manager = LogManager(tmp_path / "data")
    yield manager
    manager.close()


def fill(manager: LogManager, topic: str, count: int, *, per_segment: int = 10,
         ts_step_ms: int = HOUR_MS) -> None:
    """``count`` records of the same size, a segment every ``per_segment``; record i is
    stamped ``T0 + i * ts_step_ms``."""
    plog = manager.log(topic, 0)
    for _ in range(count):
        o = plog.high_watermark
        plog.append(build_batch([b"v" * 100], keys=[b"key-%06d" % o], timestamps=[T0 + o * ts_step_ms]))
        if plog.high_watermark % per_segment == 0:
            plog.roll()


def units(sizes: list[int], newest_ts: list[int]) -> list[Unit]:
    out, offset = [], 0
    for size, ts in zip(sizes, newest_ts, strict=True):
        offset += 10
        out.append(Unit(offset, ts, size, 10, None))
    return out


EMPTY = PartitionState(0, 0, 0, ())


def test_size_rule_keeps_at_least_retention_bytes_as_kafka() -> None:
    config = TopicConfig(retention_bytes=1000, retention_ms=-1)
    # 5 units of 300 bytes + an active segment of 100: 1600 in all.
    plan = plan_partition(0, EMPTY, units([300] * 5, [0] * 5), 100, config, now=0)
    assert plan is not None and len(plan.deleted) == 2 and plan.new_start == 20  # 1000 left
    # At the limit: nothing goes; a byte short of a whole unit over it: still nothing.
    assert plan_partition(0, EMPTY, units([300] * 3, [0] * 3), 100, config, now=0) is None
    assert plan_partition(0, EMPTY, units([300] * 3, [0] * 3), 100 + 299, config, now=0) is None


def test_time_rule_by_newest_timestamp_and_only_a_prefix() -> None:
    config = TopicConfig(retention_ms=1000, retention_bytes=-1)
    # The third unit is young, so the fourth (old again) stays too: retention is a prefix.
    plan = plan_partition(0, EMPTY, units([1] * 4, [0, 500, 9000, 0]), 0, config, now=10_000)
    assert plan is not None and plan.new_start == 20
    assert plan_partition(0, EMPTY, units([1] * 2, [9000, 9001]), 0, config, now=10_000) is None


@pytest.mark.slow
def test_time_retention_over_both_tiers(spark: SparkSession, data: LogManager) -> None:
    data.create_topic("events", 1, {"retention.ms": str(10 * HOUR_MS)})
    fill(data, "events", 40)                   # 4 sealed segments of 10, an empty active one
    layout = Layout.of(data.data_dir)
    TierJob(layout).run(spark)                 # offsets 0..39 in Delta
    fill(data, "events", 25)                   # 40..59 sealed, not tiered; 60..64 active
    hw = data.log("events", 0).high_watermark
    # At T0 + 60h: files and segments whose newest record is older than T0 + 50h go:
    # the four Delta files and the first untiered segment.
    report = RetentionJob(layout, now_ms=T0 + 60 * HOUR_MS).run()
    assert [(r.partition, r.records_in) for r in report.runs] == [(0, 50)]
    state = snapshot(open_table(layout.table_uri("events")), 1)[0]
    assert state.start_offset == 50 and state.files == ()
    assert partition_bounds(layout, "events", 0, state) == (50, 40, hw)
    assert data.log("events", 0).high_watermark == hw
    # The next tier run skips what retention deleted before it was tiered.
    data.log("events", 0).delete_records(50)   # the server follows the log start
    TierJob(layout).run(spark)
    assert snapshot(open_table(layout.table_uri("events")), 1)[0].files[0].min_offset == 50
    rows = read_topic(spark, "events").orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(50, hw))
    # Again, and with nothing to delete: no commit at all.
    version = open_table(layout.table_uri("events")).version()
    assert RetentionJob(layout, now_ms=T0 + 60 * HOUR_MS).run().runs == []
    assert open_table(layout.table_uri("events")).version() == version


@pytest.mark.slow
def test_size_retention_leaves_the_newest_files_that_fit(spark: SparkSession, data: LogManager
                                                         ) -> None:
    data.create_topic("events", 1, {"retention.ms": "-1"})
    fill(data, "events", 81)
    layout = Layout.of(data.data_dir)
    TierJob(layout).run(spark)
    files = snapshot(open_table(layout.table_uri("events")), 1)[0].files
    active = list_segments(layout.partition_dir("events", 0))[-1].path.stat().st_size
    keep = sum(f.size_bytes for f in files[-3:]) + active
    data.alter_configs("events", {"retention.bytes": str(keep)})
    RetentionJob(layout).run()
    left = snapshot(open_table(layout.table_uri("events")), 1)[0]
    assert left.files == files[-3:] and left.start_offset == files[-3].min_offset


@pytest.mark.slow
@pytest.mark.parametrize("count", [0, 1, 35])
def test_retention_never_moves_the_high_watermark(spark: SparkSession, data: LogManager,
                                                  count: int) -> None:
    data.create_topic("events", 1, {"retention.ms": "0", "retention.bytes": "0"})
    fill(data, "events", count)
    layout = Layout.of(data.data_dir)
    TierJob(layout).run(spark)
    hw = data.log("events", 0).high_watermark
    RetentionJob(layout, now_ms=T0 + 1000 * HOUR_MS).run()
    state = snapshot(open_table(layout.table_uri("events")), 1)[0]
    bounds = partition_bounds(layout, "events", 0, state)
    assert bounds.high_watermark == hw == count
    # Everything sealed went; the active segment (Kafka keeps it too) stays readable.
    assert bounds.log_start_offset == list_segments(layout.partition_dir("events", 0))[-1].base_offset


@pytest.mark.slow
def test_delete_records_moves_the_log_start_mid_file(spark: SparkSession, data: LogManager
                                                     ) -> None:
    data.create_topic("events", 1)
    fill(data, "events", 35)
    layout = Layout.of(data.data_dir)
    TierJob(layout).run(spark)
    meta = data.topic("events")
    got = delete_records(layout.table_uri("events"), "events", meta.topic_id, 1, {0: 15}, "t")
    assert got == {0: 15}
    state = snapshot(open_table(layout.table_uri("events")), 1)[0]
    assert [f.min_offset for f in state.files] == [10, 20]   # 0..9 removed, 10..19 straddles
    rows = read_topic(spark, "events").orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(15, 35))
    # Never backwards.
    assert delete_records(layout.table_uri("events"), "events", meta.topic_id, 1, {0: 5}, "t") == {0: 15}
