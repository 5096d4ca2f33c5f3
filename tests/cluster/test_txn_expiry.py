"""``__transaction_state`` compacted on a real three-broker cluster: an idle transactional
id expires (``transactional_id_expiration_ms``), its slot is written again through the
replicated state log (the states kept, a tombstone for the id) and the log start moved;
the slot's leader SIGKILLed, the next one loads the slot from its own replica: the id is
still gone and the other id of the slot finishes its open transaction."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from consumer_groups.hashing import group_slot
from lakelog.client import Producer
from lakelog.zookeeper import ZooKeeperServer
from log_tables.registry import TXN_STATE_TOPIC
from tests.cluster.harness import Cluster, three_brokers, wait_for
from tests.cluster.test_transactions import (
    SLOTS,
    _read_committed,
    _replicated_topic,
    _tid_led_by,
    _urls,
)


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Cluster]:
    with three_brokers(tmp_path_factory.mktemp("txn-expiry"), zookeeper.connect, env={
            "LAKELOG_TRANSACTIONAL_ID_EXPIRATION_MS": "3000",
            "LAKELOG_TRANSACTION_ABORT_INTERVAL_MS": "200"}) as c:
        yield c


def test_an_expired_id_stays_gone_when_its_slot_moves_and_its_neighbour_commits(
        cluster: Cluster) -> None:
    topic = "txn-expiry"
    _replicated_topic(cluster, topic, 3)
    victim = 2
    idle = _tid_led_by(cluster, victim, "idle")
    slot = group_slot(idle, SLOTS)
    busy = next(f"busy-{i}" for i in range(10_000) if group_slot(f"busy-{i}", SLOTS) == slot)
    with Producer(_urls(cluster), transactional_id=idle, linger_ms=1) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"idle-0", partition=0)
        producer.commit_transaction()
    assert cluster.get(victim, f"/transactions/{idle}").status_code == 200
    with Producer(_urls(cluster), transactional_id=busy, linger_ms=1,
                  transaction_timeout_ms=120_000, delivery_timeout_ms=60_000) as producer:
        producer.init_transactions()
        producer.begin_transaction()  # open all along: never expires
        producer.send(topic, b"busy-0", partition=1).result(timeout=30)
        wait_for(lambda: cluster.get(victim, f"/transactions/{idle}").status_code == 404,
                 f"{idle} expired", 60)
        cluster.brokers.kill(victim)
        try:
            wait_for(lambda: cluster.state(TXN_STATE_TOPIC, slot).leader not in (-1, victim),
                     "the coordinator slot led by another broker")
            leader = cluster.state(TXN_STATE_TOPIC, slot).leader
            r, _ = wait_for(lambda: (lambda r: r if r.status_code in (200, 404) else None)(
                cluster.get(leader, f"/transactions/{busy}")), "the slot loaded")
            assert r.status_code == 200 and r.json()["state"] == "Ongoing", r.text
            assert cluster.get(leader, f"/transactions/{idle}").status_code == 404
            producer.send(topic, b"busy-1", partition=2)
            producer.commit_transaction(timeout_s=60)
        finally:
            cluster.brokers.start(victim)
    assert sorted(_read_committed(cluster, topic, 3, "expiry-reader")) == \
        [b"busy-0", b"busy-1", b"idle-0"]
