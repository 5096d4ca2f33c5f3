"""The controller killed right after each of its steps (cluster.controller: ``elected``,
``epoch``, ``leader-written``, ``topic-written``), and the cluster recovering from it.

A real broker runs ``lakelog serve`` under tests/cluster/broker_proc.py, which SIGKILLs the
process as its controller completes the step. Which broker is the controller is arranged,
not raced for: the hooked broker is started alone (or is the only one left) when the
``/controller`` node is free. What the cluster did is read from ZooKeeper itself (kazoo,
cluster.model's paths and types).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import httpx
import msgspec
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, NoNodeError

from cluster import controller
from cluster.model import (
    BROKERS,
    CONTROLLER,
    CONTROLLER_EPOCH,
    NO_LEADER,
    TOPICS,
    PartitionState,
    TopicAssignment,
    decode,
    state_path,
    topic_path,
)
from lakelog.zookeeper import ZooKeeperServer
from tests.cluster.brokers import Brokers
from tests.server import LAKELOG

pytestmark = pytest.mark.slow
CLUSTER = "/v3/clusters/lakelog"
ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 60.0
"""The bound of every wait (sessions last 4 s here; a slow, shared machine needs more)."""

_T = TypeVar("_T")


# -- fixtures and helpers ----------------------------------------------------------------
@pytest.fixture
def zk(zookeeper: ZooKeeperServer, chroot: str) -> Iterator[KazooClient]:
    """A ZooKeeper client in the test's chroot, to read what the controllers wrote."""
    client = KazooClient(hosts=zookeeper.connect + chroot, timeout=30)
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def brokers(tmp_path: Path, zookeeper: ZooKeeperServer, chroot: str) -> Iterator[Brokers]:
    """Brokers 1..3, none started: each test starts them in the order it needs."""
    b = Brokers(tmp_path, zookeeper.connect + chroot)
    try:
        yield b
    finally:  # killed brokers leave unclean logs anyway: no clean stop to check here
        b.kill_all()


