"""``format("lakelog")``: batch reads and Structured Streaming, exactly once across restarts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compaction_jobs.tier import TierJob
from lakelog.views import register_views
from log_tables.cold.topic_reader import SPARK_DDL
from log_tables.config import SQL_VIEW_NAMES
from log_tables.hot.log_manager import LogManager
from log_tables.layout import Layout
from tests.compaction_jobs.helpers import check_rows, produce

pytestmark = pytest.mark.slow


@pytest.fixture
def data(tmp_path: Path) -> Iterator[LogManager]:
    manager = LogManager(tmp_path / "data")
    yield manager
    manager.close()


def _stream_to_parquet(spark: SparkSession, sink: Path, checkpoint: Path,
                       **options: str) -> list[int]:
    """Run an availableNow query into a Parquet sink; returns rows per micro-batch."""
    reader = spark.readStream.format("lakelog").option("subscribe", "events")
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (reader.load().writeStream.format("parquet").option("path", str(sink))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return [p["numInputRows"] for p in query.recentProgress]


def test_stream_available_now_then_restart_delivers_each_record_once(
        spark: SparkSession, data: LogManager, tmp_path: Path) -> None:
    data.create_topic("events", 2)
    for p in range(2):
        produce(data, "events", p, 60, roll_every=20)
    TierJob(Layout.of(data.data_dir)).run(spark)  # part cold, part hot
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    first = _stream_to_parquet(spark, sink, checkpoint, startingOffsets="earliest",
                               maxOffsetsPerTrigger="50")
    assert sum(first) == 120 and max(first) <= 50, first  # rate limited: several batches
    for p in range(2):
        produce(data, "events", p, 25)
    second = _stream_to_parquet(spark, sink, checkpoint, startingOffsets="earliest")
    assert sum(second) == 50, second  # only the new records, from the checkpoint
    assert _stream_to_parquet(spark, sink, checkpoint) in ([], [0])
    rows = spark.read.parquet(str(sink)).collect()
    check_rows((r.asDict() for r in rows), "events", {0: 85, 1: 85})


def test_stream_starts_at_latest_by_default(spark: SparkSession, data: LogManager,
                                            tmp_path: Path) -> None:
    data.create_topic("events", 1)
    produce(data, "events", 0, 30)
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    assert sum(_stream_to_parquet(spark, sink, checkpoint)) == 0
    produce(data, "events", 0, 10)
    assert sum(_stream_to_parquet(spark, sink, checkpoint)) == 10
    rows = spark.read.parquet(str(sink)).collect()
    check_rows((r.asDict() for r in rows), "events", {0: 40}, {0: 30})


def test_batch_read_with_kafka_options(spark: SparkSession, data: LogManager) -> None:
    data.create_topic("events", 2)
    for p in range(2):
        produce(data, "events", p, 40, roll_every=15)
    TierJob(Layout.of(data.data_dir)).run(spark)
    df = (spark.read.format("lakelog").option("subscribe", "events")
          .option("startingOffsets", json.dumps({"events": {"0": 5, "1": -2}}))
          .option("endingOffsets", json.dumps({"events": {"0": 33}})).load())
    check_rows((r.asDict() for r in df.collect()), "events", {0: 33, 1: 40}, {0: 5, 1: 0})
    with pytest.raises(Exception, match="subscribe"):
        spark.read.format("lakelog").load().collect()


def test_sql_views_and_partitions(spark: SparkSession, data: LogManager) -> None:
    data.create_topic("events", 2)
    data.create_topic("other-topic", 1)
    for p in range(2):
        produce(data, "events", p, 30, roll_every=10)
    produce(data, "other-topic", 0, 5)
    TierJob(Layout.of(data.data_dir)).run(spark)
    views = register_views(spark)
    assert views == ["events", "other-topic", "partitions", "job_runs",
                     "consumer_offsets", "consumer_lag", "consumer_group_lag"]
    # lakelog's own view names (and its helper view's) are reserved for topics
    helpers = {t.name for t in spark.catalog.listTables() if t.isTemporary} - set(views)
    assert set(views[2:]) | helpers == set(SQL_VIEW_NAMES)
    # No group has committed yet: the group views exist, empty.
    assert spark.sql("SELECT count(*) FROM consumer_lag").first()[0] == 0
    tiered = spark.sql("SELECT topic, partition, records_in FROM job_runs WHERE job = 'tier' "
                       "ORDER BY topic, partition").collect()
    assert [tuple(r) for r in tiered] == [("events", 0, 30), ("events", 1, 30)]
    counts = {r["partition"]: r["n"] for r in spark.sql(
        "SELECT partition, count(*) AS n FROM events GROUP BY partition").collect()}
    assert counts == {0: 30, 1: 30}
    assert spark.sql("SELECT count(*) FROM `other-topic`").first()[0] == 5
    parts = {(r["topic"], r["partition"]): r for r in spark.sql("SELECT * FROM partitions").collect()}
    assert parts[("events", 0)]["tiered_offset"] == data.log("events", 0).active_segment.base_offset
    assert parts[("events", 0)]["high_watermark"] == 30
    assert parts[("events", 1)]["cold_bytes"] > 0
    assert parts[("other-topic", 0)]["tiered_offset"] == 0
    assert parts[("other-topic", 0)]["hot_bytes"] > 0


def test_stream_processing_time_trigger_restart_exactly_once(
        spark: SparkSession, data: LogManager, tmp_path: Path) -> None:
    import time

    data.create_topic("events", 2)
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"

    def start() -> object:
        return (spark.readStream.format("lakelog").option("subscribe", "events")
                .option("startingOffsets", "earliest").load()
                .writeStream.format("parquet").option("path", str(sink))
                .option("checkpointLocation", str(checkpoint))
                .trigger(processingTime="200 milliseconds").start())

    def wait_rows(n: int) -> None:
        deadline = time.monotonic() + 120
        while True:
            if sink.exists() and spark.read.schema(SPARK_DDL).parquet(str(sink)).count() >= n:
                return
            assert time.monotonic() < deadline, f"sink never reached {n} rows"
            time.sleep(0.2)

    query = start()
    for p in range(2):
        produce(data, "events", p, 30)
    wait_rows(60)
    query.stop()  # type: ignore[attr-defined]
    for p in range(2):
        produce(data, "events", p, 20)
    query = start()
    try:
        wait_rows(100)
    finally:
        query.stop()  # type: ignore[attr-defined]
    rows = spark.read.parquet(str(sink)).collect()
    check_rows((r.asDict() for r in rows), "events", {0: 50, 1: 50})
