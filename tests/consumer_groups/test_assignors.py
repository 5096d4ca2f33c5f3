"""Assignors: for random subscriptions every partition has exactly one owner, only
subscribed topics are assigned, and counts are as even as the assignor promises;
cooperative-sticky moves only what must move."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer_groups.assignors import ASSIGNORS, MemberSpec, TopicPartition, assign
from log_tables.errors import InvalidOptionError

TOPICS = ["a", "b", "c", "d"]
partitions_st = st.dictionaries(st.sampled_from(TOPICS), st.integers(1, 12), min_size=1)


@st.composite
def groups(draw: st.DrawFn, same_topics: bool = False
           ) -> tuple[dict[str, MemberSpec], dict[str, int]]:
    partitions = draw(partitions_st)
    n = draw(st.integers(1, 8))
    shared = frozenset(draw(st.sets(st.sampled_from(TOPICS), min_size=1)))
    members = {f"m{i}": MemberSpec(f"k{i:02d}", shared if same_topics else frozenset(
        draw(st.sets(st.sampled_from(TOPICS), min_size=1)))) for i in range(n)}
    return members, partitions


def _check_owners(members: dict[str, MemberSpec], partitions: dict[str, int],
                  out: dict[str, set[TopicPartition]]) -> None:
    owners = Counter(tp for tps in out.values() for tp in tps)
    assert all(count == 1 for count in owners.values())
    subscribed = {t for m in members.values() for t in m.topics}
    expected = {TopicPartition(t, p) for t in subscribed if t in partitions
                for p in range(partitions[t])}
    assert set(owners) == expected  # every subscribed partition, and nothing else
    for m, tps in out.items():
        assert all(tp.topic in members[m].topics for tp in tps)


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
@settings(max_examples=150, deadline=None)
@given(group=groups())
def test_one_owner_per_partition_and_only_subscribed_topics(
        name: str, group: tuple[dict[str, MemberSpec], dict[str, int]]) -> None:
    members, partitions = group
    _check_owners(members, partitions, assign(name, members, partitions, {}))


@pytest.mark.parametrize("name", ["roundrobin", "cooperative-sticky"])
@settings(max_examples=150, deadline=None)
@given(group=groups(same_topics=True))
def test_counts_differ_by_at_most_one_with_the_same_subscriptions(
        name: str, group: tuple[dict[str, MemberSpec], dict[str, int]]) -> None:
    members, partitions = group
    counts = [len(tps) for tps in assign(name, members, partitions, {}).values()]
    assert max(counts) - min(counts) <= 1


@settings(max_examples=150, deadline=None)
@given(group=groups())
def test_sticky_leaves_no_move_that_would_even_out_counts(
        group: tuple[dict[str, MemberSpec], dict[str, int]]) -> None:
    members, partitions = group
    out = assign("cooperative-sticky", members, partitions, {})
    for donor, tps in out.items():
        for tp in tps:
            for taker in members:
                if tp.topic in members[taker].topics:
                    assert len(out[taker]) + 1 >= len(out[donor])


@settings(max_examples=100, deadline=None)
@given(group=groups(same_topics=True), data=st.data())
def test_sticky_moves_only_what_a_join_or_a_leave_must_move(
        group: tuple[dict[str, MemberSpec], dict[str, int]], data: st.DataObject) -> None:
    members, partitions = group
    before = assign("cooperative-sticky", members, partitions, {})
    # A member joins: only partitions going to it move.
    joined = {**members, "new": MemberSpec("k99", next(iter(members.values())).topics)}
    after = assign("cooperative-sticky", joined, partitions, before)
    moved = {tp for m in members for tp in before[m] - after[m]}
    assert moved == after["new"]
    # A member leaves: only its partitions move.
    gone = data.draw(st.sampled_from(sorted(members)))
    rest = {m: s for m, s in members.items() if m != gone}
    if rest:
        after = assign("cooperative-sticky", rest, partitions, before)
        assert all(before[m] <= after[m] for m in rest)
        assert {tp for m in rest for tp in after[m] - before[m]} == before[gone]


def test_range_gives_consecutive_runs_and_roundrobin_deals_in_turn() -> None:
    members = {m: MemberSpec(m, frozenset({"t"})) for m in ("a", "b")}
    tp = [TopicPartition("t", p) for p in range(5)]
    assert assign("range", members, {"t": 5}, {}) == {"a": set(tp[:3]), "b": set(tp[3:])}
    assert assign("roundrobin", members, {"t": 5}, {}) == {
        "a": {tp[0], tp[2], tp[4]}, "b": {tp[1], tp[3]}}
    with pytest.raises(InvalidOptionError, match="unknown assignor 'sticky'"):
        assign("sticky", members, {"t": 5}, {})
