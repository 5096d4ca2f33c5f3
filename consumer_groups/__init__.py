"""Consumer groups, one floor above ``log_tables`` and beside ``cluster``: the
coordinator of a server's groups (joins, heartbeats, sessions, assignments, commits,
fencing), the committed offsets in their Delta table (``_consumer_offsets``), lag,
live subscriptions and their SQL views. It knows no HTTP and no cluster: the broker
decides which groups it coordinates and hands it the partitions.
"""
