"""The cluster's partition placements read once from ZooKeeper, without watches: for
tools that ask who leads what now (the SQL ``partitions`` view) and follow no change.

ZooKeeper is where the controller writes each partition's state, so a read there is the
newest any broker can know, and it needs no broker up (a stopped cluster's partitions
read as offline)."""

from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from cluster.broker import CLUSTER_ID_PATH
from cluster.model import TOPICS, PartitionState, TopicAssignment, decode, state_path, topic_path
from cluster.view import Placement

MAX_TOPICS = 100_000
"""Bound on what one read walks (each topic is a few ZooKeeper reads)."""


def read_placements(connect: str, timeout_s: float = 10.0
                    ) -> tuple[str | None, dict[tuple[str, int], Placement]]:
    """(the cluster's id, every partition's placement) at ``connect`` ("HOST:PORT/chroot");
    a partition without a state yet has leader -1 and leader epoch -1 (and, its ISR
    empty, is under-replicated: ``Placement.under_replicated``)."""
    client = KazooClient(hosts=connect, timeout=timeout_s)
    client.start(timeout=timeout_s)
    try:
        try:
            cluster_id: str | None = client.get(CLUSTER_ID_PATH)[0].decode()
        except NoNodeError:
            cluster_id = None
        try:
            topics = client.get_children(TOPICS)
        except NoNodeError:
            topics = []
        if len(topics) > MAX_TOPICS:
            raise ValueError(f"{len(topics)} topics in ZooKeeper at {connect}: more than "
                             f"{MAX_TOPICS} to read")
        out: dict[tuple[str, int], Placement] = {}
        for topic in topics:
            try:
                assignment = decode(client.get(topic_path(topic))[0], TopicAssignment)
            except NoNodeError:
                continue  # deleted meanwhile
            for p, replicas in enumerate(assignment.replicas):
                try:
                    state: PartitionState | None = decode(
                        client.get(state_path(topic, p))[0], PartitionState)
                except NoNodeError:
                    state = None
                out[(topic, p)] = Placement(
                    state.leader if state else -1, state.leader_epoch if state else -1,
                    tuple(replicas), tuple(state.isr) if state else ())
        return cluster_id, out
    finally:
        client.stop()
        client.close()