def wait_for(what: str, probe: Callable[[], _T | None], timeout_s: float = WAIT_S) -> _T:
    """``probe()`` once it is neither None nor False; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s:.0f}s: {what}")
        time.sleep(0.05)


def launch_with(b: Brokers, i: int, step: str | None) -> None:
    """Broker ``i`` runs as ``lakelog serve``, or (``step``) under the launcher that kills
    it right after its controller completes that step."""
    server = b.servers[i]
    if step is None:
        server.command = [str(LAKELOG)]
        return
    server.command = [sys.executable, "-m", "tests.cluster.broker_proc", step]
    server.env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)


def start_to_die(b: Brokers, i: int, step: str) -> None:
    """Start broker ``i`` hooked at ``step`` and see it SIGKILLed there (it may die before
    it first answers, the controller being elected while the server starts)."""
    launch_with(b, i, step)
    with contextlib.suppress(RuntimeError):
        b.start(i, WAIT_S)
    proc = b.servers[i].proc
    assert proc is not None
    wait_for(f"broker {i} killed after {step}", lambda: proc.poll() is not None)
    assert proc.returncode == -signal.SIGKILL, b.servers[i].log()


def start(b: Brokers, *ids: int) -> None:
    """Start these brokers plainly, at once."""
    for i in ids:
        launch_with(b, i, None)
    with ThreadPoolExecutor(len(ids)) as pool:
        list(pool.map(lambda i: b.start(i, WAIT_S), ids))


def controller_id(zk: KazooClient) -> int | None:
    try:
        data, _ = zk.get(CONTROLLER)
    except NoNodeError:
        return None
    return int(msgspec.json.decode(data)["broker_id"])


def controller_epoch(zk: KazooClient) -> int:
    try:
        return int(zk.get(CONTROLLER_EPOCH)[0])
    except NoNodeError:
        return 0


def states(zk: KazooClient, topic: str) -> dict[int, PartitionState]:
    """Every partition state of ``topic`` (a missing one fails: it must be complete)."""
    assignment = decode(zk.get(topic_path(topic))[0], TopicAssignment)
    return {p: decode(zk.get(state_path(topic, p))[0], PartitionState)
            for p in range(assignment.partitions)}


def live_brokers(zk: KazooClient) -> set[int]:
    return {int(c) for c in zk.get_children(BROKERS)}


def create(b: Brokers, via: int, topic: str, partitions: int) -> httpx.Response:
    return httpx.post(b.url(via) + CLUSTER + "/topics", timeout=30,
                      json={"topic_name": topic, "partitions_count": partitions,
                            "replication_factor": 1})


def produce_acked(b: Brokers, via: int, topic: str, partitions: int, per: int = 5
                  ) -> dict[tuple[int, int], str]:
    """``per`` records to every partition through broker ``via`` (acks=all): the
    acknowledged ((partition, offset) -> value); every one must be acknowledged."""
    entries = [{"id": f"{p}-{j}", "partition_id": p, "value": {"type": "STRING",
                                                               "data": f"{topic}-{p}-{j}"}}
               for p in range(partitions) for j in range(per)]
    r = httpx.post(b.url(via) + CLUSTER + f"/topics/{topic}/records:batch", timeout=30,
                   params={"acks": "all"}, json={"entries": entries})
    assert r.status_code == 207 and r.json()["failures"] == [], r.text
    values = {e["id"]: e["value"]["data"] for e in entries}  # type: ignore[index]
    return {(s["partition_id"], s["offset"]): values[s["id"]] for s in r.json()["successes"]}


def fetched(b: Brokers, via: int, topic: str, partition: int) -> list[dict[str, object]] | None:
    """Every record of the partition through broker ``via``; None while it is refused."""
    r = httpx.get(b.url(via) + CLUSTER + f"/topics/{topic}/partitions/{partition}/records",
                  params={"offset": 0, "format": "STRING", "max_records": 1000}, timeout=30)
    if r.status_code in (421, 503):
        return None
    assert r.status_code == 200, r.text
    records: list[dict[str, object]] = r.json()["records"]
    return records


def created(b: Brokers, via: int, topic: str, partitions: int) -> httpx.Response:
    """``create``'s answer once it is not a 503 (a broker whose view has not caught up with
    a new controller yet, or that forwarded to the dead one, says to try again)."""
    def answered() -> httpx.Response | None:
        r = create(b, via, topic, partitions)
        return None if r.status_code == 503 else r
    return wait_for(f"broker {via} answers the creation of {topic}", answered)


def leaders(zk: KazooClient, topic: str) -> list[int]:
    return [s.leader for _, s in sorted(states(zk, topic).items())]


def earlier_life(b: Brokers, zk: KazooClient) -> dict[int, PartitionState]:
    """The cluster ran before: brokers 1..3 made topic ``before`` (6 partitions, two led by
    each) and were all SIGKILLed at once, so no controller rewrote a state on the way down.
    Returns the states they left."""
    start(b, 1, 2, 3)
    wait_for("a controller", lambda: controller_id(zk))
    r = created(b, 1, "before", 6)
    assert r.status_code == 201, r.text
    before = states(zk, "before")
    assert sorted(s.leader for s in before.values()) == [1, 1, 2, 2, 3, 3]
    b.kill_all()
    return before


def is_controller(zk: KazooClient, among: set[int], above_epoch: int) -> int | None:
    """The controller's id once one of ``among`` is, with an epoch above ``above_epoch``."""
    cid = controller_id(zk)
    if cid in among and controller_epoch(zk) > above_epoch:
        return cid
    return None


def settled(zk: KazooClient, topic: str, before: dict[int, PartitionState], dead: set[int]
            ) -> dict[int, PartitionState] | None:
    """``topic``'s states once every partition the ``dead`` brokers led (in ``before``) is
    offline and every other one is led by its leader in ``before``."""
    now = states(zk, topic)
    if all(now[p].leader == (NO_LEADER if s.leader in dead else s.leader)
           for p, s in before.items()):
        return now
    return None


def assert_taken_over(after: dict[int, PartitionState], before: dict[int, PartitionState],
                      dead: int, controller_epoch: int) -> None:
    """The new controller (at ``controller_epoch``) took the ``dead`` broker's partitions
    offline, each leader epoch raised once and its ISR kept; the live brokers keep their
    leaders: untouched, or (a broker that registered only after the new controller's first
    look) offline for a moment and back, two leader epochs up."""
    for p, s in after.items():
        b = before[p]
        if b.leader == dead:
            assert s == PartitionState(NO_LEADER, b.leader_epoch + 1, [dead], controller_epoch)
        elif s != b:
            assert s == PartitionState(b.leader, b.leader_epoch + 2, b.isr, controller_epoch)


