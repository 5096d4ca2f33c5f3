"""The SQL views' names come from one list (``log_tables.config.SQL_VIEW_NAMES``), which
topic names may not take; the views themselves are checked with Spark in
tests/log_tables/test_spark_stream.py and tests/consumer_groups/test_lag_views.py, and
``partitions``' placement columns here (the cluster of one) and in
tests/cluster/test_views.py (a cluster's, from ZooKeeper)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lakelog.views import register_views
from log_tables.hot.log_manager import LogManager
from log_tables.leadership import write_cluster_id

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["log_tables", "consumer_groups", "compaction_jobs", "ingest_api", "lakelog"]


def test_no_view_is_named_outside_the_one_list() -> None:
    """A view registered under a literal name would be a second list: its name could
    miss the reserved ones, and a topic of that name would hide behind it."""
    literal = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ("createOrReplaceTempView", "createTempView")
                        and node.args and isinstance(node.args[0], ast.Constant)):
                    literal.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.args[0].value}")
    assert not literal, "views named outside log_tables.config.SQL_VIEW_NAMES:\n" + "\n".join(
        literal)


PLACEMENT = "SELECT topic, partition, leader, replicas, isr, leader_epoch, under_replicated " \
            "FROM partitions ORDER BY topic, partition"


@pytest.mark.slow
def test_partitions_of_the_cluster_of_one_are_led_by_broker_1(spark: SparkSession,
                                                              tmp_path: Path) -> None:
    manager = LogManager(tmp_path / "data")
    try:
        manager.create_topic("events", 2)
    finally:
        manager.close()
    register_views(spark, topics=[])
    assert [tuple(r) for r in spark.sql(PLACEMENT).collect()] == [
        ("events", 0, 1, [1], [1], 0, False), ("events", 1, 1, [1], [1], 0, False)]
    # A cluster's data directory without its ZooKeeper: not known, rather than made up.
    write_cluster_id(tmp_path / "data", "c-1", 2)
    register_views(spark, topics=[], zookeeper=None)
    assert [tuple(r) for r in spark.sql(PLACEMENT).collect()] == [
        ("events", 0, None, None, None, None, None),
        ("events", 1, None, None, None, None, None)]
