"""Consumer groups over HTTP on a real server: join, poll, commit, fencing, reset
policies, admin reset and delete, restart with the offsets reloaded from Delta."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.ingest_api.helpers import string
from tests.server import ServerProcess


def _produce(client: httpx.Client, topic: str, partition: int, values: list[str]) -> None:
    r = client.post(f"/topics/{topic}/records:batch", json={"entries": [
        {"id": str(i), "partition_id": partition, "value": string(v)}
        for i, v in enumerate(values)]})
    assert r.status_code == 207 and not r.json()["failures"], r.text


def _join(client: httpx.Client, group: str, topics: list[str], **extra: Any) -> dict[str, Any]:
    r = client.post(f"/consumer-groups/{group}/members",
                    json={"topics": topics, "session_timeout_ms": 10_000, **extra})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _poll(client: httpx.Client, group: str, member: str, **params: Any) -> list[dict[str, Any]]:
    r = client.get(f"/consumer-groups/{group}/members/{member}/records",
                   params={"format": "STRING", "timeout_ms": 200, **params})
    assert r.status_code == 200, r.text
    records: list[dict[str, Any]] = r.json()["records"]
    return records


def _values(records: list[dict[str, Any]]) -> list[str]:
    return [r["value"]["data"] for r in records]


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:10]}"


def test_poll_commit_and_resume_after_a_crash(spawn_server: Callable[..., ServerProcess]) -> None:
    server = spawn_server()
    with server.client() as client:
        assert client.post("/topics", json={"topic_name": "t", "partitions_count": 2}).status_code == 201
        _produce(client, "t", 0, [f"a{i}" for i in range(5)])
        _produce(client, "t", 1, [f"b{i}" for i in range(5)])
        m = _join(client, "g", ["t"], auto_offset_reset="earliest")
        assert {(a["topic_name"], a["partition_id"]) for a in m["assignment"]} == {("t", 0), ("t", 1)}
        got = _poll(client, "g", m["member_id"], max_records=100)
        assert sorted(_values(got)) == sorted([f"a{i}" for i in range(5)] + [f"b{i}" for i in range(5)])
        assert _poll(client, "g", m["member_id"]) == []  # positions moved past them
        r = client.post("/consumer-groups/g/offsets", json={
            "member_id": m["member_id"], "member_epoch": m["member_epoch"],
            "offsets": [{"topic_name": "t", "partition_id": 0, "offset": 3, "metadata": "x"},
                        {"topic_name": "t", "partition_id": 1, "offset": 5}]})
        assert r.status_code == 200, r.text
    server.kill()  # SIGKILL: what was acknowledged must be in Delta
    server.start()
    with server.client() as client:
        offsets = client.get("/consumer-groups/g/offsets").json()["offsets"]
        assert [(o["partition_id"], o["offset"], o["metadata"]) for o in offsets] == [
            (0, 3, "x"), (1, 5, None)]
        # The old member is gone with the process: fenced; a new one resumes at the commits.
        r = client.post(f"/consumer-groups/g/members/{m['member_id']}/heartbeat",
                        json={"member_epoch": m["member_epoch"]})
        assert r.status_code == 404 and r.json()["error"] == "unknown_member_id"
        m2 = _join(client, "g", ["t"])
        assert _values(_poll(client, "g", m2["member_id"])) == ["a3", "a4"]
        described = client.get("/consumer-groups/g").json()
        lag = {o["partition_id"]: o["lag"] for o in described["offsets"]}
        assert lag == {0: 2, 1: 0} and described["state"] == "Stable"


def test_fenced_calls_answer_409_and_404_with_the_error_body(
        client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic, group = make_topic(4), _group()
    a = _join(client, group, [topic])
    b = _join(client, group, [topic])
    r = client.post(f"/consumer-groups/{group}/members/{a['member_id']}/heartbeat",
                    json={"member_epoch": a["member_epoch"]})
    assert r.status_code == 200 and len(r.json()["revoking"]) == 2
    r = client.post(f"/consumer-groups/{group}/members/{a['member_id']}/heartbeat",
                    json={"member_epoch": a["member_epoch"]})  # acknowledges: epoch moves on
    assert r.json()["member_epoch"] == a["member_epoch"] + 1
    for member, epoch, status, error in ((a["member_id"], a["member_epoch"], 409,
                                          "stale_member_epoch"),
                                         ("nobody", 1, 404, "unknown_member_id")):
        hb = client.post(f"/consumer-groups/{group}/members/{member}/heartbeat",
                         json={"member_epoch": epoch})
        commit = client.post(f"/consumer-groups/{group}/offsets", json={
            "member_id": member, "member_epoch": epoch,
            "offsets": [{"topic_name": topic, "partition_id": 0, "offset": 1}]})
        for resp in (hb, commit):
            assert resp.status_code == status, resp.text
            assert resp.json()["error"] == error and member in resp.json()["message"]
    assert client.get(f"/consumer-groups/{group}/offsets").json()["offsets"] == []
    assert client.delete(f"/consumer-groups/{group}/members/{b['member_id']}").status_code == 204


def test_reset_policies_earliest_latest_none(client: httpx.Client,
                                             make_topic: Callable[..., str]) -> None:
    topic = make_topic(1)
    _produce(client, topic, 0, ["old-1", "old-2"])
    latest_group = _group()
    latest = _join(client, latest_group, [topic])  # Kafka's default: latest
    earliest_group = _group()
    earliest = _join(client, earliest_group, [topic], auto_offset_reset="earliest")
    none_group = _group()
    none = _join(client, none_group, [topic], auto_offset_reset="none")
    assert _values(_poll(client, earliest_group, earliest["member_id"])) == ["old-1", "old-2"]
    r = client.get(f"/consumer-groups/{none_group}/members/{none['member_id']}/records")
    assert r.status_code == 416 and r.json()["error"] == "no_offset_for_partition"
    # As in Kafka, "latest" is the log end when the position is first needed (first poll).
    assert _poll(client, latest_group, latest["member_id"]) == []
    _produce(client, topic, 0, ["new"])
    assert _values(_poll(client, latest_group, latest["member_id"])) == ["new"]
    # Records deleted below a committed position: earliest resets to the new log start.
    _produce(client, topic, 0, ["n2", "n3"])
    assert client.post(f"/topics/{topic}/records:delete", json={
        "partitions": [{"partition_id": 0, "offset": 4}]}).status_code == 200
    group = _group()
    r = client.post(f"/consumer-groups/{group}/offsets", json={
        "offsets": [{"topic_name": topic, "partition_id": 0, "offset": 1}]})
    assert r.status_code == 200, r.text  # a member-less commit (epoch -1) into an empty group
    m = _join(client, group, [topic], auto_offset_reset="earliest")
    assert _values(_poll(client, group, m["member_id"])) == ["n3"]


def test_admin_reset_and_delete_need_an_empty_group(client: httpx.Client,
                                                    make_topic: Callable[..., str]) -> None:
    topic, group = make_topic(2), _group()
    for p in range(2):
        _produce(client, topic, p, [f"v{i}" for i in range(10)])
    time.sleep(0.01)  # record timestamps are in ms: keep "middle" apart from both sides
    middle = datetime.now(UTC)
    time.sleep(0.01)
    _produce(client, topic, 0, ["late"])
    m = _join(client, group, [topic])
    reset = {"to": "earliest", "topics": [topic]}
    r = client.post(f"/consumer-groups/{group}/offsets:reset", json=reset)
    assert r.status_code == 409 and r.json()["error"] == "non_empty_group"
    assert client.delete(f"/consumer-groups/{group}").status_code == 409
    assert client.delete(f"/consumer-groups/{group}/members/{m['member_id']}").status_code == 204
    dry = client.post(f"/consumer-groups/{group}/offsets:reset", json={**reset, "dry_run": True})
    assert [o["offset"] for o in dry.json()["offsets"]] == [0, 0]
    assert client.get(f"/consumer-groups/{group}/offsets").json()["offsets"] == []
    for body, expected in (({"to": "latest"}, [11, 10]), ({"to": "offset", "offset": 99}, [11, 10]),
                           ({"to": "offset", "offset": 4}, [4, 4]),
                           ({"to": "datetime", "datetime": middle.isoformat()}, [10, 10]),
                           (reset, [0, 0])):
        r = client.post(f"/consumer-groups/{group}/offsets:reset", json={"topics": [topic], **body})
        assert r.status_code == 200, r.text
        got = client.get(f"/consumer-groups/{group}/offsets").json()["offsets"]
        assert [o["offset"] for o in got] == expected, body
    assert client.delete(f"/consumer-groups/{group}").status_code == 204
    r = client.get(f"/consumer-groups/{group}")
    assert r.status_code == 404 and r.json()["error"] == "group_id_not_found"


def test_bad_group_requests_get_clear_errors(client: httpx.Client,
                                             make_topic: Callable[..., str]) -> None:
    topic, group = make_topic(1), _group()
    cases = [
        # Bodies outside the schema: 422 with the path of the field, as everywhere in the API.
        ("post", f"/consumer-groups/{group}/members", {"topics": []}, 422),
        ("post", f"/consumer-groups/{group}/members",
         {"topics": [topic], "session_timeout_ms": 10}, 422),
        ("post", f"/consumer-groups/{group}/members", {"topics": [topic], "assignor": "x"}, 422),
        ("post", f"/consumer-groups/{group}/offsets",
         {"offsets": [{"topic_name": topic, "partition_id": 0, "offset": -1}]}, 422),
        ("post", f"/consumer-groups/{group}/offsets",
         {"offsets": [{"topic_name": topic, "partition_id": 7, "offset": 1}]}, 404),
        ("post", f"/consumer-groups/{group}/offsets",
         {"offsets": [{"topic_name": topic, "partition_id": 0, "offset": 1,
                       "metadata": "m" * 5000}]}, 422),
        ("post", f"/consumer-groups/{group}/offsets:reset", {"to": "offset", "topics": [topic]}, 400),
    ]
    for method, path, body, status in cases:
        r = client.request(method, path, json=body)
        assert r.status_code == status, (path, body, r.text)
        assert r.json()["message"], r.text
    a = _join(client, group, [topic], assignor="range")
    r = client.post(f"/consumer-groups/{group}/members",
                    json={"topics": [topic], "assignor": "roundrobin"})
    assert r.status_code == 400 and "range" in r.json()["message"]
    r = client.post(f"/consumer-groups/{group}/members/{a['member_id']}/positions", json={
        "positions": [{"topic_name": "elsewhere", "partition_id": 0, "offset": 1}]})
    assert r.status_code == 400 and "not assigned" in r.json()["message"]


def test_a_failed_poll_skips_nothing_and_seek_moves_positions(
        client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic, group = make_topic(2), _group()
    for p in range(2):
        _produce(client, topic, p, [f"p{p}-{i}" for i in range(4)])
    assert client.post(f"/consumer-groups/{group}/offsets", json={"offsets": [
        {"topic_name": topic, "partition_id": 0, "offset": 1}]}).status_code == 200
    m = _join(client, group, [topic], auto_offset_reset="none")
    # Partition 1 has no offset: every poll fails (whichever partition it visits first)...
    for _ in range(3):
        r = client.get(f"/consumer-groups/{group}/members/{m['member_id']}/records")
        assert r.status_code == 416 and f"{topic}/1" in r.json()["message"]
    # ...and moved no position: partition 0 is still read from its commit.
    assert client.post(f"/consumer-groups/{group}/offsets", json={
        "member_id": m["member_id"], "member_epoch": m["member_epoch"],
        "offsets": [{"topic_name": topic, "partition_id": 1, "offset": 3}]}).status_code == 200
    assert sorted(_values(_poll(client, group, m["member_id"]))) == [
        "p0-1", "p0-2", "p0-3", "p1-3"]
    # Seek: back to an offset, or (null) back to the committed offset.
    seek = client.post(f"/consumer-groups/{group}/members/{m['member_id']}/positions", json={
        "positions": [{"topic_name": topic, "partition_id": 0, "offset": 2},
                      {"topic_name": topic, "partition_id": 1, "offset": None}]})
    assert seek.status_code == 200, seek.text
    assert sorted(_values(_poll(client, group, m["member_id"]))) == ["p0-2", "p0-3", "p1-3"]


def _lag_rows(client: httpx.Client, group: str) -> list[tuple[Any, ...]]:
    r = client.get(f"/consumer-groups/{group}")
    assert r.status_code == 200, r.text
    return [(o["topic_name"], o["partition_id"], o["committed_offset"], o.get("log_start_offset"),
             o["log_end_offset"], o["lag"], o["member_id"]) for o in r.json()["offsets"]]


def _group_gauges(server: ServerProcess, name: str, group: str) -> dict[tuple[str, str], float]:
    text = httpx.get(f"{server.url}/metrics").text
    return {(s.labels["topic"], s.labels["partition"]): s.value
            for family in text_string_to_metric_families(text) if family.name == name
            for s in family.samples if s.labels["group"] == group}


def test_lag_lists_every_partition_the_group_reads(server: ServerProcess, client: httpx.Client,
                                                   make_topic: Callable[..., str]) -> None:
    """Issue 19: a group that read one of three partitions showed only that one's lag."""
    topic, other = make_topic(3), make_topic(2)
    for p, n in enumerate((10, 20, 30)):
        _produce(client, topic, p, [f"v{i}" for i in range(n)])
    _produce(client, other, 1, ["x"] * 4)
    r = client.post(f"/topics/{topic}/records:delete",
                    json={"partitions": [{"partition_id": 2, "offset": 5}]})
    assert r.status_code == 200, r.text
    # An empty group that committed one of three partitions reads the whole topic: the
    # other two are listed with no committed offset, all lag from the log start.
    empty = _group()
    assert client.post(f"/consumer-groups/{empty}/offsets", json={"offsets": [
        {"topic_name": topic, "partition_id": 0, "offset": 4}]}).status_code == 200
    assert _lag_rows(client, empty) == [(topic, 0, 4, 0, 10, 6, None),
                                        (topic, 1, None, 0, 20, 20, None),
                                        (topic, 2, None, 5, 30, 25, None)]
    # A live member's subscription counts before anything is committed.
    live = _group()
    m = _join(client, live, [other])["member_id"]
    assert _lag_rows(client, live) == [(other, 0, None, 0, 0, 0, m), (other, 1, None, 0, 4, 4, m)]
    # The same numbers in /metrics; a committed offset only where there is one.
    assert _group_gauges(server, "lakelog_consumer_group_lag", empty) == {
        (topic, "0"): 6, (topic, "1"): 20, (topic, "2"): 25}
    assert _group_gauges(server, "lakelog_consumer_group_committed_offset", empty) == {
        (topic, "0"): 4}
    assert _group_gauges(server, "lakelog_consumer_group_lag", live) == {
        (other, "0"): 0, (other, "1"): 4}
    assert _group_gauges(server, "lakelog_consumer_group_committed_offset", live) == {}
    # One commit to another topic makes the group read all of that topic too.
    assert client.post(f"/consumer-groups/{empty}/offsets", json={"offsets": [
        {"topic_name": other, "partition_id": 1, "offset": 1}]}).status_code == 200
    assert [row[:3] for row in _lag_rows(client, empty)] == sorted([
        (other, 0, None), (other, 1, 1), (topic, 0, 4), (topic, 1, None), (topic, 2, None)],
        key=lambda row: row[:2])  # by topic, then partition
    assert client.delete(f"/consumer-groups/{live}/members/{m}").status_code == 204


