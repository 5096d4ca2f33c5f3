"""The ISR in ZooKeeper: what the controller makes of it when brokers come and go
(cluster.controller step 2, cluster.election's rules), a leader's own changes
(cluster.isr.alter_isr), what a broker's view sees of them (cluster.view), and preferred
leader elections (step 4).

Real ZooKeeper, real sessions: each broker here is a kazoo session holding its
registration (``/brokers/ids/<id>``), ended by closing it (ZooKeeper removes the node at
once) and "bounced" by closing and registering again before the controller looks (a new
czxid: a restarted broker). The controller is ``cluster.controller.Controller`` in this
process, driven a turn at a time with ``run_once`` (its thread only where the test is
about its timer), so that what it saw between two changes is decided by the test.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from cluster import controller
from cluster.controller import Controller
from cluster.election import after_brokers_changed
from cluster.isr import InvalidIsrError, IsrConflictError, IsrFencedError, alter_isr
from cluster.model import (
    NO_LEADER,
    PartitionState,
    TopicAssignment,
    decode,
    encode,
    state_path,
    topic_path,
)
from cluster.snapshot import read_placements
from cluster.view import ClusterView, under_replicated
from lakelog.zookeeper import ZooKeeperServer
from tests.cluster.sessions import CONTROLLER_ID, Sessions, create, elected, replicas, state
from tests.cluster.test_controller_steps import wait_for

pytestmark = pytest.mark.slow
WAIT_S = 30.0


def as_leader(zk: KazooClient, topic: str, new_isr: list[int], p: int = 0
              ) -> tuple[PartitionState, int]:
    """What the partition's leader does to change its ISR: read, then ``alter_isr``."""
    data, stat = zk.get(state_path(topic, p))
    s = decode(data, PartitionState)
    return alter_isr(zk, topic, p, s.leader, s.leader_epoch, new_isr, stat.version)


# -- creation ----------------------------------------------------------------------------
def test_isr_is_every_replica_at_create(zk: KazooClient, brokers: Sessions) -> None:
    ctl = elected(zk)
    placed = create(ctl, "t", 3)
    ctl.add_partitions("t", 5)
    placed = decode(zk.get(topic_path("t"))[0], TopicAssignment).replicas
    assert len(placed) == 5
    for p, rs in enumerate(placed):
        assert sorted(rs) == [1, 2, 3]
        assert state(zk, "t", p) == PartitionState(rs[0], 0, rs, ctl.epoch)


# -- brokers leaving and returning ---------------------------------------------------------
def test_a_followers_session_ending_shrinks_the_isr_without_a_new_leader_epoch(
        zk: KazooClient, brokers: Sessions, steps: list[str]) -> None:
    ctl = elected(zk)
    r0, r1, r2 = create(ctl, "t")[0]
    brokers.end(r2)
    ctl.run_once()
    assert state(zk, "t") == PartitionState(r0, 0, [r0, r1], ctl.epoch)
    assert steps[-1] == "isr-written"
    # A follower that restarted between two looks leaves the ISR as well.
    brokers.bounce(r1)
    ctl.run_once()
    assert state(zk, "t") == PartitionState(r0, 0, [r0], ctl.epoch)
    # Returning does not put a follower back: its leader does, once it has caught up.
    brokers.register(r2)
    assert ctl.reconcile() == 0
    assert state(zk, "t").isr == [r0]


def test_the_leaders_session_ending_elects_the_next_isr_member(
        zk: KazooClient, brokers: Sessions, steps: list[str]) -> None:
    ctl = elected(zk)
    r0, r1, r2 = create(ctl, "t")[0]
    brokers.end(r0)
    ctl.run_once()
    assert state(zk, "t") == PartitionState(r1, 1, [r1, r2], ctl.epoch)
    assert steps[-1] == "leader-written"
    brokers.bounce(r1)  # the new leader restarts: the one in sync left leads
    ctl.run_once()
    assert state(zk, "t") == PartitionState(r2, 2, [r2], ctl.epoch)


