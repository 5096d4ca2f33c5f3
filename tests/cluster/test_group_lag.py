"""A group's lag in a cluster is the same through every broker and equal to what one
broker would show: the log end of a partition its coordinator holds no replica of is
that partition's leader's (``ingest_api.broker.leader_bounds``), in ``groups describe``,
Confluent's lag views, ``/metrics`` and the dashboard; a leader that does not answer
leaves its partitions' bounds null, never 0. Three real brokers, authentication on (the
coordinator asks the leaders with its own key), replication factor 1."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest

from lakelog.client import Producer
from lakelog.zookeeper import ZooKeeperServer
from tests.cluster.harness import Cluster, three_brokers, wait_for

pytestmark = pytest.mark.slow
PARTITIONS = 6
PRODUCED = 10
"""Records per partition."""
COMMITTED = {0: 0, 1: 2, 2: 4, 3: 6, 4: 8}
"""The group's committed offset per partition; partition 5 has none (its lag counts from
the log start)."""
EXPECTED = {p: PRODUCED - COMMITTED.get(p, 0) for p in range(PARTITIONS)}


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Cluster]:
    with three_brokers(tmp_path_factory.mktemp("group-lag"), zookeeper.connect,
                       {"LAKELOG_AUTH": "api-key"}) as c:
        yield c


def _topic_with_a_group(cluster: Cluster, topic: str, group: str) -> tuple[int, dict[int, int]]:
    """``topic`` (RF 1) with PRODUCED records in each partition and ``group``'s COMMITTED
    offsets in it; the group's coordinator and each partition's leader."""
    r = cluster.post(1, "/topics", json={"topic_name": topic, "partitions_count": PARTITIONS,
                                         "replication_factor": 1})
    assert r.status_code == 201, r.text
    for i in cluster.brokers.ids:
        wait_for(lambda i=i: cluster.get(i, f"/topics/{topic}").status_code == 200,  # type: ignore[misc]
                 f"broker {i} knowing {topic}")
    wait_for(lambda: all(ld >= 0 for ld in cluster.leaders(topic, PARTITIONS).values()),
             f"every partition of {topic} led")
    assert cluster.admin is not None
    with Producer(cluster.brokers.url(1), api_key=":".join(cluster.admin), acks="all") as prod:
        futures = [prod.send(topic, f"v{n}", partition=p)
                   for p in range(PARTITIONS) for n in range(PRODUCED)]
        prod.flush(60)
    assert sorted((f.result(0).partition, f.result(0).offset) for f in futures) == [
        (p, n) for p in range(PARTITIONS) for n in range(PRODUCED)]
    # The first group request makes the coordinator slots; until a slot's leader is
    # elected its group is answered 503 coordinator_not_available (retriable): retried.
    def committed() -> httpx.Response | None:
        r = cluster.post(1, f"/consumer-groups/{group}/offsets", json={"offsets": [
            {"topic_name": topic, "partition_id": p, "offset": o} for p, o in COMMITTED.items()]})
        return None if r.status_code == 503 else r

    r, _ = wait_for(committed, f"group {group}'s coordinator answering")
    assert r.status_code == 200, r.text
    coordinator = cluster.get(1, f"/consumer-groups/{group}/coordinator").json()["broker_id"]
    return coordinator, cluster.leaders(topic, PARTITIONS)


def _get(cluster: Cluster, i: int, path: str) -> httpx.Response:
    """``path`` from the server's root (``/metrics``, ``/ui/data``)."""
    return httpx.get(cluster.brokers.url(i) + path, auth=cluster.admin, timeout=30)


def _metrics_lag(cluster: Cluster, i: int, group: str) -> tuple[dict[int, float], float | None]:
    """Broker ``i``'s ``/metrics``: the group's lag per partition, and its total."""
    text = _get(cluster, i, "/metrics").text
    lag = {int(m.group(1)): float(m.group(2)) for m in re.finditer(
        r'^lakelog_consumer_group_lag\{group="' + group + r'",partition="(\d+)",topic="[^"]*"\}'
        r" (\S+)$", text, re.M)}
    total = re.search(r'^lakelog_consumer_group_total_lag\{group="' + group + r'"\} (\S+)$',
                      text, re.M)
    return lag, float(total.group(1)) if total else None


def _dashboard_lag(cluster: Cluster, i: int, group: str) -> dict[int, int | None] | None:
    """Broker ``i``'s dashboard: the group's lag per partition (None: not shown there)."""
    for g in _get(cluster, i, "/ui/data").json()["groups"]["groups"]:
        if g["group"] == group:
            return {p["partition"]: p["lag"] for p in g["partitions"]}
    return None


