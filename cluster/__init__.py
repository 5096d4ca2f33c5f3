"""A cluster of brokers coordinated by ZooKeeper, in Kafka's ZooKeeper-mode design.

ZooKeeper holds the brokers (ephemeral nodes), the controller (an ephemeral node and an
epoch that fences an old controller), each topic's replica assignment and configs, and
each partition's state (leader, leader epoch, ISR), changed only by conditional writes.
One broker is the controller; every broker keeps a cache of the metadata from watches
and acts only on partition states whose leader epoch is at least the one it holds.
``docs/architecture.md`` ("A cluster of brokers") tells the whole of it.

This room imports ``log_tables`` and kazoo only; ``ingest_api`` wires it into the server.
"""
