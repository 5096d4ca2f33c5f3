"""Spark on any broker of a cluster sees every partition up to its leader's high watermark:
``read_topic``, the SQL views and the ``lakelog`` streaming source on a session attached
to each broker's data directory show every acknowledged record, the tails of partitions
that broker holds no replica of (or follows) fetched from their leaders
(``log_tables.spark.tails``). Three real brokers, authentication on (the readers use the
data directory's broker key), replication factors 1 and 2, before and after tiering.

Each test prints what it measured (``measured: ...``; run with ``-s`` to see them)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pyspark.sql import SparkSession

from cluster.model import TopicAssignment, decode, topic_path
from compaction_jobs.job import led_here
from compaction_jobs.tier import TierJob
from lakelog.client import Producer
from lakelog.views import register_views
from lakelog.zookeeper import ZooKeeperServer
from log_tables.cold.topic_reader import hot_end_offset
from log_tables.layout import Layout
from log_tables.leadership import read_cluster_id, write_cluster_id
from log_tables.spark.leaders import leader_bounds
from log_tables.spark.read import partition_rows, read_topic
from log_tables.spark.session import attach
from log_tables.spark.source import _StreamReader
from log_tables.spark.tails import tail_source
from tests.cluster.harness import Cluster, three_brokers, wait_for

pytestmark = pytest.mark.slow
PARTITIONS = 6
Acked = dict[tuple[int, int], bytes]
"""(partition, offset) -> value of every acknowledged record."""


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Cluster]:
    with three_brokers(tmp_path_factory.mktemp("tails"), zookeeper.connect,
                       {"LAKELOG_AUTH": "api-key"}) as c:
        yield c


def measured(what: str, value: float, unit: str = "s") -> None:
    print(f"\nmeasured: {what}: {value:.3f} {unit}")


def _create(cluster: Cluster, name: str, rf: int) -> list[list[int]]:
    """A topic of PARTITIONS partitions and ``rf`` replicas each, known and led everywhere;
    its replicas per partition."""
    r = cluster.post(1, "/topics", json={
        "topic_name": name, "partitions_count": PARTITIONS, "replication_factor": rf,
        "configs": [{"name": "segment.bytes", "value": "2048"}]})
    assert r.status_code == 201, r.text
    for i in cluster.brokers.ids:
        wait_for(lambda i=i: cluster.get(i, f"/topics/{name}").status_code == 200,  # type: ignore[misc]
                 f"broker {i} knowing {name}")
    wait_for(lambda: all(ld >= 0 for ld in cluster.leaders(name, PARTITIONS).values()),
             f"every partition of {name} led")
    return decode(cluster.zk.get(topic_path(name))[0], TopicAssignment).replicas


def _produce(cluster: Cluster, topic: str, per_partition: int, tag: str) -> Acked:
    """``per_partition`` records to each partition through broker 1, acks=all."""
    assert cluster.admin is not None
    with Producer(cluster.brokers.url(1), api_key=":".join(cluster.admin), acks="all",
                  linger_ms=2) as producer:
        futures = [(producer.send(topic, f"{tag}-{p}-{n}".encode(), partition=p),
                    f"{tag}-{p}-{n}".encode())
                   for p in range(PARTITIONS) for n in range(per_partition)]
        producer.flush(60)
    out: Acked = {}
    for future, value in futures:
        md = future.result(0)
        out[md.partition, md.offset] = value
    return out


def _session(spark: SparkSession, cluster: Cluster, i: int) -> SparkSession:
    return attach(spark, cluster.brokers.servers[i].data_dir, str(cluster.brokers.warehouse))


def _read(spark: SparkSession, topic: str) -> Acked:
    rows = read_topic(spark, topic).select("partition", "offset", "value").collect()
    out = {(r.partition, r.offset): bytes(r.value) for r in rows}
    assert len(out) == len(rows), "an offset read twice"
    return out


def _stream(spark: SparkSession, topic: str, where: Path) -> Acked:
    """An availableNow query of the ``lakelog`` source from the earliest offsets."""
    query = (spark.readStream.format("lakelog").option("subscribe", topic)
             .option("startingOffsets", "earliest").load()
             .select("partition", "offset", "value").writeStream.format("parquet")
             .option("path", str(where / "sink"))
             .option("checkpointLocation", str(where / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    rows = spark.read.parquet(str(where / "sink")).collect()
    out = {(r.partition, r.offset): bytes(r.value) for r in rows}
    assert len(out) == len(rows), "an offset streamed twice"
    return out


def _high_watermarks(cluster: Cluster, topic: str) -> dict[int, int]:
    body = cluster.get(1, f"/topics/{topic}/partitions").json()
    return {b["partition_id"]: b["high_watermark"] for b in body["data"]}


@pytest.mark.parametrize("rf", [1, 2])
def test_every_broker_s_spark_sees_every_acknowledged_record(
        cluster: Cluster, spark_session: SparkSession, tmp_path: Path, rf: int) -> None:
    topic = f"tails-rf{rf}"
    replicas = _create(cluster, topic, rf)
    acked = _produce(cluster, topic, 120, "a")
    for i in cluster.brokers.ids:
        missing = sorted(p for p in range(PARTITIONS) if i not in replicas[p])
        assert missing, "every broker lacks some partition (the case this test is about)"
        spark = _session(spark_session, cluster, i)
        started = time.monotonic()
        got = _read(spark, topic)
        measured(f"rf {rf}: read_topic on broker {i} (no replica of {missing})",
                 time.monotonic() - started)
        assert got == acked, f"broker {i}: {len(got)} of {len(acked)} records"

    # A follower's own tail never shows a record its leader has not committed.
    hws = _high_watermarks(cluster, topic)
    for p, held_by in enumerate(replicas):
        for i in held_by:
            layout = Layout.of(cluster.brokers.servers[i].data_dir, cluster.brokers.warehouse)
            assert hot_end_offset(layout, topic, p) <= hws[p]

    # Tier what each leader holds sealed (as its job process would), produce more: the
    # Delta tier, the local replicas and the leaders' tails meet without a gap.
    for i in cluster.brokers.ids:
        layout = Layout.of(cluster.brokers.servers[i].data_dir, cluster.brokers.warehouse)
        TierJob(layout, [topic], led=led_here(layout)).run(spark_session, record=False)
    acked |= _produce(cluster, topic, 40, "b")
    tiered = {b["partition_id"]: b["tiered_offset"]
              for b in cluster.get(1, f"/topics/{topic}/partitions").json()["data"]}
    assert all(t > 0 for t in tiered.values()), tiered
    for i in cluster.brokers.ids:
        spark = _session(spark_session, cluster, i)
        assert _read(spark, topic) == acked, f"broker {i}"
        assert _stream(spark, topic, tmp_path / f"stream-{i}") == acked, f"broker {i} streamed"
        register_views(spark, [topic], zookeeper=cluster.brokers.zookeeper)
        assert spark.sql(f"SELECT count(*) FROM `{topic}`").collect()[0][0] == len(acked)
        hws = _high_watermarks(cluster, topic)
        rows = spark.sql(f"SELECT partition, high_watermark FROM partitions "
                         f"WHERE topic = '{topic}'").collect()
        assert {r.partition: r.high_watermark for r in rows} == hws, f"broker {i}"


def test_a_record_is_in_every_broker_s_read_as_soon_as_it_is_acknowledged(
        cluster: Cluster, spark_session: SparkSession) -> None:
    """The staleness of a read on a broker without a replica: none beyond the read itself
    (the plan asks the leader's high watermark), where it was up to delta.target.lag.ms."""
    topic = "tails-fresh"
    replicas = _create(cluster, topic, 1)
    _produce(cluster, topic, 1, "warm")
    assert cluster.admin is not None
    key = ":".join(cluster.admin)
    lags: list[float] = []
    for i in cluster.brokers.ids:
        spark = _session(spark_session, cluster, i)
        p = next(p for p in range(PARTITIONS) if i not in replicas[p])
        for n in range(3):
            value = f"fresh-{i}-{n}"
            r = httpx.post(f"{cluster.brokers.url(i)}/v3/clusters/lakelog/topics/{topic}/records",
                           json={"partition_id": p, "value": {"type": "STRING", "data": value}},
                           auth=tuple(key.split(":", 1)), timeout=30)  # type: ignore[arg-type]
            assert r.status_code == 200, r.text
            acked_at = time.monotonic()
            df = read_topic(spark, topic, starting_offsets={q: -1 for q in range(PARTITIONS)
                                                            if q != p})
            values = {bytes(r.value).decode() for r in df.select("value").collect()}
            lags.append(time.monotonic() - acked_at)
            assert value in values, f"broker {i}, partition {p} (led by {replicas[p]})"
    measured("from an acknowledgement to a read_topic on a broker without a replica that "
             "holds it (the read's own time; max)", max(lags))


def test_a_key_that_may_not_describe_a_topic_leaves_only_that_topic_local(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """LAKELOG_API_KEY outranks the broker's key: with alice's, who may describe and consume
    one topic of two, the ``partitions`` rows on broker 1's data directory (what
    register_views shows) hold hers at her partitions' leaders' high watermarks and the
    other as broker 1 holds it, with a warning. Before, the 403 failed them all."""
    replicas = {t: _create(cluster, t, 1) for t in ("tails-hers", "tails-not-hers")}
    for topic in replicas:
        _produce(cluster, topic, 5, topic)
    with cluster.http(1) as admin:
        alice = admin.post("/api-keys", json={"principal": "alice"}).json()
        for operation in ("describe", "consume"):
            r = admin.post("/acls", json={"principal": "alice", "operation": operation,
                                          "resource_type": "topic", "resource_name": "tails-hers"})
            assert r.status_code == 201, r.text
    auth = (alice["key_id"], alice["secret"])
    wait_for(lambda: cluster.get(1, "/topics/tails-hers/partitions", auth=auth).status_code
             == 200, "broker 1 knowing alice's key and ACLs")
    monkeypatch.setenv("LAKELOG_API_KEY", ":".join(auth))
    layout = Layout.of(cluster.brokers.servers[1].data_dir, cluster.brokers.warehouse)
    with caplog.at_level(logging.WARNING):
        rows = partition_rows(layout)
    ends = {(r[0], r[1]): r[3] for r in rows}
    assert [ends["tails-hers", p] for p in range(PARTITIONS)] == [5] * PARTITIONS
    assert [ends["tails-not-hers", p] for p in range(PARTITIONS)] == [
        5 if 1 in held_by else 0 for held_by in replicas["tails-not-hers"]]
    assert "answered 403" in caplog.text and "for topic tails-not-hers" in caplog.text


def test_a_broker_of_another_cluster_at_the_address_leaves_the_read_local(
        cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A data directory whose cluster.json names broker 1's address under another cluster's
    id (as when another cluster's broker took over the address): its reads stay local;
    under this cluster's id, they ask broker 1."""
    _create(cluster, "tails-whose", 1)
    url = cluster.brokers.url(1)
    mine = read_cluster_id(cluster.brokers.servers[1].data_dir)
    assert mine is not None
    (tmp_path / "security").mkdir()  # a key broker 1 takes: only the cluster id differs
    (tmp_path / "security" / "broker.key").write_text(
        (cluster.brokers.servers[1].data_dir / "security" / "broker.key").read_text())
    write_cluster_id(tmp_path, "another-cluster", 1, url)
    source = tail_source(Layout.of(tmp_path))
    assert source is not None
    with caplog.at_level(logging.WARNING):
        assert leader_bounds(source, ["tails-whose"]) is None
    assert f"{url} answers for cluster {mine} (/healthz: 200), not for this data " \
        "directory's cluster another-cluster" in caplog.text
    write_cluster_id(tmp_path, mine, 1, url)
    source = tail_source(Layout.of(tmp_path))
    assert source is not None
    found = leader_bounds(source, ["tails-whose"])
    assert found is not None and len(found["tails-whose"]) == PARTITIONS


def test_a_stream_follows_its_broker_to_a_new_address(cluster: Cluster) -> None:
    """A stream's planner reads cluster.json again at every plan. Broker 1 restarted on
    another address is stood in for by rewriting its cluster.json as that start would (a
    test's broker restarts on its own port): one plan while the file names an address
    where nothing answers (only what broker 1 holds), the next at the file's new address
    (every partition to its leader's high watermark). Before, the stream kept the first."""
    replicas = _create(cluster, "tails-moved", 1)
    _produce(cluster, "tails-moved", 5, "m")
    data_dir = cluster.brokers.servers[1].data_dir
    written = (data_dir / "cluster.json").read_bytes()
    mine = read_cluster_id(data_dir)
    assert mine is not None
    try:
        write_cluster_id(data_dir, mine, 1, "http://127.0.0.1:1")
        reader = _StreamReader({"subscribe": "tails-moved"},
                               (str(data_dir), str(cluster.brokers.warehouse)))
        held = {str(p): 5 if 1 in held_by else 0 for p, held_by in enumerate(replicas)}
        assert reader._bounds()[1] == {"tails-moved": held}
        (data_dir / "cluster.json").write_bytes(written)
        assert reader._bounds()[1] == {"tails-moved": {str(p): 5 for p in range(PARTITIONS)}}
    finally:
        (data_dir / "cluster.json").write_bytes(written)
