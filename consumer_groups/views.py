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

from collections.abc import Collection
from typing import TYPE_CHECKING

from consumer_groups.offsets import SPARK_DDL, offsets_uri
from consumer_groups.subscriptions import read_subscriptions
from log_tables.config import GROUP_HELPER_VIEWS, GROUP_VIEWS, LOG_VIEWS
from log_tables.spark.read import read_delta

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from log_tables.layout import Layout

SUBSCRIPTIONS_DDL = "`group` STRING, topic STRING"
# The names come from the one list of reserved view names.
OFFSETS, LAG, GROUP_LAG = GROUP_VIEWS
OFFSET_ROWS, SUBSCRIPTIONS = GROUP_HELPER_VIEWS
PARTITIONS = LOG_VIEWS[0]


def register_group_views(spark: SparkSession, layout: Layout,
                         visible: Collection[str] | None = None) -> list[str]:
    """Register the three views (needs the ``partitions`` view); returns their names.
    ``visible``: only rows of these topics (what a principal may consume)."""
    rows = read_delta(spark, offsets_uri(layout.warehouse), SPARK_DDL)
    if visible is not None:
        rows = rows.where(rows.topic.isin(sorted(visible)))
    rows.createOrReplaceTempView(OFFSET_ROWS)
    spark.sql(f"""
        SELECT `group`, topic, partition, latest.offset AS offset, latest.metadata AS metadata,
               latest.commit_timestamp AS commit_timestamp, latest.member_id AS member_id,
               latest.member_epoch AS member_epoch
        FROM (SELECT `group`, topic, partition,
                     max_by(struct(offset, metadata, commit_timestamp, member_id, member_epoch),
                            seq) AS latest
              FROM {OFFSET_ROWS} GROUP BY `group`, topic, partition)
        WHERE latest.offset IS NOT NULL
    """).createOrReplaceTempView(OFFSETS)
    subscribed = [(g, t) for g, topics in read_subscriptions(layout.data_dir).items()
                  for t in topics if visible is None or t in visible]
    spark.createDataFrame(subscribed, SUBSCRIPTIONS_DDL).createOrReplaceTempView(SUBSCRIPTIONS)
    # Every partition of every topic the group reads, committed or not: a partition the
    # group has not reached is all lag (from the log start), not absent.
    spark.sql(f"""
        WITH reads AS (SELECT DISTINCT `group`, topic FROM {OFFSETS}
                       UNION SELECT `group`, topic FROM {SUBSCRIPTIONS})
        SELECT r.`group`, p.topic, p.partition, o.offset AS committed_offset,
               p.log_start_offset, p.high_watermark,
               CASE WHEN o.offset IS NULL
                    THEN greatest(p.high_watermark - p.log_start_offset, 0)
                    ELSE greatest(p.high_watermark - o.offset, 0) END AS lag,
               o.commit_timestamp
        FROM reads r
        JOIN {PARTITIONS} p ON p.topic = r.topic
        LEFT JOIN {OFFSETS} o
          ON o.`group` = r.`group` AND o.topic = p.topic AND o.partition = p.partition
    """).createOrReplaceTempView(LAG)
    spark.sql(f"""
        SELECT `group`, count(*) AS partitions, count(committed_offset) AS committed_partitions,
               sum(lag) AS total_lag, max(lag) AS max_lag, max(commit_timestamp) AS last_commit
        FROM {LAG} GROUP BY `group`
    """).createOrReplaceTempView(GROUP_LAG)
    return list(GROUP_VIEWS)