def test_every_broker_shows_the_lag_of_every_partition(cluster: Cluster) -> None:
    topic, group = "lagged", "g-lag"
    coordinator, leaders = _topic_with_a_group(cluster, topic, group)
    led_elsewhere = sorted(p for p, b in leaders.items() if b != coordinator)
    assert led_elsewhere and len(led_elsewhere) < PARTITIONS, leaders  # the case at hand

    for i in cluster.brokers.ids:
        r = cluster.get(i, f"/consumer-groups/{group}")
        assert r.status_code == 200, r.text
        described = {o["partition_id"]: (o["log_start_offset"], o["log_end_offset"], o["lag"])
                     for o in r.json()["offsets"]}
        assert described == {p: (0, PRODUCED, EXPECTED[p]) for p in range(PARTITIONS)}, (
            f"describe through broker {i} (coordinator {coordinator}, leaders {leaders})")

        r = cluster.get(i, f"/consumer-groups/{group}/lags")
        assert r.status_code == 200, r.text
        lags = {x["partition_id"]: (x["current_offset"], x["log_end_offset"], x["lag"])
                for x in r.json()["data"]}
        assert lags == {p: (COMMITTED.get(p, 0), PRODUCED, EXPECTED[p])
                        for p in range(PARTITIONS)}, f"lags through broker {i}"
        p = led_elsewhere[0]
        r = cluster.get(i, f"/consumer-groups/{group}/lags/{topic}/partitions/{p}")
        assert (r.status_code, r.json()["lag"]) == (200, EXPECTED[p]), r.text
        summary = cluster.get(i, f"/consumer-groups/{group}/lag-summary").json()
        assert (summary["total_lag"], summary["max_lag"], summary["max_lag_partition_id"]) == (
            sum(EXPECTED.values()), PRODUCED, 0), summary

    # /metrics and the dashboard: the coordinator shows the group, with the same lag (both
    # refresh the leaders' bounds at most once a second: waited for).
    want = ({p: float(n) for p, n in EXPECTED.items()}, float(sum(EXPECTED.values())))
    deadline = time.monotonic() + 10
    while (got := _metrics_lag(cluster, coordinator, group)) != want and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    assert got == want, f"broker {coordinator}'s /metrics"
    deadline = time.monotonic() + 10
    while (shown := _dashboard_lag(cluster, coordinator, group)) != EXPECTED and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    assert shown == EXPECTED, f"broker {coordinator}'s dashboard"
    for i in cluster.brokers.ids:  # a broker that shows the group at all shows the same
        lag, _ = _metrics_lag(cluster, i, group)
        assert lag in ({}, {p: float(n) for p, n in EXPECTED.items()}), (i, lag)


def test_a_leader_that_does_not_answer_leaves_its_partitions_without_bounds(
        cluster: Cluster) -> None:
    topic, group = "lagged-paused", "g-paused"
    coordinator, leaders = _topic_with_a_group(cluster, topic, group)
    silent = next(b for b in cluster.brokers.ids if b != coordinator)
    unknown = {p for p, b in leaders.items() if b == silent}
    assert unknown, leaders
    cluster.pause(silent)
    try:
        started = time.monotonic()
        r = cluster.get(coordinator, f"/consumer-groups/{group}")
        took = time.monotonic() - started
        assert r.status_code == 200, r.text
        described = {o["partition_id"]: (o["log_end_offset"], o["lag"])
                     for o in r.json()["offsets"]}
        assert described == {p: (None, None) if p in unknown else (PRODUCED, EXPECTED[p])
                             for p in range(PARTITIONS)}, (silent, leaders)
        assert took < 10, f"describe took {took:.1f} s with broker {silent} paused"
        # Confluent's views cannot leave a lag out: a retriable 503 naming the partitions.
        r = cluster.get(coordinator, f"/consumer-groups/{group}/lag-summary")
        assert r.status_code == 503 and r.json()["retriable"], r.text
        assert f"{topic}/{min(unknown)}" in r.json()["message"]
        known = next(p for p in range(PARTITIONS) if p not in unknown)
        r = cluster.get(coordinator, f"/consumer-groups/{group}/lags/{topic}/partitions/{known}")
        assert (r.status_code, r.json()["lag"]) == (200, EXPECTED[known]), r.text
        # /metrics leaves the unknown partitions' lag out rather than showing 0.
        lag, _ = _metrics_lag(cluster, coordinator, group)
        assert all(lag.get(p) is None for p in unknown), lag
    finally:
        cluster.resume(silent)
    wait_for(lambda: cluster.get(coordinator, f"/consumer-groups/{group}/lag-summary")
             .status_code == 200, f"the lag summary once broker {silent} answers again", 60)
