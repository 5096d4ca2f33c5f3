"""A typed topic on a real cluster: three brokers, each with its job process (Spark)
tiering every 500 ms; schemas registered with confluent-kafka's client through one
broker, Avro records produced through another, and the broker that tiers and types the
topic (the leader of partition 0) SIGKILLed in the middle. Each broker's typed job reads
schemas from its own replica of ``__schemas``. At the end the typed table holds every
acknowledged record exactly once, decoded. (One cluster, one run.)"""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable
from kazoo.client import KazooClient

from lakelog.zookeeper import ZooKeeperServer
from log_tables.cold.table import open_table
from log_tables.layout import delta_path
from log_tables.typed.columns import typed_app_id
from tests.cluster.brokers import Brokers
from tests.cluster.harness import Cluster, wait_for
from tests.cluster.test_replicated_jobs import ENV

pytestmark = pytest.mark.slow
TOPIC = "orders"
PARTITIONS = 3
ORDER = ('{"type": "record", "name": "Order", "fields": [{"name": "n", "type": "long"}, '
         '{"name": "item", "type": "string"}]}')


def test_the_tierer_killed_while_typing_types_each_record_once(
        tmp_path: Path, zookeeper: ZooKeeperServer, chroot: str) -> None:
    brokers = Brokers(tmp_path, zookeeper.connect + chroot, 3, env=ENV)
    typed = brokers.warehouse / "typed" / TOPIC
    zk = KazooClient(hosts=zookeeper.connect + chroot, timeout=10)
    zk.start(timeout=30)
    acked: dict[tuple[int, int], int] = {}
    try:
        with brokers:
            cluster = Cluster(brokers, zk)
            wait_for(lambda: cluster.registered() == [1, 2, 3], "three brokers registered")
            r = cluster.post(1, "/topics", json={
                "topic_name": TOPIC, "partitions_count": PARTITIONS, "replication_factor": 3,
                "configs": [{"name": "min.insync.replicas", "value": "2"},
                            {"name": "delta.table.mode", "value": "typed"},
                            {"name": "segment.bytes", "value": "16384"},
                            {"name": "segment.ms", "value": "500"}]})
            assert r.status_code == 201, r.text
            sr = SchemaRegistryClient({"url": brokers.url(2)})
            try:
                encode = AvroSerializer(sr, ORDER)
                ctx = SerializationContext(TOPIC, MessageField.VALUE)
                blobs = [encode({"n": n, "item": f"i{n}"}, ctx) for n in range(600)]
            finally:
                sr.close()

            def produce(first: int, count: int) -> None:
                entries = [{"id": str(n), "partition_id": n % PARTITIONS, "value": {
                    "type": "BINARY", "data": base64.b64encode(blobs[n] or b"").decode()}}
                    for n in range(first, first + count)]
                deadline = time.monotonic() + 120
                while entries:  # (a leader moving away refuses some: they are sent again)
                    r = cluster.post(1 if brokers.alive(1) else 2,
                                     f"/topics/{TOPIC}/records:batch", json={"entries": entries})
                    assert time.monotonic() < deadline, r.text
                    if r.status_code != 207:  # a leader just killed: retriable, sent again
                        assert r.json()["retriable"], r.text
                        time.sleep(0.5)
                        continue
                    for s in r.json()["successes"]:
                        acked[(s["partition_id"], s["offset"])] = int(s["id"])
                    failed = {f["id"] for f in r.json()["failures"]}
                    entries = [e for e in entries if e["id"] in failed]
                    if entries:
                        time.sleep(0.5)

            for first in range(0, 300, 50):
                produce(first, 50)
            tierer = cluster.state(TOPIC, 0).leader
            wait_for(lambda: (dt := open_table(str(typed))) is not None
                     and (dt.transaction_version(typed_app_id(0)) or 0) > 0,
                     "the typed table started", timeout_s=300)
            brokers.kill(tierer)  # its job process too, wherever it is in a run
            for first in range(300, 600, 50):
                produce(first, 50)
            brokers.start(tierer)
            ends = {p: 1 + max(o for q, o in acked if q == p) for p in range(PARTITIONS)}

            def typed_to_the_end() -> bool:
                dt = open_table(str(typed))
                return dt is not None and all(
                    (dt.transaction_version(typed_app_id(p)) or 0) >= ends[p]
                    for p in range(PARTITIONS))

            wait_for(typed_to_the_end, "every acknowledged record typed", timeout_s=300)
    finally:
        zk.stop()
        zk.close()
    dt = DeltaTable(str(typed))
    rows = ds.dataset([delta_path(u) for u in dt.file_uris()], partitioning="hive"
                      ).to_table(columns=["partition", "offset", "n", "item"]).to_pylist()
    seen = [(r["partition"], r["offset"]) for r in rows]
    assert len(seen) == len(set(seen)), "a record was typed twice"
    got = {(r["partition"], r["offset"]): (r["n"], r["item"]) for r in rows}
    want = {k: (n, f"i{n}") for k, n in acked.items()}
    assert {k: v for k, v in got.items() if k in want} == want, "an acknowledged record " \
        "is missing from the typed table or decoded wrong"
    assert not (brokers.warehouse / "dlq" / TOPIC).exists()
