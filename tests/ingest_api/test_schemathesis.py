"""schemathesis against the published OpenAPI schema (no 500s, no hangs), and against
Confluent REST v3's operations as Confluent's document gives them."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.ingest_api import confluent_openapi
from tests.server import ServerProcess

pytestmark = pytest.mark.slow


def test_no_server_errors(spawn_server: Callable[..., ServerProcess], tmp_path: Path) -> None:
    # A long poll may last max_fetch_wait_ms (30 s by default): bounded here well inside
    # the run's 20 s request timeout, so that only a real hang times out.
    server = spawn_server(max_fetch_wait_ms="5000")
    with server.client() as client:
        assert client.post("/topics", json={"topic_name": "st", "partitions_count": 2}).status_code == 201
        client.post("/topics/st/records", json={"value": {"type": "STRING", "data": "seed"}})
    config = tmp_path / "schemathesis.toml"
    # Path parameters pinned to a real cluster and topic, so the fuzzing reaches the handlers.
    config.write_text('[parameters]\n"path.cluster_id" = "lakelog"\n"path.topic_name" = "st"\n')
    result = subprocess.run(
        [Path(sys.executable).parent / "schemathesis", "--config-file", str(config), "run",
         f"{server.url}/openapi.json", "--checks", "not_a_server_error", "--max-examples", "25",
         "--request-timeout", "20", "--generation-deterministic"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "passed" in result.stdout
    assert httpx.get(f"{server.url}/healthz").status_code == 200  # still serving
    assert "Traceback" not in server.log()


# What differs from Confluent's own answers on purpose (the Confluent section of docs/http-api.md);
# each is pinned by tests/ingest_api/test_confluent_statuses.py.
CONFLUENT_CONFIG = """
# Every check but those about credentials and deleted resources (no auth here; nothing is
# created and deleted by the run).
[checks]
ignored_auth.enabled = false
use_after_free.enabled = false
ensure_resource_availability.enabled = false

[parameters]
"path.cluster_id" = "lakelog"
"path.topic_name" = "st"
"path.consumer_group_id" = "g1"
"path.consumer_id" = "{member}"
"path.name" = "compression.type"

[[operations]]
include-path-regex = "/brokers/"
parameters = {{ "path.broker_id" = 1 }}

# An invalid entry fails alone, inside the 207 (as in Confluent): an entry that breaks
# the schema is refused there, not by the request's status.
[[operations]]
include-path-regex = "records:batch$"
checks.negative_data_rejection.enabled = false
"""


def test_confluent_operations_answer_as_confluents_document(
        spawn_server: Callable[..., ServerProcess], tmp_path: Path) -> None:
    """Every check schemathesis has, over the operations lakelog shares with Confluent
    REST v3, against a document built from schemas written from Confluent's
    (``confluent_openapi.py``): statuses, content types, answer schemas, refused invalid
    and accepted valid requests, 405s and their ``Allow``."""
    server = spawn_server(max_fetch_wait_ms="5000")
    with server.client() as client:
        assert client.post("/topics", json={"topic_name": "st", "partitions_count": 2}
                           ).status_code == 201
        for i in range(4):
            client.post("/topics/st/records", json={"partition_id": i % 2,
                                                    "value": {"type": "STRING", "data": "x"}})
        member = client.post("/consumer-groups/g1/members", json={
            "topics": ["st"], "session_timeout_ms": 300_000}).json()
        assert client.post("/consumer-groups/g1/offsets", json={
            "member_id": member["member_id"], "member_epoch": member["member_epoch"],
            "offsets": [{"topic_name": "st", "partition_id": 0, "offset": 1}]}
            ).status_code == 200
    (tmp_path / "confluent.json").write_text(json.dumps(confluent_openapi.document()))
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFLUENT_CONFIG.format(member=member["member_id"]))
    result = subprocess.run(
        [Path(sys.executable).parent / "schemathesis", "--config-file", str(config), "run",
         str(tmp_path / "confluent.json"), "--url", f"{server.url}/v3",
         "--exclude-operation-id", "createTopic", "--exclude-operation-id", "updatePartitionCount",
         "--exclude-operation-id", "deleteTopic", "--max-examples", "25", "--request-timeout", "20", "--generation-deterministic"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "Traceback" not in server.log()
