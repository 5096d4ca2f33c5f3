"""Replication's multi-step changes killed right after each step (cluster.replicas.step
and cluster.controller.step): a leader right after its ISR change is in ZooKeeper
(``leader-isr-written``, before it holds it in memory), a deposed leader right after it
cut its log by leader epoch (``truncated``, before it fetched again), and the controller
right after it wrote a dead follower out of an ISR (``isr-written``) or moved a leader
back to its preferred replica (``preferred-written``), before the rest of its pass. Real brokers on a real ZooKeeper; the broker
under test runs ``lakelog serve`` under tests/cluster/broker_proc.py, which SIGKILLs it
there; an idempotent acks=all producer runs throughout and every acknowledged record is
counted at the end (lost, duplicated), with the replicas compared byte for byte."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from kazoo.client import KazooClient

from cluster.assign import assign_replicas
from lakelog.zookeeper import ZooKeeperServer
from tests.cluster.brokers import Brokers
from tests.cluster.harness import Cluster, string, wait_for
from tests.cluster.test_controller_steps import launch_with
from tests.cluster.test_replication import (
    Jepsen,
    _assert_replicas_identical,
    _check_no_loss,
    _create,
    _leader,
)
from tests.server import CLUSTER

pytestmark = pytest.mark.slow
ENV = {"LAKELOG_REPLICA_LAG_TIME_MAX_MS": "3000", "LAKELOG_PRODUCE_TIMEOUT_MS": "10000"}


def _led_by(broker: int, prefix: str) -> str:
    """A one-partition topic name the controller gives ``broker`` as preferred leader
    (the assignment's start is a hash of the name)."""
    for i in range(1000):
        name = f"{prefix}-{i}"
        if assign_replicas(name, [(1, None), (2, None), (3, None)], 1, 3)[0][0] == broker:
            return name
    raise AssertionError("no such name")


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: ZooKeeperServer, chroot: str,
            request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """Brokers 1..3; broker 1 under the launcher that kills it after the test's step."""
    brokers = Brokers(tmp_path, zookeeper.connect + chroot, 3, env=ENV)
    zk = KazooClient(hosts=zookeeper.connect + chroot, timeout=10)
    zk.start(timeout=30)
    cluster = Cluster(brokers, zk)
    try:
        launch_with(brokers, 1, request.param)
        for i in (2, 3):
            launch_with(brokers, i, None)
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda i: brokers.start(i, 60), brokers.ids))
        wait_for(lambda: cluster.registered() == [1, 2, 3], "three brokers registered")
        wait_for(lambda: all(cluster.controller(i) > 0 for i in brokers.ids),
                 "every broker knowing the controller")
        yield cluster
    finally:
        for i in brokers.ids:  # a paused broker is resumed, then killed with the rest
            if brokers.alive(i):
                cluster.resume(i)
        brokers.kill_all()
        zk.stop()
        zk.close()


@pytest.fixture
def controlled(tmp_path: Path, zookeeper: ZooKeeperServer, chroot: str,
               request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """Brokers 1..3, broker 1 the controller under the launcher that kills it after the
    test's step. Followers fall out of an ISR only when their session ends (a 30 s lag
    allowance), so it is the controller, not a leader, that writes them out; preferred
    leaders are checked every second."""
    env = {**ENV, "LAKELOG_REPLICA_LAG_TIME_MAX_MS": "30000",
           "LAKELOG_LEADER_IMBALANCE_CHECK_INTERVAL_SECONDS": "1"}
    brokers = Brokers(tmp_path, zookeeper.connect + chroot, 3, env=env)
    zk = KazooClient(hosts=zookeeper.connect + chroot, timeout=10)
    zk.start(timeout=30)
    cluster = Cluster(brokers, zk)
    try:
        launch_with(brokers, 1, request.param)
        brokers.start(1, 60)
        wait_for(lambda: cluster.controller(1) == 1, "broker 1 the controller")
        for i in (2, 3):
            launch_with(brokers, i, None)
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda i: brokers.start(i, 60), (2, 3)))
        wait_for(lambda: cluster.registered() == [1, 2, 3], "three brokers registered")
        yield cluster
    finally:
        brokers.kill_all()
        zk.stop()
        zk.close()


def _died_at_step(cluster: Cluster, i: int, step: str) -> None:
    proc = cluster.brokers.servers[i].proc
    assert proc is not None
    wait_for(lambda: proc.poll() is not None, f"broker {i} killed after {step}")
    assert proc.returncode == -signal.SIGKILL, cluster.brokers.servers[i].log()[-2000:]


