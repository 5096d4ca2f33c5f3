"""Spark SQL views of a lakelog: every topic, its partitions, the jobs' runs and the
consumer groups' offsets and lag.

They compose ``log_tables`` (topics, ``partitions``, ``job_runs``) and
``consumer_groups`` (``consumer_offsets``, ``consumer_lag``, ``consumer_group_lag``),
so they are registered here, above both: ``lakelog sql`` and notebooks call
``register_views``. Their names are reserved for topics (``log_tables.config``).

``partitions`` also says where each partition lives (Kafka's Leader, Replicas, Isr and
the leader epoch) and whether it is under-replicated (fewer replicas in sync than
assigned). A cluster's are read from its ZooKeeper, where the controller writes
them: the newest state any broker knows, with or without brokers up. (Asking a broker's
HTTP API instead would need it up, its key, and would answer from its cache.) The cluster
of one is broker 1, the only replica of everything, at leader epoch 0.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING

from consumer_groups.views import register_group_views
from ingest_api.broker.metadata import BROKER_ID
from log_tables.cold.job_runs import SPARK_DDL as JOB_RUNS_DDL
from log_tables.cold.job_runs import job_runs_uri
from log_tables.config import LOG_VIEWS
from log_tables.errors import LakelogError
from log_tables.layout import Layout
from log_tables.leadership import read_cluster_id
from log_tables.spark.read import PARTITIONS_DDL, partition_rows, read_delta, read_topic
from log_tables.spark.session import session_layout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
PARTITIONS, JOB_RUNS = LOG_VIEWS
CONF_ZOOKEEPER = "spark.lakelog.zookeeper"
PLACEMENT_DDL = "leader INT, replicas ARRAY<INT>, isr ARRAY<INT>, leader_epoch INT, " \
                "under_replicated BOOLEAN"
"""Columns ``partitions`` adds after the storage ones (null: not known)."""
Place = tuple[int | None, list[int] | None, list[int] | None, int | None, bool | None]
Placing = Callable[[str, int], Place]


def register_views(spark: SparkSession, topics: list[str] | None = None, *,
                   zookeeper: str | None = None,
                   visible: Collection[str] | None = None) -> list[str]:
    """Make every topic (or the given ones) a temporary SQL view, plus ``partitions``,
    ``job_runs`` (what the jobs did: one row per run and partition), and the consumer
    group views ``consumer_offsets``, ``consumer_lag`` and ``consumer_group_lag``;
    returns the views' names.

    ``zookeeper`` ("HOST:PORT/chroot", else the session's ``spark.lakelog.zookeeper``,
    else ``LAKELOG_ZOOKEEPER``): the cluster whose leaders ``partitions`` shows.
    ``visible`` (the topics a principal may consume, for the SQL endpoint): no view of
    another topic, and no row about one in ``partitions``, ``job_runs`` or the group views.
    A view is a snapshot as of this call (like ``read_topic``); call again to refresh.
    """
    layout = session_layout(spark)
    names = [t.name for t in layout.topics() if (topics is None or t.name in topics)
             and (visible is None or t.name in visible)]
    for name in names:
        read_topic(spark, name).createOrReplaceTempView(f"`{name}`")
    connect = zookeeper or spark.conf.get(CONF_ZOOKEEPER, None) or \
        os.environ.get("LAKELOG_ZOOKEEPER") or None
    place = placing(layout, connect)
    rows = [(*row, *place(str(row[0]), row[1]))  # type: ignore[arg-type]
            for row in partition_rows(layout) if visible is None or row[0] in visible]
    spark.createDataFrame(rows, f"{PARTITIONS_DDL}, {PLACEMENT_DDL}").createOrReplaceTempView(
        PARTITIONS)
    runs = read_delta(spark, job_runs_uri(layout.warehouse), JOB_RUNS_DDL)
    if visible is not None:
        runs = runs.where(runs.topic.isin(sorted(visible)))
    runs.createOrReplaceTempView(JOB_RUNS)
    return [*names, *LOG_VIEWS, *register_group_views(spark, layout, visible)]


def placing(layout: Layout, zookeeper: str | None) -> Placing:
    """Each partition's (leader, replicas, isr, leader epoch, under-replicated): from the
    cluster's ZooKeeper, or the cluster of one's; unknown (nulls) for a cluster's data
    directory without one."""
    cluster_id = read_cluster_id(Path(layout.data_dir))
    if zookeeper is None:
        if cluster_id is None:
            return lambda topic, partition: (BROKER_ID, [BROKER_ID], [BROKER_ID], 0, False)
        log.warning("%s belongs to cluster %s: give its ZooKeeper (LAKELOG_ZOOKEEPER) to see "
                    "the partitions' leaders", layout.data_dir, cluster_id)
        return lambda topic, partition: (None, None, None, None, None)
    from cluster.snapshot import read_placements

    found_id, placements = read_placements(zookeeper)
    if cluster_id is not None and found_id != cluster_id:
        raise LakelogError(f"{layout.data_dir} belongs to cluster {cluster_id}, but ZooKeeper "
                           f"at {zookeeper} holds cluster {found_id}: a wrong chroot?")

    def place(topic: str, partition: int) -> Place:
        found = placements.get((topic, partition))
        if found is None:
            return None, None, None, None, None
        return (found.leader, list(found.replicas), list(found.isr), found.leader_epoch,
                found.under_replicated)

    return place
