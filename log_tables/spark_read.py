"""Moved to ``lakelog.spark`` (deprecated path, kept working)."""

from log_tables.moved import moved

_READ = "log_tables.spark.read"
__getattr__ = moved(__name__, {"read_topic": "lakelog.spark", "register_views": "lakelog.spark",
                               "FILE_DDL": _READ, "KAFKA_COLUMNS": _READ,
                               "PARTITIONS_DDL": _READ, "partition_rows": _READ})
