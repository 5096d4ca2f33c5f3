"""The ``consumer_lag`` and ``consumer_group_lag`` SQL views against a real server and
real Spark: every partition a group reads is listed, committed or not (issue 19)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pyspark.sql import SparkSession

from consumer_groups.subscriptions import read_subscriptions
from lakelog.views import register_views
from tests.ingest_api.helpers import string
from tests.server import ServerProcess

pytestmark = pytest.mark.slow


def _produce(client: httpx.Client, topic: str, partition: int, n: int) -> None:
    r = client.post(f"/topics/{topic}/records:batch", json={"entries": [
        {"id": str(i), "partition_id": partition, "value": string(f"v{i}")} for i in range(n)]})
    assert r.status_code == 207 and not r.json()["failures"], r.text


def _wait_subscriptions(data_dir: Path, expected: dict[str, list[str]]) -> None:
    deadline = time.monotonic() + 60
    while read_subscriptions(data_dir) != expected:
        assert time.monotonic() < deadline, read_subscriptions(data_dir)
        time.sleep(0.05)


def _lag(spark: SparkSession) -> list[tuple[Any, ...]]:
    register_views(spark, topics=[])  # the views are snapshots: refresh
    return [tuple(r) for r in spark.sql(
        "SELECT `group`, topic, partition, committed_offset, log_start_offset, high_watermark, "
        "lag FROM consumer_lag ORDER BY `group`, topic, partition").collect()]


def test_lag_views_list_every_partition_the_group_reads(spark: SparkSession,
                                                        tmp_path: Path) -> None:
    data_dir = tmp_path / "data"  # the directory the spark fixture is attached to
    server = ServerProcess(data_dir).start()
    try:
        with server.client() as client:
            for topic, partitions in (("clicks", 3), ("views", 2)):
                assert client.post("/topics", json={"topic_name": topic,
                                                    "partitions_count": partitions}).status_code == 201
            for p, n in enumerate((10, 20, 30)):
                _produce(client, "clicks", p, n)
            _produce(client, "views", 1, 4)
            assert client.post("/topics/clicks/records:delete", json={"partitions": [
                {"partition_id": 2, "offset": 5}]}).status_code == 200
            # "reader" committed one of three partitions and has no members; "live" has a
            # member subscribed to "views" and has committed nothing.
            assert client.post("/consumer-groups/reader/offsets", json={"offsets": [
                {"topic_name": "clicks", "partition_id": 0, "offset": 4}]}).status_code == 200
            r = client.post("/consumer-groups/live/members",
                            json={"topics": ["views"], "session_timeout_ms": 60_000})
            assert r.status_code == 200, r.text
            member = r.json()["member_id"]
            _wait_subscriptions(data_dir, {"live": ["views"]})
            assert _lag(spark) == [
                ("live", "views", 0, None, 0, 0, 0),
                ("live", "views", 1, None, 0, 4, 4),
                ("reader", "clicks", 0, 4, 0, 10, 6),
                ("reader", "clicks", 1, None, 0, 20, 20),
                ("reader", "clicks", 2, None, 5, 30, 25)]
            groups = [tuple(r) for r in spark.sql(
                "SELECT `group`, partitions, committed_partitions, total_lag, max_lag "
                "FROM consumer_group_lag ORDER BY `group`").collect()]
            assert groups == [("live", 2, 0, 4, 4), ("reader", 3, 1, 51, 25)]
            # Once its member leaves, a group that committed nothing reads nothing.
            assert client.delete(f"/consumer-groups/live/members/{member}").status_code == 204
            _wait_subscriptions(data_dir, {})
            assert [row[0] for row in _lag(spark)] == ["reader"] * 3
            r = client.post("/consumer-groups/live/members",
                            json={"topics": ["views"], "session_timeout_ms": 60_000})
            assert r.status_code == 200, r.text
            _wait_subscriptions(data_dir, {"live": ["views"]})
        # A killed server leaves its members' subscriptions behind; its next start, whose
        # groups have no members yet, clears them.
        server.kill()
        assert read_subscriptions(data_dir) == {"live": ["views"]}
        server.start()
        assert read_subscriptions(data_dir) == {}
        assert [row[0] for row in _lag(spark)] == ["reader"] * 3
    finally:
        server.stop()


def test_a_topic_made_again_under_its_name_inherits_no_committed_offsets(
        spark: SparkSession, tmp_path: Path) -> None:
    """Kafka deletes a topic's committed offsets with it (issue 35): a group that had
    read the old topic to its end reads the new one from the start, and its lag counts
    the new topic's records."""
    from lakelog.client import Consumer

    data_dir = tmp_path / "data"
    server = ServerProcess(data_dir).start()
    try:
        with server.client() as client:
            def remake() -> None:
                client.delete("/topics/orders")
                r = client.post("/topics", json={"topic_name": "orders", "partitions_count": 2})
                assert r.status_code == 201, r.text

            remake()
            for p in (0, 1):
                _produce(client, "orders", p, 75)
            with Consumer(server.url, "billing", ["orders"], auto_offset_reset="earliest",
                          session_timeout_ms=6_000) as consumer:
                seen = 0
                deadline = time.monotonic() + 60
                while seen < 150:
                    assert time.monotonic() < deadline, seen
                    seen += len(consumer.poll(timeout_s=1.0))
                consumer.commit()
            committed = client.get("/consumer-groups/billing/offsets").json()["offsets"]
            assert sorted(o["offset"] for o in committed) == [75, 75]
            remake()
            for p in (0, 1):
                _produce(client, "orders", p, 100)
            assert client.get("/consumer-groups/billing/offsets").json()["offsets"] == []
            _wait_subscriptions(data_dir, {})
            assert _lag(spark) == []  # no members and no offsets: the group reads nothing
            with Consumer(server.url, "billing", ["orders"], auto_offset_reset="earliest",
                          session_timeout_ms=6_000) as consumer:
                seen = 0
                deadline = time.monotonic() + 60
                while seen < 200:
                    assert time.monotonic() < deadline, f"read {seen} of the new topic's 200"
                    seen += len(consumer.poll(timeout_s=1.0))
                consumer.commit()
            assert [r[:4] + r[6:] for r in _lag(spark)] == [
                ("billing", "orders", 0, 100, 0), ("billing", "orders", 1, 100, 0)]
    finally:
        server.stop()
