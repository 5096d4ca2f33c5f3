"""Topic admin over HTTP against a real server."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.server import ServerProcess

pytestmark = pytest.mark.slow


def test_cluster_listing(server: ServerProcess, client: httpx.Client) -> None:
    r = httpx.get(f"{server.url}/v3/clusters")
    assert r.status_code == 200
    assert [c["cluster_id"] for c in r.json()["data"]] == ["lakelog"]
    assert httpx.get(f"{server.url}/v3/clusters/lakelog").json()["cluster_id"] == "lakelog"
    other = httpx.get(f"{server.url}/v3/clusters/kafka/topics")
    assert other.status_code == 404 and other.json()["error_code"] == 404


def test_create_get_list_delete(client: httpx.Client) -> None:
    r = client.post("/topics", json={"topic_name": "orders-x", "partitions_count": 3,
                                     "configs": [{"name": "retention.ms", "value": "60000"}]})
    assert r.status_code == 201, r.text
    body = r.json()
    assert (body["topic_name"], body["partitions_count"], body["kind"]) == ("orders-x", 3, "KafkaTopic")
    assert client.get("/topics/orders-x").json()["partitions_count"] == 3
    assert "orders-x" in [t["topic_name"] for t in client.get("/topics").json()["data"]]
    again = client.post("/topics", json={"topic_name": "orders-x", "partitions_count": 1})
    assert again.status_code == 400 and "already exists" in again.json()["message"]
    assert again.json()["error_code"] == 40002  # Confluent's code for TopicExistsException
    assert client.delete("/topics/orders-x").status_code == 204
    gone = client.get("/topics/orders-x")
    assert gone.status_code == 404 and gone.json()["error_code"] == 40403
    assert client.delete("/topics/orders-x").status_code == 404


@pytest.mark.parametrize(("body", "status", "fragment"), [
    ({"topic_name": "bad name", "partitions_count": 1}, 400, "bad name"),
    ({"topic_name": "x", "partitions_count": 0}, 400, "partitions_count"),
    ({"topic_name": "x", "partitions_count": 10_001}, 400, "10001"),
    ({"topic_name": "x", "partitions_count": 1, "configs": [{"name": "retention.ms", "value": "soon"}]},
     400, "retention.ms"),
    ({"topic_name": "x", "partitions_count": 1, "configs": [{"name": "nope", "value": "1"}]}, 400, "nope"),
    # A wrong shape is 400 here: Confluent's Create Topic documents 400 and no 422.
    ({"partitions_count": 1}, 400, "topic_name"),
    ({"topic_name": "x", "partitions_count": "3"}, 400, "partitions_count"),
    ({"topic_name": "x", "replication_factor": 3}, 400, "replication_factor"),
])
def test_invalid_topics_are_rejected_with_a_message(client: httpx.Client, body: dict[str, object],
                                                    status: int, fragment: str) -> None:
    r = client.post("/topics", json=body)
    assert r.status_code == status, r.text
    assert fragment in r.json()["message"] and isinstance(r.json()["error_code"], int)


def test_malformed_json_is_400(client: httpx.Client) -> None:
    r = client.post("/topics", content=b'{"topic_name": ', headers={"content-type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in r.json()["message"]


def test_configs_read_and_alter(client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic(segment_ms="5000")
    configs = {c["name"]: c for c in client.get(f"/topics/{topic}/configs").json()["data"]}
    assert configs["segment.ms"]["value"] == "5000" and not configs["segment.ms"]["is_default"]
    assert configs["retention.ms"]["is_default"] and configs["retention.ms"]["value"] == "604800000"
    assert client.put(f"/topics/{topic}/configs/retention.ms", json={"value": "1000"}).status_code == 204
    assert client.get(f"/topics/{topic}/configs/retention.ms").json()["value"] == "1000"
    assert client.delete(f"/topics/{topic}/configs/segment.ms").status_code == 204
    assert client.get(f"/topics/{topic}/configs/segment.ms").json()["is_default"]
    r = client.post(f"/topics/{topic}/configs:alter", json={"data": [
        {"name": "cleanup.policy", "value": "compact"},
        {"name": "retention.ms", "operation": "DELETE"}]})
    assert r.status_code == 204
    assert client.get(f"/topics/{topic}/configs/cleanup.policy").json()["value"] == "compact"
    assert client.get(f"/topics/{topic}/configs/retention.ms").json()["is_default"]
    bad = client.put(f"/topics/{topic}/configs/segment.bytes", json={"value": "-1"})
    assert bad.status_code == 400 and "segment.bytes" in bad.json()["message"]
    assert client.get(f"/topics/{topic}/configs/no.such").status_code == 404


def test_partitions_grow_never_shrink(client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic(partitions=2)
    assert client.patch(f"/topics/{topic}", json={"partitions_count": 5}).json()["partitions_count"] == 5
    shrink = client.patch(f"/topics/{topic}", json={"partitions_count": 3})
    assert shrink.status_code == 400 and "only grow" in shrink.json()["message"]
    parts = client.get(f"/topics/{topic}/partitions").json()["data"]
    assert [p["partition_id"] for p in parts] == [0, 1, 2, 3, 4]
    client.post(f"/topics/{topic}/records", json={"partition_id": 4, "value": {"type": "STRING", "data": "x"}})
    p4 = client.get(f"/topics/{topic}/partitions/4").json()
    assert (p4["log_start_offset"], p4["high_watermark"]) == (0, 1) and p4["size_bytes"] > 0
    missing = client.get(f"/topics/{topic}/partitions/5")
    assert missing.status_code == 404 and missing.json()["error_code"] == 40402


def test_unknown_route_is_a_json_404(client: httpx.Client) -> None:
    r = client.get("/nothing/here")
    assert r.status_code == 404 and "no such endpoint" in r.json()["message"]


def test_broker_defaults_of_topic_configs_show_as_kafkas_static_broker_config(
        spawn_server: Callable[..., ServerProcess]) -> None:
    server = spawn_server(min_insync_replicas="2")
    with server.client() as client:
        assert client.post("/topics", json={"topic_name": "own", "partitions_count": 1, "configs": [
            {"name": "min.insync.replicas", "value": "3"}]}).status_code == 201
        assert client.post("/topics", json={"topic_name": "broker",
                                            "partitions_count": 1}).status_code == 201
        broker = client.get("/topics/broker/configs/min.insync.replicas").json()
        assert (broker["value"], broker["source"], broker["is_default"]) == \
            ("2", "STATIC_BROKER_CONFIG", False)
        assert [s["source"] for s in broker["synonyms"]] == ["STATIC_BROKER_CONFIG",
                                                             "DEFAULT_CONFIG"]
        assert broker["default_value"] == "1"
        own = client.get("/topics/own/configs/min.insync.replicas").json()
        assert (own["value"], own["source"]) == ("3", "DYNAMIC_TOPIC_CONFIG")
        assert [s["value"] for s in own["synonyms"]] == ["3", "2", "1"]
        configs = {c["name"]: c for c in client.get("/topics/broker/configs").json()["data"]}
        unclean = configs["unclean.leader.election.enable"]  # not set for the broker
        assert (unclean["value"], unclean["source"], unclean["is_default"]) == \
            ("false", "DEFAULT_CONFIG", True)