def test_a_dead_brokers_partitions_get_leaders_before_any_isr_shrinks(
        zk: KazooClient, brokers: Sessions, steps: list[str]) -> None:
    """Kafka's order on a broker's failure: its partitions without a leader take no
    produce, the ones it only followed still do, so the leaders come first."""
    ctl = elected(zk)
    placed = {name: create(ctl, name, 3) for name in ("a", "b", "c")}
    victim = placed["a"][0][0]
    led = sum(rs[0] == victim for ps in placed.values() for rs in ps)
    followed = sum(victim in rs[1:] for ps in placed.values() for rs in ps)
    assert led and followed
    brokers.end(victim)
    steps.clear()
    assert ctl.reconcile() == led + followed
    assert steps == ["leader-written"] * led + ["isr-written"] * followed, steps


def test_no_isr_member_alive_is_offline_and_the_last_one_returning_leads_again(
        zk: KazooClient, brokers: Sessions) -> None:
    ctl = elected(zk)
    r0, r1, r2 = create(ctl, "t")[0]
    brokers.end(r2)
    ctl.run_once()
    brokers.end(r0)
    ctl.run_once()
    assert state(zk, "t") == PartitionState(r1, 1, [r1], ctl.epoch)
    brokers.end(r1)
    ctl.run_once()
    offline = PartitionState(NO_LEADER, 2, [r1], ctl.epoch)
    assert state(zk, "t") == offline  # the ISR is never emptied
    # Replicas out of sync return: nothing changes (unclean election is off).
    brokers.register(r0, r2)
    assert ctl.reconcile() == 0 and state(zk, "t") == offline
    brokers.register(r1)
    ctl.run_once()
    assert state(zk, "t") == PartitionState(r1, 3, [r1], ctl.epoch)


def test_a_bounced_leader_alone_in_the_isr_leads_again(
        zk: KazooClient, brokers: Sessions) -> None:
    ctl = elected(zk)
    r0, r1, _ = create(ctl, "t")[0]
    brokers.end(r1)
    ctl.run_once()
    alone = as_leader(zk, "t", [r0])[0]  # the leader shrank it (its followers lagged)
    assert alone == PartitionState(r0, 0, [r0], ctl.epoch)
    brokers.bounce(r0)  # restarted before the controller looked again
    ctl.run_once()
    assert state(zk, "t") == PartitionState(r0, 1, [r0], ctl.epoch)


def test_unclean_election_lets_an_out_of_sync_replica_lead(
        zk: KazooClient, brokers: Sessions, caplog: pytest.LogCaptureFixture) -> None:
    """The topic's unclean.leader.election.enable, else the broker's default (here true)."""
    caplog.set_level(logging.WARNING, logger="cluster.controller")
    ctl = elected(zk, topic_defaults={"unclean.leader.election.enable": "true"})
    topics = {"own-true": {"unclean.leader.election.enable": "true"},
              "own-false": {"unclean.leader.election.enable": "false"}, "default": {}}
    for topic, configs in topics.items():
        r0, r1 = create(ctl, topic, 1, 2, configs)[0]
        as_leader(zk, topic, [r0])  # its follower fell behind
        brokers.end(r0)  # and the only replica in sync goes
        ctl.run_once()
        s = state(zk, topic)
        if topic == "own-false":
            assert s == PartitionState(NO_LEADER, 1, [r0], ctl.epoch)
            assert "own-false-0: unclean" not in caplog.text
        else:
            assert s == PartitionState(r1, 1, [r1], ctl.epoch), topic
            assert f"{topic}-0: unclean leader election" in caplog.text
            assert "acknowledged records it does not have are lost" in caplog.text
        caplog.clear()
        brokers.register(r0)  # back for the next topic
        ctl.run_once()
    # Back, the one that was in sync leads the clean partition again (the last ended).
    s = state(zk, "own-false")
    assert (s.leader, s.leader_epoch) == (replicas(zk, "own-false")[0], 2)


def test_unclean_election_is_off_by_default(zk: KazooClient, brokers: Sessions) -> None:
    ctl = elected(zk)
    r0, r1 = create(ctl, "t", 1, 2)[0]
    as_leader(zk, "t", [r0])
    brokers.end(r0)
    ctl.run_once()
    assert state(zk, "t") == PartitionState(NO_LEADER, 1, [r0], ctl.epoch)
    assert r1 in brokers.live() and ctl.reconcile() == 0