def led_again(zk: KazooClient, topic: str, before: dict[int, PartitionState]
              ) -> dict[int, PartitionState] | None:
    """``topic``'s states once every partition is led by its leader in ``before`` again."""
    now = states(zk, topic)
    return now if all(now[p].leader == s.leader for p, s in before.items()) else None


class ControllerWatch:
    """Every broker id seen in ``/controller`` (None while there is none), in order, each
    with the brokers registered right after the change was seen."""

    def __init__(self, zk: KazooClient) -> None:
        self.zk = zk
        self.seen: list[tuple[int | None, set[int]]] = []
        zk.DataWatch(CONTROLLER, self._changed)

    def _changed(self, data: bytes | None, _stat: object) -> None:
        cid = None if data is None else int(msgspec.json.decode(data)["broker_id"])
        if not self.seen or self.seen[-1][0] != cid:
            self.seen.append((cid, live_brokers(self.zk)))


def dead_controller_then_another(brokers: Brokers, zk: KazooClient, step: str
                                 ) -> tuple[dict[int, PartitionState], int, int]:
    """The earlier life, then broker 1 alone elected and killed after ``step``, then brokers
    2 and 3 started: (the states of ``before`` left by the earlier life, the controller
    epoch it left, the new controller's id)."""
    before = earlier_life(brokers, zk)
    epoch = controller_epoch(zk)
    assert epoch >= 1
    # Alone, broker 1 waits out the sessions of the killed processes, is elected, dies.
    start_to_die(brokers, 1, step)
    raised = 0 if step == "elected" else 1
    # Its ephemeral /controller outlives it, held by its session until ZooKeeper ends
    # that: meanwhile nobody controls, and nobody else can be elected.
    watch = ControllerWatch(zk)
    assert controller_id(zk) == 1
    assert controller_epoch(zk) == epoch + raised
    assert states(zk, "before") == before  # killed before its first reconcile
    start(brokers, 2, 3)
    new = wait_for("broker 2 or 3 controls at a higher epoch",
                   lambda: is_controller(zk, {2, 3}, epoch + raised))
    assert controller_epoch(zk) == epoch + raised + 1
    # The watch hears of a change after ZooKeeper has it: wait for it to hear of `new`.
    wait_for("the watch sees the new controller",
             lambda: new in [c for c, _ in watch.seen])
    assert [c for c, _ in watch.seen if c is not None] == [1, new]  # nobody in between
    # ... and it went with the dead broker's session: its registration, an ephemeral node
    # of the same session, was gone by the time the controller node was seen to change.
    assert 1 not in watch.seen[1][1], watch.seen
    return before, epoch, new


# -- the steps ---------------------------------------------------------------------------
def test_killed_after_elected(brokers: Brokers, zk: KazooClient) -> None:
    """Step 1a: /controller made, /controller_epoch not raised yet."""
    before, epoch, new = dead_controller_then_another(brokers, zk, "elected")
    # It acts: broker 1's partitions go offline at a higher leader epoch, written at the
    # new controller epoch; brokers 2's and 3's keep their leaders.
    after = wait_for("broker 1's partitions offline, the others led",
                     lambda: settled(zk, "before", before, {1}))
    assert_taken_over(after, before, 1, epoch + 1)
    r = created(brokers, 2, "after", 4)
    assert r.status_code == 201, r.text
    assert sorted(leaders(zk, "after")) == [2, 2, 3, 3]
    assert {s.controller_epoch for s in states(zk, "after").values()} == {epoch + 1}
    assert controller_id(zk) == new


def test_killed_after_epoch(brokers: Brokers, zk: KazooClient) -> None:
    """Step 1b: /controller_epoch raised, no reconcile yet. Nothing is ever written at the
    dead controller's epoch; the next one writes at its own."""
    before, epoch, new = dead_controller_then_another(brokers, zk, "epoch")
    dead_epoch, new_epoch = epoch + 1, epoch + 2
    after = wait_for("broker 1's partitions offline, the others led",
                     lambda: settled(zk, "before", before, {1}))
    assert_taken_over(after, before, 1, new_epoch)
    r = created(brokers, 3, "after", 4)
    assert r.status_code == 201, r.text
    assert sorted(leaders(zk, "after")) == [2, 2, 3, 3]
    # Broker 1 returns (plainly): it leads its partitions again, at a higher leader epoch.
    start(brokers, 1)
    again = wait_for("broker 1 leads again", lambda: led_again(zk, "before", before))
    for p, s in again.items():
        if before[p].leader == 1:
            assert s == PartitionState(1, before[p].leader_epoch + 2, [1], new_epoch)
    written = {s.controller_epoch for t in ("before", "after") for s in states(zk, t).values()}
    assert dead_epoch not in written, written
    assert written <= {epoch, new_epoch}
    assert controller_id(zk) == new and controller_epoch(zk) == new_epoch


