"""A cluster of brokers coordinated by ZooKeeper, in Kafka's ZooKeeper-mode design.

ZooKeeper holds the brokers (ephemeral nodes), the controller (an ephemeral node and an
epoch that fences an old controller), each topic's replica assignment and configs, and
each partition's state (leader, leader epoch, ISR), changed only by conditional writes:
by the controller (leaders, and brokers gone from the ISR) and by a partition's leader
(its ISR: cluster.isr). Every broker keeps a cache of the metadata from watches and
never steps back to an older state (a lower leader epoch and znode version).
``docs/architecture.md`` ("A cluster of brokers") tells the whole of it.

This room imports ``log_tables`` and kazoo only; ``ingest_api`` wires it into the server.
"""
