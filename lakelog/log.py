"""The log on its own, embedded in a Python program without a server: the one import
path to use, kept stable across releases.

    from lakelog.log import PartitionLog, TopicConfig, build_batch

``PartitionLog`` is one partition's append-only segment files with their offset and time
indexes; ``TopicConfig`` a topic's settings; ``build_batch`` makes a record batch to
append. Where these live inside (``log_tables``) may change; these names will not
without a deprecation first.
"""

from log_tables.config import TopicConfig
from log_tables.hot.partition_log import PartitionLog
from log_tables.records import build_batch

__all__ = ["PartitionLog", "TopicConfig", "build_batch"]