def test_killed_after_one_leader_written(brokers: Brokers, zk: KazooClient) -> None:
    """Step 2, between two partitions' writes: the next controller finishes the job."""
    launch_with(brokers, 1, "leader-written")
    brokers.start(1, WAIT_S)
    wait_for("broker 1 controls", lambda: controller_id(zk) == 1 and controller_epoch(zk) >= 1)
    epoch = controller_epoch(zk)
    start(brokers, 2, 3)
    wait_for("three brokers registered", lambda: live_brokers(zk) == {1, 2, 3})
    r = create(brokers, 1, "t", 6)
    assert r.status_code == 201, r.text
    before = states(zk, "t")
    assert sorted(s.leader for s in before.values()) == [1, 1, 2, 2, 3, 3]
    of = {b: sorted(p for p, s in before.items() if s.leader == b) for b in (1, 2, 3)}
    acked = produce_acked(brokers, 1, "t", 6)
    # Broker 2 dies: when its session ends, the controller takes its two partitions
    # offline one by one, and is killed after the first.
    brokers.kill(2)
    proc = brokers.servers[1].proc
    assert proc is not None
    wait_for("the controller killed after a write", lambda: proc.poll() is not None)
    assert proc.returncode == -signal.SIGKILL, brokers.servers[1].log()
    left = states(zk, "t")
    written = [p for p in of[2] if left[p] != before[p]]
    assert len(written) == 1, left
    assert left[written[0]] == PartitionState(NO_LEADER, before[written[0]].leader_epoch + 1,
                                              [2], epoch)
    assert all(left[p] == before[p] for p in before if p not in written)
    # Broker 3, the one left, takes over and finishes: each dead broker's partition
    # offline, its leader epoch raised once; broker 3's keep their leader.
    wait_for("broker 3 controls", lambda: is_controller(zk, {3}, epoch))
    after = wait_for("brokers 1's and 2's partitions offline",
                     lambda: settled(zk, "t", before, {1, 2}))
    for p, s in after.items():
        if p in of[3]:
            assert s == before[p]
        else:
            assert (s.leader, s.leader_epoch, s.isr) == \
                (NO_LEADER, before[p].leader_epoch + 1, [before[p].leader])
            assert s.controller_epoch == (epoch if p in written else epoch + 1)
    # The dead brokers return: every partition leads again, and no epoch went down.
    start(brokers, 1, 2)
    again = wait_for("every partition led again", lambda: led_again(zk, "t", before))
    for p, s in again.items():
        assert s.leader_epoch >= after[p].leader_epoch >= before[p].leader_epoch
        assert s.leader_epoch == before[p].leader_epoch + (0 if p in of[3] else 2)
    assert controller_epoch(zk) == epoch + 1
    # Every record acknowledged before the kills is at its offset, once; none lost.
    for p in range(6):
        log = wait_for(f"t-{p} readable through broker 3", lambda p=p: fetched(brokers, 3, "t", p))
        values = [rec["value"]["data"] for rec in log]
        mine = {o: v for (q, o), v in acked.items() if q == p}
        assert {o: values[o] for o in mine if o < len(values)} == mine, (p, values)
        assert all(values.count(v) == 1 for v in mine.values()), (p, values)


