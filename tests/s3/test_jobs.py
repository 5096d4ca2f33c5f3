"""Every job on an s3:// warehouse (moto_server on loopback), and every read of it.

The chain a user runs: produce → tier → ``read_topic`` → compaction → retention →
vacuum, then optimize; the SQL views over the same warehouse. The shared SparkSession
was started before this test set the AWS variables, so its Python workers do not have
them: the reads below pass only because lakelog carries the settings to its tasks.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pytest
from pyspark.sql import SparkSession

from compaction_jobs.compact import CompactJob
from compaction_jobs.optimize import OptimizeJob
from compaction_jobs.retention import RetentionJob
from compaction_jobs.tier import TierJob
from compaction_jobs.vacuum import VacuumJob
from log_tables.cold.table import open_table, snapshot
from log_tables.hot.log_manager import LogManager
from log_tables.layout import Layout
from log_tables.spark.read import CONF_STORE_READS, read_topic, spark_reads_store
from log_tables.spark.session import attach
from log_tables.storage import filesystem
from tests.compaction_jobs.helpers import check_rows, produce
from tests.compaction_jobs.test_compact import DAY_MS, T0, table_map, updates
from tests.s3.conftest import S3Bucket

pytestmark = pytest.mark.slow


def _on_s3(spark: SparkSession, manager: LogManager, bucket: S3Bucket) -> Layout:
    layout = Layout.of(manager.data_dir, bucket.warehouse)
    attach(spark, layout.data_dir, layout.warehouse)
    return layout


def _objects(uri: str) -> set[str]:
    fs, root = filesystem(uri)
    return {i.path.removeprefix(root + "/") for i in fs.get_file_info(
        pafs.FileSelector(root, recursive=True, allow_not_found=True))
        if i.path.endswith(".parquet")}


def _referenced(uri: str) -> set[str]:
    dt = open_table(uri)
    assert dt is not None
    return {u.removeprefix(uri + "/") for u in dt.file_uris()}


def test_produce_tier_read_compact_expire_vacuum(spark: SparkSession, data: LogManager,
                                                 s3_bucket: S3Bucket) -> None:
    layout = _on_s3(spark, data, s3_bucket)
    assert not spark_reads_store(spark, layout.warehouse)  # no hadoop-aws here: lakelog's reads
    data.create_topic("state", 1, {"cleanup.policy": "compact,delete"})
    expected = updates(data, "state", 0, keys=10, rounds=5)
    data.create_topic("events", 2)
    for p in range(2):
        produce(data, "events", p, 60 + 10 * p, roll_every=25)
    ends = {p: data.log("events", p).high_watermark for p in range(2)}

    tiered = TierJob(layout).run(spark)
    assert {(r.topic, r.partition) for r in tiered.tiered} == {("state", 0), ("events", 0),
                                                                ("events", 1)}
    # read_topic over S3: the tiered files (pyarrow in lakelog's source) and the hot tail.
    check_rows((r.asDict() for r in read_topic(spark, "events").collect()), "events", ends)
    sealed = {p: data.log("events", p).active_segment.base_offset for p in ends}
    check_rows((r.asDict() for r in read_topic(spark, "events", include_hot=False).collect()),
               "events", sealed)
    before = open_table(layout.table_uri("state")).version()  # type: ignore[union-attr]
    assert read_topic(spark, "state", include_hot=False).count() == 50

    report = CompactJob(layout, now_ms=T0 + DAY_MS).run(spark)
    assert [(r.topic, r.partition, r.records_in, r.records_out) for r in report.runs] == [
        ("state", 0, 50, 10)]
    assert table_map(spark, "state")[0] == expected
    assert read_topic(spark, "state").count() == 10
    # Time travel reads the snapshot's own files (removed by compaction, not yet vacuumed).
    assert read_topic(spark, "state", version=before).count() == 50
    uri = layout.table_uri("state")
    assert _objects(uri) > _referenced(uri)  # the compacted-away files wait for vacuum

    data.alter_configs("state", {"retention.ms": "1"})
    expired = RetentionJob(layout, now_ms=T0 + 2 * DAY_MS).run()
    assert [(r.topic, r.partition) for r in expired.runs] == [("state", 0)]
    assert snapshot(open_table(uri), 1)[0].files == ()  # type: ignore[arg-type]
    assert read_topic(spark, "state", include_hot=False).count() == 0

    VacuumJob(layout, ["state"], retention_hours=0).run()
    assert _objects(uri) == _referenced(uri) == set()

    # The SQL views read the same warehouse: job runs and partitions.
    from lakelog.views import register_views

    register_views(spark)
    jobs = {r["job"] for r in spark.sql("SELECT job FROM job_runs").collect()}
    assert {"tier", "compact", "retention", "vacuum"} <= jobs
    rows = {(r["topic"], r["partition"]): r for r in spark.sql(
        "SELECT * FROM partitions").collect()}
    assert rows[("events", 1)]["tiered_offset"] == sealed[1]
    assert rows[("events", 1)]["high_watermark"] == ends[1]


def test_optimize_merges_small_files_on_s3(spark: SparkSession, data: LogManager,
                                           s3_bucket: S3Bucket) -> None:
    layout = _on_s3(spark, data, s3_bucket)
    data.create_topic("events", 1)
    for _ in range(3):  # three tier runs: three small files
        produce(data, "events", 0, 30, roll_every=30)
        data.log("events", 0).roll()
        TierJob(layout).run(spark)
    uri = layout.table_uri("events")
    assert len(_referenced(uri)) >= 3
    report = OptimizeJob(layout, target_bytes=1 << 30).run(spark)
    assert len(report.runs) == 1
    assert len(_referenced(uri)) == 1
    end = data.log("events", 0).high_watermark
    check_rows((r.asDict() for r in read_topic(spark, "events").collect()), "events", {0: end})
    VacuumJob(layout, retention_hours=0).run()
    assert _objects(uri) == _referenced(uri)


def test_forcing_spark_reads_without_hadoop_aws_fails_clearly(
        spark: SparkSession, data: LogManager, s3_bucket: S3Bucket) -> None:
    """``objectStoreReads=spark`` is for clusters with hadoop-aws: here Spark's own reader
    has no s3a file system, and says so."""
    from log_tables.spark.read import _has_class

    # How "auto" decides: the store's Hadoop file system class is on Spark's class path.
    assert _has_class(spark, "org.apache.hadoop.fs.LocalFileSystem")
    assert not _has_class(spark, "org.apache.hadoop.fs.s3a.S3AFileSystem")
    layout = _on_s3(spark, data, s3_bucket)
    data.create_topic("events", 1)
    produce(data, "events", 0, 30, roll_every=30)
    data.log("events", 0).roll()
    TierJob(layout).run(spark)
    spark.conf.set(CONF_STORE_READS, "spark")
    try:
        assert spark_reads_store(spark, layout.warehouse)
        with pytest.raises(Exception, match="s3a"):
            read_topic(spark, "events").collect()
    finally:
        spark.conf.unset(CONF_STORE_READS)


def test_structured_streaming_reads_an_s3_topic(spark: SparkSession, data: LogManager,
                                                s3_bucket: S3Bucket, tmp_path: Path) -> None:
    layout = _on_s3(spark, data, s3_bucket)
    data.create_topic("events", 2)
    for p in range(2):
        produce(data, "events", p, 60, roll_every=20)
    TierJob(layout).run(spark)
    for p in range(2):  # tiered segments leave the hot tier: the stream must read S3
        plog = data.log("events", p)
        plog.delete_segments_below(plog.active_segment.base_offset)
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    query = (spark.readStream.format("lakelog").option("subscribe", "events")
             .option("startingOffsets", "earliest").load()
             .writeStream.format("parquet").option("path", str(sink))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    check_rows((r.asDict() for r in spark.read.parquet(str(sink)).collect()), "events",
               {0: 60, 1: 60})
