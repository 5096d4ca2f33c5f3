"""Transactions on a real three-broker cluster: the coordinator on the leader of the
transactional id's ``__transaction_state`` partition (replicated), markers written by
each partition's leader, the coordinator's broker SIGKILLed in an open transaction and
right after PrepareCommit is durable, and the next leader of the slot finishing it."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.exceptions import NoNodeError

from cluster.model import OFFSETS_TOPIC
from consumer_groups.hashing import group_slot
from lakelog.client import Consumer, Producer, TopicPartition
from lakelog.zookeeper import ZooKeeperServer
from log_tables.registry import TXN_STATE_TOPIC
from tests.cluster.harness import Cluster, three_brokers, wait_for
from tests.server import LAKELOG

ROOT = Path(__file__).resolve().parents[2]

SLOTS = 16  # transaction_state_log_num_partitions' default


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Cluster]:
    # A restarted broker leads its preferred coordinator slots again within a second.
    with three_brokers(tmp_path_factory.mktemp("txn"), zookeeper.connect, env={
            "LAKELOG_LEADER_IMBALANCE_CHECK_INTERVAL_SECONDS": "1",
            "LAKELOG_LEADER_IMBALANCE_PER_BROKER_PERCENTAGE": "0"}) as c:
        yield c


def _replicated_topic(cluster: Cluster, name: str, partitions: int) -> None:
    r = cluster.post(1, "/topics", json={"topic_name": name, "partitions_count": partitions,
                                         "replication_factor": 3})
    assert r.status_code == 201, r.text
    for i in cluster.brokers.ids:
        if cluster.brokers.alive(i):
            wait_for(lambda i=i: cluster.get(i, f"/topics/{name}").status_code == 200,  # type: ignore[misc]
                     f"broker {i} knowing {name}")
    wait_for(lambda: all(len(cluster.state(name, p).isr) == 3 for p in range(partitions)),
             f"{name} in sync on three brokers")


def _urls(cluster: Cluster) -> list[str]:
    return [cluster.brokers.url(i) for i in cluster.brokers.ids]


def _read_committed(cluster: Cluster, topic: str, want: int, group: str) -> list[bytes]:
    out: list[bytes] = []
    deadline = time.monotonic() + 60
    with Consumer(_urls(cluster), group, [topic], auto_offset_reset="earliest",
                  isolation_level="read_committed", enable_auto_commit=False) as consumer:
        while len(out) < want and time.monotonic() < deadline:
            out += [r.value or b"" for r in consumer.poll(timeout_s=0.5)]
        time.sleep(0.5)
        out += [r.value or b"" for r in consumer.poll(timeout_s=0.5)]
    return out


def _tid_led_by(cluster: Cluster, broker: int, prefix: str) -> str:
    """A transactional id whose coordinator slot ``broker`` leads (the first transactional
    call makes ``__transaction_state``)."""
    r = cluster.post(1, "/transactions/warm-up:init", json={})
    assert r.status_code == 200, r.text
    wait_for(lambda: all(cluster.state(TXN_STATE_TOPIC, s).leader >= 0 for s in range(SLOTS)),
             "every coordinator slot led")

    def led() -> str | None:
        for i in range(1000):
            tid = f"{prefix}-{i}"
            if cluster.state(TXN_STATE_TOPIC, group_slot(tid, SLOTS)).leader == broker:
                return tid
        return None

    tid, _ = wait_for(led, f"a coordinator slot led by broker {broker}")
    return tid


def test_a_transaction_over_every_broker_commits_and_one_aborts(cluster: Cluster) -> None:
    topic = "txn-spread"
    leaders = cluster.create_topic(topic, 6)
    assert len(set(leaders.values())) == 3  # the partitions' leaders are the three brokers
    with Producer(_urls(cluster), transactional_id="spread", linger_ms=1) as producer:
        producer.init_transactions()  # makes __transaction_state (its replication: below)
        producer.begin_transaction()
        for p in range(6):
            producer.send(topic, f"kept-{p}".encode(), partition=p)
        producer.commit_transaction()
        producer.begin_transaction()
        for p in range(6):
            producer.send(topic, f"dropped-{p}".encode(), partition=p)
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send(topic, b"last", partition=0)
        producer.commit_transaction()
    state = cluster.state(TXN_STATE_TOPIC, group_slot("spread", SLOTS))
    assert len(state.isr) == 3  # the coordinator's state is on every broker
    got = _read_committed(cluster, topic, 7, "spread-reader")
    assert sorted(got) == sorted([f"kept-{p}".encode() for p in range(6)] + [b"last"])


def test_the_coordinator_killed_in_an_open_transaction_moves_and_the_commit_lands(
        cluster: Cluster) -> None:
    topic = "txn-failover"
    _replicated_topic(cluster, topic, 3)
    victim = 2
    tid = _tid_led_by(cluster, victim, "failover")
    group = "failover-group"
    with Producer(_urls(cluster), transactional_id=tid, linger_ms=1,
                  delivery_timeout_ms=60_000) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for p in range(3):
            producer.send(topic, f"v{p}".encode(), partition=p).result(timeout=30)
        producer.send_offsets_to_transaction({TopicPartition(topic, 0): 5}, group)
        cluster.brokers.kill(victim)
        try:
            slot = group_slot(tid, SLOTS)
            wait_for(lambda: cluster.state(TXN_STATE_TOPIC, slot).leader not in (-1, victim),
                     "the coordinator slot led by another broker")
            producer.commit_transaction(timeout_s=60)
        finally:
            cluster.brokers.start(victim)
    got = _read_committed(cluster, topic, 3, "failover-reader")
    assert sorted(got) == [b"v0", b"v1", b"v2"]
    via = next(i for i in cluster.brokers.ids if i != victim)
    offsets = cluster.get(via, f"/consumer-groups/{group}/offsets").json()["offsets"]
    assert [(o["partition_id"], o["offset"]) for o in offsets] == [(0, 5)]


def test_the_coordinator_killed_after_prepare_commit_is_finished_by_the_next(
        cluster: Cluster) -> None:
    """SIGKILLed right after PrepareCommit is durable on the in-sync replicas: the next
    leader of the slot loads it, writes every marker once, and answers the client's retry
    of the commit as a success."""
    topic = "txn-prepared"
    _replicated_topic(cluster, topic, 3)
    victim = 3
    server = cluster.brokers.servers[victim]
    cluster.brokers.stop(victim)
    server.command = [sys.executable, "-m", "tests.cluster.broker_proc", "txn-prepared"]
    server.env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    cluster.brokers.start(victim)
    try:
        tid = _tid_led_by(cluster, victim, "prepared")
        slot = group_slot(tid, SLOTS)
        wait_for(lambda: cluster.get(victim, f"/transactions/{tid}").status_code in (404, 200),
                 "the victim serving the slot")
        with Producer(_urls(cluster), transactional_id=tid, linger_ms=1) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            for p in range(3):
                producer.send(topic, f"p{p}".encode(), partition=p)
            producer.commit_transaction(timeout_s=90)  # dies after prepare; retried
        assert server.proc is not None and server.proc.wait(30) == -9
        wait_for(lambda: cluster.state(TXN_STATE_TOPIC, slot).leader != victim,
                 "the slot led elsewhere")
    finally:
        server.command = [str(LAKELOG)]
        if not cluster.brokers.alive(victim):
            cluster.brokers.start(victim)
    got = _read_committed(cluster, topic, 3, "prepared-reader")
    assert sorted(got) == [b"p0", b"p1", b"p2"]
    for p in range(3):  # one marker each: one record, then the marker, is the whole log
        leader = cluster.state(topic, p).leader
        r = cluster.get(leader, f"/topics/{topic}/partitions/{p}/records",
                        params={"offset": 0, "isolation_level": "read_uncommitted"})
        assert r.status_code == 200 and r.json()["high_watermark"] == 2, r.text


def test_a_transactional_write_sent_to_a_broker_that_does_not_lead_is_forwarded(
        cluster: Cluster) -> None:
    """The nemesis found a transactional write to a broker that does not lead its
    partition answered 421 (the KIP-890 check raised NOT_LEADER there instead of leaving
    the partition to its leader): a producer that only knew that broker retried for its
    whole delivery timeout."""
    import base64

    topic = "txn-forward"
    leaders = cluster.create_topic(topic, 3)
    wait_for(lambda: len(set(cluster.leaders(topic, 3).values())) == 3 or None,
             "the partitions led by three brokers")
    r = cluster.post(1, "/transactions/forwarded:init", json={})
    assert r.status_code == 200, r.text
    ids = {"producer_id": r.json()["producer_id"], "producer_epoch": r.json()["producer_epoch"]}
    r = cluster.post(1, "/transactions/forwarded/partitions", json={
        **ids, "partitions": [{"topic_name": topic, "partition_id": p} for p in range(3)]})
    assert r.status_code == 204, r.text
    assert len(set(leaders.values())) == 3  # one request: a partition led here, two not
    r = cluster.post(1, f"/topics/{topic}/records:batch",
                     params={"transactional_id": "forwarded"}, json={"entries": [
                         {"id": str(p), "partition_id": p, **ids, "sequence": 0,
                          "value": {"type": "BINARY",
                                    "data": base64.b64encode(f"w{p}".encode()).decode()}}
                         for p in range(3)]})
    assert r.status_code == 207 and not r.json()["failures"], r.text
    r = cluster.post(2, "/transactions/forwarded:commit", json=ids)
    assert r.status_code == 200, r.text
    got = _read_committed(cluster, topic, 3, "forwarded-reader")
    assert sorted(got) == [b"w0", b"w1", b"w2"]



def test_offsets_a_transaction_holds_are_unstable_at_a_group_coordinator_elsewhere(
        cluster: Cluster) -> None:
    """KIP-447 across brokers: the transaction's coordinator (broker 1) has the group's
    coordinator (broker 2) hold the offsets it adds, so that a ``require_stable`` fetch
    there (or forwarded there) is told ``unstable_offset_commit`` until the commit writes
    them, or the abort releases them. Before, only a group coordinated where the
    transaction was knew."""
    topic = "txn-held"
    _replicated_topic(cluster, topic, 1)
    tid = _tid_led_by(cluster, 1, "held")
    with Consumer(_urls(cluster), "held-warm-up", [topic]) as consumer:
        consumer.poll(timeout_s=0.5)  # the group coordinator slots exist from here
    slots = 50  # offsets_topic_num_partitions' default

    def group_led_by_2() -> str | None:
        for i in range(1000):
            try:
                state = cluster.state(OFFSETS_TOPIC, group_slot(f"held-{i}", slots))
            except NoNodeError:  # the slots not made yet
                return None
            if state.leader == 2:
                return f"held-{i}"
        return None

    group, _ = wait_for(group_led_by_2, "a group coordinated by broker 2")

    def fetch(via: int) -> tuple[int, str | list[tuple[int, int]]]:
        r = cluster.get(via, f"/consumer-groups/{group}/offsets",
                        params={"require_stable": "true"})
        if r.status_code != 200:
            return r.status_code, r.json()["error"]
        return 200, [(o["partition_id"], o["offset"]) for o in r.json()["offsets"]]

    with Producer(_urls(cluster), transactional_id=tid, linger_ms=1) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"x", partition=0)
        producer.send_offsets_to_transaction({TopicPartition(topic, 0): 7}, group)
        assert fetch(2) == (409, "unstable_offset_commit")
        assert fetch(3) == (409, "unstable_offset_commit")  # forwarded to broker 2
        producer.commit_transaction()
        assert fetch(2) == (200, [(0, 7)])
        producer.begin_transaction()
        producer.send(topic, b"y", partition=0)
        producer.send_offsets_to_transaction({TopicPartition(topic, 0): 9}, group)
        assert fetch(2) == (409, "unstable_offset_commit")
        producer.abort_transaction()
        assert fetch(2) == (200, [(0, 7)])
