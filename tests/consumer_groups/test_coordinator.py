"""The coordinator's group protocol, with a real offset store (Delta on disk) and a
clock the test moves: epochs, fencing, session timeouts, static members and the
cooperative hand-over (a partition never has two owners)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumer_groups.assignors import TopicPartition
from consumer_groups.coordinator import GroupCoordinator, Member
from consumer_groups.errors import (
    GroupNotEmptyError,
    StaleMemberEpochError,
    UnknownMemberError,
)
from consumer_groups.lag import all_group_lag
from consumer_groups.offsets import OffsetStore
from log_tables.errors import UnknownPartitionError, UnknownTopicError

PARTITIONS = {"t": 6, "u": 2}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def coordinator(tmp_path: Path, clock: Clock) -> Iterator[GroupCoordinator]:
    store = OffsetStore(str(tmp_path / "warehouse"), max_wait_ms=1)
    store.start()
    yield GroupCoordinator(store, PARTITIONS.get, clock=clock)
    store.close()


def _tps(*parts: int) -> set[TopicPartition]:
    return {TopicPartition("t", p) for p in parts}


def _heartbeat(c: GroupCoordinator, m: Member) -> Member:
    return c.heartbeat("g", m.member_id, m.epoch, owned=set(m.assigned))


def _owners_ok(c: GroupCoordinator) -> None:
    held = [tp for m in c.groups["g"].members.values() for tp in m.assigned | m.revoking]
    assert len(held) == len(set(held)), "a partition has two owners"


def test_epochs_advance_on_rebalance_and_partitions_move_after_revocation(
        coordinator: GroupCoordinator) -> None:
    a = coordinator.join("g", ["t"], 10_000)
    assert a.epoch == 1 and a.assigned == _tps(*range(6))
    b = coordinator.join("g", ["t"], 10_000)
    assert coordinator.groups["g"].epoch == 2
    assert b.assigned == set() and b.epoch == 0  # a still holds what b will get
    assert len(a.revoking) == 3 and a.epoch == 1  # revoked at once, epoch unchanged
    _owners_ok(coordinator)
    b = _heartbeat(coordinator, b)
    assert b.assigned == set()  # not before a lets go
    a = coordinator.heartbeat("g", a.member_id, 1, owned=a.assigned | a.revoking)
    assert a.revoking and a.epoch == 1  # still owns them: no acknowledgement
    a = _heartbeat(coordinator, a)
    assert not a.revoking and a.epoch == 2 and len(a.assigned) == 3
    b = _heartbeat(coordinator, b)
    assert b.epoch == 2 and b.assigned == _tps(*range(6)) - a.assigned
    assert coordinator.groups["g"].state() == "Stable"


def test_unknown_member_and_stale_epoch_are_fenced_on_heartbeat_and_commit(
        coordinator: GroupCoordinator) -> None:
    a = coordinator.join("g", ["t"], 10_000)
    with pytest.raises(UnknownMemberError):
        coordinator.heartbeat("g", "nobody", 1)
    with pytest.raises(StaleMemberEpochError, match="sent epoch 0, its current epoch is 1"):
        coordinator.heartbeat("g", a.member_id, 0)
    b = coordinator.join("g", ["t"], 10_000)
    a = _heartbeat(coordinator, a)
    a = _heartbeat(coordinator, a)  # acknowledged the revocation: epoch 2
    assert a.epoch == 2
    with pytest.raises(StaleMemberEpochError):
        asyncio.run(coordinator.commit("g", a.member_id, 1, [("t", 0, 5, None)]))
    with pytest.raises(UnknownMemberError):
        asyncio.run(coordinator.commit("g", "zombie", 2, [("t", 0, 5, None)]))
    with pytest.raises(UnknownMemberError):  # no member-less commits into a live group
        asyncio.run(coordinator.commit("g", None, -1, [("t", 0, 5, None)]))
    with pytest.raises(UnknownTopicError, match="topic 'nope' does not exist"):
        asyncio.run(coordinator.commit("g", a.member_id, 2, [("nope", 0, 5, None)]))
    with pytest.raises(UnknownPartitionError, match=r"partitions 0\.\.5"):
        asyncio.run(coordinator.commit("g", a.member_id, 2, [("t", 6, 5, None)]))
    asyncio.run(coordinator.commit("g", a.member_id, 2, [("t", 0, 5, "m")]))
    assert coordinator.committed("g")[("t", 0)].offset == 5
    coordinator.leave("g", b.member_id)
    with pytest.raises(UnknownMemberError):
        asyncio.run(coordinator.commit("g", b.member_id, b.epoch, [("t", 0, 9, None)]))
    assert coordinator.committed("g")[("t", 0)].offset == 5


def test_session_timeout_removes_a_member_and_its_partitions_move(
        coordinator: GroupCoordinator, clock: Clock) -> None:
    a = coordinator.join("g", ["t"], 3_000)
    b = coordinator.join("g", ["t"], 10_000)
    a = _heartbeat(coordinator, a)
    a = _heartbeat(coordinator, a)
    b = _heartbeat(coordinator, b)
    assert len(a.assigned) == len(b.assigned) == 3
    clock.now += 2.0
    assert coordinator.expire_sessions() == []
    b = _heartbeat(coordinator, b)
    clock.now += 1.5  # a: 3.5 s without a heartbeat
    assert coordinator.expire_sessions() == [("g", a.member_id)]
    b = _heartbeat(coordinator, b)
    assert b.assigned == _tps(*range(6)) and b.epoch == 3
    with pytest.raises(UnknownMemberError):
        _heartbeat(coordinator, a)
    # Once the last member is gone the group is only its offsets: its state is forgotten
    # (max_groups bounds live groups), the offsets stay, old members stay fenced.
    asyncio.run(coordinator.commit("g", b.member_id, b.epoch, [("t", 2, 7, None)]))
    clock.now += 20.0
    assert coordinator.expire_sessions() == [("g", b.member_id)]
    assert "g" not in coordinator.groups and coordinator.known_groups() == ["g"]
    assert coordinator.committed("g")[("t", 2)].offset == 7
    with pytest.raises(UnknownMemberError):
        _heartbeat(coordinator, b)


def test_a_static_member_rejoining_inside_its_timeout_keeps_its_assignment(
        coordinator: GroupCoordinator, clock: Clock) -> None:
    a = coordinator.join("g", ["t"], 5_000, instance_id="host-a")
    b = coordinator.join("g", ["t"], 5_000, instance_id="host-b")
    for _ in range(2):
        a, b = _heartbeat(coordinator, a), _heartbeat(coordinator, b)
    mine, epoch = set(a.assigned), coordinator.groups["g"].epoch
    coordinator.leave("g", a.member_id)  # a restart: the static member leaves...
    clock.now += 2.0
    assert coordinator.expire_sessions() == []
    a2 = coordinator.join("g", ["t"], 5_000, instance_id="host-a")  # ...and is back
    assert a2.member_id != a.member_id and a2.assigned == mine
    assert coordinator.groups["g"].epoch == epoch  # no rebalance
    with pytest.raises(UnknownMemberError):  # the old instance is fenced
        coordinator.heartbeat("g", a.member_id, a.epoch)
    # Gone for longer than its session: its partitions move.
    coordinator.leave("g", a2.member_id)
    clock.now += 6.0
    b = coordinator.heartbeat("g", b.member_id, b.epoch)  # b stays alive
    assert coordinator.expire_sessions() == [("g", a2.member_id)]
    b = _heartbeat(coordinator, b)
    assert b.assigned == _tps(*range(6))


def test_random_membership_changes_never_give_a_partition_two_owners(
        coordinator: GroupCoordinator, clock: Clock) -> None:
    rng = random.Random(7)
    members: list[Member] = []
    for _ in range(300):
        action = rng.random()
        if action < 0.2 or not members:
            members.append(coordinator.join("g", rng.choice([["t"], ["t", "u"]]), 10_000))
        elif action < 0.3 and len(members) > 1:
            coordinator.leave("g", members.pop(rng.randrange(len(members))).member_id)
        else:
            i = rng.randrange(len(members))
            members[i] = _heartbeat(coordinator, members[i])
        _owners_ok(coordinator)
    for _ in range(4):  # everyone heartbeats: the group converges
        members = [_heartbeat(coordinator, m) for m in members]
    group = coordinator.groups["g"]
    assert group.state() == "Stable"
    assert all(m.epoch == group.epoch for m in members)
    owned = [tp for m in members for tp in m.assigned]
    assert sorted(owned) == sorted({TopicPartition("t", p) for p in range(6)}
                                   | ({TopicPartition("u", p) for p in range(2)}
                                      if any("u" in m.topics for m in members) else set()))


def test_delete_needs_an_empty_group_and_removes_its_offsets(
        coordinator: GroupCoordinator) -> None:
    a = coordinator.join("g", ["t"], 10_000)
    asyncio.run(coordinator.commit("g", a.member_id, a.epoch, [("t", 1, 3, None)]))
    with pytest.raises(GroupNotEmptyError):
        asyncio.run(coordinator.delete_group("g"))
    coordinator.leave("g", a.member_id)
    asyncio.run(coordinator.delete_group("g"))
    assert coordinator.committed("g") == {} and "g" not in coordinator.known_groups()


def test_a_deleted_topics_offsets_go_with_it_and_stay_gone_after_a_reload(
        tmp_path: Path, clock: Clock) -> None:
    partitions = dict(PARTITIONS)
    created: dict[str, int] = {}
    store = OffsetStore(str(tmp_path / "warehouse"), max_wait_ms=1)
    store.start()
    c = GroupCoordinator(store, partitions.get, clock=clock, created_ms_of=created.get)
    asyncio.run(c.commit("g", None, -1, [("t", 0, 75, None), ("u", 1, 9, None)]))
    asyncio.run(c.commit("h", None, -1, [("t", 3, 40, None)]))
    del partitions["t"]
    assert asyncio.run(c.forget_topic("t")) == 2
    assert list(c.committed("g")) == [("u", 1)]
    assert c.committed("h") == {}
    # The tombstones are in Delta: a coordinator that reads the table finds none of them.
    store.close()
    again = OffsetStore(str(tmp_path / "warehouse"))
    again.load()
    assert {(k.group, k.topic) for k in again.latest} == {("g", "u")}


def test_offsets_committed_before_their_topic_was_made_are_not_the_new_topics(
        tmp_path: Path, clock: Clock) -> None:
    """A coordinator that missed the deletion (another broker's group then, or down) still
    hands out no offset of the old topic once one of the name is made again."""
    created: dict[str, int] = {}
    store = OffsetStore(str(tmp_path / "warehouse"), max_wait_ms=1)
    store.start()
    try:
        c = GroupCoordinator(store, PARTITIONS.get, clock=clock, created_ms_of=created.get,
                             epoch_of=lambda _g: None)  # not coordinated here: no writes
        asyncio.run(GroupCoordinator(store, PARTITIONS.get).commit(
            "g", None, -1, [("t", 0, 75, None)]))
        (committed,) = c.committed("g").values()
        created["t"] = committed.commit_ms + 1  # made again just after: within the skew
        assert c.committed("g") != {}
        created["t"] = committed.commit_ms + 60_000
        assert c.committed("g") == {}
        # Where a member starts and what lag counts from read it the same way.
        assert c.committed_offset("g", ("t", 0)) is None
        assert list(all_group_lag(c, lambda _t, _p: None)) == []
        # A commit to the new topic is the group's.
        created["t"] = committed.commit_ms - 5
        assert list(c.committed("g")) == [("t", 0)]
        assert asyncio.run(c.forget_topic("t")) == 0  # the new topic's offsets stay
    finally:
        store.close()
