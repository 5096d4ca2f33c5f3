"""Replica assignment spreads leaders and replicas as Kafka's does, rack-aware."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.assign import assign_replicas, rack_alternated
from log_tables.errors import InvalidConfigError


def test_leaders_spread_evenly_and_replicas_are_distinct() -> None:
    brokers = [(1, None), (2, None), (3, None)]
    replicas = assign_replicas("orders", brokers, 6, 3)
    assert Counter(r[0] for r in replicas) == {1: 2, 2: 2, 3: 2}
    assert all(sorted(r) == [1, 2, 3] for r in replicas)
    # Followers are shifted too: not every partition has the same order.
    assert len({tuple(r) for r in replicas}) > 3


def test_one_partition_topics_do_not_all_land_on_one_broker() -> None:
    brokers = [(1, None), (2, None), (3, None)]
    leaders = {assign_replicas(f"t{i}", brokers, 1, 1)[0][0] for i in range(30)}
    assert leaders == {1, 2, 3}


def test_racks_alternate_and_each_partition_spans_racks() -> None:
    brokers = [(1, "a"), (2, "a"), (3, "b"), (4, "b"), (5, "c"), (6, "c")]
    assert rack_alternated(brokers) == [1, 3, 5, 2, 4, 6]
    rack = dict(brokers)
    for replicas in assign_replicas("payments", brokers, 12, 3):
        assert len({rack[b] for b in replicas}) == 3, replicas


def test_more_replicas_than_racks_still_uses_every_rack() -> None:
    brokers = [(1, "a"), (2, "a"), (3, "b"), (4, "b")]
    rack = dict(brokers)
    for replicas in assign_replicas("t", brokers, 8, 3):
        assert len(set(replicas)) == 3 and {rack[b] for b in replicas} == {"a", "b"}


def test_added_partitions_continue_the_round() -> None:
    brokers = [(1, None), (2, None), (3, None)]
    whole = assign_replicas("grow", brokers, 6, 1)
    assert assign_replicas("grow", brokers, 3, 1, first_partition=3) == whole[3:]


def test_replication_factor_beyond_the_brokers_is_refused() -> None:
    with pytest.raises(InvalidConfigError, match="larger than the 2 live broker"):
        assign_replicas("t", [(1, None), (2, None)], 1, 3)
    with pytest.raises(InvalidConfigError, match="at least 1"):
        assign_replicas("t", [(1, None)], 1, 0)


@given(n=st.integers(1, 7), racks=st.integers(0, 3), partitions=st.integers(1, 40),
       data=st.data())
def test_every_assignment_is_valid(n: int, racks: int, partitions: int,
                                   data: st.DataObject) -> None:
    brokers = [(i + 1, f"r{i % racks}" if racks else None) for i in range(n)]
    factor = data.draw(st.integers(1, n))
    replicas = assign_replicas("topic", brokers, partitions, factor)
    assert len(replicas) == partitions
    for r in replicas:
        assert len(r) == factor == len(set(r)) and set(r) <= {b for b, _ in brokers}
        if racks:
            rack = dict(brokers)
            assert len({rack[b] for b in r}) == min(factor, len({rack[b] for b in rack}))
    counts = Counter(r[0] for r in replicas)
    assert max(counts.values()) - min(counts.get(b, 0) for b, _ in brokers) <= 1


def test_grow_adds_live_brokers_least_loaded_first_and_spreads_them() -> None:
    from cluster.assign import grow

    assert grow([[1, 2], [2, 3]], [1, 2, 3], 2) is None  # enough already
    grown = grow([[1], [2], [3], [1], [2], [3]], [1, 2, 3], 3)
    assert grown is not None
    assert all(sorted(rs) == [1, 2, 3] and rs[0] == first
               for rs, first in zip(grown, [1, 2, 3, 1, 2, 3], strict=True))
    # The second replicas of one broker's partitions differ, so its partitions do not
    # all move to one broker when it dies.
    assert len({rs[1] for rs in grown if rs[0] == 1}) == 2
    # Up to the target only, from live brokers only; a dead replica stays listed.
    assert grow([[4], [4]], [1, 2], 2) == [[4, 1], [4, 2]]
