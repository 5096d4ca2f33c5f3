"""The jobs that keep the Delta tier, one floor above ``log_tables``: tiering (durable,
readable hot segments into Delta), retention, compaction, optimize and vacuum, run on
Spark on a schedule in a child process of ``lakelog serve`` (``scheduler``). A job reads
the hot logs from disk as another process, only of the partitions this broker leads
(``leadership.json``); the server only starts the scheduler and tells it when a
segment rolls.
"""
