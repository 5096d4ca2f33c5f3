"""The consumer group coordinator slots (``__consumer_offsets``) in ZooKeeper: replicated,
grown by the controller as brokers join, moved to a live replica when their leader dies,
every live replica in sync (they hold no records). Real ZooKeeper, real sessions; the
controller in this process, a turn at a time (``tests/cluster/sessions.py``)."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from cluster.model import NO_LEADER, OFFSETS_TOPIC, PartitionState
from tests.cluster.sessions import Sessions, create, elected, replicas, state

pytestmark = pytest.mark.slow
SLOTS = 6


def test_slots_made_with_one_replica_get_more_as_brokers_join(
        zk: KazooClient, brokers: Sessions, steps: list[str]) -> None:
    brokers.end(2, 3)
    ctl = elected(zk)
    create(ctl, OFFSETS_TOPIC, SLOTS, factor=1)  # one broker lived (or an older lakelog)
    before = [state(zk, OFFSETS_TOPIC, p) for p in range(SLOTS)]
    brokers.register(2, 3)
    ctl.run_once()
    assert "replicas-grown" in steps
    for p in range(SLOTS):
        rs = replicas(zk, OFFSETS_TOPIC, p)
        assert sorted(rs) == [1, 2, 3], rs
        assert rs[0] == before[p].leader  # the preferred leader stays first
        now = state(zk, OFFSETS_TOPIC, p)
        assert (now.leader, now.leader_epoch) == (before[p].leader, before[p].leader_epoch)
        assert now.isr == rs  # nothing to catch up with: in sync at once
    # Followers are spread: each broker is the second replica of some slot.
    assert {replicas(zk, OFFSETS_TOPIC, p)[1] for p in range(SLOTS)} == {2, 3}
    assert ctl.reconcile() == 0  # grown once


def test_a_slot_moves_to_a_live_replica_and_takes_a_returning_one_back(
        zk: KazooClient, brokers: Sessions) -> None:
    ctl = elected(zk, offsets_topic_replication_factor=3)
    create(ctl, OFFSETS_TOPIC, SLOTS, factor=3)
    first = state(zk, OFFSETS_TOPIC, 0)
    brokers.end(first.leader)
    ctl.run_once()
    moved = state(zk, OFFSETS_TOPIC, 0)
    rs = replicas(zk, OFFSETS_TOPIC, 0)
    assert moved.leader == rs[1] and moved.leader_epoch == first.leader_epoch + 1
    assert moved.isr == rs[1:]
    brokers.register(first.leader)
    ctl.run_once()
    back = state(zk, OFFSETS_TOPIC, 0)
    assert (back.leader, back.leader_epoch) == (moved.leader, moved.leader_epoch)
    assert back.isr == rs  # in sync again at once, unlike a partition with records


def test_a_slot_with_no_live_replica_is_offline_and_any_returning_one_leads(
        zk: KazooClient, brokers: Sessions) -> None:
    ctl = elected(zk)
    create(ctl, OFFSETS_TOPIC, 1, factor=3)
    rs = replicas(zk, OFFSETS_TOPIC, 0)
    brokers.end(rs[2])
    ctl.run_once()
    brokers.end(rs[0], rs[1])
    ctl.run_once()
    offline = state(zk, OFFSETS_TOPIC, 0)
    assert offline.leader == NO_LEADER and offline.isr
    # The replica that left first returns: it leads (a partition with records would stay
    # offline until a member of its last ISR came back).
    brokers.register(rs[2])
    ctl.run_once()
    assert state(zk, OFFSETS_TOPIC, 0) == PartitionState(rs[2], offline.leader_epoch + 1,
                                                         [rs[2]], ctl.epoch)