def test_killed_after_topic_written(brokers: Brokers, zk: KazooClient) -> None:
    """Step 3, topic committed but not answered: the client sees the connection fail, the
    topic is there whole, and creating it again says it exists."""
    launch_with(brokers, 1, "topic-written")
    brokers.start(1, WAIT_S)
    wait_for("broker 1 controls", lambda: controller_id(zk) == 1 and controller_epoch(zk) >= 1)
    epoch = controller_epoch(zk)
    start(brokers, 2, 3)
    wait_for("three brokers registered", lambda: live_brokers(zk) == {1, 2, 3})
    with pytest.raises(httpx.TransportError):
        create(brokers, 1, "t", 6)
    proc = brokers.servers[1].proc
    assert proc is not None
    wait_for("broker 1 killed after the commit", lambda: proc.poll() is not None)
    assert proc.returncode == -signal.SIGKILL, brokers.servers[1].log()
    written = states(zk, "t")  # every partition's state, or this fails
    assert sorted(s.leader for s in written.values()) == [1, 1, 2, 2, 3, 3]
    assert {s.controller_epoch for s in written.values()} == {epoch}
    for i in (2, 3):  # the other brokers see the whole topic
        def described(i: int = i) -> bool:
            r = httpx.get(brokers.url(i) + CLUSTER + "/topics/t/partitions", timeout=10)
            return r.status_code == 200 and \
                sorted(x["partition_id"] for x in r.json()["data"]) == list(range(6))
        wait_for(f"broker {i} describes t", described)
        r = httpx.get(brokers.url(i) + CLUSTER + "/topics/t", timeout=10)
        assert r.status_code == 200 and r.json()["partitions_count"] == 6, r.text
    wait_for("another controller", lambda: is_controller(zk, {2, 3}, epoch))
    for i in (2, 3):  # one asks the new controller, the other forwards to it
        r = created(brokers, i, "t", 6)
        assert (r.status_code, r.json()["error"]) == (400, "topic_already_exists"), r.text


def test_topic_changes_through_a_broker_whose_watches_lag_show_at_once_there(
        brokers: Brokers, zk: KazooClient) -> None:
    """A broker that sends a topic change on to the controller reads the topic back once
    the controller answers, so its own next answer shows the change, however late its
    ZooKeeper watches are (a suite run saw a leader of -1 listed right after a creation
    through such a broker). Broker 2 applies its watches of ``lag-*`` topics 3 s late."""
    start(brokers, 1)
    wait_for("broker 1 controls", lambda: controller_id(zk) == 1)
    launch_with(brokers, 2, "slow-watches:lag-+3")
    brokers.start(2, WAIT_S)
    start(brokers, 3)
    wait_for("three brokers registered", lambda: live_brokers(zk) == {1, 2, 3})
    base = brokers.url(2) + CLUSTER

    def leaders() -> list[int]:
        r = httpx.get(f"{base}/topics/lag-t/partitions", timeout=10)
        assert r.status_code == 200, r.text
        return sorted(p["leader_id"] for p in r.json()["data"])

    r = create(brokers, 2, "lag-t", 6)
    assert r.status_code == 201, r.text
    assert leaders() == [1, 1, 2, 2, 3, 3]
    r = httpx.patch(f"{base}/topics/lag-t", json={"partitions_count": 9}, timeout=30)
    assert r.status_code == 200 and r.json()["partitions_count"] == 9, r.text
    assert leaders() == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    r = httpx.put(f"{base}/topics/lag-t/configs/retention.ms", json={"value": "60000"},
                  timeout=30)
    assert r.status_code == 204, r.text
    r = httpx.get(f"{base}/topics/lag-t/configs/retention.ms", timeout=10)
    assert r.json()["value"] == "60000", r.text
    assert httpx.delete(f"{base}/topics/lag-t", timeout=30).status_code == 204
    r = httpx.get(f"{base}/topics/lag-t", timeout=10)
    assert r.status_code == 404, r.text
    # A creation only validated is read back too: nothing there, nothing made here.
    r = httpx.post(f"{base}/topics", json={"topic_name": "lag-v", "partitions_count": 2,
                                            "validate_only": True}, timeout=30)
    assert r.status_code == 200 and r.json()["topic_name"] == "lag-v", r.text
    assert httpx.get(f"{base}/topics/lag-v", timeout=10).status_code == 404


def test_an_election_interrupted_after_elected_is_finished_by_its_session(
        zk: KazooClient) -> None:
    """Step 1a, interrupted without a death (a ConnectionLoss between the two writes, say):
    the /controller node is this session's own, so the same controller goes on to raise
    the epoch, rather than waiting for a node nobody will ever remove."""
    for path in (BROKERS, TOPICS):
        zk.ensure_path(path)
    interrupted: list[str] = []

    def once(done: str) -> None:
        if done == "elected" and not interrupted:
            interrupted.append(done)
            raise ConnectionLoss("lost right after creating /controller")

    controller.step_hook = once
    ctl = controller.Controller(zk, 7)
    try:
        ctl.start()
        ctl.poke()
        wait_for("the interrupted controller active", lambda: ctl.active, timeout_s=20)
    finally:
        ctl.stop()
        controller.step_hook = None
    assert interrupted == ["elected"]
    assert controller_id(zk) == 7 and controller_epoch(zk) == ctl.epoch == 1
