"""SQL views over ``_consumer_offsets``: committed offsets and lag, one query away.

- ``consumer_offsets``: the latest committed offset per group, topic and partition
  (the newest row by ``seq``; tombstones hide deleted and expired groups).
- ``consumer_lag``: per group and partition, the high watermark (from the
  ``partitions`` view), the committed offset and ``lag`` = high watermark -
  committed offset (at least 0).
- ``consumer_group_lag``: per group, the partitions it has offsets for, the total
  and the largest lag.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from consumer_groups.offsets import SPARK_DDL, offsets_uri
from log_tables.cold_table import delta_path, open_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from log_tables.layout import Layout

VIEWS = ["consumer_offsets", "consumer_lag", "consumer_group_lag"]


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
    spark.sql("""
        SELECT o.`group`, o.topic, o.partition, o.offset AS committed_offset,
               p.log_start_offset, p.high_watermark,
               greatest(p.high_watermark - o.offset, 0) AS lag, o.commit_timestamp
        FROM consumer_offsets o
        JOIN partitions p ON p.topic = o.topic AND p.partition = o.partition
    """).createOrReplaceTempView("consumer_lag")
    spark.sql("""
        SELECT `group`, count(*) AS partitions, sum(lag) AS total_lag, max(lag) AS max_lag,
               max(commit_timestamp) AS last_commit
        FROM consumer_lag GROUP BY `group`
    """).createOrReplaceTempView("consumer_group_lag")
    return VIEWS
