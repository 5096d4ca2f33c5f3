"""Moved to ``lakelog.spark`` (deprecated path, kept working)."""

from log_tables.moved import moved

__getattr__ = moved(__name__, {"LakelogDataSource": "lakelog.spark",
                               "register_source": "log_tables.spark.source"})
