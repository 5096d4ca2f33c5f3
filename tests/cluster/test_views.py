"""The SQL ``partitions`` view of a cluster: leader, replicas, isr, leader epoch and
whether it is under-replicated, as ZooKeeper holds them (written here as the controller
writes them; no broker needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from cluster.broker import CLUSTER_ID_PATH
from cluster.model import PartitionState, TopicAssignment, encode, state_path, topic_path
from lakelog.views import register_views
from lakelog.zookeeper import ZooKeeperServer
from log_tables.errors import LakelogError
from log_tables.hot.log_manager import LogManager
from log_tables.leadership import write_cluster_id

pytestmark = pytest.mark.slow
PLACEMENT = "SELECT partition, leader, replicas, isr, leader_epoch, under_replicated " \
            "FROM partitions ORDER BY partition"


def test_partitions_show_the_leaders_zookeeper_holds(
        spark: SparkSession, tmp_path: Path, zookeeper: ZooKeeperServer, chroot: str) -> None:
    connect = zookeeper.connect + chroot
    manager = LogManager(tmp_path / "data")
    try:
        meta = manager.create_topic("events", 3)
    finally:
        manager.close()
    write_cluster_id(tmp_path / "data", "cluster-a", 2)
    zk = KazooClient(hosts=connect)
    zk.start(timeout=30)
    try:
        zk.create(CLUSTER_ID_PATH, b"cluster-a", makepath=True)
        zk.create(topic_path("events"), encode(TopicAssignment(
            [[1, 2], [2, 3], [3, 1]], {}, meta.topic_id, 0)), makepath=True)
        states = [PartitionState(1, 0, [1, 2], 1), PartitionState(3, 4, [3], 2),
                  PartitionState(-1, 7, [3], 2)]
        for p, state in enumerate(states):
            zk.create(state_path("events", p), encode(state), makepath=True)
        register_views(spark, topics=[], zookeeper=connect)
        assert [tuple(r) for r in spark.sql(PLACEMENT).collect()] == [
            (0, 1, [1, 2], [1, 2], 0, False), (1, 3, [2, 3], [3], 4, True),
            (2, -1, [3, 1], [3], 7, True)]

        zk.set(CLUSTER_ID_PATH, b"cluster-b")  # another cluster's chroot
        with pytest.raises(LakelogError, match="wrong chroot"):
            register_views(spark, topics=[], zookeeper=connect)
    finally:
        zk.stop()
        zk.close()
