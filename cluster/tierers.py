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
tiered in two commits.

A follower's replica may lack records its leader has acknowledged: a transaction whose
marker the tierer already holds in one partition may have records in another that have
not reached it, and tiering the first without the second would show the transaction in
part (a nemesis run found one). So the tierer tiers a topic only while it is in the ISR
of every partition it holds a replica of (an in-sync follower had all its leader had at
most ``replica.lag.time.max.ms`` ago), and its job process takes a transaction as
committed only once its marker is older than ``SETTLE_FACTOR`` times that
(``settle_ms`` in ``leadership.json``; younger, it holds back like an open one): by then
every in-sync replica of every partition holds the records written before the marker. A
replica out of the ISR holds back its topic's tiering until it is back: the guarantee
first, the hot logs grow meanwhile.

Two tierers at once (leadership files lag a move of partition 0's leader) stay safe: a
commit of transactions loses all its partitions when another job took one of them first
(``commit_changes``'s ``whole``), and is planned again. While partition 0 has no leader,
none of the topic's partitions is tiered.
"""

from __future__ import annotations

from collections.abc import Mapping

from cluster.model import PartitionState, TopicAssignment

SETTLE_FACTOR = 2
"""A transaction's marker must be this many ``replica.lag.time.max.ms`` old before the
tiering job takes it as committed (one for the followers to catch up, one of margin for
the ISR's own lag and the brokers' clocks)."""


def _isr(states: Mapping[tuple[str, int], PartitionState], topic: str, p: int) -> list[int]:
    state = states.get((topic, p))
    return state.isr if state is not None else []


def tiered_by(broker_id: int, topics: Mapping[str, TopicAssignment],
              states: Mapping[tuple[str, int], PartitionState]) -> dict[str, list[int]]:
    """The partitions, by topic, that ``broker_id`` tiers in the cluster ``topics`` and
    ``states`` describe."""
    out: dict[str, list[int]] = {}
    for topic, assignment in sorted(topics.items()):
        first = states.get((topic, 0))
        tierer = first.leader if first is not None and first.leader > 0 else None
        if tierer is None or any(
                tierer in replicas and tierer not in _isr(states, topic, p)
                for p, replicas in enumerate(assignment.replicas)):
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
