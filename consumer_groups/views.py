"""SQL views over ``_consumer_offsets``: committed offsets and lag, one query away.

- ``consumer_offsets``: the latest committed offset per group, topic and partition
  (the newest row by ``seq``; tombstones hide deleted and expired groups).
- ``consumer_lag``: every partition of every topic a group reads (see ``lag.py``:
  the topics its live members subscribe to, from the server's
  ``group_subscriptions.json``, and the topics it has committed offsets for), with
  the log start and high watermark (from the ``partitions`` view), the committed
  offset (NULL where the group has committed nothing) and ``lag`` = high watermark
  - committed offset (at least 0), or high watermark - log start offset where
  nothing is committed.
- ``consumer_group_lag``: per group, the partitions it reads, how many of them have
  a committed offset, the total and the largest lag.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from consumer_groups.offsets import SPARK_DDL, offsets_uri
from consumer_groups.subscriptions import read_subscriptions
from log_tables.cold.table import open_table
from log_tables.layout import delta_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from log_tables.layout import Layout

VIEWS = ["consumer_offsets", "consumer_lag", "consumer_group_lag"]
SUBSCRIPTIONS_DDL = "`group` STRING, topic STRING"


def register_group_views(spark: SparkSession, layout: Layout) -> list[str]:
    """Register the three views (needs the ``partitions`` view); returns their names."""
    dt = open_table(offsets_uri(layout.warehouse))
    files = [delta_path(u) for u in dt.file_uris()] if dt is not None else []
    rows = (spark.read.schema(SPARK_DDL).parquet(*files) if files
            else spark.createDataFrame([], SPARK_DDL))
    rows.createOrReplaceTempView("_consumer_offset_rows")
    spark.sql("""
        SELECT `group`, topic, partition, latest.offset AS offset, latest.metadata AS metadata,
               latest.commit_timestamp AS commit_timestamp, latest.member_id AS member_id,
               latest.member_epoch AS member_epoch
        FROM (SELECT `group`, topic, partition,
                     max_by(struct(offset, metadata, commit_timestamp, member_id, member_epoch),
                            seq) AS latest
              FROM _consumer_offset_rows GROUP BY `group`, topic, partition)
        WHERE latest.offset IS NOT NULL
    """).createOrReplaceTempView("consumer_offsets")
    subscribed = [(g, t) for g, topics in read_subscriptions(layout.data_dir).items()
                  for t in topics]
    spark.createDataFrame(subscribed, SUBSCRIPTIONS_DDL).createOrReplaceTempView(
        "_consumer_group_subscriptions")
    # Every partition of every topic the group reads, committed or not: a partition the
    # group has not reached is all lag (from the log start), not absent.
    spark.sql("""
        WITH reads AS (SELECT DISTINCT `group`, topic FROM consumer_offsets
                       UNION SELECT `group`, topic FROM _consumer_group_subscriptions)
        SELECT r.`group`, p.topic, p.partition, o.offset AS committed_offset,
               p.log_start_offset, p.high_watermark,
               CASE WHEN o.offset IS NULL
                    THEN greatest(p.high_watermark - p.log_start_offset, 0)
                    ELSE greatest(p.high_watermark - o.offset, 0) END AS lag,
               o.commit_timestamp
        FROM reads r
        JOIN partitions p ON p.topic = r.topic
        LEFT JOIN consumer_offsets o
          ON o.`group` = r.`group` AND o.topic = p.topic AND o.partition = p.partition
    """).createOrReplaceTempView("consumer_lag")
    spark.sql("""
        SELECT `group`, count(*) AS partitions, count(committed_offset) AS committed_partitions,
               sum(lag) AS total_lag, max(lag) AS max_lag, max(commit_timestamp) AS last_commit
        FROM consumer_lag GROUP BY `group`
    """).createOrReplaceTempView("consumer_group_lag")
    return VIEWS
