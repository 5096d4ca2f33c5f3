"""schemathesis against the published OpenAPI schema: no 500s, no hangs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.server import ServerProcess

pytestmark = pytest.mark.slow


def test_no_server_errors(spawn_server: Callable[..., ServerProcess], tmp_path: Path) -> None:
    server = spawn_server()
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
