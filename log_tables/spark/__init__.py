"""Spark over the log, the top room of ``log_tables``: the session, batch reads
(``read_topic`` and the SQL views' tables), the streaming source (``format("lakelog")``)
and, in a cluster, the tails a data directory lacks fetched from the partitions' leaders.
Each reads at ``read_committed``; users import it from ``lakelog.spark``.
"""
