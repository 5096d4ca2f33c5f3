"""Failover while the leaders tier: three brokers, each with its job process (Spark)
tiering every 500 ms, an idempotent acks=all producer on a topic of replication factor
3 (min.insync.replicas=2), and partition leaders SIGKILLed while their job processes
tier, once while the ISR is still growing back. At the end every acknowledged record is
in the log once, the replicas are byte-identical, and the Delta table equals the log:
tiering stayed exactly once across the failovers (only leaders tier, only below the high
watermark, with app transactions). (One cluster, one run: each job process starts a
Spark JVM.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from deltalake import DeltaTable
from kazoo.client import KazooClient

from lakelog.zookeeper import ZooKeeperServer
from log_tables.cold.table import open_table, snapshot
from tests.cluster.brokers import Brokers
from tests.cluster.harness import Cluster, wait_for
from tests.cluster.test_jobs import _tier_commits
from tests.cluster.test_replication import (
    Jepsen,
    _assert_replicas_identical,
    _check_no_loss,
    _leader,
)

pytestmark = pytest.mark.slow
TOPIC = "tiered"
PARTITIONS = 3
ENV = {"LAKELOG_TIER_INTERVAL_MS": "500", "LAKELOG_ROLL_CHECK_INTERVAL_MS": "100",
       "LAKELOG_SPARK_MASTER": "local[1]", "LAKELOG_REPLICA_LAG_TIME_MAX_MS": "3000",
       "LAKELOG_LEADER_IMBALANCE_CHECK_INTERVAL_SECONDS": "2"}


def _tiered(table: Path) -> set[int]:
    if not (table / "_delta_log").exists():
        return set()
    return set().union(*(parts for *_, parts in _tier_commits(table)))


def test_leaders_killed_while_tiering_lose_nothing_and_tier_each_record_once(
        tmp_path: Path, zookeeper: ZooKeeperServer, chroot: str) -> None:
    brokers = Brokers(tmp_path, zookeeper.connect + chroot, 3, env=ENV)
    table = brokers.warehouse / "topics" / TOPIC
    zk = KazooClient(hosts=zookeeper.connect + chroot, timeout=10)
    zk.start(timeout=30)
    try:
        with brokers:
            cluster = Cluster(brokers, zk)
            wait_for(lambda: cluster.registered() == [1, 2, 3], "three brokers registered")
            r = cluster.post(1, "/topics", json={
                "topic_name": TOPIC, "partitions_count": PARTITIONS, "replication_factor": 3,
                "configs": [{"name": "min.insync.replicas", "value": "2"},
                            {"name": "segment.bytes", "value": "16384"},
                            {"name": "segment.ms", "value": "500"}]})
            assert r.status_code == 201, r.text
            wait_for(lambda: all(len(cluster.state(TOPIC, p).isr) == 3
                                 for p in range(PARTITIONS)), "every replica in sync")
            rounds = []
            with Jepsen(brokers.url(1), TOPIC, PARTITIONS) as jepsen:
                # Each job process starts its Spark JVM first: tens of seconds.
                wait_for(lambda: _tiered(table) == set(range(PARTITIONS)),
                         "every partition tiered once", timeout_s=300)
                for round_, wait_isr in enumerate((True, False, True)):
                    victim = next(b for p in range(PARTITIONS)
                                  if (b := _leader(cluster, TOPIC, p)) != 1)
                    commits = len(_tier_commits(table))
                    before = jepsen.acked_count()
                    killed = time.monotonic()
                    brokers.kill(victim)  # its job process too: mid-tiering or between runs
                    wait_for(lambda b=before: jepsen.acked_count() > b + 20,  # type: ignore[misc]
                             f"round {round_}: acknowledgements again after killing {victim}")
                    rounds.append((victim, round(time.monotonic() - killed, 2)))
                    brokers.start(victim)
                    if wait_isr:
                        wait_for(lambda: all(len(cluster.state(TOPIC, p).isr) == 3
                                             for p in range(PARTITIONS)),
                                 f"round {round_}: broker {victim} back in every ISR")
                    # (round 1: the next kill comes while broker `victim` is rejoining)
                    wait_for(lambda c=commits: len(_tier_commits(table)) > c,  # type: ignore[misc]
                             f"round {round_}: tiering goes on", timeout_s=300)
                wait_for(lambda: all(len(cluster.state(TOPIC, p).isr) == 3
                                     for p in range(PARTITIONS)), "every replica in sync")
            figures = _check_no_loss(cluster, TOPIC, PARTITIONS, jepsen.acked)
            records = _assert_replicas_identical(cluster, TOPIC, PARTITIONS)
            ends = {p: max((o + 1 for q, o in jepsen.acked.values() if q == p), default=0)
                    for p in range(PARTITIONS)}

            def tiered_to_the_end() -> bool:
                dt = open_table(str(table))
                states = snapshot(dt, PARTITIONS) if dt is not None else []
                return bool(states) and all(states[p].tiered_offset >= ends[p]
                                            for p in range(PARTITIONS))

            wait_for(tiered_to_the_end, "every acknowledged record tiered", timeout_s=180)
            logs = {p: {r["offset"]: r["value"]["data"].encode()
                        for r in cluster.fetch(1, TOPIC, p)} for p in range(PARTITIONS)}
    finally:
        zk.stop()
        zk.close()
    print(f"\nmeasured: jepsen with tiering {figures}, failures {len(jepsen.failed)}, "
          f"records compared across replicas {records}, (victim, failover s) {rounds}")
    assert figures["lost"] == 0 and figures["duplicated"] == 0, figures
    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["partition", "offset", "value"])
    got = list(zip(rows.column("partition").to_pylist(), rows.column("offset").to_pylist(),
                   rows.column("value").to_pylist(), strict=True))
    assert len(got) == len({(p, o) for p, o, _ in got}), "a record was tiered twice"
    delta = {(p, o): v for p, o, v in got}
    log = {(p, o): v for p, held in logs.items() for o, v in held.items()
           if (p, o) in delta or o < ends[p]}
    assert delta == log, "the Delta table differs from the log"
