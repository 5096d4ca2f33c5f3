"""Confluent REST v3's List Partition Offsets and consumer-group views (group, consumers,
assignments, lags, lag summary) answer as Confluent's document says (``confluent_v3.py``)
and agree with lakelog's own lag (``groups describe``), against a real server."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.ingest_api import confluent_v3 as v3
from tests.ingest_api.helpers import string
from tests.ingest_api.test_confluent import _links, check, error
from tests.server import ServerProcess

pytestmark = pytest.mark.slow


def _topic(client: httpx.Client, partitions: int = 2) -> str:
    name = f"cv-{uuid.uuid4().hex[:8]}"
    assert client.post("/topics", json={"topic_name": name,
                                        "partitions_count": partitions}).status_code == 201
    return name


def _produce(client: httpx.Client, topic: str, partition: int, count: int) -> None:
    for i in range(count):
        r = client.post(f"/topics/{topic}/records",
                        json={"partition_id": partition, "value": string(str(i))})
        assert r.status_code == 200, r.text


def _member(client: httpx.Client, group: str, topics: list[str],
            instance: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"topics": topics}
    if instance is not None:
        body["group_instance_id"] = instance
    r = client.post(f"/consumer-groups/{group}/members", json=body)
    assert r.status_code == 200, r.text
    joined: dict[str, Any] = r.json()
    return joined


def _commit(client: httpx.Client, group: str, member: dict[str, Any], topic: str,
            offsets: dict[int, int]) -> None:
    r = client.post(f"/consumer-groups/{group}/offsets", json={
        "member_id": member["member_id"], "member_epoch": member["member_epoch"],
        "offsets": [{"topic_name": topic, "partition_id": p, "offset": o}
                    for p, o in offsets.items()]})
    assert r.status_code == 200, r.text


def test_partition_offsets_are_the_log_start_and_the_high_watermark(
        client: httpx.Client) -> None:
    topic = _topic(client)
    _produce(client, topic, 1, 5)
    path = f"/topics/{topic}/partitions/1/offset"
    body = check(client.get(path), 200, v3.PARTITION_OFFSETS)
    assert (body["earliest_offset"], body["latest_offset"]) == (0, 5)
    assert body["metadata"]["self"].endswith(f"/topics/{topic}/partitions/1/offset")
    assert body["metadata"]["resource_name"].endswith("/offset_type=earliest_and_latest")
    # The same answer with the one offset type named; the log start moves with a delete.
    assert client.post(f"/topics/{topic}/records:delete", json={
        "partitions": [{"partition_id": 1, "offset": 3}]}).status_code == 200
    named = check(client.get(path, params={"offset_type": "earliest_and_latest"}), 200,
                  v3.PARTITION_OFFSETS)
    assert (named["earliest_offset"], named["latest_offset"]) == (3, 5)
    empty = check(client.get(f"/topics/{topic}/partitions/0/offset"), 200, v3.PARTITION_OFFSETS)
    assert (empty["earliest_offset"], empty["latest_offset"]) == (0, 0)
    # As Confluent's: another offset type is a 400, an unknown partition or topic a 404.
    assert "earliest_and_latest" in error(client.get(path, params={"offset_type": "latest"}),
                                          400, 400)
    error(client.get(f"/topics/{topic}/partitions/7/offset"), 404, 40402)
    error(client.get(f"/topics/nope-{topic}/partitions/0/offset"), 404, 40403)


def test_lags_are_what_groups_describe_shows(client: httpx.Client) -> None:
    topic = _topic(client)
    _produce(client, topic, 0, 10)
    _produce(client, topic, 1, 4)
    group = f"g-{uuid.uuid4().hex[:8]}"
    member = _member(client, group, [topic], instance="app-1")
    _commit(client, group, member, topic, {0: 7})  # partition 1: nothing committed
    lags = check(client.get(f"/consumer-groups/{group}/lags"), 200, v3.LAG_LIST)["data"]
    by_partition = {lag["partition_id"]: lag for lag in lags}
    assert sorted(by_partition) == [0, 1]
    p0, p1 = by_partition[0], by_partition[1]
    assert (p0["current_offset"], p0["log_end_offset"], p0["lag"], p0["committed_offset"]) == (
        7, 10, 3, 7)
    # Nothing committed: the lag counts from the log start, as describe and consumer_lag do.
    assert (p1["current_offset"], p1["log_end_offset"], p1["lag"], p1["committed_offset"]) == (
        0, 4, 4, None)
    owners = {lag["consumer_id"] for lag in lags}
    assert owners == {member["member_id"]}
    assert {lag["instance_id"] for lag in lags} == {"app-1"}
    described = {(r["partition_id"], r["lag"]) for r in
                 client.get(f"/consumer-groups/{group}").json()["offsets"]}
    assert described == {(0, 3), (1, 4)}
    one = check(client.get(f"/consumer-groups/{group}/lags/{topic}/partitions/0"), 200, v3.LAG)
    assert one == p0
    error(client.get(f"/consumer-groups/{group}/lags/{topic}/partitions/5"), 404, 40403)
    error(client.get(f"/consumer-groups/{group}/lags/other/partitions/0"), 404, 40403)
    summary = check(client.get(f"/consumer-groups/{group}/lag-summary"), 200, v3.LAG_SUMMARY)
    assert (summary["total_lag"], summary["max_lag"], summary["max_lag_topic_name"],
            summary["max_lag_partition_id"]) == (7, 4, topic, 1)
    assert summary["max_lag_consumer_id"] == member["member_id"]
    assert summary["max_lag_instance_id"] == "app-1"
    assert summary["max_lag_partition"]["related"].endswith(f"/topics/{topic}/partitions/1")


def test_an_empty_group_keeps_its_lag_and_unknown_groups_are_404(
        client: httpx.Client) -> None:
    topic = _topic(client, partitions=1)
    _produce(client, topic, 0, 6)
    group = f"g-{uuid.uuid4().hex[:8]}"
    member = _member(client, group, [topic])
    _commit(client, group, member, topic, {0: 2})
    assert client.delete(f"/consumer-groups/{group}/members/{member['member_id']}"
                         ).status_code == 204
    lag = check(client.get(f"/consumer-groups/{group}/lags/{topic}/partitions/0"), 200, v3.LAG)
    assert (lag["lag"], lag["consumer_id"], lag["instance_id"]) == (4, "", None)
    summary = check(client.get(f"/consumer-groups/{group}/lag-summary"), 200, v3.LAG_SUMMARY)
    assert (summary["total_lag"], summary["max_lag_consumer_id"]) == (4, "")
    unknown = f"none-{uuid.uuid4().hex[:6]}"
    for path in ("", "/lags", "/lag-summary", f"/lags/{topic}/partitions/0", "/consumers"):
        error(client.get(f"/consumer-groups/{unknown}{path}"), 404, 40405)


def test_groups_are_confluents_consumer_groups_and_their_links_resolve(
        server: ServerProcess, client: httpx.Client) -> None:
    topic = _topic(client)
    _produce(client, topic, 0, 3)
    group = f"g-{uuid.uuid4().hex[:8]}"
    member = _member(client, group, [topic])
    _commit(client, group, member, topic, {0: 1})
    m = member["member_id"]
    listed = check(client.get("/consumer-groups"), 200, v3.CONSUMER_GROUP_LIST)
    mine = next(g for g in listed["data"] if g["consumer_group_id"] == group)
    # lakelog's own fields stay beside Confluent's (Kafka's state names, the member count).
    assert (mine["state"], mine["members"]) == ("Stable", 1)
    described = check(client.get(f"/consumer-groups/{group}"), 200, v3.CONSUMER_GROUP)
    assert described["partition_assignor"] == mine["assignor"] == "cooperative-sticky"
    assert described["is_simple"] is False
    assert [x["member_id"] for x in described["members"]] == [m]
    consumers = check(client.get(f"/consumer-groups/{group}/consumers"), 200, v3.CONSUMER_LIST)
    assert [c["consumer_id"] for c in consumers["data"]] == [m]
    check(client.get(f"/consumer-groups/{group}/consumers/{m}"), 200, v3.CONSUMER)
    assignments = check(client.get(f"/consumer-groups/{group}/consumers/{m}/assignments"),
                        200, v3.ASSIGNMENT_LIST)["data"]
    assert sorted((a["topic_name"], a["partition_id"]) for a in assignments) == [
        (topic, 0), (topic, 1)]
    check(client.get(f"/consumer-groups/{group}/consumers/{m}/assignments/{topic}/partitions/1"),
          200, v3.ASSIGNMENT)
    error(client.get(f"/consumer-groups/{group}/consumers/nobody"), 404, 404)
    answers = [mine, described, consumers, *assignments,
               client.get(f"/consumer-groups/{group}/lags").json(),
               client.get(f"/consumer-groups/{group}/lag-summary").json()]
    with httpx.Client(base_url=server.url, timeout=30) as root:
        for url in sorted({u for body in answers for u in _links(body)}):
            assert root.get(url).status_code == 200, url
