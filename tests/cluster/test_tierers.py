"""Which broker tiers which partition (``cluster.tierers``): the leader of partition 0
tiers every partition it holds a replica of, so that a transaction over partitions led
by several brokers reaches the topic's table in one commit."""

from __future__ import annotations

from cluster.model import PartitionState, TopicAssignment
from cluster.tierers import tiered_by


def _state(leader: int, isr: list[int] | None = None) -> PartitionState:
    """In sync: every broker (``isr`` None)."""
    return PartitionState(leader=leader, leader_epoch=1,
                          isr=[1, 2, 3] if isr is None else isr, controller_epoch=1)


def _all(topics: dict[str, TopicAssignment], states: dict[tuple[str, int], PartitionState]
         ) -> dict[int, dict[str, list[int]]]:
    return {b: tiered_by(b, topics, states) for b in (1, 2, 3)}


def test_the_leader_of_partition_0_tiers_every_partition_it_holds_a_replica_of() -> None:
    topics = {"t": TopicAssignment([[1, 2, 3], [2, 3, 1], [3, 1, 2]])}
    states = {("t", 0): _state(2), ("t", 1): _state(2), ("t", 2): _state(3)}
    assert _all(topics, states) == {1: {}, 2: {"t": [0, 1, 2]}, 3: {}}


def test_a_partition_without_a_replica_on_that_broker_is_tiered_by_its_leader() -> None:
    topics = {"t": TopicAssignment([[1, 2], [2, 3], [3, 1]])}
    states = {("t", 0): _state(1), ("t", 1): _state(3), ("t", 2): _state(3)}
    assert _all(topics, states) == {1: {"t": [0, 2]}, 2: {}, 3: {"t": [1]}}
    # Every partition tiered once, by one broker.
    topics["u"] = TopicAssignment([[1], [2], [3]])
    states.update({("u", 0): _state(1), ("u", 1): _state(2), ("u", 2): _state(3)})
    found = _all(topics, states)
    assert sorted(p for b in found.values() for p in b.get("u", [])) == [0, 1, 2]


def test_while_partition_0_has_no_leader_no_partition_of_the_topic_is_tiered() -> None:
    topics = {"t": TopicAssignment([[1, 2], [2, 3], [3, 1]]),
              "other": TopicAssignment([[3, 1]])}
    states = {("t", 0): _state(-1), ("t", 1): _state(2), ("t", 2): _state(3),
              ("other", 0): _state(3)}
    assert _all(topics, states) == {1: {}, 2: {}, 3: {"other": [0]}}
    del states[("t", 0)]  # no state read yet
    assert _all(topics, states)[2] == {}


def test_a_tierer_out_of_sync_on_one_partition_tiers_none_of_the_topic() -> None:
    """Its replica there may lack records of a transaction whose marker it holds
    elsewhere: the topic waits until it is back in sync (the other topic goes on)."""
    topics = {"t": TopicAssignment([[1, 2, 3], [2, 3, 1], [3, 1, 2]]),
              "u": TopicAssignment([[1, 2, 3]])}
    states = {("t", 0): _state(1), ("t", 1): _state(2, [2, 3]), ("t", 2): _state(3),
              ("u", 0): _state(1)}
    assert _all(topics, states) == {1: {"u": [0]}, 2: {}, 3: {}}
    states[("t", 1)] = _state(2)  # back in sync
    assert _all(topics, states)[1] == {"t": [0, 1, 2], "u": [0]}
