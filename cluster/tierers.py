"""Which broker tiers which partition: a topic's tierer is the leader of its partition 0.

The tiering job keeps a committed transaction's records of one topic out of the Delta
table until all of them can go in one commit (``compaction_jobs.tier_txns``), but it can
only see the partitions it tiers. If every partition were tiered by its own leader, a
transaction over partitions led by two brokers would reach the table in two commits,
visible in part between them. So the leader of partition 0 tiers every partition of the
topic of which it holds a replica, a follower's replica included: below the high
watermark it publishes, a follower's records are the leader's, byte for byte, and every
one of them is committed. A partition it holds no replica of (replication factor below
the number of brokers) is tiered by its own leader, and a transaction reaching it may be
tiered in two commits. A replica of the tierer's that lags (out of the ISR) holds back
its partition's tiering until it catches up: the guarantee first, the leader's hot log
grows meanwhile. Two tierers at once (leadership files lag a move of partition 0's
leader) stay safe: a commit of transactions loses all its partitions when another job
took one of them first (``commit_changes``'s ``whole``), and is planned again. While
partition 0 has no leader, none of the topic's partitions is tiered.
"""

from __future__ import annotations

from collections.abc import Mapping

from cluster.model import PartitionState, TopicAssignment


def tiered_by(broker_id: int, topics: Mapping[str, TopicAssignment],
              states: Mapping[tuple[str, int], PartitionState]) -> dict[str, list[int]]:
    """The partitions, by topic, that ``broker_id`` tiers in the cluster ``topics`` and
    ``states`` describe."""
    out: dict[str, list[int]] = {}
    for topic, assignment in sorted(topics.items()):
        first = states.get((topic, 0))
        tierer = first.leader if first is not None and first.leader > 0 else None
        if tierer is None:
            continue
        for p, replicas in enumerate(assignment.replicas):
            if tierer in replicas:
                who: int | None = tierer
            else:
                state = states.get((topic, p))
                who = state.leader if state is not None and state.leader > 0 else None
            if who == broker_id:
                out.setdefault(topic, []).append(p)
    return out
