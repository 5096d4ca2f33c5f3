"""Status and error codes as Confluent's REST v3 document and examples give them, for the
operations lakelog shares with it; and the differences lakelog keeps on purpose (the
Confluent section of docs/http-api.md lists them), pinned."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.ingest_api import confluent_v3 as v3
from tests.ingest_api.helpers import b64, string
from tests.ingest_api.test_confluent import check, error

pytestmark = pytest.mark.slow


@pytest.fixture
def topic(client: httpx.Client) -> str:
    name = f"cs-{uuid.uuid4().hex[:8]}"
    assert client.post("/topics", json={"topic_name": name, "partitions_count": 2}
                       ).status_code == 201
    return name


def test_a_path_that_is_not_an_id_is_400_and_an_id_out_of_range_404(
        client: httpx.Client, topic: str) -> None:
    """Confluent's partition and broker operations document 400 and 404, never 422."""
    for suffix in ("", "/replicas", "/replicas/1", "/reassignment", "/offset"):
        assert "partition_id" in error(client.get(f"/topics/{topic}/partitions/abc{suffix}"),
                                       400, 400), suffix
        error(client.get(f"/topics/{topic}/partitions/-1{suffix}"), 404, 40402)
        error(client.get(f"/topics/{topic}/partitions/{2**40}{suffix}"), 404, 40402)
    error(client.get(f"/topics/{topic}/partitions/0/replicas/x"), 400, 400)
    error(client.get("/brokers/one"), 400, 400)
    error(client.get(f"/consumer-groups/g/lags/{topic}/partitions/1.5"), 400, 400)


def test_admin_bodies_of_the_wrong_shape_or_missing_are_400(client: httpx.Client,
                                                            topic: str) -> None:
    """Create Topic, Update Partition Count, Update Topic Config and Batch Alter Topic
    Configs document 400 for a bad request and no 422."""
    for method, path, body in [
            ("POST", "/topics", {"topic_name": "x", "partitions_count": "3"}),
            ("POST", "/topics", {"topic_name": "x", "validate_only": {}}),
            ("PATCH", f"/topics/{topic}", {"partitions_count": "3"}),
            ("PATCH", f"/topics/{topic}", {"partitions_count": 3.5}),
            ("PUT", f"/topics/{topic}/configs/retention.ms", {"value": 5}),
            ("POST", f"/topics/{topic}/configs:alter", {"data": [{"value": "1"}]}),
            ("POST", f"/topics/{topic}/configs:alter", {"data": [], "validate_only": "yes"})]:
        error(client.request(method, path, json=body), 400, 400)
        assert "empty" in error(client.request(method, path, content=b""), 400, 400), path
    assert client.get(f"/topics/{topic}").json()["partitions_count"] == 2


def test_produce_error_codes_are_those_of_confluents_examples(client: httpx.Client,
                                                              topic: str) -> None:
    """BINARY data that is not base64: 400; an empty body: 422 (Confluent's examples)."""
    r = client.post(f"/topics/{topic}/records",
                    json={"value": {"type": "BINARY", "data": "not base64!"}})
    assert "base64" in error(r, 400, 400)
    r = client.post(f"/topics/{topic}/records",
                    json={"headers": [{"name": "h", "value": "%%%"}], "value": string("x")})
    assert "$.headers[0].value" in error(r, 400, 400)
    assert "empty" in error(client.post(f"/topics/{topic}/records", content=b""), 422, 422)
    assert "empty" in error(client.post(f"/topics/{topic}/records", content=b" \n"), 422, 422)
    ok = check(client.post(f"/topics/{topic}/records",
                           json={"value": {"type": "BINARY", "data": b64(b"fine")}}),
               200, v3.PRODUCE_RESPONSE)
    assert ok["value"]["size"] == 4


def test_include_authorized_operations(client: httpx.Client, topic: str) -> None:
    plain = check(client.get(f"/topics/{topic}"), 200, v3.TOPIC)
    assert "authorized_operations" not in plain
    off = client.get(f"/topics/{topic}", params={"include_authorized_operations": "false"})
    assert "authorized_operations" not in check(off, 200, v3.TOPIC)
    on = check(client.get(f"/topics/{topic}", params={"include_authorized_operations": "true"}),
               200, v3.TOPIC)
    # Authentication is off here: every operation is allowed.
    assert set(on["authorized_operations"]) == {
        "READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "DESCRIBE_CONFIGS",
        "ALTER_CONFIGS"}
    for method in ("GET", "PATCH", "DELETE"):
        r = client.request(method, f"/topics/{topic}",
                           params={"include_authorized_operations": "maybe"},
                           json={"partitions_count": 2} if method == "PATCH" else None)
        error(r, 400, 400)
    assert client.get(f"/topics/{topic}").status_code == 200  # the DELETE did nothing


def test_options_answers_what_the_405_allows(client: httpx.Client, topic: str) -> None:
    for path in ("/topics", f"/topics/{topic}", f"/topics/{topic}/partitions/0/offset",
                 "/consumer-groups/g/lags"):
        refused = client.request("TRACE", path)
        error(refused, 405, 405)
        options = client.request("OPTIONS", path)
        assert options.status_code == 204 and not options.content, path
        assert options.headers["allow"] == refused.headers["allow"] + ", OPTIONS", path
    assert client.request("OPTIONS", "/no/such/thing").status_code == 404


def test_differences_kept_on_purpose(client: httpx.Client, topic: str) -> None:
    """What the Confluent section of docs/http-api.md says lakelog does differently, and why."""
    # An unknown field is refused, naming it (Confluent ignores it): a misspelled
    # option must not be dropped without a word.
    assert "replication_factr" in error(client.post("/topics", json={
        "topic_name": f"{topic}-x", "replication_factr": 1}), 400, 400)
    assert "vaule" in error(client.post(f"/topics/{topic}/records", json={
        "vaule": string("x")}), 422, 422)
    # Batch entry ids: any 1 to 256 characters (Confluent: 1 to 80 of [0-9a-zA-Z_-]).
    long_id, odd_id = "i" * 256, "order:17/é"
    body = check(client.post(f"/topics/{topic}/records:batch", json={"entries": [
        {"id": long_id, "value": string("a")}, {"id": odd_id, "value": string("b")}]}),
        207, v3.BATCH_RESPONSE)
    assert sorted(s["id"] for s in body["successes"]) == sorted([long_id, odd_id])
    error(client.post(f"/topics/{topic}/records:batch", json={"entries": [
        {"id": "i" * 257, "value": string("a")}]}), 422, 42208)
    # A group can be deleted (Kafka's DeleteGroups), so its Allow names DELETE.
    assert client.request("OPTIONS", "/consumer-groups/g").headers["allow"] == (
        "DELETE, GET, OPTIONS")
    # A replication factor above the live brokers is refused, as Kafka refuses it.
    assert "replication_factor" in error(client.post("/topics", json={
        "topic_name": f"{topic}-rf", "replication_factor": 3}), 400, 40005)
