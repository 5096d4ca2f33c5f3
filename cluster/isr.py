"""A partition leader changing its ISR in ZooKeeper: Kafka's AlterPartition idea, in
ZooKeeper mode.

The controller writes a partition's state when leadership changes; between those
changes the leader owns the ISR: it shrinks it when a follower falls behind for
``replica.lag.time.max.ms`` and expands it when one has caught up. Kafka before 2.7 did
exactly this: the leader wrote the new ISR to the partition's state znode itself, with
the znode version it last saw (its "zkVersion"), and the controller learnt it from the
ISR change notification (later Kafkas send AlterPartition to the controller instead).
Here brokers learn it from their watches on the state.

``alter_isr`` is one conditional ``set_data(version=...)``:

1. read the state: it must still name the caller as leader at the caller's leader
   epoch (else the caller was replaced: ``IsrFencedError``), and have the caller's
   version (else something changed it since the caller read it: ``IsrConflictError``);
2. write the new ISR, same leader, same leader epoch (an ISR change does not bump it,
   as in Kafka), same controller epoch, conditional on that version; a write that lost
   a race is an ``IsrConflictError`` too.

On a conflict the caller reads the state again (its view, or ZooKeeper) and decides
anew; a fenced caller has stopped leading and must not retry.
"""

from __future__ import annotations

from collections.abc import Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError

from cluster.model import PartitionState, TopicAssignment, decode, encode, state_path, topic_path
from log_tables.errors import (  # the ISR's errors are the table's (log_tables.cluster_errors)
    InvalidIsrError,
    IsrConflictError,
    IsrFencedError,
    UnknownPartitionError,
    UnknownTopicError,
)

__all__ = ["InvalidIsrError", "IsrConflictError", "IsrFencedError", "alter_isr"]


def alter_isr(client: KazooClient, topic: str, partition: int, leader_id: int,
              leader_epoch: int, new_isr: Sequence[int], version: int
              ) -> tuple[PartitionState, int]:
    """Write ``new_isr`` as the ISR of ``topic``-``partition`` for its leader ``leader_id``
    at ``leader_epoch``, if the state znode is still at ``version``; returns the new state
    and its znode version (for the next change)."""
    name = f"{topic}-{partition}"
    isr = list(new_isr)
    try:
        assignment = decode(client.get(topic_path(topic))[0], TopicAssignment)
        data, stat = client.get(state_path(topic, partition))
    except NoNodeError:
        raise UnknownTopicError(topic) from None
    if partition >= assignment.partitions:
        raise UnknownPartitionError(topic, partition, assignment.partitions)
    replicas = assignment.replicas[partition]
    if leader_id not in isr:
        raise InvalidIsrError(f"{name}: the new ISR {isr} must contain its leader {leader_id}")
    if len(set(isr)) != len(isr) or not set(isr) <= set(replicas):
        raise InvalidIsrError(f"{name}: the new ISR {isr} must be distinct replicas of the "
                              f"partition (replicas {replicas})")
    # 1. the caller still leads at its epoch, and read the version it writes on
    current = decode(data, PartitionState)
    if (current.leader, current.leader_epoch) != (leader_id, leader_epoch):
        raise IsrFencedError(
            f"{name}: broker {leader_id} at leader epoch {leader_epoch} does not lead it; "
            f"broker {current.leader} does at leader epoch {current.leader_epoch}",
            topic, partition, current, stat.version)
    if stat.version != version:
        raise IsrConflictError(
            f"{name}: its state is at version {stat.version}, not {version} (ISR "
            f"{current.isr}); read it again", topic, partition, current, stat.version)
    # 2. the new ISR, conditional on that version
    new = PartitionState(leader_id, leader_epoch, isr, current.controller_epoch)
    try:
        stat = client.set(state_path(topic, partition), encode(new), version=version)
    except BadVersionError:
        raise IsrConflictError(f"{name}: its state changed while the ISR was written; read "
                               f"it again", topic, partition) from None
    except NoNodeError:
        raise UnknownTopicError(topic) from None
    return new, int(stat.version)