# -- the leader's own ISR changes --------------------------------------------------------
def test_alter_isr_is_refused_unless_the_leader_writes_on_the_version_it_read(
        zk: KazooClient, brokers: Sessions) -> None:
    ctl = elected(zk)
    r0, r1, r2 = create(ctl, "t")[0]
    version = zk.get(state_path("t", 0))[1].version
    with pytest.raises(InvalidIsrError, match=r"t-0.*must contain its leader"):
        alter_isr(zk, "t", 0, r0, 0, [r1, r2], version)
    with pytest.raises(InvalidIsrError, match=r"t-0.*distinct replicas"):
        alter_isr(zk, "t", 0, r0, 0, [r0, 7], version)
    with pytest.raises(InvalidIsrError, match="distinct replicas"):
        alter_isr(zk, "t", 0, r0, 0, [r0, r0], version)
    with pytest.raises(IsrFencedError, match=r"t-0.*leader epoch 1 does not lead"):
        alter_isr(zk, "t", 0, r0, 1, [r0], version)
    with pytest.raises(IsrFencedError, match=f"broker {r1} at leader epoch 0 does not lead"):
        alter_isr(zk, "t", 0, r1, 0, [r1], version)
    with pytest.raises(IsrConflictError, match="t-0: its state is at version") as stale:
        alter_isr(zk, "t", 0, r0, 0, [r0], version + 1)
    assert stale.value.retriable and stale.value.current == state(zk, "t")
    assert state(zk, "t").isr == [r0, r1, r2]  # nothing refused was written
    # Accepted: same leader, leader epoch and controller epoch; the version moves on.
    shrunk, v1 = alter_isr(zk, "t", 0, r0, 0, [r0, r2], version)
    assert shrunk == PartitionState(r0, 0, [r0, r2], ctl.epoch) == state(zk, "t")
    assert v1 == version + 1
    with pytest.raises(IsrConflictError):  # the old version is stale now
        alter_isr(zk, "t", 0, r0, 0, [r0], version)
    expanded, v2 = alter_isr(zk, "t", 0, r0, 0, [r0, r2, r1], v1)
    assert expanded.isr == [r0, r2, r1] and v2 == v1 + 1
    # A leader replaced by the controller is fenced, whatever version it holds.
    brokers.end(r0)
    ctl.run_once()
    _, stat = zk.get(state_path("t", 0))
    with pytest.raises(IsrFencedError) as fenced:
        alter_isr(zk, "t", 0, r0, 0, [r0], stat.version)
    assert not fenced.value.retriable and fenced.value.current == state(zk, "t")


def test_the_view_sees_an_isr_change_at_the_same_leader_epoch(
        zk: KazooClient, brokers: Sessions, zookeeper: ZooKeeperServer, chroot: str) -> None:
    ctl = elected(zk)
    r0, r1, r2 = create(ctl, "t")[0]
    client = KazooClient(hosts=zookeeper.connect + chroot, timeout=30)
    client.start(timeout=30)
    view = ClusterView(client)
    heard: list[tuple[str, str]] = []
    view.listeners.append(lambda kind, name: heard.append((kind, name)))
    try:
        view.start()
        first = wait_for("the view holds t-0", lambda: view.state_with_version("t", 0))
        assert first[0] == state(zk, "t") and under_replicated(view) == []
        new, version = as_leader(zk, "t", [r0, r1])
        assert version == first[1] + 1
        assert wait_for("the view holds the new ISR",
                        lambda: view.state_with_version("t", 0) == (new, version))
        assert view.leader_epoch("t", 0) == 0 and ("state", "t") in heard
        placement = view.placement("t", 0)
        assert placement is not None and placement.isr == (r0, r1)
        assert placement.under_replicated and under_replicated(view) == [("t", 0)]
        # A stale read applied late (sync_topic reads the state; here an older one is
        # replayed as a late watch event would be) does not step the view back.
        stale = client.get(state_path("t", 0))[1]._replace(version=first[1])
        view._events.put(("state", ("t", 0, encode(first[0]), stale)))
        assert view.wait_applied(WAIT_S)
        assert view.state_with_version("t", 0) == (new, version)
        # The controller's follower removal: the same leader epoch again, a new version.
        brokers.end(r1)
        ctl.run_once()
        assert wait_for("the view holds the controller's ISR",
                        lambda: view.state_with_version("t", 0) ==
                        (PartitionState(r0, 0, [r0], ctl.epoch), version + 1))
    finally:
        view.stop()
        client.stop()
        client.close()
    # The snapshot (the SQL partitions view's source) says so too.
    _, placements = read_placements(zookeeper.connect + chroot)
    assert placements[("t", 0)].isr == (r0,) and placements[("t", 0)].under_replicated
    assert r2 in replicas(zk, "t")