def test_metrics_scrapes_stay_whole_while_topics_and_groups_change(
        server: ServerProcess, client: httpx.Client) -> None:
    """/metrics collects in a worker thread while the event loop creates and deletes topics
    and groups join, commit and leave: every scrape answers 200."""
    stop = threading.Event()
    errors: list[str] = []
    rounds = [0]

    def churn() -> None:
        with server.client() as c:
            while not stop.is_set():
                topic, empty, live = f"churn-{uuid.uuid4().hex[:8]}", _group(), _group()
                c.post("/topics", json={"topic_name": topic, "partitions_count": 4})
                c.post(f"/consumer-groups/{empty}/offsets", json={"offsets": [
                    {"topic_name": topic, "partition_id": 1, "offset": 0}]})
                m = c.post(f"/consumer-groups/{live}/members",
                           json={"topics": [topic], "session_timeout_ms": 10_000}).json()
                c.delete(f"/topics/{topic}")
                c.delete(f"/consumer-groups/{empty}")
                c.delete(f"/consumer-groups/{live}/members/{m.get('member_id')}")
                rounds[0] += 1

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        for _ in range(60):
            r = httpx.get(f"{server.url}/metrics", timeout=30)
            if r.status_code != 200:
                errors.append(r.text[:500])
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    assert rounds[0] >= 3, rounds  # the scrapes did overlap changes
