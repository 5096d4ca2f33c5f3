"""lakelog for Spark users: the one import path to use, kept stable across releases.

    from lakelog.spark import lakelog_session, read_topic, register_views

    spark = lakelog_session("lakelog-data")          # or attach(spark, "lakelog-data")
    read_topic(spark, "orders").show()              # a topic as a DataFrame (live tail too)
    register_views(spark)                           # every topic, partitions, lag in SQL
    spark.readStream.format("lakelog").option("subscribe", "orders").load()
    stream_topic(spark, "orders")                   # the same; typed columns if the topic has

``LakelogDataSource`` is the ``lakelog`` data source (batch and streaming) that
``attach`` registers; register it yourself with ``spark.dataSource.register``.
Where these live inside is the house's business (``log_tables.spark``, ``lakelog.views``)
and may change; this module's names will not without a deprecation first.
"""

from lakelog.views import register_views
from log_tables.spark.read import read_topic
from log_tables.spark.session import attach, lakelog_session
from log_tables.spark.source import LakelogDataSource
from log_tables.spark.typed_read import stream_topic

__all__ = ["LakelogDataSource", "attach", "lakelog_session", "read_topic", "register_views",
           "stream_topic"]
