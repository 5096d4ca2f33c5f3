"""Every endpoint lakelog shares with Confluent REST Proxy v3 answers as Confluent's OpenAPI
document says (schemas in ``confluent_v3.py``), against a real server."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from tests.ingest_api import confluent_v3 as v3
from tests.ingest_api.helpers import b64, fetch_all, string
from tests.server import ServerProcess

pytestmark = pytest.mark.slow


def check(r: httpx.Response, status: int, schema: v3.Schema) -> Any:
    """The answer has this status and its body validates against the schema."""
    assert r.status_code == status, (r.request.method, r.request.url, r.status_code, r.text)
    body = r.json()
    errors = sorted(Draft202012Validator(schema).iter_errors(body), key=str)
    assert not errors, f"{r.request.method} {r.request.url.path}: {errors[0]}"
    return body


def error(r: httpx.Response, status: int, code: int) -> str:
    body = check(r, status, v3.ERROR)
    assert body["error_code"] == code, body
    message: str = body["message"]
    return message


def _links(body: Any) -> Iterator[str]:
    """Every ``related`` and ``metadata.self`` URL in an answer."""
    if isinstance(body, dict):
        for key, value in body.items():
            if key in ("related", "self") and isinstance(value, str):
                yield value
            else:
                yield from _links(value)
    elif isinstance(body, list):
        for item in body:
            yield from _links(item)


@pytest.fixture
def topic(client: httpx.Client) -> str:
    name = f"cf-{uuid.uuid4().hex[:8]}"
    r = client.post("/topics", json={"topic_name": name, "partitions_count": 2,
                                     "replication_factor": 1})
    assert r.status_code == 201, r.text
    return name


def test_every_shared_endpoint_answers_its_schema_and_its_links_resolve(
        server: ServerProcess, client: httpx.Client, topic: str) -> None:
    t, p = f"/topics/{topic}", f"/topics/{topic}/partitions/1"
    with httpx.Client(base_url=server.url, timeout=30) as root:
        _check_all(client, root, topic, t, p)


def _check_all(client: httpx.Client, root: httpx.Client, topic: str, t: str, p: str) -> None:
    created = check(client.post("/topics", json={
        "topic_name": f"{topic}-c", "partitions_count": 2, "replication_factor": 1,
        "configs": [{"name": "cleanup.policy", "value": "delete"}]}), 201, v3.TOPIC)
    assert client.put(f"{t}/configs/compression.type", json={"value": "gzip"}).status_code == 204
    answers = [created,
        check(root.get("/v3/clusters"), 200, v3.CLUSTER_LIST),
        check(root.get("/v3/clusters/lakelog"), 200, v3.CLUSTER),
        check(client.get("/brokers"), 200, v3.BROKER_LIST),
        check(client.get("/brokers/1"), 200, v3.BROKER),
        check(client.get("/brokers/1/configs"), 200, v3.BROKER_CONFIG_LIST),
        check(client.get("/brokers/1/partition-replicas"), 200, v3.REPLICA_LIST),
        check(client.get("/broker-configs"), 200, v3.CLUSTER_CONFIG_LIST),
        check(client.get("/topics"), 200, v3.TOPIC_LIST),
        check(client.get(t), 200, v3.TOPIC),
        check(client.get(f"{t}/configs"), 200, v3.TOPIC_CONFIG_LIST),
        check(client.get(f"{t}/configs/compression.type"), 200, v3.TOPIC_CONFIG),
        check(client.get(f"{t}/partitions"), 200, v3.PARTITION_LIST),
        check(client.get(p), 200, v3.PARTITION),
        check(client.get(f"{p}/replicas"), 200, v3.REPLICA_LIST),
        check(client.get(f"{p}/replicas/1"), 200, v3.REPLICA),
        check(client.get("/topics/-/partitions/-/reassignment"), 200, v3.REASSIGNMENT_LIST),
        check(client.get(f"{t}/partitions/-/reassignment"), 200, v3.REASSIGNMENT_LIST),
        check(client.patch(t, json={"partitions_count": 3}), 200, v3.TOPIC),
    ]
    error(client.get(f"{p}/reassignment"), 404, 404)  # none in progress, as Confluent says
    error(client.get(f"{p}/replicas/2"), 404, 404)
    error(client.get("/brokers/2"), 404, 404)
    # One broker leads every partition and is its only replica.
    part = client.get(p).json()
    assert part["leader"]["related"].endswith(f"{p}/replicas/1")
    replicas = client.get(f"{p}/replicas").json()["data"]
    assert [(r["broker_id"], r["is_leader"], r["is_in_sync"]) for r in replicas] == [(1, True, True)]
    assert client.get(t).json()["replication_factor"] == 1
    assert any(r["topic_name"] == topic for r in
               client.get("/brokers/1/partition-replicas").json()["data"])
    config = client.get(f"{t}/configs/compression.type").json()
    assert (config["value"], config["source"], config["is_default"]) == (
        "gzip", "DYNAMIC_TOPIC_CONFIG", False)
    assert config["synonyms"] == [
        {"name": "compression.type", "value": "gzip", "source": "DYNAMIC_TOPIC_CONFIG"},
        {"name": "compression.type", "value": "producer", "source": "DEFAULT_CONFIG"}]
    # Every link answers (a partition's reassignment: 404 while none is in progress; the
    # ACLs: 409 while authentication is off, as in this server).
    for url in sorted({u for body in answers for u in _links(body)}):
        r = root.get(url)
        expected = (404 if url.endswith("/reassignment") and "/-/" not in url
                    else 409 if url.endswith("/acls") else 200)
        assert r.status_code == expected, (url, r.text)


def test_topic_errors_are_confluents(client: httpx.Client, topic: str) -> None:
    again = client.post("/topics", json={"topic_name": topic, "partitions_count": 1})
    assert "already exists" in error(again, 400, 40002)
    unknown = "nope-" + uuid.uuid4().hex[:6]
    for method, path, body in [
            ("GET", f"/topics/{unknown}", None), ("DELETE", f"/topics/{unknown}", None),
            ("PATCH", f"/topics/{unknown}", {"partitions_count": 2}),
            ("GET", f"/topics/{unknown}/configs", None),
            ("GET", f"/topics/{unknown}/partitions", None),
            ("GET", f"/topics/{unknown}/partitions/0", None),
            ("GET", f"/topics/{unknown}/partitions/0/replicas", None),
            ("POST", f"/topics/{unknown}/records", {"value": string("x")}),
            ("POST", f"/topics/{unknown}/records:batch", {"entries": [{"id": "a"}]}),
            ("GET", f"/topics/{unknown}/partitions/0/records?offset=0", None)]:
        r = client.request(method, path, json=body)
        assert unknown in error(r, 404, 40403), (method, path)
    error(client.get(f"/topics/{topic}/partitions/9"), 404, 40402)
    error(client.get(f"/topics/{topic}/configs/no.such"), 404, 40409)
    error(httpx.get(str(client.base_url).replace("/lakelog", "/other") + "/topics"), 404, 404)


def test_validate_only_creates_nothing(client: httpx.Client, server: ServerProcess) -> None:
    name = f"dry-{uuid.uuid4().hex[:8]}"
    dry = check(client.post("/topics", json={"topic_name": name, "partitions_count": 4,
                                             "validate_only": True}), 200, v3.TOPIC)
    assert (dry["topic_name"], dry["partitions_count"]) == (name, 4)
    error(client.get(f"/topics/{name}"), 404, 40403)
    assert name not in [t["topic_name"] for t in client.get("/topics").json()["data"]]
    assert not (server.data_dir / "hot" / name).exists()
    # A dry run says what a real one would: invalid input is refused the same way.
    error(client.post("/topics", json={"topic_name": name, "validate_only": True,
                                       "configs": [{"name": "segment.bytes", "value": "1"}]}),
          400, 40004)
    error(client.post("/topics", json={"topic_name": "bad name", "validate_only": True}),
          400, 40002)
    taken = f"{name}-taken"
    check(client.post("/topics", json={"topic_name": taken}), 201, v3.TOPIC)
    error(client.post("/topics", json={"topic_name": taken, "validate_only": True}), 400, 40002)
    # And creating it for real afterwards works.
    check(client.post("/topics", json={"topic_name": name, "partitions_count": 4}), 201, v3.TOPIC)
    # configs:alter in dry-run mode changes nothing.
    r = client.post(f"/topics/{name}/configs:alter", json={
        "data": [{"name": "retention.ms", "value": "1000"}], "validate_only": True})
    assert r.status_code == 204
    assert client.get(f"/topics/{name}/configs/retention.ms").json()["is_default"]
    error(client.post(f"/topics/{name}/configs:alter", json={
        "data": [{"name": "retention.ms", "value": "soon"}], "validate_only": True}), 400, 40004)


def test_null_config_values_mean_the_default(client: httpx.Client) -> None:
    name = f"nul-{uuid.uuid4().hex[:8]}"
    check(client.post("/topics", json={"topic_name": name, "configs": [
        {"name": "retention.ms", "value": None}, {"name": "segment.ms", "value": "60000"}]}),
        201, v3.TOPIC)
    configs = {c["name"]: c for c in client.get(f"/topics/{name}/configs").json()["data"]}
    assert configs["retention.ms"]["is_default"] and configs["segment.ms"]["value"] == "60000"
    assert client.put(f"/topics/{name}/configs/segment.ms", json={"value": None}).status_code == 204
    assert client.get(f"/topics/{name}/configs/segment.ms").json()["is_default"]
    client.put(f"/topics/{name}/configs/segment.ms", json={"value": "60000"})
    assert client.post(f"/topics/{name}/configs:alter", json={"data": [
        {"name": "segment.ms", "value": None, "operation": None}]}).status_code == 204
    assert client.get(f"/topics/{name}/configs/segment.ms").json()["is_default"]
    # A null value still has to name a config that exists.
    assert "nope" in error(client.post("/topics", json={
        "topic_name": f"{name}-2", "configs": [{"name": "nope", "value": None}]}), 400, 40004)


@pytest.mark.parametrize("value", ["producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"])
def test_compression_type_takes_kafkas_values(client: httpx.Client, topic: str,
                                              value: str) -> None:
    assert client.put(f"/topics/{topic}/configs/compression.type",
                      json={"value": value}).status_code == 204
    assert client.get(f"/topics/{topic}/configs/compression.type").json()["value"] == value


def test_compression_type_refuses_other_values(client: httpx.Client, topic: str) -> None:
    message = error(client.put(f"/topics/{topic}/configs/compression.type",
                               json={"value": "brotli"}), 400, 40004)
    assert "gzip" in message and "zstd" in message


def test_replicas_assignments_must_be_this_broker(client: httpx.Client) -> None:
    name = f"ra-{uuid.uuid4().hex[:8]}"
    created = check(client.post("/topics", json={"topic_name": name, "replicas_assignments": [
        {"partition_id": 0, "broker_ids": [1]}, {"partition_id": 1, "broker_ids": [1]}]}),
        201, v3.TOPIC)
    assert created["partitions_count"] == 2
    assert "one broker" in error(client.post("/topics", json={
        "topic_name": f"{name}-x", "replicas_assignments": [
            {"partition_id": 0, "broker_ids": [1, 2]}]}), 400, 40005)


def test_batch_entries_fail_alone_and_report_as_confluent(client: httpx.Client,
                                                          topic: str) -> None:
    entries = [
        {"id": "s", "partition_id": 0, "key": {"type": "STRING", "data": "clé"},
         "value": {"type": "BINARY", "data": b64(b"\x00\x01\x02")}},
        {"id": "bad-base64", "partition_id": 0, "value": {"type": "BINARY", "data": "!!!not"}},
        {"id": "j", "partition_id": 0, "value": {"type": "JSON", "data": {"a": [1, 2]}}},
        {"id": "unknown-field", "partition_id": 0, "valu": {"type": "STRING", "data": "x"}},
        {"id": "tombstone", "partition_id": 0, "key": {"type": "BINARY", "data": b64(b"k")},
         "value": None},
    ]
    body = check(client.post(f"/topics/{topic}/records:batch", json={"entries": entries}),
                 207, v3.BATCH_RESPONSE)
    ok = {s["id"]: s for s in body["successes"]}
    assert sorted(ok) == ["j", "s", "tombstone"]
    assert {(s["cluster_id"], s["topic_name"]) for s in ok.values()} == {("lakelog", topic)}
    assert ok["s"]["key"] == {"type": "STRING", "size": len("clé".encode())}
    assert ok["s"]["value"] == {"type": "BINARY", "size": 3}
    assert ok["j"]["key"] is None and ok["j"]["value"] == {"type": "JSON",
                                                            "size": len(b'{"a":[1,2]}')}
    assert ok["tombstone"]["value"] is None and ok["tombstone"]["key"]["size"] == 1
    for s in ok.values():
        datetime.fromisoformat(s["timestamp"])
    failed = {f["id"]: f for f in body["failures"]}
    assert sorted(failed) == ["bad-base64", "unknown-field"]
    assert "base64" in failed["bad-base64"]["message"]
    assert "$.entries[1].value.data" in failed["bad-base64"]["message"]
    assert "valu" in failed["unknown-field"]["message"]
    # Exactly the good entries were stored.
    stored = fetch_all(client, topic, 0)
    assert sorted(r["offset"] for r in stored) == sorted(s["offset"] for s in ok.values())
    assert failed["bad-base64"]["error_code"] == 400  # as Confluent's examples answer it
    assert failed["unknown-field"]["error_code"] == 422
    # Refused whole with Confluent's 422/42208: an empty batch, an empty body, an id used
    # twice, an invalid entry without an id to report it by.
    error(client.post(f"/topics/{topic}/records:batch", json={"entries": []}), 422, 42208)
    error(client.post(f"/topics/{topic}/records:batch", content=b""), 422, 42208)
    assert "'a'" in error(client.post(f"/topics/{topic}/records:batch", json={"entries": [
        {"id": "a"}, {"id": "a"}]}), 422, 42208)
    error(client.post(f"/topics/{topic}/records:batch", json={"entries": [
        {"id": "a"}, {"value": {"type": "BINARY", "data": "!!!"}}]}), 422, 42208)


@pytest.mark.parametrize(("key", "value"), [
    ({"type": "STRING", "data": "ключ"}, {"type": "JSON", "data": {"é": [1, None]}}),
    ({"type": "JSON", "data": [1, "x"]}, {"type": "BINARY", "data": b64(b"\x00" * 7)}),
    ({"type": "BINARY", "data": b64(b"k")}, {"type": "STRING", "data": "v€"})])
def test_batch_sizes_are_stored_bytes(client: httpx.Client, topic: str,
                                      key: dict[str, Any], value: dict[str, Any]) -> None:
    """Every entry alike (the answer's fast path): sizes are the bytes stored."""
    entries = [{"id": str(i), "key": key, "value": value} for i in range(20)]
    body = check(client.post(f"/topics/{topic}/records:batch", json={"entries": entries}),
                 207, v3.BATCH_RESPONSE)
    stored = fetch_all(client, topic, 0) + fetch_all(client, topic, 1)
    k = base64.b64decode(stored[0]["key"]["data"])
    v = base64.b64decode(stored[0]["value"]["data"])
    assert {(s["key"]["type"], s["key"]["size"], s["value"]["type"], s["value"]["size"])
            for s in body["successes"]} == {(key["type"], len(k), value["type"], len(v))}


def test_produce_reports_are_produce_responses(client: httpx.Client, topic: str) -> None:
    one = check(client.post(f"/topics/{topic}/records", json={
        "key": {"type": "JSON", "data": "k"}, "value": {"type": "STRING", "data": "é"}}),
        200, v3.PRODUCE_RESPONSE)
    assert one["key"] == {"type": "JSON", "size": 3} and one["value"]["size"] == 2
    stream = client.post(f"/topics/{topic}/records", content=b"".join(
        json.dumps({"value": string(str(i))}).encode() for i in range(3)))
    validator = Draft202012Validator(v3.PRODUCE_RESPONSE)
    reports = [json.loads(line) for line in stream.text.splitlines()]
    assert len(reports) == 3 and all(validator.is_valid(r) for r in reports)


@pytest.mark.parametrize("content_type", ["text/plain", "application/xml",
                                          "application/x-www-form-urlencoded",
                                          "application/json; charset=latin-1"])
def test_bodies_that_are_not_json_are_415(client: httpx.Client, topic: str,
                                          content_type: str) -> None:
    for method, path, body in [
            ("POST", "/topics", {"topic_name": "x"}),
            ("POST", f"/topics/{topic}/records", {"value": string("x")}),
            ("POST", f"/topics/{topic}/records:batch", {"entries": [{"id": "a"}]}),
            ("PUT", f"/topics/{topic}/configs/retention.ms", {"value": "1"}),
            ("POST", f"/topics/{topic}/configs:alter", {"data": []}),
            ("POST", "/consumer-groups/g415/members", {"topics": [topic]})]:
        r = client.request(method, path, content=json.dumps(body),
                           headers={"content-type": content_type})
        assert "application/json" in error(r, 415, 415), (method, path)
    assert fetch_all(client, topic, 0) + fetch_all(client, topic, 1) == []


@pytest.mark.parametrize("content_type", [None, "application/json",
                                          "application/json; charset=UTF-8",
                                          "application/vnd.kafka.v3+json"])
def test_json_bodies_are_taken(client: httpx.Client, topic: str,
                               content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}
    r = client.post(f"/topics/{topic}/records", content=json.dumps({"value": string("x")}),
                    headers=headers)
    check(r, 200, v3.PRODUCE_RESPONSE)


def test_405_names_the_allowed_methods(client: httpx.Client, topic: str) -> None:
    for method, path, allowed in [
            ("PUT", "/topics", "GET, POST"),
            ("POST", f"/topics/{topic}", "DELETE, GET, PATCH"),
            ("DELETE", f"/topics/{topic}/partitions", "GET"),
            ("GET", f"/topics/{topic}/records:batch", "POST")]:
        r = client.request(method, path)
        error(r, 405, 405)
        assert r.headers["allow"] == allowed, (method, path, r.headers)


def test_other_errors_are_error_bodies(client: httpx.Client, topic: str) -> None:
    for r, status in [
            (client.post("/topics", content=b"{", headers={"content-type": "application/json"}),
             400),
            (client.post("/topics", json={"partitions_count": 1}), 400),
            (client.get(f"/topics/{topic}/partitions/0/records"), 422),
            (client.get(f"/topics/{topic}/partitions/0/records?offset=99"), 416),
            (client.get("/no/such/endpoint"), 404)]:
        check(r, status, v3.ERROR)