# -- preferred leaders -------------------------------------------------------------------
def lose_the_preferred_leader(zk: KazooClient, brokers: Sessions, ctl: Controller
                              ) -> tuple[int, int, int]:
    """``t``-0's first replica gone and back, out of the ISR: (r0, r1, r2)."""
    r0, r1, r2 = create(ctl, "t")[0]
    brokers.end(r0)
    ctl.run_once()
    assert state(zk, "t") == PartitionState(r1, 1, [r1, r2], ctl.epoch)
    brokers.register(r0)
    ctl.run_once()
    assert state(zk, "t").leader == r1
    return r0, r1, r2


def test_the_preferred_leader_moves_back_once_it_is_in_sync_again(
        zk: KazooClient, brokers: Sessions, steps: list[str]) -> None:
    ctl = elected(zk, auto_leader_rebalance_enable=False)
    r0, r1, r2 = lose_the_preferred_leader(zk, brokers, ctl)
    assert ctl.elect_preferred() == 0  # live but not in sync: it stays a follower
    # Its leader adds it back once it has caught up.
    rejoined, _ = as_leader(zk, "t", [r1, r2, r0])
    assert rejoined == PartitionState(r1, 1, [r1, r2, r0], ctl.epoch)
    assert ctl.elect_preferred("t") == 1
    assert state(zk, "t") == PartitionState(r0, 2, [r1, r2, r0], ctl.epoch)
    assert steps[-1] == "preferred-written"
    assert ctl.elect_preferred() == 0  # done already


def test_the_controller_rebalances_leaders_on_its_own_every_interval(
        zk: KazooClient, brokers: Sessions) -> None:
    ctl = elected(zk, leader_imbalance_check_interval_seconds=1)
    r0, r1, r2 = lose_the_preferred_leader(zk, brokers, ctl)
    as_leader(zk, "t", [r1, r2, r0])
    ctl.start()
    try:
        moved = wait_for("the preferred replica leads again",
                         lambda: (s := state(zk, "t")).leader == r0 and s)
    finally:
        ctl.stop()
    assert moved == PartitionState(r0, 2, [r1, r2, r0], ctl.epoch)


# -- a controller that dies between two writes -------------------------------------------
class Died(Exception):
    """The controller's death right after a step (its session is closed next)."""


def die_after(name: str) -> Callable[[str], None]:
    def hook(done: str) -> None:
        if done == name:
            raise Died(done)
    return hook


@pytest.mark.parametrize("write", ["isr-written", "leader-written", "preferred-written"])
def test_a_controller_dead_after_one_write_leaves_the_rest_to_the_next(
        zk: KazooClient, brokers: Sessions, zookeeper: ZooKeeperServer, chroot: str,
        write: str) -> None:
    """Step 3 (and 5) between two partitions' writes: the next controller does the rest
    from what ZooKeeper holds, and no leader epoch goes up twice."""
    first = KazooClient(hosts=zookeeper.connect + chroot, timeout=30)
    first.start(timeout=30)
    dead = Controller(first, CONTROLLER_ID, auto_leader_rebalance_enable=False)
    try:
        dead.run_once()
        create(dead, "t", 6)
        gone = 1 if write == "isr-written" else 2
        if write == "preferred-written":  # broker 2's partitions led elsewhere, it back
            brokers.end(2)
            dead.run_once()
            brokers.register(2)
            dead.run_once()
            for p in range(6):  # and in sync again, as its leaders would say
                s = state(zk, "t", p)
                if 2 not in s.isr:
                    as_leader(zk, "t", [*s.isr, 2], p)
        before = {p: state(zk, "t", p) for p in range(6)}
        controller.step_hook = die_after(write)
        with pytest.raises(Died):
            if write == "preferred-written":
                dead.elect_preferred()
            else:
                brokers.end(gone)
                dead.run_once()
    finally:
        controller.step_hook = None
        first.stop()  # its session ends: /controller is free
        first.close()
    written = {p for p in range(6) if state(zk, "t", p) != before[p]}
    to_write = {p for p, b in before.items()
                if (b.leader != replicas(zk, "t", p)[0] if write == "preferred-written"
                    else gone in b.isr)}
    assert written and written < to_write, (written, to_write)  # died part way
    ctl = elected(zk, auto_leader_rebalance_enable=False)
    assert ctl.epoch == dead.epoch + 1
    if write == "preferred-written":
        ctl.elect_preferred()
    for p in range(6):
        s, b, rs = state(zk, "t", p), before[p], replicas(zk, "t", p)
        epoch = ctl.epoch if p not in written else dead.epoch
        if write == "preferred-written":
            moved = b.leader != rs[0]
            assert s == (PartitionState(rs[0], b.leader_epoch + 1, b.isr, epoch) if moved
                         else b), p
        elif gone in b.isr:
            change = after_brokers_changed(b, rs, brokers.live(), set(), False, epoch)
            assert change is not None and s == change.state, p
            assert s.leader_epoch == b.leader_epoch + (b.leader == gone)
        else:
            assert s == b
    assert {p for p in range(6) if state(zk, "t", p) != before[p]} == to_write


