"""cluster.election's rules, one case each (pure functions: no ZooKeeper here; the
controller's writes of them are tests/cluster/test_isr.py's)."""

from __future__ import annotations

from collections.abc import Sequence

from cluster.election import (
    Change,
    after_brokers_changed,
    after_brokers_changed_recordless,
    imbalanced,
    to_preferred,
)
from cluster.model import NO_LEADER, PartitionState

REPLICAS = [1, 2, 3]


def state(leader: int, epoch: int, isr: list[int]) -> PartitionState:
    return PartitionState(leader, epoch, isr, 1)


def after(s: PartitionState, live: Sequence[int], bounced: Sequence[int] = (),
          unclean: bool = False) -> Change | None:
    return after_brokers_changed(s, REPLICAS, set(live), set(bounced), unclean, 2)


def test_all_alive_changes_nothing() -> None:
    assert after(state(1, 0, [1, 2, 3]), [1, 2, 3]) is None
    assert after(state(2, 4, [2, 3]), [1, 2, 3]) is None  # a returned follower is not re-added


def test_a_gone_or_bounced_follower_leaves_the_isr_at_the_same_leader_epoch() -> None:
    assert after(state(1, 3, [1, 2, 3]), [1, 3]) == Change(PartitionState(1, 3, [1, 3], 2), "isr")
    assert after(state(1, 3, [1, 2, 3]), [1, 2, 3], bounced=[3]) == \
        Change(PartitionState(1, 3, [1, 2], 2), "isr")


def test_a_gone_leader_is_followed_by_the_first_live_isr_member_in_replica_order() -> None:
    assert after(state(1, 3, [1, 3, 2]), [2, 3]) == \
        Change(PartitionState(2, 4, [3, 2], 2), "leader")
    assert after(state(1, 3, [1, 3]), [2, 3], bounced=[2]) == \
        Change(PartitionState(3, 4, [3], 2), "leader")
    assert after(state(1, 3, [1, 2, 3]), [1, 2, 3], bounced=[1]) == \
        Change(PartitionState(2, 4, [2, 3], 2), "leader")


def test_no_live_isr_member_is_offline_with_the_isr_kept_until_one_returns() -> None:
    assert after(state(1, 3, [1]), [2, 3]) == Change(PartitionState(NO_LEADER, 4, [1], 2), "leader")
    assert after(state(1, 3, [1, 2]), [3]) == \
        Change(PartitionState(NO_LEADER, 4, [1, 2], 2), "leader")  # all went at once: whole
    assert after(state(NO_LEADER, 4, [1]), [2, 3]) is None
    assert after(state(NO_LEADER, 4, [1, 2]), [2, 3]) == \
        Change(PartitionState(2, 5, [2], 2), "leader")


def test_a_bounced_broker_alone_in_the_isr_leads_again() -> None:
    assert after(state(1, 3, [1]), [1, 2, 3], bounced=[1]) == \
        Change(PartitionState(1, 4, [1], 2), "leader")
    assert after(state(1, 3, [1, 2]), [1, 3], bounced=[1]) == \
        Change(PartitionState(1, 4, [1], 2), "leader")


def test_unclean_election_takes_the_first_live_replica_alone() -> None:
    assert after(state(1, 3, [1]), [3, 2], unclean=True) == \
        Change(PartitionState(2, 4, [2], 2), "unclean")
    assert after(state(NO_LEADER, 4, [1]), [3], unclean=True) == \
        Change(PartitionState(3, 5, [3], 2), "unclean")
    assert after(state(1, 3, [1]), [], unclean=True) == \
        Change(PartitionState(NO_LEADER, 4, [1], 2), "leader")
    # Clean first, always.
    assert after(state(1, 3, [1, 3]), [2, 3], unclean=True) == \
        Change(PartitionState(3, 4, [3], 2), "leader")


def test_the_preferred_replica_leads_again_only_live_and_in_sync() -> None:
    s = state(2, 5, [2, 3, 1])
    assert to_preferred(s, REPLICAS, {1, 2, 3}, 2) == PartitionState(1, 6, [2, 3, 1], 2)
    assert to_preferred(s, REPLICAS, {2, 3}, 2) is None
    assert to_preferred(state(2, 5, [2, 3]), REPLICAS, {1, 2, 3}, 2) is None
    assert to_preferred(state(1, 5, [1, 2]), REPLICAS, {1, 2, 3}, 2) is None


def test_imbalance_is_measured_per_preferred_broker_against_the_percentage() -> None:
    placements = {("t", p): ([1 + p % 2, 2 - p % 2], state(2 if p == 0 else 1 + p % 2, 1, [1, 2]))
                  for p in range(20)}
    # Broker 1 is preferred for the 10 even partitions and leads 9 (10% elsewhere);
    # broker 2 for the 10 odd ones, and leads all.
    assert imbalanced(placements, 10) == []
    assert imbalanced(placements, 9) == [("t", 0)]
    placements[("t", 1)] = ([2, 1], state(1, 1, [1, 2]))
    assert imbalanced(placements, 9) == [("t", 0), ("t", 1)]
    assert imbalanced(placements, 100) == []


# -- a partition without records (a coordinator slot) -----------------------------------
def recordless(s: PartitionState, live: Sequence[int], bounced: Sequence[int] = ()
               ) -> Change | None:
    return after_brokers_changed_recordless(s, REPLICAS, set(live), set(bounced), 2)


def test_every_live_replica_of_a_recordless_partition_is_in_sync() -> None:
    assert recordless(state(1, 0, [1, 2, 3]), [1, 2, 3]) is None
    assert recordless(state(1, 0, [1, 2, 3]), [1, 3]) == \
        Change(PartitionState(1, 0, [1, 3], 2), "isr")
    # A returning replica is in sync at once: there is nothing to catch up with.
    assert recordless(state(1, 0, [1]), [1, 2, 3]) == \
        Change(PartitionState(1, 0, [1, 2, 3], 2), "isr")


def test_a_recordless_partition_moves_to_any_live_replica() -> None:
    assert recordless(state(1, 4, [1, 2, 3]), [2, 3]) == \
        Change(PartitionState(2, 5, [2, 3], 2), "leader")
    # Out of the ISR does not matter; a bounced leader is replaced by one that is not.
    assert recordless(state(1, 4, [1]), [1, 3], bounced=[1]) == \
        Change(PartitionState(3, 5, [1, 3], 2), "leader")
    # A bounced replica alone leads again (at a new epoch: its state is loaded anew).
    assert recordless(state(1, 4, [1, 2]), [1], bounced=[1]) == \
        Change(PartitionState(1, 5, [1], 2), "leader")


def test_a_recordless_partition_with_no_live_replica_is_offline_until_any_returns() -> None:
    offline = PartitionState(NO_LEADER, 5, [1, 2], 2)
    assert recordless(state(1, 4, [1, 2]), []) == Change(offline, "leader")
    assert recordless(offline, []) is None
    assert recordless(offline, [3]) == Change(PartitionState(3, 6, [3], 2), "leader")
