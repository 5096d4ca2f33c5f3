"""Spark SQL views of a lakelog: every topic, its partitions, the jobs' runs and the
consumer groups' offsets and lag.

They compose ``log_tables`` (topics, ``partitions``, ``job_runs``) and
``consumer_groups`` (``consumer_offsets``, ``consumer_lag``, ``consumer_group_lag``),
so they are registered here, above both: ``lakelog sql`` and notebooks call
``register_views``. Their names are reserved for topics (``log_tables.config``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from consumer_groups.views import register_group_views
from log_tables.cold.job_runs import SPARK_DDL as JOB_RUNS_DDL
from log_tables.cold.job_runs import job_runs_uri
from log_tables.config import LOG_VIEWS
from log_tables.spark.read import PARTITIONS_DDL, partition_rows, read_delta, read_topic
from log_tables.spark.session import session_layout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PARTITIONS, JOB_RUNS = LOG_VIEWS


def register_views(spark: SparkSession, topics: list[str] | None = None) -> list[str]:
    """Make every topic (or the given ones) a temporary SQL view, plus ``partitions``,
    ``job_runs`` (what the jobs did: one row per run and partition), and the consumer
    group views ``consumer_offsets``, ``consumer_lag`` and ``consumer_group_lag``;
    returns the views' names.

    A view is a snapshot as of this call (like ``read_topic``); call again to refresh.
    """
    layout = session_layout(spark)
    names = [t.name for t in layout.topics() if topics is None or t.name in topics]
    for name in names:
        read_topic(spark, name).createOrReplaceTempView(f"`{name}`")
    spark.createDataFrame(partition_rows(layout), PARTITIONS_DDL).createOrReplaceTempView(
        PARTITIONS)
    read_delta(spark, job_runs_uri(layout.warehouse), JOB_RUNS_DDL).createOrReplaceTempView(
        JOB_RUNS)
    return [*names, *LOG_VIEWS, *register_group_views(spark, layout)]