def test_a_late_topic_list_does_not_drop_a_synced_topic(
        zk: KazooClient, brokers: Sessions, zookeeper: ZooKeeperServer, chroot: str) -> None:
    """``sync_topic`` (the answer to a create, run in the request's thread) reads a topic
    outside the event queue; a children list read before the topic existed, applied after,
    must not drop it (CI once saw a create answered 201 and the creating broker then
    refuse produces to a partition it had no state for)."""
    ctl = elected(zk)
    client = KazooClient(hosts=zookeeper.connect + chroot, timeout=30)
    client.start(timeout=30)
    view = ClusterView(client)
    try:
        view.start()
        assert view.wait_applied(WAIT_S)
        create(ctl, "t", 3)
        assert view.sync_topic("t") is not None
        view._events.put(("topics", ((),)))  # the list from before "t" was made, late
        assert view.wait_applied(WAIT_S)
        for p in range(3):
            placement = view.placement("t", p)
            assert placement is not None and placement.leader_epoch == 0, placement
        # A topic really gone still goes.
        ctl.delete_topic("t")
        wait_for("t dropped", lambda: view.placement("t", 0) is None)
    finally:
        view.stop()
        client.stop()
        client.close()


def test_a_new_topic_shows_with_its_states(
        zk: KazooClient, brokers: Sessions, zookeeper: ZooKeeperServer, chroot: str) -> None:
    """A topic's assignment is published with its partitions' states, not before them
    (their watches' events come later): a broker sent a produce in between would say the
    partition has no leader."""
    ctl = elected(zk)
    create(ctl, "t", 3)
    client = KazooClient(hosts=zookeeper.connect + chroot, timeout=30)
    client.start(timeout=30)
    view = ClusterView(client)  # not started: no thread applies the watches' events
    try:
        view._apply_topic("t", decode(zk.get(topic_path("t"))[0], TopicAssignment))
        for p in range(3):
            placement = view.placement("t", p)
            assert placement is not None and placement.leader_epoch == 0, placement
            assert placement.leader == placement.replicas[0]
    finally:
        view.stop()
        client.stop()
        client.close()


def test_a_topic_is_applied_when_its_states_cannot_be_read_with_it(
        zk: KazooClient, brokers: Sessions, zookeeper: ZooKeeperServer, chroot: str) -> None:
    """The states read with a new topic are a shortcut: ZooKeeper out of reach at that
    moment (a stand-in client raises ConnectionLoss for them: the moment cannot be timed
    for real) leaves them to the watches, and the topic is applied all the same."""
    from kazoo.exceptions import ConnectionLoss

    ctl = elected(zk)
    create(ctl, "t", 2)
    client = KazooClient(hosts=zookeeper.connect + chroot, timeout=30)
    client.start(timeout=30)

    class Unreachable:
        """Its first read of a partition state fails (the watches' reads after succeed)."""

        failed = False

        def __getattr__(self, name: str) -> object:
            return getattr(client, name)

        def get(self, path: str, *args: object, **kwargs: object) -> object:
            if path.endswith("/state") and not self.failed:
                self.failed = True
                raise ConnectionLoss()
            return client.get(path, *args, **kwargs)

    unreachable = Unreachable()
    view = ClusterView(unreachable)  # type: ignore[arg-type]
    try:
        view._apply_topic("t", decode(zk.get(topic_path("t"))[0], TopicAssignment))
        assert unreachable.failed
        assert view.topic("t") is not None  # applied; its states left to the watches
        placement = view.placement("t", 0)
        assert placement is not None and placement.leader_epoch == -1
    finally:
        view.stop()
        client.stop()
        client.close()