def _restart_plain(cluster: Cluster, i: int) -> None:
    launch_with(cluster.brokers, i, None)
    cluster.brokers.start(i, 60)


def _report(what: str, figures: dict[str, int], jepsen: Jepsen, records: int) -> None:
    print(f"\nmeasured: {what}: {figures}, failures {len(jepsen.failed)}, records "
          f"compared across replicas {records}")


@pytest.mark.parametrize("cluster", ["leader-isr-written"], indirect=True)
def test_leader_killed_after_its_isr_write_loses_nothing_acknowledged(
        cluster: Cluster) -> None:
    topic = _led_by(1, "isr-step")
    _create(cluster, topic, 1)
    assert _leader(cluster, topic) == 1
    with Jepsen(cluster.brokers.url(2), topic, 1) as jepsen:
        wait_for(lambda: jepsen.acked_count() > 100, "the producer running")
        cluster.brokers.kill(3)  # the leader shrinks its ISR (3 s behind), or, if the
        # controller removed broker 3 first, expands it again when 3 returns
        deadline = time.monotonic() + 15
        while cluster.brokers.alive(1) and time.monotonic() < deadline:
            time.sleep(0.1)
        if cluster.brokers.alive(1):
            _restart_plain(cluster, 3)
        _died_at_step(cluster, 1, "leader-isr-written")
        wait_for(lambda: _leader(cluster, topic) not in (1, -1), "a new leader")
        if not cluster.brokers.alive(3):
            _restart_plain(cluster, 3)
        _restart_plain(cluster, 1)
        wait_for(lambda: len(cluster.state(topic, 0).isr) == 3, "every replica in sync")
        before = jepsen.acked_count()
        wait_for(lambda: jepsen.acked_count() > before + 50, "acknowledgements again")
    figures = _check_no_loss(cluster, topic, 1, jepsen.acked)
    records = _assert_replicas_identical(cluster, topic, 1)
    _report("leader killed after its ISR write", figures, jepsen, records)
    assert figures["lost"] == 0 and figures["duplicated"] == 0, figures


@pytest.mark.parametrize("cluster", ["truncated"], indirect=True)
def test_deposed_leader_killed_after_truncating_converges_and_loses_nothing(
        cluster: Cluster) -> None:
    topic = _led_by(1, "truncate-step")
    _create(cluster, topic, 1)
    assert _leader(cluster, topic) == 1
    with Jepsen(cluster.brokers.url(2), topic, 1) as jepsen:
        wait_for(lambda: jepsen.acked_count() > 100, "the producer running")
        # A record only broker 1 gets (its followers paused long enough for their waiting
        # fetches to end, not long enough to leave the ISR), then broker 1 paused beyond
        # its session: a new leader takes over, broker 1 must cut that record on return.
        for i in (2, 3):
            cluster.pause(i)
        time.sleep(1.0)
        r = cluster.post(1, f"/topics/{topic}/records", params={"acks": "1"},
                         json={"partition_id": 0, "value": string("leader-only")})
        assert r.status_code == 200, r.text
        cluster.pause(1)
        for i in (2, 3):
            cluster.resume(i)
        wait_for(lambda: _leader(cluster, topic) not in (1, -1), "a new leader")
        before = jepsen.acked_count()
        wait_for(lambda: jepsen.acked_count() > before + 50, "acknowledgements again")
        cluster.resume(1)
        _died_at_step(cluster, 1, "truncated")
        _restart_plain(cluster, 1)
        wait_for(lambda: len(cluster.state(topic, 0).isr) == 3, "every replica in sync")
        before = jepsen.acked_count()
        wait_for(lambda: jepsen.acked_count() > before + 50, "more acknowledgements")
    figures = _check_no_loss(cluster, topic, 1, jepsen.acked)
    records = _assert_replicas_identical(cluster, topic, 1)
    _report("deposed leader killed after truncating", figures, jepsen, records)
    assert figures["lost"] == 0 and figures["duplicated"] == 0, figures
    values = {rec["value"]["data"] for rec in cluster.fetch(1, topic, 0)}
    assert "leader-only" not in values


