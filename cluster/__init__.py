"""The cluster of brokers: what they keep in ZooKeeper (imports only log_tables and kazoo)."""