@pytest.mark.parametrize("controlled", ["isr-written", "preferred-written"], indirect=True)
def test_controller_killed_after_its_isr_or_preferred_leader_write_loses_nothing(
        controlled: Cluster, request: pytest.FixtureRequest) -> None:
    cluster = controlled
    step = request.node.callspec.params["controlled"]
    topic = _led_by(2, "controller-step")  # broker 2 its preferred leader, 1 a follower
    _create(cluster, topic, 1)
    assert _leader(cluster, topic) == 2
    # The producer's bootstrap broker is one the test does not kill.
    with Jepsen(cluster.brokers.url(2 if step == "isr-written" else 3), topic, 1) as jepsen:
        wait_for(lambda: jepsen.acked_count() > 100, "the producer running")
        if step == "isr-written":
            cluster.brokers.kill(3)  # its session ends: the controller shrinks the ISR
        else:
            cluster.brokers.kill(2)  # broker 3 or 1 leads; then 2 returns, catches up,
            wait_for(lambda: _leader(cluster, topic) not in (2, -1), "another leader")
            before = jepsen.acked_count()
            wait_for(lambda: jepsen.acked_count() > before + 50, "acknowledgements again")
            _restart_plain(cluster, 2)  # and the controller moves the lead back to it
        _died_at_step(cluster, 1, step)
        state = cluster.state(topic, 0)
        if step == "isr-written":
            assert 3 not in state.isr and state.leader == 2, state
            _restart_plain(cluster, 3)
        else:
            assert state.leader == 2, state
        # A new controller takes over (broker 1's session ends) and finishes the pass.
        wait_for(lambda: cluster.controller(2) in (2, 3), "a new controller")
        _restart_plain(cluster, 1)
        wait_for(lambda: len(cluster.state(topic, 0).isr) == 3, "every replica in sync")
        assert _leader(cluster, topic) == 2, cluster.state(topic, 0)
        before = jepsen.acked_count()
        wait_for(lambda: jepsen.acked_count() > before + 50, "more acknowledgements")
    figures = _check_no_loss(cluster, topic, 1, jepsen.acked)
    records = _assert_replicas_identical(cluster, topic, 1)
    _report(f"controller killed after {step}", figures, jepsen, records)
    assert figures["lost"] == 0 and figures["duplicated"] == 0, figures


@pytest.mark.parametrize("cluster", ["becoming-leader+10"], indirect=True)
def test_a_new_leader_acknowledges_nothing_before_it_replicates(cluster: Cluster) -> None:
    """The moment between the metadata naming a broker the leader and its leader state
    being made (``becoming-leader``; the nemesis met it after a lease lost and held
    again): acks=all must not be answered on the leader's own fsync then, since its
    followers cannot fetch yet. Broker 1 stalls there 10 s while the test produces to
    it, then is SIGKILLed: a record acknowledged in that moment would be lost."""
    topic = _led_by(1, "becoming")
    r = cluster.post(2, "/topics", json={
        "topic_name": topic, "partitions_count": 1, "replication_factor": 3,
        "configs": [{"name": "min.insync.replicas", "value": "2"}]})
    assert r.status_code == 201, r.text
    wait_for(lambda: cluster.get(1, f"/topics/{topic}").status_code == 200,
             "broker 1 knowing the topic")
    assert _leader(cluster, topic) == 1
    acked: dict[str, int] = {}
    refused: list[int] = []
    i = 0
    while cluster.brokers.alive(1):
        try:
            r = httpx.post(f"{cluster.brokers.url(1)}{CLUSTER}/topics/{topic}/records",
                           json={"partition_id": 0, "value": string(f"v{i}")}, timeout=5)
        except httpx.TransportError:  # killed while it answered
            break
        if r.status_code == 200:
            acked[f"v{i}"] = r.json()["offset"]
        else:
            refused.append(r.status_code)
            assert r.json().get("retriable"), r.text
        i += 1
        time.sleep(0.05)
    _died_at_step(cluster, 1, "becoming-leader")
    assert i >= 20, f"only {i} produce requests were sent while broker 1 stalled"
    wait_for(lambda: _leader(cluster, topic) not in (1, -1), "a new leader")
    _restart_plain(cluster, 1)
    wait_for(lambda: len(cluster.state(topic, 0).isr) == 3, "every replica in sync")
    held = {rec["value"]["data"] for rec in cluster.fetch(2, topic, 0)}
    lost = sorted(set(acked) - held)
    print(f"\nmeasured: produced to a broker becoming leader: {len(acked)} acknowledged, "
          f"{len(refused)} refused (retriable), {len(lost)} lost")
    assert not lost, f"{len(lost)} acknowledged records lost: {lost[:5]}"
